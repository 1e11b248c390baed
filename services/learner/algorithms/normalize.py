"""Running reward statistics (OpenRLHF ``--normalize_reward``) that survive checkpoints."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class RunningMeanStd:
    """Mean and variance of every value seen so far (Chan et al. parallel update)."""

    mean: float = 0.0
    var: float = 1.0
    count: float = 0.0

    def update(self, x: torch.Tensor) -> None:
        x = x.detach().double().flatten()
        n = float(x.numel())
        if n == 0:
            return
        b_mean = float(x.mean())
        b_var = float(x.var(unbiased=False))
        if self.count == 0:
            self.mean, self.var, self.count = b_mean, b_var, n
            return
        total = self.count + n
        delta = b_mean - self.mean
        m2 = self.var * self.count + b_var * n + delta**2 * self.count * n / total
        self.mean = self.mean + delta * n / total
        self.var = m2 / total
        self.count = total

    @property
    def std(self) -> float:
        return self.var**0.5

    def normalize(self, x: torch.Tensor, eps: float = 1e-8, clip: float | None = None) -> torch.Tensor:
        """``(x - mean) / sqrt(var + eps)``, optionally clipped to ``[-clip, clip]``."""
        out = (x - self.mean) / (self.var + eps) ** 0.5
        return out.clamp(-clip, clip) if clip is not None else out

    def state_dict(self) -> dict[str, float]:
        return {"mean": self.mean, "var": self.var, "count": self.count}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.mean, self.var, self.count = float(state["mean"]), float(state["var"]), float(state["count"])
