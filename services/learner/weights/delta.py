"""Delta rounds, publisher side: the base (the wire bytes of the version every member confirmed), which replicas
hold it, and a version's patches against it.

    base = DeltaBase(settings)
    plan = base.plan(outbox)          # after the outbox took the version: patches, or None (a full round)
    base.eligible(members)            # may a round to these replicas be a delta round?
    base.confirmed(ids, version)      # members that reported the version loaded
    base.settle(outbox, plan, ids)    # after the publish: advance the base if every member confirmed it

Rules (docs/weight-sync.md, "Delta rounds"):

- a replica is *level* when this publisher saw it load the base version (a report of a round it ran) and the
  registry says it still serves it; a new replica, one restarted, one that joined from a peer, one that
  missed a version or refused a patch is not, and a round with any such member sends every bucket whole;
- the base advances only when every live delta-capable member confirmed the version just published (the
  patches are applied to the base, buckets sent whole are copied); otherwise it stays, and the next round
  is full for everyone (a full round re-establishes it);
- every ``full_every`` versions a round is full anyway.

Memory: one copy of the wire bytes (``base.buffers``), on the device each bucket is packed on.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from shared.weight_sync.delta import Patch, make_patch, unit_size
from shared.weight_sync.settings import WeightSyncSettings
from shared.weight_sync.wire import DTYPES, DeltaRound, ReplicaInfo

log = logging.getLogger(__name__)


@dataclass
class DeltaPlan:
    """A version's buckets against the base: a patch each, or None for a bucket that goes whole."""

    version: int
    base_version: int
    patches: list[Patch | None]
    full_bytes: int  # the version's bytes
    changed: int = 0  # units that differ from the base, all buckets
    units: int = 0
    whole_bytes: int = 0  # buckets sent whole (a patch would not have been smaller)

    @property
    def payload(self) -> tuple[int, ...]:
        """Per bucket what is broadcast (:class:`~shared.weight_sync.wire.DeltaRound`)."""
        return tuple(-1 if p is None else (len(p.data) if p.changed else 0) for p in self.patches)

    def record(self) -> DeltaRound:
        return DeltaRound(base_version=self.base_version, payload=self.payload)

    @property
    def bytes(self) -> int:
        """What a delta round broadcasts: patches, and whole buckets where a patch would not be smaller."""
        return sum(len(p.data) if p is not None and p.changed else 0 for p in self.patches) + self.whole_bytes

    @property
    def changed_fraction(self) -> float:
        return self.changed / self.units if self.units else 0.0


@dataclass
class DeltaBase:
    """See the module docstring."""

    settings: WeightSyncSettings
    version: int = 0  # the version the base holds (0: none)
    layout_id: str = ""
    buffers: list[Any] = field(default_factory=list)
    level: dict[str, int] = field(default_factory=dict)  # replica id -> the version it was seen to load
    suspect: set[str] = field(default_factory=set)  # refused a patch: a full round before the next delta
    last_full: int = 0  # the last version published by a full round to every member
    #: the last plan's position bytes by codec (summed over its patches) and how often each was chosen
    last_codecs: dict[str, Any] = field(default_factory=dict)
    _said: bool = False

    @property
    def on(self) -> bool:
        return self.settings.delta == "auto"

    def usable(self, outbox: Any) -> bool:
        """Can a delta round be built for the version the outbox holds?"""
        m = outbox.manifest
        if not self.on or m is None or not m.checksum or self.version == 0 or m.layout_id != self.layout_id:
            return False
        if outbox.pooling and not outbox.send_in_place:
            if not self._said:
                self._said = True
                log.info("delta rounds need the version's bytes held through the publish (retain: copy, or "
                         "weights laid out in place); with retain: none every round is full")
            return False
        return m.version - self.last_full < self.settings.full_every

    def plan(self, outbox: Any) -> DeltaPlan | None:
        """Each bucket of the held version against the base (blocking: run it in a thread); digests every bucket
        too, so the checksums can go out before the round is announced. None when no delta round is possible."""
        if not self.usable(outbox):
            return None
        m = outbox.manifest
        plan = DeltaPlan(version=m.version, base_version=self.version, patches=[], full_bytes=m.total_bytes)
        sizes: dict[str, int] = {}
        chosen: dict[str, int] = {}
        for i, b in enumerate(m.buckets):
            new = outbox.pack(i)
            outbox.digest(i)
            unit = unit_size([DTYPES[e.dtype] for e in b.tensors], b.nbytes)
            base = self.buffers[i]
            if base.device != new.device:
                base = base.to(new.device)
            patch = make_patch(new, base, unit) if b.nbytes else None
            plan.patches.append(patch)
            n_units = b.nbytes // unit
            plan.units += n_units
            if patch is None:
                plan.changed += n_units  # (an upper bound: sent whole)
                plan.whole_bytes += b.nbytes
            else:
                plan.changed += patch.changed
                chosen[patch.codec] = chosen.get(patch.codec, 0) + 1
                for c, n in patch.sizes.items():
                    sizes[c] = sizes.get(c, 0) + n
        self.last_codecs = {"sizes": sizes, "chosen": chosen}
        return plan

    def eligible(self, members: list[ReplicaInfo]) -> bool:
        """Are all ``members`` level with the base (a delta round can serve them)?"""
        return bool(members) and all(
            i.delta and i.replica_id not in self.suspect and self.level.get(i.replica_id) == self.version
            and i.weight_version == self.version for i in members)

    def confirmed(self, ids: list[str], version: int) -> None:
        for rid in ids:
            self.level[rid] = version
            self.suspect.discard(rid)

    def refused(self, ids: list[str]) -> None:
        self.suspect.update(ids)

    def settle(self, outbox: Any, plan: DeltaPlan | None, sent_delta: bool, members: list[str], loaded: list[str]) -> None:
        """After a publish: move the base to the version just published if every live delta-capable member loaded
        it (``members``: their ids); ``sent_delta``: it went as patches of ``plan`` (else whole). Blocking."""
        m = outbox.manifest
        if not self.on or m is None or not m.checksum:
            return
        everyone = bool(members) and set(members) <= set(loaded)
        if not sent_delta and everyone:
            self.last_full = m.version
        if not everyone:
            return  # someone missed it: the base stays; the next round is full
        self._advance(outbox, plan if sent_delta else None)

    def _advance(self, outbox: Any, plan: DeltaPlan | None) -> None:
        """The base becomes the held version: patches applied in place where a plan against the current base
        exists, whole buckets copied otherwise (from the outbox's bytes, still the version)."""
        import torch

        from shared.weight_sync.delta import apply_diff

        m = outbox.manifest
        same = plan is not None and plan.base_version == self.version and self.layout_id == m.layout_id and \
            len(self.buffers) == len(m.buckets)
        if not same:
            self.buffers = []
        for i, b in enumerate(m.buckets):
            src = outbox.pack(i)
            if same:
                patch = plan.patches[i]
                if patch is None:
                    self.buffers[i].copy_(src)
                elif patch.changed:
                    apply_diff(self.buffers[i], patch, patch.data[5])  # header byte 5: the unit
            else:
                buf = torch.empty(b.nbytes, dtype=torch.uint8, device=src.device)
                buf.copy_(src)
                self.buffers.append(buf)
        self.version, self.layout_id = m.version, m.layout_id

    def forget(self) -> None:
        """Drop the base (a failed publish: the held bytes may not be the version anyone has)."""
        self.buffers, self.version, self.layout_id = [], 0, ""
