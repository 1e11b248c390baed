"""hf engine: the sidecar receives the buckets itself and copies them into the model's own tensors.

Buckets are staged (received and checksummed while generation goes on), then generation is paused only
for the in-place copy, so a version is applied whole or not at all. The staging buffers (one copy of the
weights) are freed as soon as the copy is done.
"""

from __future__ import annotations

import asyncio
from typing import Any

from services.rollout.weights.sinks.base import RoundFailed, UpdateRefused, WeightSink
from shared.weight_sync.receiver import BucketReceiver
from shared.weight_sync.wire import Manifest, Member, Rendezvous


class HFSink(WeightSink):
    kind = "hf"

    def __init__(self, engine: Any, settings: Any) -> None:
        super().__init__(engine, settings)
        self._loader: Any = None
        self._receiver: BucketReceiver | None = None

    def _model(self) -> Any:
        model = getattr(self.engine, "model", None)
        if model is None:
            raise RoundFailed("the hf engine has no model loaded")
        return model

    def _loader_for(self) -> Any:
        from shared.weight_sync.tensors import InPlaceLoader

        if self._loader is None:
            self._loader = InPlaceLoader(self._model())
        return self._loader

    def _device(self) -> Any:
        return next(self._model().parameters()).device

    async def run_round(self, rdv: Rendezvous, member: Member, manifest: Manifest) -> None:
        loader = self._loader_for()
        try:
            loader.check(e for b in manifest.buckets for e in b.tensors)
        except (KeyError, ValueError) as exc:
            # still take part in the broadcast (the group needs every rank), then refuse
            await self._receive(rdv, member, manifest)
            raise UpdateRefused(str(exc)) from exc
        buffers = await self._receive(rdv, member, manifest)
        async with self.paused():
            await asyncio.to_thread(self._apply, manifest, buffers)
            self.engine.set_weight_version(manifest.version)
        del buffers

    async def _receive(self, rdv: Rendezvous, member: Member, manifest: Manifest) -> list[Any]:
        if self._receiver is None:
            device = self._device() if rdv.backend == "nccl" else "cpu"
            self._receiver = BucketReceiver(device=device, keep_staging=self.settings.keep_staging)
        return await asyncio.to_thread(self._receiver.receive, rdv, member, manifest)

    def _apply(self, manifest: Manifest, buffers: list[Any]) -> None:
        loader = self._loader_for()
        for b, buf in zip(manifest.buckets, buffers):
            for e in b.tensors:
                loader.copy_bytes(e, buf)

    async def load_snapshot(self, manifest: Manifest) -> None:
        from shared.weight_sync.snapshot import SnapshotError, read_snapshot

        if manifest.snapshot is None:
            raise UpdateRefused(f"version {manifest.version} has no snapshot")
        loader = self._loader_for()
        loader.check(e for b in manifest.buckets for e in b.tensors)

        def fetch() -> list[dict]:
            return list(read_snapshot(manifest.snapshot, self.settings.snapshot_timeout_s,
                                      self.settings.snapshot_prefer_url))

        try:
            files = await asyncio.to_thread(fetch)
        except SnapshotError as exc:
            raise UpdateRefused(str(exc)) from exc

        def apply() -> None:
            for tensors in files:
                for name, t in tensors.items():
                    loader.copy_tensor(name, t)

        async with self.paused():
            await asyncio.to_thread(apply)
            self.engine.set_weight_version(manifest.version)

    async def close(self) -> None:
        if self._receiver is not None:
            await asyncio.to_thread(self._receiver.close)
            self._receiver = None
