"""Learner side: publish a version of the weights to every rollout replica.

    pub = WeightPublisher(redis, run, WeightSyncSettings(...))     # redis: a redis.asyncio client
    version = await pub.publish(model)        # nn.Module, {name: tensor} or [(name, tensor)]
    pub.last_report                           # PublishReport: loaded / dropped / refused replicas
    await pub.close()                         # or: async with WeightPublisher(...) as pub

What ``publish`` does, in order (every wait bounded by a setting):

1. plans the buckets and builds the manifest; the :class:`Outbox` takes the version (its buckets' bytes
   come from the weights' own memory after :meth:`WeightPublisher.flatten`, else are packed into a
   retained host copy or a reused device buffer, see ``retain``);
2. lets each transport stage the version (the snapshot transport writes its files when ``snapshot_dir``
   is set: then every bucket is packed first);
3. hands each transport the live replicas that advertise it (``ReplicaInfo.transport``): the collective
   transport runs update rounds with them (:mod:`services.learner.weights.collective`), snapshot replicas
   pull the files themselves;
4. packs what late joiners can be served and no round sent (see :meth:`Outbox.finish`), writes the
   checksums record, and sets ``shared.keys.weights_version(run)`` to the version, then returns it.

A background task (started on first publish) lets the transports bring replicas that join later (or were
dropped) to the latest version from what the outbox holds (or, if it holds nothing any more, at the next
version). Keep the event loop responsive (run training steps in a thread) so that it can run; otherwise
they catch up at the next publish.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import TYPE_CHECKING, Any

from services.learner.weights import packing as T
from services.learner.weights.adapter import AdapterWeights
from services.learner.weights.delta import DeltaBase
from services.learner.weights.health import RoundHistory, lag_problem
from services.learner.weights.outbox import Outbox
from services.learner.weights.shards import ShardedWeights
from services.learner.weights.transport import (
    PUBLISHER_TRANSPORTS,
    PublishFailed,
    PublishReport,
    Shipment,
    WeightTransport,
)
from services.learner.weights.walk import ModuleWalk
from shared import keys
from shared.redis_errors import redis_unavailable
from shared.weight_sync import keys as wkeys
from shared.weight_sync.phases import PhaseClock
from shared.weight_sync.registry import ReplicaRegistry
from shared.weight_sync.settings import WeightSyncSettings
from shared.weight_sync.wire import Manifest, layout_id, plan_buckets

if TYPE_CHECKING:
    from typing_extensions import Self

log = logging.getLogger(__name__)

__all__ = ["PublishFailed", "PublishReport", "WeightPublisher"]


class WeightPublisher:
    """Publishes versioned weights; see the module docstring. Not safe to share across event loops."""

    def __init__(self, redis: Any, run: str, settings: WeightSyncSettings | None = None) -> None:
        self.redis, self.run = redis, run
        self.settings = settings or WeightSyncSettings()
        self.registry = ReplicaRegistry(redis, run)
        self.last_report: PublishReport | None = None
        self.history = RoundHistory()  # consecutive failed publishes and the last reason (see lag_problem)
        self._last_version = 0  # the newest version this publisher published
        self.outbox = Outbox(self.settings)  # the held version's buckets: packed, digested, kept for late joiners
        self.delta = DeltaBase(self.settings)  # the version every replica confirmed, for delta rounds (delta.py)
        self.lock = asyncio.Lock()  # held while a version is published; a catch-up takes it too
        # every registered transport, in registration order (snapshot first: written before any round announces)
        self.transports: dict[str, WeightTransport] = {name: PUBLISHER_TRANSPORTS.load(name)(self)
                                                       for name in PUBLISHER_TRANSPORTS}
        self._sums_written = False
        self._plan_key: list | None = None
        self._plan: tuple | None = None
        self._layout_id = ""
        self._walk = ModuleWalk()  # a published module's tensors, re-walked only when its structure changes
        self._catch_up_task: asyncio.Task | None = None
        self._closing = asyncio.Event()
        self._merged_said: set[str] = set()  # replicas already named as getting merged rounds (adapter_or_merged)
        self._said_choice: str | None = None  # the round kind delta: auto last said it prefers (_say_choice)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- public API ----------------------------------------------------------------------------------
    async def publish(self, weights: Any, *, version: int | None = None) -> int:
        """Publish ``weights`` as a new version (default: latest + 1) and return the version. ``weights`` may be
        a :class:`~services.learner.weights.shards.ShardedWeights` (rank 0 of a sharded learner): its buckets
        are gathered from every rank as they are packed, and the other ranks are released when this returns; or
        an :class:`~services.learner.weights.adapter.AdapterWeights` (a LoRA learner): an adapter round when
        every live replica loads adapters, else the merged model (:meth:`adapter_or_merged`)."""
        sharded = weights if isinstance(weights, ShardedWeights) else None
        try:
            return await self._publish(weights, version, sharded)
        finally:
            if sharded is not None:
                await asyncio.to_thread(sharded.finish)

    async def _publish(self, weights: Any, version: int | None, sharded: ShardedWeights | None) -> int:
        t0 = time.perf_counter()
        s = self.settings
        async with self.lock:
            clock = PhaseClock()
            pipe = self.redis.pipeline(transaction=False)  # one round trip: latest version, registry, round id
            pipe.get(keys.weights_version(self.run))
            pipe.hgetall(wkeys.replicas(self.run))
            pipe.incr(wkeys.round_counter(self.run))
            latest, listing, round_id = await pipe.execute()
            # a Redis that restarted may have lost the last version it was told (appendfsync everysec); this
            # publisher's own record keeps a version number from being handed out twice
            latest = max(int(latest or 0), self._last_version)
            v = latest + 1 if version is None else int(version)
            if v <= latest:
                raise ValueError(f"version {v} is not newer than the latest published version {latest}")
            replicas = await self.registry.alive(listing)
            adapter = merged_adapter = None
            if isinstance(weights, AdapterWeights):
                info = weights.info
                weights, adapter = await self.adapter_or_merged(weights, replicas)
                merged_adapter = info if adapter is None else None
            named = sharded.named() if sharded is not None else T.named_tensors(weights, self._walk)
            if not named:
                raise ValueError("nothing to publish: no tensors")
            buckets = self._plan_for(T.specs(named))
            manifest = Manifest(version=v, bucket_bytes=s.bucket_bytes, total_bytes=sum(b.nbytes for b in buckets),
                                buckets=buckets, checksum=self._digest_algo(replicas) if s.checksum else None,
                                layout_id=self._layout_id, adapter=adapter, merged_adapter=merged_adapter)
            self.outbox.begin(manifest, dict(named), source=sharded)
            self._sums_written = False
            for transport in self.transports.values():
                transport.waiting.clear()  # this version goes to every live replica
            clock.lap("plan")
            report = PublishReport(version=v, total_bytes=manifest.total_bytes)
            try:
                for transport in self.transports.values():  # before any replica hears of the version
                    manifest = await transport.stage(manifest)
                self.outbox.manifest = manifest
                # the manifest goes out with the first round's rendezvous (see CollectiveTransport._round)
                shipment = Shipment(report=report, clock=clock, manifest_unwritten=True, round_id=round_id)
                # an adapter round is small and is applied to each replica's base, not patched onto its weights
                shipment.delta = None if adapter is not None else await self._delta_plan(replicas, report)
                clock.lap("manifest")
                for name, transport in self.transports.items():  # each replica by the transport it advertises
                    await transport.deliver([i for i in replicas if i.transport == name], shipment)
                if shipment.manifest_unwritten:  # no round ran
                    await self.redis.set(wkeys.manifest(self.run, v), manifest.dumps(), ex=s.key_ttl_s)
                    shipment.manifest_unwritten = False
                await asyncio.to_thread(self.outbox.finish)
                await self.write_checksums()
                await asyncio.to_thread(self.delta.settle, self.outbox, shipment.delta, shipment.sent_delta,
                                        [i.replica_id for i in self._delta_members(replicas)], report.loaded)
            except Exception as exc:
                self.outbox.forget()  # half-packed: nothing to serve late joiners from
                self.delta.forget()
                if _redis_outage(exc):
                    raise  # the caller waits Redis out and publishes again
                reason = f"publishing version {v} failed: {type(exc).__name__}: {exc}"
                report.errors.append(reason)
                report.seconds = time.perf_counter() - t0
                self.last_report = report
                self.history.failed(reason)
                log.warning("%s (the fleet keeps the version it has)", reason, exc_info=True)
                raise PublishFailed(reason) from exc
            except BaseException:
                self.outbox.forget()
                raise
            finally:
                self.outbox.release()
            pipe = self.redis.pipeline(transaction=False)
            pipe.set(keys.weights_version(self.run), str(v))
            if report.delta_choice is not None:  # for fleetrl weights status
                pipe.set(wkeys.delta_choice(self.run), json.dumps({"version": v, **report.delta_choice}),
                         ex=s.key_ttl_s)
            await pipe.execute()
            self._last_version = v
            clock.lap("finish")
            report.seconds = time.perf_counter() - t0
            report.phases = {k: round(x, 6) for k, x in clock.phases.items()}
            self.last_report = report
            self.history.record(report)
        self._ensure_catch_up()
        log.info("published version %d (%.1f MB, %d buckets) in %.2fs (%s): loaded=%s dropped=%s refused=%s",
                 v, manifest.total_bytes / 1e6, len(buckets), report.seconds,
                 " ".join(f"{k} {x * 1e3:.0f}ms" for k, x in report.phases.items()), report.loaded, report.dropped,
                 report.refused)
        return v

    @property
    def replicas_waiting(self) -> list[str]:
        """Replicas that joined (or fell behind) after the last publish and could not be served it from what
        the outbox holds (weights sent in place have moved on, or ``retain: none``): they serve older weights
        until the next publish, so a learner that publishes only every few steps should publish sooner."""
        return sorted(set().union(*(t.waiting for t in self.transports.values())))

    async def lag_problem(self) -> str | None:
        """Which live replicas serve old weights and why (``lag_problem``), or None: for ``/status`` and logs."""
        replicas = await self.registry.alive() if self._last_version > 0 else []
        return lag_problem([(i.name or i.replica_id, i.weight_version) for i in replicas], self._last_version,
                           self.history)

    async def close(self) -> None:
        """Stop the catch-up task and release what the transports hold (the collective's groups)."""
        if self._catch_up_task is not None:
            # the loop ends at its next sleep (cancelling it inside a redis call can stall the client)
            self._closing.set()
            _, late = await asyncio.wait([self._catch_up_task], timeout=self.settings.catch_up_poll_s + 5.0)
            for t in late:
                t.cancel()
            await asyncio.gather(self._catch_up_task, return_exceptions=True)
            self._catch_up_task = None
            self._closing = asyncio.Event()
        for transport in self.transports.values():
            transport.close()

    def flatten(self, model: Any) -> int:
        """Lay ``model``'s tensors out in place the way :meth:`publish` buckets them: one flat buffer per
        bucket, each parameter pointed at its slice (same Parameter objects; optimizers keep working).
        Publishing ``model`` (or its ``state_dict()``) then sends straight from the weights' memory, with no
        pack copy. Returns the bucket count.

        Call it once, before training (plain torch training; not under frameworks that manage parameter
        memory themselves, e.g. DeepSpeed). Trade-off: the publisher retains no copy of the version it
        sent, so a replica that joins late is brought up from memory only while the weights still hold
        that version (checked by digest); once training has moved on, it gets the next version."""
        named = T.named_tensors(model, self._walk)
        buckets = self._plan_for(T.specs(named))
        T.flatten_into_buckets(named, buckets)
        self.outbox.send_in_place = True
        return len(buckets)

    async def adapter_or_merged(self, weights: AdapterWeights, replicas: list) -> tuple[Any, Any]:
        """What a LoRA learner's version goes out as: ``(adapter tensors, AdapterInfo)`` when every live replica
        loads adapter rounds (``ReplicaInfo.adapters``), else ``(merged weights, None)``: a merged full round for
        the whole fleet (one outbox, one version's buckets), said once per replica that cannot. The merged round's
        manifest names the adapter (``merged_adapter``): replicas that load adapters keep their base of its modules
        through it, so once the last replica that cannot has left, the rounds are adapter rounds again."""
        cannot = [i for i in replicas if not i.adapters]
        for i in cannot:
            if i.replica_id not in self._merged_said:
                self._merged_said.add(i.replica_id)
                log.warning("replica %s (%s engine, %s transport) cannot load LoRA adapters: versions go out as the "
                            "merged model (full rounds) while it is live", i.name or i.replica_id, i.engine or "?",
                            i.transport)
        if cannot:
            return await asyncio.to_thread(weights.merged), None
        return weights.tensors, weights.info

    def _delta_members(self, replicas: list) -> list:
        """The live replicas a delta round could serve (collective, this backend, a sink that applies patches)."""
        return [i for i in replicas if i.delta and i.backend == self.settings.backend
                and (t := self.transports.get(i.transport)) is not None and t.sends_delta]

    async def _delta_plan(self, replicas: list, report: PublishReport) -> Any:
        """An empty plan against the base when a delta round is chosen for the replicas (``DeltaBase.choose``:
        they are level with it, and the setting or the measured rounds say delta), else None: full rounds. Its
        patches are built during the round (``DeltaBase.build``). The choice goes in the report."""
        choice = self.delta.choose(self._delta_members(replicas), self.outbox)
        report.delta_choice = choice.as_dict()
        self._say_choice(choice)
        return self.delta.start(self.outbox) if choice.kind == "delta" else None

    def _say_choice(self, choice: Any) -> None:
        """Log the kind ``delta: auto`` prefers when it changes (probes and rounds that cannot be delta rounds are
        not a change of preference: debug only)."""
        if choice.reason != "faster":
            log.debug("round kind: %s (%s)", choice.kind, choice.reason)
            return
        if choice.kind == self._said_choice:
            return
        self._said_choice = choice.kind

        def fmt(x: float | None) -> str:
            return "not measured" if x is None else f"{x:.3f}s"

        why = f"a full round {fmt(choice.full_s)}, a delta round {fmt(choice.delta_s)}"
        log.info("delta auto: %s rounds from now (%s; the other kind is probed every %d rounds)", choice.kind, why,
                 self.settings.delta_probe_every)

    def _digest_algo(self, replicas: list) -> str:
        """The version's digest algorithm: the setting, with ``auto`` taking the one a live replica's transport
        declares (``auto_digest``: ipc's wsum64, computed on the GPU, so nothing is copied to the host to digest
        it), else the backend's."""
        s = self.settings
        if s.checksum_algo == "auto":
            for i in replicas:
                if (t := self.transports.get(i.transport)) is not None and t.auto_digest is not None:
                    return t.auto_digest
        return s.digest_algo

    # ---- packing -------------------------------------------------------------------------------------
    def _plan_for(self, specs: list) -> tuple:
        """The bucket plan of these tensor specs (reused while they stay the same)."""
        if self._plan is None or specs != self._plan_key:
            self._plan_key, self._plan = specs, tuple(plan_buckets(specs, self.settings.bucket_bytes))
            self._layout_id = layout_id(self._plan, self.settings.bucket_bytes)
        return self._plan

    async def write_checksums(self) -> None:
        """Write the version's :class:`Checksums` record once every bucket is digested (once per version)."""
        rec = self.outbox.checksums()
        if rec is None or self._sums_written:
            return
        await self.redis.set(wkeys.checksums(self.run, rec.version), rec.dumps(), ex=self.settings.key_ttl_s)
        self._sums_written = True

    # ---- late joiners --------------------------------------------------------------------------------
    def _ensure_catch_up(self) -> None:
        if self._catch_up_task is None or self._catch_up_task.done():
            self._catch_up_task = asyncio.get_running_loop().create_task(self._catch_up_loop())

    async def _catch_up_loop(self) -> None:
        failing_since: float | None = None  # a failing pass (Redis down) is logged once, then every 30 s
        last_logged = 0.0
        while True:
            try:
                await asyncio.wait_for(self._closing.wait(), self.settings.catch_up_poll_s)
                return
            except (asyncio.TimeoutError, TimeoutError):
                pass
            try:
                if self.outbox.manifest is not None and not self.lock.locked():
                    for transport in self.transports.values():
                        await transport.catch_up()
                if failing_since is not None:
                    log.info("catch-up passes work again (failed for %.1fs)", time.monotonic() - failing_since)
                    failing_since = None
            except Exception as exc:  # noqa: BLE001 - the loop outlives a failed pass (Redis away)
                now = time.monotonic()
                if failing_since is None:
                    failing_since = now
                if now - last_logged >= 30.0 or failing_since == now:
                    last_logged = now
                    log.warning("catch-up pass failed (failing for %.1fs): %s", now - failing_since, exc)


def _redis_outage(exc: BaseException) -> bool:
    """Is ``exc`` Redis being away (the caller waits that out), rather than the publish itself failing?"""
    return redis_unavailable(exc)
