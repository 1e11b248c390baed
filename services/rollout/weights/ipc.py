"""The ``ipc`` transport, replica side (hf engine): open the learner's bucket handles on this GPU and copy the
bytes device to device into staging buffers, digesting each there (see ``services/learner/weights/ipc.py``)."""

from __future__ import annotations

from typing import Any

from services.rollout.weights.receiver import Received, StagingSets, UpdateRefused
from shared.weight_sync.cuda_ipc import IpcError, IpcOpener
from shared.weight_sync.digest import digest
from shared.weight_sync.wire import IpcRound, Manifest


class IpcReceiver(StagingSets):
    """Copies an :class:`IpcRound`'s buckets into staging buffers on ``device`` (the model's GPU), with the
    same spare-set handling as :class:`~services.rollout.weights.receiver.BucketReceiver`."""

    def __init__(self, device: Any, keep_staging: bool = True) -> None:
        super().__init__(device, keep_staging)
        self.opener = IpcOpener()

    def receive(self, rnd: IpcRound, manifest: Manifest) -> Received:
        """Open (once per allocation), copy and digest every bucket. Blocking: run it in a thread."""
        import torch

        sizes = [b.nbytes for b in manifest.buckets]
        if [h.nbytes for h in rnd.handles] != sizes:
            raise UpdateRefused(f"round {rnd.round}: its {len(rnd.handles)} handles do not match the manifest's "
                                f"{len(sizes)} buckets")
        try:
            sources = [self.opener.open(h) for h in rnd.handles]
        except IpcError as exc:
            raise UpdateRefused(str(exc)) from exc
        buffers = self.take(sizes)
        for dst, src in zip(buffers, sources):
            dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize(self.device)
        digests = [digest(buf, manifest.checksum) if manifest.checksum else None for buf in buffers]
        return Received(manifest, buffers, digests)

    def close(self) -> None:
        self._spare = None
        self.opener.clear()
