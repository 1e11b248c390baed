"""How a published version reaches the replicas: one :class:`WeightTransport` per way a replica can take
it, chosen by what each replica advertises (``ReplicaInfo.transport``):

- ``collective`` (:class:`~services.learner.weights.collective.CollectiveTransport`): update rounds in a
  broadcast group the publisher forms as rank 0 (torch.distributed or vLLM's PyNccl, by the replicas'
  group kind);
- ``snapshot`` (:class:`~services.learner.weights.snapshot.SnapshotTransport`): safetensors files per
  bucket (on a shared path, or served over HTTP), which replicas that cannot join a collective pull.

The publisher (:class:`~services.learner.weights.publisher.WeightPublisher`) plans the version and holds
its buckets (the outbox); for each publish it lets every transport :meth:`~WeightTransport.stage` the
version (before any replica hears of it), then hands each the live replicas advertising it
(:meth:`~WeightTransport.deliver`), and between publishes lets each bring late joiners up
(:meth:`~WeightTransport.catch_up`). The transports are those registered in :data:`PUBLISHER_TRANSPORTS`.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from services.learner.weights.outbox import Outbox
from shared.plugins import PluginPoint
from shared.weight_sync.phases import PhaseClock
from shared.weight_sync.registry import ReplicaRegistry
from shared.weight_sync.settings import WeightSyncSettings
from shared.weight_sync.wire import Manifest, ReplicaInfo


class PublishFailed(RuntimeError):
    """A publish failed on the publisher's side (staging, writing, a transport): the version was not announced,
    the fleet keeps the version it has; the message says why."""


@dataclass
class PublishReport:
    """What happened to one version (or one catch-up)."""

    version: int
    loaded: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    rounds: int = 0
    total_bytes: int = 0
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=dict)  # seconds spent per step (see PhaseClock)
    round_bytes: dict[str, int] = field(default_factory=dict)  # bytes broadcast by rounds, by kind: full / delta
    changed_fraction: float | None = None  # share of the wire units that differ from the delta base (None: no base)
    #: the round kind chosen for this version ({"kind": "delta" | "full", "reason", "full_s", "delta_s"}: the
    #: estimates of a round's seconds it was chosen from, services/learner/weights/chooser.py); None: no choice made
    #: (an adapter round)
    delta_choice: dict[str, Any] | None = None


@dataclass
class Shipment:
    """One version on its way out, as a transport's :meth:`~WeightTransport.deliver` gets it."""

    report: PublishReport
    clock: PhaseClock
    main: bool = True  # the publish itself (False: late joiners caught up to the version held)
    manifest_unwritten: bool = False  # the manifest is not in Redis yet: the first round writes it with its rendezvous
    round_id: int | None = None  # a round id taken in advance (the publish's first round)
    delta: Any = None  # the version's DeltaPlan against the base (services/learner/weights/delta.py), or None
    sent_delta: bool = False  # a round of this shipment went as patches

    def take_round_id(self) -> int | None:
        """The round id taken in advance, once (None afterwards: take a new one)."""
        round_id, self.round_id = self.round_id, None
        return round_id


class Publisher(Protocol):
    """What a transport uses of the publisher that owns it."""

    redis: Any
    run: str
    settings: WeightSyncSettings
    registry: ReplicaRegistry
    outbox: Outbox  # the version held: its manifest and buckets
    lock: asyncio.Lock  # held while a version is published; a catch-up takes it too
    delta: Any  # the DeltaBase: which replicas hold the base version (services/learner/weights/delta.py)

    async def write_checksums(self) -> None: ...


class WeightTransport(ABC):
    """One way a version reaches the replicas that advertise :attr:`name` (``ReplicaInfo.transport``).

    What a transport declares (class attributes; the defaults are what a third-party transport gets) is read
    by the publisher, never its name: see docs/plugins.md."""

    name: ClassVar[str]
    #: it sends delta rounds (patches against the base its replicas hold) to replicas that advertise ``delta``
    sends_delta: ClassVar[bool] = False
    #: the digest algorithm ``checksum_algo: auto`` takes for a version while one of its replicas is live (None:
    #: the backend's default), e.g. wsum64 for buckets read on the GPU, so nothing is copied to the host to digest
    auto_digest: ClassVar[str | None] = None

    def __init__(self, publisher: Publisher) -> None:
        self.publisher = publisher
        #: replicas that asked for the version held and cannot be served it (see WeightPublisher.replicas_waiting)
        self.waiting: set[str] = set()

    # the publisher's parts a transport works with
    @property
    def redis(self) -> Any:
        return self.publisher.redis

    @property
    def run(self) -> str:
        return self.publisher.run

    @property
    def settings(self) -> WeightSyncSettings:
        return self.publisher.settings

    @property
    def registry(self) -> ReplicaRegistry:
        return self.publisher.registry

    @property
    def outbox(self) -> Outbox:
        return self.publisher.outbox

    async def stage(self, manifest: Manifest) -> Manifest:
        """Make the version available this way before any replica hears of it; returns the manifest to
        announce (a transport may add where replicas find the version). Default: nothing to do."""
        return manifest

    @abstractmethod
    async def deliver(self, replicas: list[ReplicaInfo], shipment: Shipment) -> None:
        """Bring ``replicas`` (the live ones advertising this transport) to the version held, recording what
        happened in ``shipment.report``. Called once per publish, also with no replicas."""

    async def catch_up(self) -> None:
        """Between publishes: bring replicas that joined late (or fell behind) to the version held, if this
        transport brings them at all. Default: nothing (its replicas fetch what they need)."""

    def close(self) -> None:
        """Release what the transport holds (groups, sockets). Never raises."""


#: weight transports on the publisher's side, by the name replicas advertise (``ReplicaInfo.transport``): a
#: :class:`WeightTransport` subclass. Every registered one runs in every publisher, staged in this order (a
#: snapshot is written before any round announces the version). A replica's side registers the same name
#: (``services.rollout.weights.settings.REPLICA_TRANSPORTS``); register your own on both (docs/plugins.md).
PUBLISHER_TRANSPORTS: PluginPoint[type[WeightTransport]] = PluginPoint(
    "weight transport (publisher)", where="learner: every one registered runs; replicas choose by weights.transport",
    tag=None, doc="How a published version reaches the replicas advertising it "
    "(services/learner/weights/transport.py).", base=WeightTransport)
PUBLISHER_TRANSPORTS.register("snapshot", None, "services.learner.weights.snapshot:SnapshotTransport")
PUBLISHER_TRANSPORTS.register("collective", None, "services.learner.weights.collective:CollectiveTransport")
PUBLISHER_TRANSPORTS.register("ipc", None, "services.learner.weights.ipc:IpcTransport")
