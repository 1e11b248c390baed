"""Plain torch: AdamW + LambdaLR, the whole model on every rank (CPU or one GPU each), gradients all-reduced.
Mixed precision (``model.dtype: auto`` on CUDA): fp32 parameters, forward under bf16 autocast."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from services.learner.settings import OptimSettings, TorchBackendSettings
from services.learner.training.backends.base import TrainEngine, make_schedule
from services.learner.training.collectives import all_reduce_grads
from services.learner.training.precision import Precision, autocast_forward


class TorchEngine(TrainEngine):
    def __init__(self, model: nn.Module, lr: float, optim: OptimSettings, total_steps: int,
                 precision: Precision | None = None) -> None:
        self.model = autocast_forward(model, precision)
        self.params = [p for p in model.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError("the model has no trainable parameters")
        self.max_grad_norm = optim.max_grad_norm
        self.optimizer = torch.optim.AdamW(self.params, lr=lr, betas=optim.betas, eps=optim.eps,
                                           weight_decay=optim.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, make_schedule(optim, total_steps))
        self._steps = 0

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self) -> float:
        all_reduce_grads(self.params)  # data parallel: sum over ranks (losses use global denominators)
        if self.max_grad_norm is not None:
            norm = torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm)
        else:
            norm = torch.linalg.vector_norm(
                torch.stack([p.grad.detach().norm() for p in self.params if p.grad is not None])
            )
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._steps += 1
        return float(norm)

    def lr(self) -> float:
        return float(self.scheduler.get_last_lr()[0])

    @property
    def optimizer_steps(self) -> int:
        return self._steps

    def set_optimizer_steps(self, steps: int) -> None:
        self._steps = int(steps)

    @property
    def dcp_checkpoints(self) -> bool:
        return True

    def save_state(self, out_dir: Path) -> None:
        """The full-state layout checkpoints had before DCP shards (kept to read and test older ones)."""
        out_dir.mkdir(parents=True, exist_ok=True)
        torch.save({"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                    "steps": self._steps}, out_dir / "optimizer.pt")

    def load_state(self, in_dir: Path) -> None:
        # weights_only: plain tensors and containers from our own checkpoint directory, nothing else
        state = torch.load(in_dir / "optimizer.pt", map_location="cpu", weights_only=True)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self._steps = int(state["steps"])


def build_torch_engine(backend: TorchBackendSettings, model: nn.Module, lr: float, optim: OptimSettings,
                       total_steps: int, accumulation: int, precision: Precision | None = None) -> TrainEngine:
    return TorchEngine(model, lr, optim, total_steps, precision)


def prepare_frozen(backend: TorchBackendSettings, model: nn.Module, precision: Precision | None = None) -> nn.Module:
    """A forward-only model as it is (whole on this rank), under the same autocast as the engine's."""
    return autocast_forward(model, precision)
