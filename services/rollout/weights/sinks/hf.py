"""hf engine: the sidecar receives the buckets itself and copies them into the model's own tensors.

Buckets are staged (received and digested while generation goes on, each bucket while the next is on
the wire) and verified against the publisher's checksums; then generation is paused only for the switch,
so a version is applied whole or not at all. The switch (``apply_mode``):

- ``swap`` (default): the model's tensors are re-pointed at the verified staging buffers (no copy, ~1 us
  per tensor); the set they used before becomes the next staging set. Two flat sets alternate.
- ``copy``: one batched copy into the model's own storage; the staging set is reused.

Either way the memory cost is one flat copy of the weights beside the model (``keep_staging``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from services.rollout.weights.receiver import (
    AbandonWatch,
    BucketReceiver,
    Received,
    RoundAbandoned,
    RoundWatcher,
)
from services.rollout.weights.sinks.base import RoundFailed, UpdateRefused, WeightSink
from shared.weight_sync.phases import PhaseClock
from shared.weight_sync.wire import IpcRound, Manifest, Member, Rendezvous

if TYPE_CHECKING:
    from services.rollout.weights.ipc import IpcReceiver

log = logging.getLogger(__name__)


class HFSink(WeightSink):
    """The hf engine's sink (``HFEngine.weight_sink``): receive, verify, swap or copy in (module docstring)."""

    accepts_delta = True  # it holds the bytes it receives: delta rounds are patched here and checked by digest
    adapters_by_default = True  # adapter rounds: applied to its own base weights (services/rollout/weights/adapters.py)

    def __init__(self, engine: Any, settings: Any) -> None:
        super().__init__(engine, settings)
        self._adapters: Any = None  # ModuleAdapters while the model serves base + an adapter
        self._pristine = True  # the model still holds the base it loaded (no full, delta or snapshot version since)
        #: since a LoRA learner's merged full round: the base weights of the modules it merged (copies); every other
        #: tensor the model holds is the base (adapter rounds can resume: apply_adapter)
        self._kept: dict[str, Any] | None = None
        self._loader: Any = None
        self._receiver: BucketReceiver | IpcReceiver | None = None
        self._live: tuple[list, list] | None = None  # (layout, buffers) the model's tensors point into (swap)
        self._prefault: asyncio.Future | None = None
        self._switch = asyncio.Lock()  # every change of the model's weights, paused or between steps, one at a time
        self._merges: set[asyncio.Task] = set()  # adapter merges under way in the background (merge: apply_adapter)
        #: the last adapter version whose merge was swapped in, and the merge's seconds (merge: apply_adapter)
        self.adapter_merged: tuple[int, float] | None = None

    @contextlib.asynccontextmanager
    async def _switching(self) -> AsyncIterator[None]:
        """Generation paused, and no other change of the weights under way (a background merge's swap)."""
        async with self._switch, self.paused():
            yield

    def _model(self) -> Any:
        model = getattr(self.engine, "model", None)
        if model is None:
            raise RoundFailed("the hf engine has no model loaded")
        return model

    def _loader_for(self) -> Any:
        from services.rollout.weights.loader import InPlaceLoader

        if self._loader is None:
            self._loader = InPlaceLoader(self._model())
        return self._loader

    def _device(self) -> Any:
        return next(self._model().parameters()).device

    async def run_round(self, rdv: Rendezvous, member: Member, manifest: Manifest, watcher: RoundWatcher) -> None:
        clock = PhaseClock()
        self.phases = clock.phases
        loader = self._loader_for()
        if not isinstance(self._receiver, BucketReceiver):  # as run_ipc: a sink that took ipc rounds before
            if self._receiver is not None:
                await asyncio.to_thread(self._receiver.close)
            device = self._device() if rdv.backend == "nccl" else "cpu"
            self._receiver = BucketReceiver(device=device, keep_staging=self.settings.keep_staging,
                                            bind_addr=self.settings.bind_addr)
        receiver = self._receiver
        if self._prefault is not None:
            await asyncio.gather(self._prefault, return_exceptions=True)
            self._prefault = None
        # the group needs every rank: start receiving first, check names and shapes while bytes arrive; a round the
        # publisher abandons (a member died or hung) is left at once (AbandonWatch), not after the collective timeout
        self._check_wire_dtypes(manifest)
        if manifest.adapter is not None:
            await self._run_adapter(rdv, member, manifest, watcher, receiver, clock)
            return
        if rdv.delta is not None:
            await self._run_delta(rdv, member, manifest, watcher, receiver, clock)
            return
        async with AbandonWatch(watcher.redis, watcher.run, rdv.round) as watch:
            receiving = asyncio.ensure_future(asyncio.to_thread(receiver.receive, rdv, member, manifest, watch.flag))
            try:
                try:
                    loader.check_buckets(manifest.buckets)
                except (KeyError, ValueError) as exc:
                    await watch.outlast(receiving)
                    raise UpdateRefused(str(exc)) from exc
                got: Received = await watch.outlast(receiving)
            except RoundAbandoned:
                if not receiving.done():  # its thread still runs (and closes its group on the way out): not ours now
                    self._receiver = None
                raise
        clock.lap("receive")
        await self._install(got, manifest, watcher, rdv, receiver, clock)

    async def _run_adapter(self, rdv: Rendezvous, member: Member, manifest: Manifest, watcher: RoundWatcher,
                           receiver: BucketReceiver, clock: PhaseClock) -> None:
        """An adapter round: receive the adapter's buckets, verify them, and make the model base + this adapter
        (``adapter_apply``). The base is the weights the engine loaded; a replica whose model a full round has
        replaced since (and that holds no base copy) cannot, refuses, and stops advertising adapters (said once):
        it gets merged full rounds from then on. A LoRA learner's merged full rounds (a mixed fleet) keep the base
        (:meth:`_replacing`): adapter rounds resume after them."""
        async with AbandonWatch(watcher.redis, watcher.run, rdv.round) as watch:
            receiving = asyncio.ensure_future(asyncio.to_thread(receiver.receive, rdv, member, manifest, watch.flag))
            try:
                got: Received = await watch.outlast(receiving)
            except RoundAbandoned:
                if not receiving.done():
                    self._receiver = None
                raise
        clock.lap("receive")
        try:
            got.verify(await watcher.checksums(rdv, manifest), required=self.settings.require_checksums)
            tensors = adapter_tensors(manifest, got.buffers)
        finally:
            receiver.recycle(got.buffers)
        clock.lap("verify")
        await self.apply_adapter(manifest, tensors)
        clock.lap("apply")

    async def apply_adapter(self, manifest: Manifest, tensors: dict) -> None:
        """Make the model base + ``manifest``'s adapter (verified ``tensors``, by wire name), paused. ``merge``: the
        version is served at once with the adapter hooked on (ModuleAdapters.stage, microseconds a module), and merged
        in the background; the merged weights are swapped in for the hooks between two decode steps
        (:meth:`_merge_in`). The round confirms once the version is served, not once it is merged."""
        from services.rollout.weights.adapters import ModuleAdapters

        info = manifest.adapter
        assert info is not None
        if self._adapters is None and not self._pristine and self._kept is None:
            raise self._no_base_for(manifest.version, "this replica's model")
        adapters = self._adapters or ModuleAdapters(self._model(), self.settings.adapter_apply, base=self._kept)
        try:
            adapters.check(info, tensors)
        except (KeyError, ValueError) as exc:
            raise UpdateRefused(str(exc)) from exc
        merge = adapters.mode == "merge"
        if merge and any(m.name not in adapters.base for m in info.modules):
            await asyncio.to_thread(adapters.prepare, info)  # copies of base weights, before pausing (the first round)
        async with self._switching():
            if merge:
                ticket = adapters.stage(info, tensors)
                self._loader_for().forget_views()
            else:
                await asyncio.to_thread(adapters.apply, info, tensors)
            self._adapters, self._kept = adapters, None
            self.engine.set_weight_version(manifest.version)
        if merge:
            task = asyncio.ensure_future(self._merge_in(adapters, ticket, manifest.version))
            self._merges.add(task)
            task.add_done_callback(self._merges.discard)

    async def _merge_in(self, adapters: Any, ticket: int, version: int) -> None:
        """Merge a staged adapter version off the event loop and beside generation, then swap the merged weights in
        for its hooks where no forward runs (the engine's ``between_steps``; else paused). A later adapter round, a
        full round or ``clear`` supersedes it: the merge stops, the swap does nothing. On failure the version is
        still served, unmerged."""
        try:
            if not await asyncio.to_thread(adapters.merge, ticket):
                return
            async with self._switch:
                between = getattr(self.engine, "between_steps", None)
                if between is not None:
                    swapped = await between(lambda: adapters.swap(ticket))
                else:
                    async with self.paused():
                        swapped = adapters.swap(ticket)
                if swapped:
                    self._loader_for().forget_views()
                    self.adapter_merged = (version, adapters.merge_seconds)
        except Exception:
            log.exception("merging adapter version %d failed: it is served unmerged", version)

    async def settled(self) -> None:
        """Wait for the adapter merges under way (each swapped in, or superseded)."""
        while self._merges:
            await asyncio.gather(*list(self._merges), return_exceptions=True)

    def _replacing(self, manifest: Manifest | None = None) -> None:
        """A whole version (full, delta, snapshot, peer) is about to replace the weights: no base any more, unless
        it is a LoRA learner's merged round (``manifest.merged_adapter``: the base with an adapter merged into the
        modules it names) and this model still knows its base: the base weights of those modules are kept (copies)
        so that adapter rounds can resume once the fleet takes them again."""
        info = manifest.merged_adapter if manifest is not None else None
        kept = self._base_of([m.name for m in info.modules]) if info is not None else None
        self._pristine = False
        if self._adapters is not None:
            self._adapters.clear()
            self._adapters = None
        self._kept = kept

    def _base_of(self, names: list[str]) -> dict[str, Any] | None:
        """This model's base weight of each named module (copies, or the copies already held), or None when the
        model no longer holds its base (a full round that was not a merged one replaced it)."""
        held: dict[str, Any]
        if self._adapters is not None:
            held = self._adapters.base  # merge: the adapted modules' base copies (unmerged: none, weights are base)
        elif self._kept is not None:
            held = self._kept  # the modules a merged round merged; every other weight is the base
        elif self._pristine:
            held = {}
        else:
            return None
        import torch

        model, out = self._model(), {}
        for name in names:
            if name in held:
                live = getattr(model.get_submodule(name), "weight", None)
                # merge: a module served hooked has its base copy as its weight, which the round will overwrite
                aliased = isinstance(live, torch.Tensor) and live.data_ptr() == held[name].data_ptr()
                out[name] = held[name].clone() if aliased else held[name]
                continue
            try:
                weight = model.get_submodule(name).weight
            except AttributeError:
                return None
            if not isinstance(weight, torch.Tensor):
                return None
            out[name] = weight.detach().clone()
        return out

    def _check_wire_dtypes(self, manifest: Manifest) -> None:
        """Delta rounds patch the wire bytes this replica holds: a model kept in another dtype than the wire's (fp32
        published into a bf16 engine) cannot give them back, so it stops advertising delta (said once); the
        publisher then sends it every bucket whole."""
        if not self.accepts_delta:
            return
        from shared.weight_sync.tensors import dtype_name

        targets = self._loader_for().targets
        odd = next((e for b in manifest.buckets for e in b.tensors
                    if e.name in targets and dtype_name(targets[e.name].dtype) != e.dtype), None)
        if odd is not None:
            self.accepts_delta = False
            log.warning("the model holds %s as %s, the learner publishes %s: this replica takes every round whole "
                        "(no delta rounds)", odd.name, dtype_name(targets[odd.name].dtype), odd.dtype)

    async def _run_delta(self, rdv: Rendezvous, member: Member, manifest: Manifest, watcher: RoundWatcher,
                         receiver: BucketReceiver, clock: PhaseClock) -> None:
        """A delta round: each bucket rebuilt as it arrives (the bytes the model holds plus its patch, applied
        while the publisher builds the next patch), digested, and switched to as a full round is. Anything that
        does not give the version's exact bytes (not at the base version, a patch that does not fit, a digest
        that differs) is refused: the publisher then sends the version whole."""
        loader = self._loader_for()
        d = rdv.delta
        assert d is not None
        why = None  # decided before the first byte: this replica still receives everything, and refuses after
        if self.engine.weight_version != d.base_version:
            why = (f"delta round against version {d.base_version}, this replica holds {self.engine.weight_version}: "
                   "needs the version whole")
        elif not manifest.checksum:
            why = "a delta round without checksums cannot be checked"
        else:
            try:
                loader.check_buckets(manifest.buckets)
            except (KeyError, ValueError) as exc:
                why = str(exc)
        rebuild = None if why else _Rebuild(loader.targets, manifest)
        async with AbandonWatch(watcher.redis, watcher.run, rdv.round) as watch:
            receiving = asyncio.ensure_future(
                asyncio.to_thread(receiver.receive_delta, rdv, member, manifest, rebuild, watch.flag))
            try:
                got: Received = await watch.outlast(receiving)  # every broadcast, even when refusing: the group needs us
            except RoundAbandoned:
                if not receiving.done():
                    self._receiver = None
                raise
        clock.lap("receive")
        if why or rebuild is None:
            raise UpdateRefused(why or "")
        self.phases["patch"] = round(rebuild.seconds, 6)  # (inside receive: each patch while the next travels)
        await self._install(got, manifest, watcher, rdv, receiver, clock)

    async def run_ipc(self, rnd: IpcRound, manifest: Manifest, watcher: RoundWatcher) -> None:
        """Copy the learner's buckets (CUDA IPC handles, same GPU) into staging buffers on the model's device,
        digest them there, then switch as a collective round does."""
        from services.rollout.weights.ipc import IpcReceiver

        clock = PhaseClock()
        self.phases = clock.phases
        loader = self._loader_for()
        if not isinstance(self._receiver, IpcReceiver):
            if self._receiver is not None:
                await asyncio.to_thread(self._receiver.close)
            self._receiver = IpcReceiver(self._device(), keep_staging=self.settings.keep_staging)
        receiver = self._receiver
        if self._prefault is not None:
            await asyncio.gather(self._prefault, return_exceptions=True)
            self._prefault = None
        try:
            loader.check_buckets(manifest.buckets)
        except (KeyError, ValueError) as exc:
            raise UpdateRefused(str(exc)) from exc
        got: Received = await asyncio.to_thread(receiver.receive, rnd, manifest)
        clock.lap("receive")
        await watcher.copied(rnd)  # the learner may move its weights on: verify and switch from our copy
        await self._install(got, manifest, watcher, rnd, receiver, clock)

    async def _install(self, got: Received, manifest: Manifest, watcher: RoundWatcher, rdv: Any, receiver: Any,
                       clock: PhaseClock) -> None:
        """Verify a received version against the publisher's digests, then switch the model to it (paused)."""
        try:
            got.verify(await watcher.checksums(rdv, manifest), required=self.settings.require_checksums)
        except BaseException:
            receiver.recycle(got.buffers)
            raise
        clock.lap("verify")
        loader = self._loader_for()
        layout = [b.tensors for b in manifest.buckets]
        swap = self.settings.apply_mode == "swap"
        async with self._switching():
            self._replacing(manifest)
            if swap:
                swap = await asyncio.to_thread(loader.adopt, manifest.buckets, got.buffers)
            else:
                await asyncio.to_thread(loader.apply, manifest.buckets, got.buffers)
            self.engine.set_weight_version(manifest.version)
        clock.lap("apply")
        if not swap:
            receiver.recycle(got.buffers)
            return
        old, self._live = self._live, (layout, got.buffers)
        if old is not None and old[0] == layout:
            receiver.recycle(old[1])  # every tensor moved off it
        else:  # the model's first flat set: touch the pages of the next staging set now, off the update path
            self._prefault = asyncio.ensure_future(
                asyncio.to_thread(receiver.ensure_spare, [b.nbytes for b in manifest.buckets]))

    async def load_snapshot(self, manifest: Manifest) -> None:
        from services.rollout.weights.snapshot import SnapshotError, read_snapshot

        if manifest.snapshot is None:
            raise UpdateRefused(f"version {manifest.version} has no snapshot")
        if manifest.adapter is not None:
            raise UpdateRefused(f"version {manifest.version} is an adapter round: snapshot replicas get merged ones")
        snapshot = manifest.snapshot
        loader = self._loader_for()
        loader.check(e for b in manifest.buckets for e in b.tensors)

        def fetch() -> list[dict]:
            return list(read_snapshot(snapshot, self.settings.snapshot_timeout_s,
                                      self.settings.snapshot_prefer_url, self.settings.snapshot_trusted_urls,
                                      self.settings.snapshot_root))

        try:
            files = await asyncio.to_thread(fetch)
        except SnapshotError as exc:
            raise UpdateRefused(str(exc)) from exc

        def apply() -> None:
            for tensors in files:
                for name, t in tensors.items():
                    loader.copy_tensor(name, t)

        async with self._switching():
            self._replacing(manifest)
            await asyncio.to_thread(apply)
            self.engine.set_weight_version(manifest.version)

    def peer_bucket(self, bucket: Any) -> bytes:
        """Bytes of ``bucket`` as the model holds them now, for a joining peer (``services/rollout/weights/peer.py``)."""
        from services.rollout.weights.peer import bucket_bytes

        held = self._adapters.tensors if self._adapters is not None else {}
        if bucket.tensors and bucket.tensors[0].name in held:  # an adapter version: the adapter applied now
            return bucket_bytes(held, bucket)
        return bucket_bytes(self._loader_for().targets, bucket)

    async def load_buckets(self, manifest: Manifest, buffers: list) -> None:
        """Load a whole version whose buckets were fetched from a peer and verified: copied in, paused (an
        adapter version: applied to the base)."""
        if manifest.adapter is not None:
            await self.apply_adapter(manifest, adapter_tensors(manifest, buffers))
            return
        loader = self._loader_for()
        try:
            loader.check_buckets(manifest.buckets)
        except (KeyError, ValueError) as exc:
            raise UpdateRefused(str(exc)) from exc
        async with self._switching():
            self._replacing(manifest)
            await asyncio.to_thread(loader.apply, manifest.buckets, buffers)
            self.engine.set_weight_version(manifest.version)

    async def close(self) -> None:
        for task in list(self._merges):
            task.cancel()
        await asyncio.gather(*list(self._merges), return_exceptions=True)
        if self._prefault is not None:
            await asyncio.gather(self._prefault, return_exceptions=True)
            self._prefault = None
        if self._receiver is not None:
            await asyncio.to_thread(self._receiver.close)
            self._receiver = None


def adapter_tensors(manifest: Manifest, buffers: list) -> dict:
    """An adapter round's tensors out of its received buckets, by wire name (copies: the buffers are reused), after
    checking that they are exactly the ones ``manifest.adapter`` names."""
    from services.rollout.weights.loader import unpack

    if manifest.adapter is None:
        raise UpdateRefused(f"version {manifest.version} is not an adapter round")
    tensors = {name: t.clone() for b, buf in zip(manifest.buckets, buffers) for name, t in unpack(b, buf)}
    want = manifest.adapter.tensor_names()
    if sorted(tensors) != sorted(want) or len(tensors) != len(want):
        raise UpdateRefused(f"version {manifest.version}: the adapter round's tensors are not lora_A / lora_B of "
                            "the modules it names")
    return tensors


class _Rebuild:
    """A delta round's buckets rebuilt on this replica (:class:`~services.rollout.weights.receiver.DeltaRebuild`):
    the bytes the model holds now, then the patch applied to them. Blocking (the receiving thread)."""

    def __init__(self, targets: dict[str, Any], manifest: Manifest) -> None:
        self.targets, self.manifest = targets, manifest
        self.seconds = 0.0  # spent rebuilding (the ``patch`` phase)

    def current(self, i: int, out: Any) -> None:
        from services.rollout.weights.loader import read_bucket

        t0 = time.perf_counter()
        read_bucket(self.targets, self.manifest.buckets[i], out)
        self.seconds += time.perf_counter() - t0

    def patch(self, i: int, buf: Any, patch: Any) -> None:
        from shared.weight_sync.delta import PatchError, apply_patch

        t0 = time.perf_counter()
        try:
            apply_patch(buf, patch)  # (decoded on the host: a GPU patch is copied down first)
        except PatchError as exc:
            raise UpdateRefused(f"bucket {i}: {exc}") from exc
        finally:
            self.seconds += time.perf_counter() - t0
