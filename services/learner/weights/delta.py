"""Delta rounds, publisher side: the base (the wire bytes of the version every member confirmed), which replicas
hold it, and a version's patches against it.

    base = DeltaBase(settings)
    plan = base.start(outbox)         # after the outbox took the version: an empty plan, or None (a full round)
    base.build(outbox, plan, i)       # during the round: bucket i's patch (None: it goes whole)
    base.eligible(members)            # may a round to these replicas be a delta round?
    base.choose(members, outbox)      # delta or full for the next round (setting, level, chooser.py's timings)
    base.confirmed(ids, version)      # members that reported the version loaded
    base.settle(outbox, plan, ids)    # after the publish: advance the base if every member confirmed it

Rules (docs/weight-sync.md, "Delta rounds"):

- a replica is *level* when this publisher saw it load the base version (a report of a round it ran) and the
  registry says it still serves it; a new replica, one restarted, one that joined from a peer, one that
  missed a version or refused a patch is not, and a round with any such member sends every bucket whole;
- the base advances only when every live delta-capable member confirmed the version just published (the
  patches are applied to the base, buckets sent whole are copied); otherwise it stays, and the next round
  is full for everyone (a full round re-establishes it);
- every ``full_every`` versions a round is full anyway;
- with ``delta: auto`` the :class:`~services.learner.weights.chooser.RoundChooser` picks delta or full from what
  recent rounds took; the base is advanced only before a round it may make a delta round (where full rounds keep
  winning, the copy into the base is skipped until the next delta probe).

A plan is built bucket by bucket while the round runs (the collective transport builds bucket k+1's patch
while bucket k is on the wire and the members patch it), so a delta round is announced at once; each bucket's
broadcast is preceded by its size (:class:`DeltaPlan.sent`).

Memory: one copy of the wire bytes (``base.buffers``), on the device each bucket is packed on.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from services.learner.weights.chooser import Choice, RoundChooser
from shared.weight_sync.delta import PIECE_BYTES, Patch, make_patch, pieces, unit_size
from shared.weight_sync.settings import WeightSyncSettings
from shared.weight_sync.wire import DTYPES, DeltaRound, ReplicaInfo

log = logging.getLogger(__name__)


@dataclass
class DeltaPlan:
    """A version's buckets against the base, in pieces (``pieces``: ``(bucket, start, end)``, at most
    ``piece_bytes`` each: :func:`shared.weight_sync.delta.pieces`), built one piece at a time while the round runs
    (:meth:`DeltaBase.build`: piece k+1's patch is made while piece k is on the wire and being patched, also within
    one bucket): a patch each, or None for a piece that goes whole."""

    version: int
    base_version: int
    patches: list[Patch | None]  # by piece
    full_bytes: int  # the version's bytes
    changed: int = 0  # units that differ from the base, pieces built so far
    units: int = 0
    whole_bytes: int = 0  # pieces sent whole (a patch would not have been smaller)
    built: list[bool] = field(default_factory=list)  # piece j's patch (or None: whole) is made
    pieces: list[tuple[int, int, int]] = field(default_factory=list)
    piece_bytes: int = 0
    sizes: dict[str, int] = field(default_factory=dict)  # position bytes by codec, summed over the patches
    chosen: dict[str, int] = field(default_factory=dict)  # how often each codec was chosen

    def sent(self, i: int) -> int:
        """What piece i's broadcast is (:class:`~shared.weight_sync.wire.DeltaRound`): -1 the whole piece, 0
        nothing (unchanged), n a patch of n bytes."""
        p = self.patches[i]
        return -1 if p is None else (len(p.data) if p.changed else 0)

    @property
    def payload(self) -> tuple[int, ...]:
        """Per piece what was broadcast (every piece built)."""
        return tuple(self.sent(i) for i in range(len(self.patches)))

    def record(self, done: bool = False) -> DeltaRound:
        """The round's :class:`DeltaRound`: announced without the payload (sizes go in band, before each bucket);
        ``done``: with it, once every bucket went (for ``fleetrl weights status``)."""
        return DeltaRound(base_version=self.base_version, piece_bytes=self.piece_bytes,
                          payload=self.payload if done else None)

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
    last_advance_s: float = 0.0  # how long the last advance of the base took (0: skipped; the benchmark reports it)
    chooser: RoundChooser = field(init=False)  # delta or full per round, from measured rounds (delta: auto)
    _said: bool = False

    def __post_init__(self) -> None:
        self.chooser = RoundChooser(self.settings.delta, self.settings.delta_probe_every)

    @property
    def on(self) -> bool:
        """Delta rounds may be made (``delta: auto`` or ``on``)."""
        return self.settings.delta != "off"

    def holdable(self, outbox: Any) -> bool:
        """Are the version's bytes held through the publish (so that a base can be kept and patches built)?"""
        if outbox.pooling and not outbox.send_in_place:
            if not self._said:
                self._said = True
                log.info("delta rounds need the version's bytes held through the publish (retain: copy, or "
                         "weights laid out in place); with retain: none every round is full and no base is kept")
            return False
        return True

    def why_not(self, outbox: Any) -> str | None:
        """Why no delta round can be built for the version the outbox holds (None: one can)."""
        m = outbox.manifest
        if not self.on:
            return "off"
        if m is None or not m.checksum:
            return "no checksums"
        if not self.holdable(outbox):
            return "retain none"
        if self.version == 0 or m.layout_id != self.layout_id:
            return "no base"
        if m.version - self.last_full >= self.settings.full_every:
            return "full_every"
        return None

    def choose(self, members: list[ReplicaInfo], outbox: Any) -> Choice:
        """Delta or full for a round of the held version to ``members``: what the setting says (``on``, ``off``) or
        the chooser picks from the timings of recent rounds (``auto``); a delta choice becomes full where no delta
        round can be made (``why_not``, a member not level: the reason says which). (Where ``auto`` chooses full,
        the base is not kept current, so the members are not level with it: the chooser's reason is the one given.)"""
        c = self.chooser
        choice = c.choose()
        if choice.kind != "delta":
            return choice
        why = self.why_not(outbox) or (None if self.eligible(members) else
                                       "not level" if members else "no member applies patches")
        return choice if why is None else Choice("full", why, choice.full_s, choice.delta_s)

    def start(self, outbox: Any) -> DeltaPlan | None:
        """An empty plan for the held version (its buckets are built during the round, :meth:`build`), or None
        when no delta round is possible."""
        if self.why_not(outbox) is not None:
            return None
        m = outbox.manifest
        ps = pieces([b.nbytes for b in m.buckets], PIECE_BYTES)
        n = len(ps)
        return DeltaPlan(version=m.version, base_version=self.version, patches=[None] * n, full_bytes=m.total_bytes,
                         built=[False] * n, pieces=ps, piece_bytes=PIECE_BYTES)

    def build(self, outbox: Any, plan: DeltaPlan, j: int) -> Patch | None:
        """Piece ``j`` of the held version against the base (its bucket packed first if needed): its patch, or None
        when it goes whole. Made once per plan (a retried round reuses it). Blocking: run it in a thread."""
        if plan.built[j]:
            return plan.patches[j]
        i, lo, hi = plan.pieces[j]
        b = outbox.manifest.buckets[i]
        new = outbox.pack(i)[lo:hi]
        unit = unit_size([DTYPES[e.dtype] for e in b.tensors], b.nbytes)  # (pieces start on 8-byte boundaries)
        base = self.buffers[i][lo:hi]
        if base.device != new.device:
            base = base.to(new.device)
        patch = make_patch(new, base, unit) if hi > lo else None
        plan.patches[j], plan.built[j] = patch, True
        n_units = (hi - lo) // unit
        plan.units += n_units
        if patch is None:
            plan.changed += n_units  # (an upper bound: sent whole)
            plan.whole_bytes += hi - lo
        else:
            plan.changed += patch.changed
            plan.chosen[patch.codec] = plan.chosen.get(patch.codec, 0) + 1
            for c, n in patch.sizes.items():
                plan.sizes[c] = plan.sizes.get(c, 0) + n
        self.last_codecs = {"sizes": plan.sizes, "chosen": plan.chosen}
        return patch

    def plan(self, outbox: Any) -> DeltaPlan | None:
        """:meth:`start`, then every bucket built and digested (blocking). None when no delta round is possible."""
        plan = self.start(outbox)
        if plan is not None:
            for j, (i, _, hi) in enumerate(plan.pieces):
                self.build(outbox, plan, j)
                if hi == outbox.manifest.buckets[i].nbytes:
                    outbox.digest(i)
        return plan

    def eligible(self, members: list[ReplicaInfo]) -> bool:
        """Are all ``members`` level with the base (a delta round can serve them)? Level is what this publisher saw
        each one load; the registry's ``weight_version`` only rules a member out when it is past the base (it took
        a newer version elsewhere, from a peer): one below it is the replica's advertisement lagging the round it
        reported (the registry is written after the round; a publish right after can read the old value, which
        sent a needless full round now and then). A replica that is not at the base after all refuses the patch
        itself (it checks ``base_version``) and gets the version whole in the same publish."""
        return bool(members) and all(
            i.delta and i.replica_id not in self.suspect and self.level.get(i.replica_id) == self.version
            and i.weight_version <= self.version for i in members)

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
        if not self.on or m is None or not m.checksum or not self.holdable(outbox):
            return
        everyone = bool(members) and set(members) <= set(loaded)
        if not sent_delta and everyone:
            self.last_full = m.version
        if not everyone:
            return  # someone missed it: the base stays; the next round is full
        if self.chooser.choose().kind != "delta":
            # auto, and full rounds keep winning: the next round is full whatever the base holds, so no copy now;
            # the round before a delta probe advances it (the choice changes only when a round is recorded, which
            # this publish already did). The members stay level with the version they loaded, not with the base:
            # a delta round needs both, so the base is advanced before the next delta round.
            self.last_advance_s = 0.0
            return
        self._advance(outbox, plan if sent_delta else None)

    def _advance(self, outbox: Any, plan: DeltaPlan | None) -> None:
        """The base becomes the held version: patches applied in place where a plan against the current base
        exists, whole buckets copied otherwise (from the outbox's bytes, still the version)."""
        import torch

        from shared.weight_sync.delta import apply_diff

        t0 = time.perf_counter()
        m = outbox.manifest
        same = plan is not None and plan.base_version == self.version and self.layout_id == m.layout_id and \
            len(self.buffers) == len(m.buckets)
        # a full round over the same layout copies into the buffers held (fresh ones would fault in their pages)
        keep = len(self.buffers) == len(m.buckets) and \
            all(buf.numel() == b.nbytes for buf, b in zip(self.buffers, m.buckets))
        if not keep:
            self.buffers = [None] * len(m.buckets)
        for i, b in enumerate(m.buckets):  # (a plan against the base has every buffer: same layout)
            src = outbox.pack(i)
            if self.buffers[i] is None or (not same and self.buffers[i].device != src.device):
                self.buffers[i] = torch.empty(b.nbytes, dtype=torch.uint8, device=src.device)
        assert plan is None or not same or len(plan.pieces) == len(plan.patches)
        ps = plan.pieces if same and plan is not None else [(i, 0, b.nbytes) for i, b in enumerate(m.buckets)]
        for j, (i, lo, hi) in enumerate(ps):
            patch = plan.patches[j] if same and plan is not None else None
            if patch is not None:
                if patch.changed:
                    apply_diff(self.buffers[i][lo:hi], patch)
                continue
            self.buffers[i][lo:hi].copy_(outbox.pack(i)[lo:hi])
        self.version, self.layout_id = m.version, m.layout_id
        self.last_advance_s = time.perf_counter() - t0

    def forget(self) -> None:
        """Drop the base (a failed publish: the held bytes may not be the version anyone has)."""
        self.buffers, self.version, self.layout_id = [], 0, ""
