"""How versions reach this replica: one :class:`ReplicaTransport` per way, chosen by the sidecar's
``transport`` setting through the plug-in point ``services.rollout.weights.settings.REPLICA_TRANSPORTS`` (which the replica advertises, ``ReplicaInfo.transport``, so that the publisher
serves it the same way):

- ``collective`` (:class:`CollectiveJoin`): wait for the update rounds that name this replica, run each
  through the engine's sink, report the outcome; to be brought to a version, ask the publisher for it
  (``wants_version`` in the registry) and it runs a catch-up round;
- ``ipc`` (:class:`IpcJoin`): as collective, but the rounds name CUDA IPC handles of the learner's buckets on
  the same GPU, copied device to device;
- ``snapshot`` (:class:`SnapshotPull`): nothing to wait for; to be brought to a version, read its manifest
  and load the safetensors files it names (written by the publisher's snapshot transport).
"""

from __future__ import annotations

import asyncio
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Coroutine
from typing import Any, ClassVar, Literal, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from services.rollout.weights.receiver import RoundWatcher, UpdateRefused
from services.rollout.weights.sinks.base import WeightSink
from shared.weight_sync import keys as wkeys
from shared.weight_sync.placement import TransportPlacement
from shared.weight_sync.wire import IpcRound, Manifest, ReportState, Transport

T = TypeVar("T")

log = logging.getLogger(__name__)


class LastUpdate(BaseModel):
    """The last update a replica ran (``GET /weights/version``'s ``last_update``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = Field(description="The version it carried.")
    state: ReportState = Field(description="loaded: served since; failed: the round broke; refused: bad data.")
    source: Transport | Literal["peer"] = Field(description="How it came: a collective round, a snapshot, or "
                                                          "another replica (peer catch-up).")
    peer: str | None = Field(default=None, description="The peer it came from (source peer).")
    round: int | None = Field(default=None, description="The collective round's id.")
    seconds: float = Field(description="How long it took on this replica.")
    phases: dict[str, float] = Field(
        default_factory=dict, description="Where those seconds went (hf: receive, verify, apply).")


class Sidecar(Protocol):
    """What a transport uses of the sidecar that runs it (:class:`~services.rollout.weights.sidecar.WeightSidecar`)."""

    redis: Any
    run: str
    sink: WeightSink
    watcher: RoundWatcher
    busy: asyncio.Lock  # held while an update runs
    wants_version: int
    last_error: str
    last_update: LastUpdate | None

    @property
    def weight_version(self) -> int: ...
    @property
    def stopping(self) -> bool: ...
    async def advertise(self) -> None: ...
    async def sleep(self, seconds: float) -> bool: ...
    async def unless_stopping(self, read: Awaitable[T]) -> T | None: ...
    async def notify(self) -> None: ...


class ReplicaTransport(ABC):
    """One way versions reach this replica (see the module docstring).

    What a transport declares (class attributes; the defaults are what a third-party transport gets) is read
    by the sidecar, the publisher and the run's placement, never its name: see docs/plugins.md."""

    name: ClassVar[str]
    #: the replica advertises delta rounds (patches against the base it holds) when its sink applies them
    takes_delta: ClassVar[bool] = False
    #: the replica advertises LoRA adapter rounds when its sink loads them (else the learner sends merged rounds)
    takes_adapters: ClassVar[bool] = False
    #: a replica that fell behind first asks a peer replica for the latest version, then this transport
    catches_up_from_peers: ClassVar[bool] = True
    #: where the replica may sit relative to the learner (``fleetrl run`` checks it at start)
    placement: ClassVar[TransportPlacement] = TransportPlacement()

    def __init__(self, sidecar: Sidecar) -> None:
        self.sidecar = sidecar

    def loops(self) -> list[Coroutine[Any, Any, None]]:
        """What runs beside the sidecar's own loops while it runs (none by default)."""
        return []

    @abstractmethod
    async def request(self, version: int) -> None:
        """Ask to be brought to ``version`` (returns before it is reached; the sidecar waits for that)."""


class CollectiveJoin(ReplicaTransport):
    """Join the publisher's update rounds (see the module docstring)."""

    name = "collective"
    takes_delta = True
    takes_adapters = True
    placement = TransportPlacement(uses_backend=True)

    def loops(self) -> list[Coroutine[Any, Any, None]]:
        return [self._rounds()]

    async def request(self, version: int) -> None:
        sc = self.sidecar
        if sc.wants_version != version:
            sc.wants_version = version
            await sc.advertise()

    def _watcher(self) -> RoundWatcher:
        return self.sidecar.watcher

    async def _load(self, rdv: Any, member: Any, manifest: Manifest) -> None:
        await self.sidecar.sink.run_round(rdv, member, manifest, self.sidecar.watcher)

    async def _rounds(self) -> None:
        sc = self.sidecar
        watcher = self._watcher()
        while not sc.stopping:
            try:
                # returns as soon as a round is announced, or the sidecar stops
                found = await sc.unless_stopping(watcher.wait(watcher.poll_s))
            except Exception as exc:  # noqa: BLE001 - the loop outlives a failed read (Redis away)
                log.warning("reading the rendezvous failed: %s", exc)
                await sc.sleep(1.0)
                continue
            if found is None:
                continue
            rdv, member = found
            async with sc.busy:
                t0 = time.perf_counter()
                state: ReportState = "loaded"
                detail = ""
                sc.sink.phases = {}
                try:
                    manifest = await watcher.manifest(rdv)
                    await self._load(rdv, member, manifest)
                except UpdateRefused as exc:
                    state, detail = "refused", str(exc)
                except Exception as exc:  # noqa: BLE001 - RoundFailed or any other failure: reported as failed
                    state, detail = "failed", f"{type(exc).__name__}: {exc}"
                sc.last_error = detail
                sc.last_update = LastUpdate(
                    round=rdv.round, version=rdv.version, state=state, source=self.name,
                    seconds=round(time.perf_counter() - t0, 3),
                    phases={k: round(x, 4) for k, x in sc.sink.phases.items()})
                log.info("weight round %d (version %d): %s %s", rdv.round, rdv.version, state, detail)
                try:
                    # the registry first: whoever the report wakes (the publisher, then anyone reading the registry)
                    # sees the version this replica now serves
                    await sc.advertise()
                    await watcher.report(rdv, state, detail)
                except Exception as exc:  # noqa: BLE001 - the publisher drops a member that never reports
                    log.warning("reporting round %d failed: %s", rdv.round, exc)
            await sc.notify()


class IpcJoin(CollectiveJoin):
    """Take the publisher's ``ipc`` rounds (replicas on the learner's GPU): each names the buckets' CUDA IPC
    handles; the sink copies them device to device, verifies the digests and reports. Catch-up as collective."""

    name = "ipc"
    takes_delta = False
    takes_adapters = False
    placement = TransportPlacement(shares_device_memory=True)

    def __init__(self, sidecar: Sidecar) -> None:
        super().__init__(sidecar)
        self.watcher = RoundWatcher(sidecar.redis, sidecar.run, sidecar.watcher.replica_id, sidecar.watcher.poll_s,
                                    key=wkeys.ipc_round(sidecar.run), record=IpcRound)

    def _watcher(self) -> RoundWatcher:
        return self.watcher

    async def _load(self, rdv: Any, member: Any, manifest: Manifest) -> None:
        await self.sidecar.sink.run_ipc(rdv, manifest, self.watcher)


class SnapshotPull(ReplicaTransport):
    """Load versions from the publisher's snapshot files (see the module docstring)."""

    name = "snapshot"
    catches_up_from_peers = False  # its loop of latest-version checks is how every version comes (from the files)

    async def request(self, version: int) -> None:
        sc = self.sidecar
        async with sc.busy:
            if sc.weight_version >= version:
                return
            raw = await sc.redis.get(wkeys.manifest(sc.run, version))
            if raw is None:
                sc.last_error = f"version {version} has no manifest"
                return
            manifest = Manifest.loads(raw)
            t0 = time.perf_counter()
            state: ReportState = "loaded"
            try:
                await sc.sink.load_snapshot(manifest)
                sc.last_error = ""
            except Exception as exc:  # noqa: BLE001 - UpdateRefused or any other failure: this version is refused
                state, sc.last_error = "refused", f"{type(exc).__name__}: {exc}"
                log.warning("loading snapshot of version %d failed: %s", version, exc)
            sc.last_update = LastUpdate(version=version, state=state, source="snapshot",
                                        seconds=round(time.perf_counter() - t0, 3))
            await sc.advertise()
        await sc.notify()

