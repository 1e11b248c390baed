"""DeepSpeed ZeRO-2/3 (multi-GPU, optional Adam / parameter offload, bf16) from the same settings.

Experimental: never run. No test has trained through this module (DeepSpeed is not installed in the dev
environment, and the GPU check does not carry it); ``fsdp`` is the sharded backend that is tested.

``deepspeed`` is imported only when this backend is built; the process must be started by a
distributed launcher (``deepspeed`` / ``torchrun``) so ``deepspeed.init_distributed`` finds its rank.
Gradient accumulation is DeepSpeed's: ``backward`` runs ``engine.backward`` + ``engine.step`` per
micro-batch and DeepSpeed applies the update at each accumulation boundary, so every mini-batch
must hold the same number of micro-batches (``accumulation``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from services.learner.settings import DeepSpeedBackendSettings, OptimSettings
from services.learner.training.backends.base import TrainEngine, make_schedule


def deepspeed_config(backend: DeepSpeedBackendSettings, optim: OptimSettings, accumulation: int,
                     micro_batch_size: int = 1) -> dict:
    """The DeepSpeed JSON config equivalent of our settings."""
    zero: dict = {"stage": backend.zero_stage, "overlap_comm": True, "contiguous_gradients": True}
    if backend.adam_offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if backend.param_offload and backend.zero_stage == 3:
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    if backend.zero_stage == 3:
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    return {
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "gradient_accumulation_steps": accumulation,
        "gradient_clipping": optim.max_grad_norm or 0.0,
        "zero_optimization": zero,
        "bf16": {"enabled": backend.bf16},
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": 0.0, "betas": list(optim.betas), "eps": optim.eps, "weight_decay": optim.weight_decay},
        },
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
    }


class DeepSpeedEngine(TrainEngine):
    def __init__(self, backend: DeepSpeedBackendSettings, model: nn.Module, lr: float, optim: OptimSettings,
                 total_steps: int, accumulation: int) -> None:
        import deepspeed  # lazy: only this backend needs it

        deepspeed.init_distributed()
        config = deepspeed_config(backend, optim, accumulation)
        config["optimizer"]["params"]["lr"] = lr
        schedule = make_schedule(optim, total_steps)
        params = [p for p in model.parameters() if p.requires_grad]
        self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=model, model_parameters=params, config=config,
            lr_scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, schedule),
        )
        self.model = self.engine.module

    def backward(self, loss: torch.Tensor) -> None:
        # our losses are divided by global (all-rank) counts; DeepSpeed averages gradients over ranks
        self.engine.backward(loss * self.engine.dp_world_size, scale_wrt_gas=False)
        self.engine.step()

    def step(self) -> float:
        norm = self.engine.get_global_grad_norm()
        return float(norm) if norm is not None else 0.0

    def lr(self) -> float:
        return float(self.scheduler.get_last_lr()[0])

    @property
    def optimizer_steps(self) -> int:
        return int(self.engine.global_steps)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        if self.engine.zero_optimization_stage() == 3:
            return self.engine._zero3_consolidated_16bit_state_dict()
        return self.model.state_dict()

    @property
    def owns_parameter_memory(self) -> bool:
        return True

    @property
    def counts_micro_batches(self) -> bool:
        return True

    @property
    def shards_parameters(self) -> bool:
        return self.engine.zero_optimization_stage() == 3

    def gathered(self, fn: Callable[[], dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """ZeRO-3: every rank enters ``GatheredParameters`` (a collective all-gather); rank 0 copies the
        full weights to CPU inside it. ZeRO-2 keeps full parameters on every rank."""
        if self.engine.zero_optimization_stage() != 3:
            return fn()
        import deepspeed
        import torch.distributed as dist

        params = list(self.model.parameters())
        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            if dist.get_rank() != 0:
                return {}
            return {k: v.detach().to("cpu", copy=True) for k, v in fn().items()}

    def save_state(self, out_dir: Path) -> None:
        self.engine.save_checkpoint(str(out_dir), tag="ds", save_latest=False)

    def load_state(self, in_dir: Path) -> None:
        self.engine.load_checkpoint(str(in_dir), tag="ds", load_module_strict=False,
                                    load_optimizer_states=True, load_lr_scheduler_states=True)


def build_deepspeed_engine(backend: DeepSpeedBackendSettings, model: nn.Module, lr: float, optim: OptimSettings,
                           total_steps: int, accumulation: int, precision: object = None) -> TrainEngine:
    """``precision`` is DeepSpeed's own (``backend.bf16``)."""
    return DeepSpeedEngine(backend, model, lr, optim, total_steps, accumulation)
