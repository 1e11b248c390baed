"""CUDA IPC for the ``ipc`` transport: share a GPU buffer with another process on the same GPU as plain data
(:class:`~shared.weight_sync.wire.IpcHandle`), and open such a handle there. This is what
``torch.multiprocessing`` does for CUDA tensors (``reduce_tensor`` / ``rebuild_cuda_tensor``), without its
pickling: the handle's fields travel as validated JSON in Redis, and the receiver checks the GPU's UUID
before it opens anything.

Both sides keep what they made: the publisher shares each storage once (sharing it again would register it
again) and the replica opens each allocation once per process (CUDA maps one allocation once), so a replica
that takes every version from the same learner buffers pays the mapping once. torch is imported inside the
functions, so that ``shared`` stays importable without it.
"""

from __future__ import annotations

import base64
from typing import Any

from shared.weight_sync.wire import IpcHandle


class IpcError(RuntimeError):
    """A handle cannot be opened here (another GPU, CUDA refused it)."""


def device_uuid(device: Any) -> str:
    """The UUID of a CUDA device (what both processes agree on, whatever their CUDA_VISIBLE_DEVICES)."""
    import torch

    return str(torch.cuda.get_device_properties(torch.device(device)).uuid)


def _b64(raw: bytes | None) -> str:
    return base64.b64encode(raw or b"").decode()


class IpcExporter:
    """The publisher's side: :meth:`export` a CUDA buffer (a view into some storage) as an :class:`IpcHandle`,
    sharing each storage once."""

    def __init__(self) -> None:
        self._shared: dict[tuple[int, int], tuple[Any, tuple]] = {}  # (data_ptr, nbytes) -> (storage, fields)
        self._uuids: dict[int, str] = {}

    def export(self, buf: Any) -> IpcHandle:
        """An :class:`IpcHandle` for ``buf`` (a flat uint8 CUDA tensor)."""
        if buf.device.type != "cuda":
            raise IpcError(f"only CUDA memory can be shared by IPC, not {buf.device}")
        storage = buf.untyped_storage()
        key = (storage.data_ptr(), storage.nbytes())
        held = self._shared.get(key)
        if held is None:
            held = self._shared[key] = (storage, storage._share_cuda_())
        _, (device, handle, size, offset, ref_handle, ref_offset, event_handle, event_sync) = held
        index = buf.device.index if buf.device.index is not None else int(device)
        if index not in self._uuids:
            self._uuids[index] = device_uuid(buf.device)
        return IpcHandle(device_uuid=self._uuids[index], handle=_b64(handle), storage_nbytes=int(size),
                         storage_offset=int(offset), ref_counter_handle=_b64(ref_handle),
                         ref_counter_offset=int(ref_offset), event_handle=_b64(event_handle),
                         event_sync_required=bool(event_sync), offset=buf.storage_offset() * buf.element_size(),
                         nbytes=buf.numel() * buf.element_size())

    def clear(self) -> None:
        self._shared.clear()


class IpcOpener:
    """The replica's side: :meth:`open` an :class:`IpcHandle` as a flat uint8 tensor on this process's view of
    the same GPU (refused, with the reason, when that GPU is not visible here)."""

    def __init__(self) -> None:
        self._opened: dict[tuple[str, int], Any] = {}  # (handle, storage offset) -> storage
        self._index_of: dict[str, int] | None = None

    def local_index(self, uuid: str) -> int:
        import torch

        if self._index_of is None:
            self._index_of = {device_uuid(i): i for i in range(torch.cuda.device_count())}
        index = self._index_of.get(uuid)
        if index is None:
            raise IpcError(f"the publisher's GPU {uuid} is not visible to this replica (visible: "
                           f"{sorted(self._index_of) or 'none'}): weights transport ipc needs the replica on the "
                           "learner's GPU; use collective (nccl) for another GPU")
        return index

    def open(self, h: IpcHandle) -> Any:
        import torch

        index = self.local_index(h.device_uuid)
        key = (h.handle, h.storage_offset)
        storage = self._opened.get(key)
        if storage is None:
            torch.cuda.init()
            try:
                storage = torch.UntypedStorage._new_shared_cuda(
                    index, base64.b64decode(h.handle), h.storage_nbytes, h.storage_offset,
                    base64.b64decode(h.ref_counter_handle), h.ref_counter_offset,
                    base64.b64decode(h.event_handle) if h.event_handle else None, h.event_sync_required)
            except RuntimeError as exc:
                raise IpcError(f"opening a CUDA IPC handle on GPU {index} failed: {exc}") from exc
            self._opened[key] = storage
        if h.offset + h.nbytes > storage.nbytes():
            raise IpcError(f"bucket bytes {h.offset}..{h.offset + h.nbytes} lie outside the shared storage "
                           f"({storage.nbytes()} bytes)")
        flat = torch.empty(0, dtype=torch.uint8, device=torch.device("cuda", index))
        flat.set_(storage, 0, (storage.nbytes(),), (1,))
        return flat[h.offset:h.offset + h.nbytes]

    def clear(self) -> None:
        self._opened.clear()
