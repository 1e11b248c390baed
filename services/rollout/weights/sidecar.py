"""The weight sidecar of one rollout replica: a component of the rollout service, built by
:func:`create_sidecar` from its engine and settings (the ``weights`` section), started after the engine and
stopped before it (``await start()`` / ``await stop()``).

It registers the replica in Redis (heartbeat), takes each version through its transport
(:mod:`services.rollout.weights.transport`: collective rounds, or snapshot files) and the engine's sink,
and keeps the replica at the latest version:

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
from collections.abc import Awaitable
from typing import Any, TypeVar
from urllib.parse import urlsplit

from services.rollout.weights.peer import PeerCatchUp
from services.rollout.weights.receiver import RoundWatcher
from services.rollout.weights.settings import REPLICA_TRANSPORTS, SidecarSettings
from services.rollout.weights.sinks import WeightSink, create_sink
from services.rollout.weights.sinks.base import ServesPeers
from services.rollout.weights.transport import LastUpdate, ReplicaTransport
from shared import keys
from shared.weight_sync.registry import ReplicaRegistry
from shared.weight_sync.wire import ReplicaInfo

T = TypeVar("T")

log = logging.getLogger(__name__)


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
    token = settings.control_token.get_secret_value() if settings.control_token else None
    from shared.advertise import default_url

    # where peers reach this replica: a wildcard bind (0.0.0.0 in a container) advertises the container's address,
    # as session mode does; http://0.0.0.0:8001 sent each joiner to itself (compose: no join from a peer)
    peer_url = (settings.advertise_url or default_url(settings.host, settings.port)
                or f"http://{settings.host}:{settings.port}").rstrip("/")
    # named by that address too: every compose replica was "0.0.0.0:8001" in the learner's status and lag warnings
    name = urlsplit(peer_url).netloc or f"{settings.host}:{settings.port}"
    sidecar = WeightSidecar(engine, redis, settings.run_name, section, name=name,
                            owns_redis=True, peer_url=peer_url if section.peer else "", peer_token=token)
    # adapter versions an engine server keeps loaded (adapters_resident 0): as many as samples may be stale, + 1
    sidecar.sink.stale_versions = settings.run.max_staleness + 1
    return sidecar


class WeightSidecar:
    """``redis``: a ``redis.asyncio`` client (closed by :meth:`stop` when ``owns_redis``)."""

    def __init__(self, engine: Any, redis: Any, run: str, settings: SidecarSettings | None = None,
                 name: str = "", sink: WeightSink | None = None, owns_redis: bool = False, peer_url: str = "",
                 peer_token: str | None = None) -> None:
        self.engine, self.redis, self.run, self.owns_redis = engine, redis, run, owns_redis
        self.settings = settings or SidecarSettings()
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.replica_id = f"{self.name}/{uuid.uuid4().hex[:8]}"
        self.sink = sink or create_sink(engine, self.settings)
        self.registry = ReplicaRegistry(redis, run)
        self.watcher = RoundWatcher(redis, run, self.replica_id, self.settings.poll_s)
        self.wants_version = 0
        self.last_error = ""
        self._last_update: LastUpdate | None = None
        self.first_update: LastUpdate | None = None  # the first version loaded: how this replica joined
        self.busy = asyncio.Lock()  # held while an update runs
        self.transport: ReplicaTransport = REPLICA_TRANSPORTS.load(self.settings.transport)(self)
        self._changed = asyncio.Condition()
        self._tasks: list[asyncio.Task] = []
        self._stopping = asyncio.Event()
        # elastic pool: serve our verified weights to joiners, and join from a peer (services/rollout/weights/peer.py)
        self.peer_url = peer_url if self.settings.peer and isinstance(self.sink, ServesPeers) else ""
        self.peer = PeerCatchUp(self, peer_token) if self.settings.peer else None
        self._peer_manifest: Any = None
        self._peer_serving = asyncio.Semaphore(1)  # one bucket packed at a time: a request cannot make us do more

    # ---- lifecycle ---------------------------------------------------------------------------------
    @property
    def last_update(self) -> LastUpdate | None:
        return self._last_update

    @last_update.setter
    def last_update(self, update: LastUpdate | None) -> None:
        self._last_update = update
        if self.first_update is None and update is not None and update.state == "loaded":
            self.first_update = update

    @property
    def weight_version(self) -> int:
        return self.sink.weight_version

    def info(self) -> ReplicaInfo:
        return ReplicaInfo(replica_id=self.replica_id, name=self.name, transport=self.settings.transport,
                           backend=self.settings.backend, ranks=self.settings.ranks,
                           group=self.sink.group_kind if self.settings.group == "auto" else self.settings.group,
                           engine=getattr(self.engine, "kind", ""), weight_version=self.weight_version,
                           delta=self.transport.takes_delta and self.sink.accepts_delta,
                           adapters=self.transport.takes_adapters and self.sink.accepts_adapters,
                           wants_version=self.wants_version, peer_url=self.peer_url)

    async def start(self) -> None:
        """Register, start the loops, and wait (bounded) to reach the latest version."""
        if not self.info().adapters:
            why = ("weights.adapters is off" if self.settings.adapters == "off" else
                   f"weights.transport is {self.settings.transport}" if not self.transport.takes_adapters else
                   f"the {getattr(self.engine, 'kind', '?')} engine loads adapters only with weights.adapters: on "
                   "(and LoRA enabled in its server)")
            log.info("this replica does not load LoRA adapter rounds (%s): a LoRA learner sends it merged full rounds",
                     why)
        await self.advertise()
        loop = asyncio.get_running_loop()
        loops = [self._heartbeat_loop(), self._latest_loop(), *self.transport.loops()]
        self._tasks = [loop.create_task(c) for c in loops]
        latest = await self.latest()
        from_peer = latest > self.weight_version and await self.from_peer(latest)
        if from_peer and (latest := await self.latest()) > self.weight_version:
            await self.from_peer(latest)  # a peer was one behind, or the learner published meanwhile: once more
        # brought (close) to the latest by a peer: the ordinary rounds (this replica is registered) do the rest,
        # so the publisher runs no catch-up round for it; with no peer to serve it, ask the publisher
        if not from_peer and latest > self.weight_version and self.settings.join_timeout_s > 0:
            reached = await self.ensure(latest, self.settings.join_timeout_s)
            if not reached:
                log.warning("not at the latest weight version %d after %.0fs; serving version %d meanwhile",
                            latest, self.settings.join_timeout_s, self.weight_version)

    async def stop(self) -> None:
        # loops end at their next sleep, the round loop's read of the announcements at once (unless_stopping);
        # a loop is cancelled only if it has not ended within 5 s
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
            await self.transport.request(version)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            async with self._changed:
                try:
                    await asyncio.wait_for(self._changed.wait(), min(remaining, 1.0))
                except (asyncio.TimeoutError, TimeoutError):
                    pass
        return True

    async def from_peer(self, version: int) -> bool:
        """Load ``version`` (or the newest below it a peer holds) from a peer replica, before asking the
        publisher; True if the engine moved to a newer version."""
        if self.peer is None or self.busy.locked():
            return False
        async with self.busy:
            if self.weight_version >= version:
                return False
            try:
                loaded = await self.peer.run(version)
            except Exception as exc:  # noqa: BLE001 - Redis away, a bad record: the publisher is asked instead
                log.warning("catching up on version %d from a peer failed: %s", version, exc)
                return False
            if loaded:
                self.last_error = ""
                await self.advertise()
        await self.notify()
        return loaded

    def note_peer_update(self, version: int, peer_url: str, seconds: float, phases: dict[str, float]) -> None:
        self.last_update = LastUpdate(version=version, state="loaded", source="peer", seconds=round(seconds, 3),
                                      phases=phases, peer=peer_url)

    async def peer_bucket(self, version: int, index: int) -> bytes:
        """Bucket ``index`` of ``version`` for a joining peer: raises LookupError (no such bucket), ValueError
        (this replica does not hold ``version``), RuntimeError (it serves no weights)."""
        if not self.peer_url:
            raise RuntimeError("this replica serves no weights to peers (weights.peer is off, or its engine "
                               "cannot read its weights back)")
        if version != self.weight_version:
            raise ValueError(f"this replica holds version {self.weight_version}, not {version}")
        manifest = self._peer_manifest
        if manifest is None or manifest.version != version:
            from services.rollout.weights.peer import version_records

            records = await version_records(self.redis, self.run, version)
            if records is None:
                raise ValueError(f"version {version}'s manifest or digests are no longer in Redis")
            manifest = self._peer_manifest = records[0]
        if not 0 <= index < len(manifest.buckets):
            raise LookupError(f"version {version} has {len(manifest.buckets)} buckets; there is no bucket {index}")
        sink = self.sink
        if not isinstance(sink, ServesPeers):
            raise LookupError("this replica's engine cannot serve weights to peers")  # noqa: TRY004 - the route's 404
        async with self._peer_serving:
            data = await asyncio.to_thread(sink.peer_bucket, manifest.buckets[index])
        if self.weight_version != version:  # switched while packing: these bytes may mix versions
            raise ValueError(f"this replica moved to version {self.weight_version} while serving {version}")
        return data

    async def advertise(self) -> None:
        """Write this replica's registry entry (version, the version it wants) and refresh its heartbeat."""
        await self.registry.put(self.info(), self.settings.heartbeat_ttl_s)

    def status(self) -> dict[str, Any]:
        return {"replica_id": self.replica_id, "weight_version": self.weight_version,
                "transport": self.settings.transport, "backend": self.settings.backend,
                "updating": self.busy.locked(), "last_update": self.last_update, "first_update": self.first_update,
                "last_error": self.last_error}

    # ---- loops -------------------------------------------------------------------------------------
    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    async def sleep(self, seconds: float) -> bool:
        """Sleep unless stopping; False once the sidecar is stopping."""
        try:
            await asyncio.wait_for(self._stopping.wait(), seconds)
        except (asyncio.TimeoutError, TimeoutError):
            return True
        return False

    async def unless_stopping(self, read: Awaitable[T]) -> T | None:
        """``read``'s result, or None as soon as the sidecar is stopping: a loop's blocking read between rounds
        (``poll_s`` long) is then cancelled, so a stop (and the process's exit) does not wait it out. redis-py
        drops the connection a cancelled read was on; nothing else is cancelled (a round holds ``busy``)."""
        task = asyncio.ensure_future(read)
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        return None if task.cancelled() else task.result()

    async def _heartbeat_loop(self) -> None:
        while await self.sleep(self.settings.heartbeat_s):
            try:
                await self.advertise()
            except Exception as exc:  # noqa: BLE001 - the loop outlives a failed beat (Redis away)
                log.warning("heartbeat failed: %s", exc)

    async def _latest_loop(self) -> None:
        """Fell behind (dropped, refused, restarted)? Ask for the latest version again."""
        while await self.sleep(self.settings.heartbeat_s):
            try:
                latest = await self.latest()
                # behind: a peer first where this loop is a catch-up (catches_up_from_peers: collective, ipc, whose
                # versions come in rounds); for a snapshot replica this loop is how every version comes, from the files
                if latest > self.weight_version and not self.busy.locked() and \
                        (not self.transport.catches_up_from_peers or not await self.from_peer(latest)):
                    await self.transport.request(latest)
            except Exception as exc:  # noqa: BLE001 - the loop outlives a failed check (Redis away)
                log.warning("checking the latest weight version failed: %s", exc)

    async def notify(self) -> None:
        """Wake whoever waits for the version to change (:meth:`ensure`)."""
        async with self._changed:
            self._changed.notify_all()
