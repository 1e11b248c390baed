"""A sink loads a version into one engine through that engine's own API. Which sink an engine takes is the
engine's own declaration (``Engine.weight_sink``, an import path), so there is no registry by kind here.

- ``run_round`` takes part in one collective update round (the sidecar calls it when a rendezvous names
  the replica; ``watcher`` reads the round's checksums for sinks that verify the bytes themselves). It raises :class:`RoundFailed` when the round broke (the replica is alive and can take
  part in a retry) and :class:`UpdateRefused` when the data is wrong; on success the engine serves the
  version and reports it as ``weight_version``.
- ``load_snapshot`` loads a version from the fallback transport (same versioning).
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from typing import Any, ClassVar, Protocol, runtime_checkable

from services.rollout.weights.receiver import RoundFailed, RoundWatcher, UpdateRefused
from services.rollout.weights.settings import SidecarSettings
from shared.service_kit.loader import load_object
from shared.weight_sync.wire import GroupKind, IpcRound, Manifest, Member, Rendezvous

log = logging.getLogger(__name__)

__all__ = ["RoundFailed", "ServesPeers", "UpdateRefused", "WeightSink", "create_sink", "sink_class"]


@runtime_checkable
class ServesPeers(Protocol):
    """A sink that can hand a bucket of the version it holds to a peer replica (``peer`` fetches)."""

    def peer_bucket(self, bucket: Any) -> bytes: ...


class WeightSink(ABC):
    group_kind: ClassVar[GroupKind] = "torch"  # the update group the engine joins (shared.weight_sync.group)
    #: applies delta rounds (patches against the version it holds, shared.weight_sync.delta): only sinks that
    #: hold the received bytes themselves can; engines receiving into their own buffers get every bucket whole
    #: (a sink may turn it off for itself once it sees it cannot: the class value is the default)
    accepts_delta: bool = False
    #: loads LoRA adapter rounds with ``weights.adapters: auto`` (the hf sink; engine servers need LoRA enabled at
    #: their start, so the operator turns them on)
    adapters_by_default: ClassVar[bool] = False
    #: versions a sample may lag behind, + 1: what a sink keeping several adapter versions loaded keeps
    #: (create_sidecar sets it from run.max_staleness)
    stale_versions: int = 2

    def __init__(self, engine: Any, settings: SidecarSettings) -> None:
        self.engine, self.settings = engine, settings
        self.phases: dict[str, float] = {}  # the last round's time per step, for sinks that measure it (PhaseClock)

    @property
    def weight_version(self) -> int:
        return self.engine.weight_version

    @property
    def accepts_adapters(self) -> bool:
        """Does this replica load adapter rounds (advertised as ``ReplicaInfo.adapters``)?"""
        mode = self.settings.adapters
        return not self._adapters_off and (mode == "on" or (mode == "auto" and self.adapters_by_default))

    _adapters_off = False  # set by a sink that found it cannot (said once in its log)

    def _no_base_for(self, version: int, holder: str) -> UpdateRefused:
        """An adapter round reached a replica whose ``holder`` (its model, the engine server) holds a full version,
        not the base the adapters apply to: from now on it asks for merged full rounds (said once); the round is
        refused with why."""
        if not self._adapters_off:
            self._adapters_off = True
            logging.getLogger(type(self).__module__).warning(
                "%s holds a full version (not the base it loaded): it cannot apply adapter rounds and asks for "
                "merged full rounds from now on", holder)
        return UpdateRefused(f"version {version} is an adapter round and {holder} no longer holds its base weights "
                             "(a full round replaced them)")

    @abstractmethod
    async def run_round(self, rdv: Rendezvous, member: Member, manifest: Manifest, watcher: RoundWatcher) -> None: ...

    @abstractmethod
    async def load_snapshot(self, manifest: Manifest) -> None: ...

    async def run_ipc(self, rnd: IpcRound, manifest: Manifest, watcher: RoundWatcher) -> None:
        """Load a version from the learner's buckets on this GPU (the ``ipc`` transport). Engines whose weights
        this process does not hold (served by another process) cannot."""
        raise UpdateRefused(f"the {getattr(self.engine, 'kind', type(self.engine).__name__)!r} engine cannot take "
                            "weights by CUDA IPC: use weights.transport collective")

    async def close(self) -> None:
        """Leave any group still held."""

    def paused(self) -> _Paused:
        """Async context: generation paused around the switch (``pause_mode``; ``wait`` falls back to
        aborting what is still in flight after ``pause_timeout_s``)."""
        return _Paused(self.engine, self.settings)


class _Paused:
    def __init__(self, engine: Any, settings: SidecarSettings) -> None:
        self.engine, self.settings = engine, settings

    async def __aenter__(self) -> None:
        try:
            await self.engine.pause(self.settings.pause_mode, timeout=self.settings.pause_timeout_s)
        except (asyncio.TimeoutError, TimeoutError):
            log.warning("in-flight requests still running after %.0fs: aborting them", self.settings.pause_timeout_s)
            await self.engine.pause("abort", timeout=self.settings.pause_timeout_s)

    async def __aexit__(self, *exc: object) -> None:
        await self.engine.resume()


def sink_class(engine: Any) -> type[WeightSink]:
    """The sink class ``engine`` declares (its ``weight_sink`` import path, loaded and checked to be a
    :class:`WeightSink`). Raises ``TypeError`` for an engine that cannot load weights."""
    path = getattr(engine, "weight_sink", None)
    kind = getattr(engine, "kind", type(engine).__name__)
    if path is None:
        raise TypeError(f"the {kind!r} engine cannot load weights (its class names no weight_sink); "
                        "turn the weight sidecar off (weights.enabled: false)")
    return load_object(path, WeightSink, what=f"weight sink of the {kind!r} engine")


def create_sink(engine: Any, settings: SidecarSettings) -> WeightSink:
    """The sink that loads versions into ``engine`` (see :func:`sink_class`)."""
    return sink_class(engine)(engine, settings)
