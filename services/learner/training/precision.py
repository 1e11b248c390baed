"""Which dtype the learner keeps its parameters in and which it computes in (``model.dtype``).

``auto`` is mixed precision on CUDA as users expect it: parameters (the optimizer's master copy) stay in
float32, forward and backward run in bfloat16, gradients are reduced in float32; on CPU everything is float32.
``float32`` / ``bfloat16`` / ``float16`` store and train the parameters in that dtype (no master copy).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

STORAGE_DTYPES = {"auto": torch.float32, "float32": torch.float32, "bfloat16": torch.bfloat16,
                  "float16": torch.float16}


@dataclass(frozen=True)
class Precision:
    storage: torch.dtype  # parameters as loaded and stepped by the optimizer
    compute: torch.dtype | None = None  # forward / backward dtype where it differs from storage (mixed precision)

    @property
    def mixed(self) -> bool:
        return self.compute is not None and self.compute != self.storage


def resolve_precision(dtype: str, device: torch.device) -> Precision:
    """``model.dtype`` on ``device``: ``auto`` is bf16-mixed on CUDA, fp32 elsewhere."""
    if dtype == "auto":
        return Precision(torch.float32, torch.bfloat16 if device.type == "cuda" else None)
    return Precision(STORAGE_DTYPES[dtype])


def autocast_forward(model: nn.Module, precision: Precision | None) -> nn.Module:
    """Run ``model``'s forward under ``torch.autocast`` in the compute dtype (the replicated ``torch`` backend's
    mixed precision; FSDP casts through its ``MixedPrecisionPolicy`` instead). Returns ``model``."""
    if precision is None or not precision.mixed:
        return model
    device = next(model.parameters()).device
    model.forward = torch.autocast(device.type, dtype=precision.compute)(model.forward)
    return model
