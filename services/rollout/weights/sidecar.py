"""The weight sidecar of one rollout replica: a component of the rollout service, built by
:func:`create_sidecar` from its engine and settings (the ``weights`` section), started after the engine and
stopped before it (``await start()`` / ``await stop()``).

It registers the replica in Redis (heartbeat), watches for update rounds that name it and runs them
through the engine's sink, reports each round's outcome, and keeps the replica at the latest version:

- at startup (``start``) it waits, up to ``join_timeout_s``, to be brought to the latest version before
  the service starts serving (collective replicas ask the publisher for a catch-up; snapshot replicas
  pull the latest snapshot);
- a replica that fell behind (dropped from a round, refused a version) asks again for the latest one.

Generation is paused around the switch (``pause_mode``: ``wait`` lets in-flight requests finish on the
old weights, ``abort`` ends them with ``finish_reason: abort`` for the rollout worker to requeue), so
every response reports the ``weight_version`` it was generated with.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from services.rollout.weights.receiver import RoundWatcher
from services.rollout.weights.settings import SidecarSettings
from services.rollout.weights.sinks import UpdateRefused, WeightSink, create_sink
from shared import keys
from shared.weight_sync.registry import ReplicaRegistry
from shared.weight_sync.wire import Manifest, ReplicaInfo, ReportState, Transport

log = logging.getLogger(__name__)


class LastUpdate(BaseModel):
    """The last update a replica ran (``GET /weights/version``'s ``last_update``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = Field(description="The version it carried.")
    state: ReportState = Field(description="loaded: served since; failed: the round broke; refused: bad data.")
    source: Transport = Field(description="How it came: a collective round or a snapshot.")
    round: int | None = Field(default=None, description="The collective round's id.")
    seconds: float = Field(description="How long it took on this replica.")
    phases: dict[str, float] = Field(
        default_factory=dict, description="Where those seconds went (hf: receive, verify, apply).")


def create_sidecar(engine: Any, settings: Any) -> WeightSidecar | None:
    """The weight sidecar of a rollout service (not started yet) around ``engine``, from the rollout
    ``settings`` (its ``weights`` section, ``redis_url``, ``run_name``; the replica is named after
    ``host:port``), or None when the section turns it off or there is no Redis to meet the learner in."""
    section: SidecarSettings = settings.weights
    if not section.enabled or not settings.redis_url:
        log.warning("weight sidecar off (%s)", "weights.enabled is false" if not section.enabled else "no redis_url")
        return None
    import redis.asyncio as aioredis

    redis = aioredis.from_url(settings.redis_url, socket_connect_timeout=5, socket_timeout=30)
    return WeightSidecar(engine, redis, settings.run_name, section, name=f"{settings.host}:{settings.port}",
                         owns_redis=True)


class WeightSidecar:
    """``redis``: a ``redis.asyncio`` client (closed by :meth:`stop` when ``owns_redis``)."""

    def __init__(self, engine: Any, redis: Any, run: str, settings: SidecarSettings | None = None,
                 name: str = "", sink: WeightSink | None = None, owns_redis: bool = False) -> None:
        self.engine, self.redis, self.run, self.owns_redis = engine, redis, run, owns_redis
        self.settings = settings or SidecarSettings()
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.replica_id = f"{self.name}/{uuid.uuid4().hex[:8]}"
        self.sink = sink or create_sink(engine, self.settings)
        self.registry = ReplicaRegistry(redis, run)
        self.watcher = RoundWatcher(redis, run, self.replica_id, self.settings.poll_s)
        self.wants_version = 0
        self.last_error = ""
        self.last_update: LastUpdate | None = None
        self._busy = asyncio.Lock()
        self._changed = asyncio.Condition()
        self._tasks: list[asyncio.Task] = []
        self._stopping = asyncio.Event()

    # ---- lifecycle ---------------------------------------------------------------------------------
    @property
    def weight_version(self) -> int:
        return self.sink.weight_version

    def info(self) -> ReplicaInfo:
        return ReplicaInfo(replica_id=self.replica_id, name=self.name, transport=self.settings.transport,
                           backend=self.settings.backend, ranks=self.settings.ranks,
                           group=self.sink.group_kind if self.settings.group == "auto" else self.settings.group,
                           engine=getattr(self.engine, "kind", ""), weight_version=self.weight_version,
                           wants_version=self.wants_version)

    async def start(self) -> None:
        """Register, start the loops, and wait (bounded) to reach the latest version."""
        await self.registry.put(self.info(), self.settings.heartbeat_ttl_s)
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._heartbeat_loop()), loop.create_task(self._latest_loop())]
        if self.settings.transport == "collective":
            self._tasks.append(loop.create_task(self._round_loop()))
        latest = await self.latest()
        if latest > self.weight_version and self.settings.join_timeout_s > 0:
            reached = await self.ensure(latest, self.settings.join_timeout_s)
            if not reached:
                log.warning("not at the latest weight version %d after %.0fs; serving version %d meanwhile",
                            latest, self.settings.join_timeout_s, self.weight_version)

    async def stop(self) -> None:
        # loops end at their next sleep; cancelling one inside a redis call can stall the client's cleanup
        self._stopping.set()
        _, late = await asyncio.wait(self._tasks, timeout=5.0) if self._tasks else (set(), set())
        for t in late:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        try:
            await self.registry.remove(self.replica_id)
        except Exception as exc:  # noqa: BLE001 - stopping goes on; the entry expires with its heartbeat
            log.warning("deregistering %s failed: %s", self.replica_id, exc)
        await self.sink.close()
        if self.owns_redis:
            await self.redis.aclose()

    # ---- control -----------------------------------------------------------------------------------
    async def latest(self) -> int:
        return int(await self.redis.get(keys.weights_version(self.run)) or 0)

    async def ensure(self, version: int, timeout_s: float) -> bool:
        """Ask to be brought to ``version`` and wait until the engine serves it (or ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        while self.weight_version < version:
            await self._request(version)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            async with self._changed:
                try:
                    await asyncio.wait_for(self._changed.wait(), min(remaining, 1.0))
                except (asyncio.TimeoutError, TimeoutError):
                    pass
        return True

    async def _request(self, version: int) -> None:
        if self.settings.transport == "snapshot":
            await self._pull_snapshot(version)
            return
        if self.wants_version != version:
            self.wants_version = version
            await self.registry.put(self.info(), self.settings.heartbeat_ttl_s)

    def status(self) -> dict[str, Any]:
        return {"replica_id": self.replica_id, "weight_version": self.weight_version,
                "transport": self.settings.transport, "backend": self.settings.backend,
                "updating": self._busy.locked(), "last_update": self.last_update, "last_error": self.last_error}

    # ---- loops -------------------------------------------------------------------------------------
    async def _sleep(self, seconds: float) -> bool:
        """Sleep unless stopping; False once the sidecar is stopping."""
        try:
            await asyncio.wait_for(self._stopping.wait(), seconds)
        except (asyncio.TimeoutError, TimeoutError):
            return True
        return False

    async def _heartbeat_loop(self) -> None:
        while await self._sleep(self.settings.heartbeat_s):
            try:
                await self.registry.put(self.info(), self.settings.heartbeat_ttl_s)
            except Exception as exc:  # noqa: BLE001 - the loop outlives a failed beat (Redis away)
                log.warning("heartbeat failed: %s", exc)

    async def _latest_loop(self) -> None:
        """Fell behind (dropped, refused, restarted)? Ask for the latest version again."""
        while await self._sleep(self.settings.heartbeat_s):
            try:
                latest = await self.latest()
                if latest > self.weight_version and not self._busy.locked():
                    await self._request(latest)
            except Exception as exc:  # noqa: BLE001 - the loop outlives a failed check (Redis away)
                log.warning("checking the latest weight version failed: %s", exc)

    async def _round_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                found = await self.watcher.wait(self.settings.poll_s)  # returns as soon as a round is announced
            except Exception as exc:  # noqa: BLE001 - the loop outlives a failed read (Redis away)
                log.warning("reading the rendezvous failed: %s", exc)
                await self._sleep(1.0)
                continue
            if found is None:
                continue
            rdv, member = found
            async with self._busy:
                t0 = time.perf_counter()
                state, detail = "loaded", ""
                self.sink.phases = {}
                try:
                    manifest = await self.watcher.manifest(rdv)
                    await self.sink.run_round(rdv, member, manifest, self.watcher)
                except UpdateRefused as exc:
                    state, detail = "refused", str(exc)
                except Exception as exc:  # noqa: BLE001 - RoundFailed or any other failure: reported as failed
                    state, detail = "failed", f"{type(exc).__name__}: {exc}"
                self.last_error = detail
                self.last_update = LastUpdate(
                    round=rdv.round, version=rdv.version, state=state, source="collective",
                    seconds=round(time.perf_counter() - t0, 3),
                    phases={k: round(x, 4) for k, x in self.sink.phases.items()})
                log.info("weight round %d (version %d): %s %s", rdv.round, rdv.version, state, detail)
                try:
                    await self.watcher.report(rdv, state, detail)
                    await self.registry.put(self.info(), self.settings.heartbeat_ttl_s)
                except Exception as exc:  # noqa: BLE001 - the publisher drops a member that never reports
                    log.warning("reporting round %d failed: %s", rdv.round, exc)
            await self._notify()

    async def _pull_snapshot(self, version: int) -> None:
        async with self._busy:
            if self.weight_version >= version:
                return
            raw = await self.redis.get(self.watcher_manifest_key(version))
            if raw is None:
                self.last_error = f"version {version} has no manifest"
                return
            manifest = Manifest.loads(raw)
            t0 = time.perf_counter()
            try:
                await self.sink.load_snapshot(manifest)
                state, self.last_error = "loaded", ""
            except Exception as exc:  # noqa: BLE001 - UpdateRefused or any other failure: this version is refused
                state, self.last_error = "refused", f"{type(exc).__name__}: {exc}"
                log.warning("loading snapshot of version %d failed: %s", version, exc)
            self.last_update = LastUpdate(version=version, state=state, source="snapshot",
                                          seconds=round(time.perf_counter() - t0, 3))
            await self.registry.put(self.info(), self.settings.heartbeat_ttl_s)
        await self._notify()

    def watcher_manifest_key(self, version: int) -> str:
        from shared.weight_sync import keys as wkeys

        return wkeys.manifest(self.run, version)

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()
