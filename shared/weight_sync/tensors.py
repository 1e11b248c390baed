"""The tensor helpers both sides of the protocol use: the names dtypes go by on the wire (``Manifest``
entries, :data:`shared.weight_sync.wire.DTYPES`) and flat staging buffers.

torch is imported inside the functions, so that ``shared`` stays importable without it. The publisher's
packing lives in ``services/learner/weights/packing.py``; the replica's unpacking and in-place loading in
``services/rollout/weights/loader.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

#: torch dtype -> its wire name, filled on first use of each dtype (readers may look a dtype up here first)
DTYPE_NAMES: dict[Any, str] = {}


def dtype_name(dtype: torch.dtype) -> str:
    """The wire name of a torch dtype (its attribute name in ``torch``: ``bfloat16``, ``int64``, ...)."""
    name = DTYPE_NAMES.get(dtype)
    if name is None:
        name = DTYPE_NAMES[dtype] = str(dtype).removeprefix("torch.")
    return name


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype a wire name stands for."""
    import torch

    dt = getattr(torch, name, None)
    if isinstance(dt, torch.dtype):
        return dt
    raise ValueError(f"unknown dtype {name!r}")


def staging_buffers(sizes: Sequence[int], device: Any = "cpu", pin: bool = False) -> list[torch.Tensor]:
    """Flat uint8 buffers of these sizes, their pages touched now (a fresh page costs more to fault in
    during a transfer than the copy itself; kept buffers pay it once). ``pin``: page-locked host memory
    where CUDA is present, so copies between it and a GPU run at full speed and asynchronously."""
    import torch

    pin = pin and str(device) == "cpu" and torch.cuda.is_available()
    out = []
    for n in sizes:
        buf = torch.empty(n, dtype=torch.uint8, device=device, pin_memory=pin)
        buf.zero_()
        out.append(buf)
    return out
