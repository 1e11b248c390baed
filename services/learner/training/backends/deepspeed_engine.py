"""DeepSpeed ZeRO-2/3 from the same settings: on CPU (DeepSpeed's CPU accelerator, gloo, fp32) and, written for
but not yet run, on CUDA (bf16, Adam / parameter offload).

What has run (``tests/learner/training/test_deepspeed.py``, DeepSpeed 0.19.8, CPU): two ZeRO-3 ranks train what
one ``torch`` rank trains (loss, gradient norm, weights), publish the same bytes, checkpoint and resume. What has
not: CUDA, bf16, offload (docs/learner.md).

``deepspeed`` is imported only when this backend is built. The trainer's contract is the one every backend
keeps: :meth:`backward` per pass, :meth:`step` per update. DeepSpeed is told so with
``managed_gradient_accumulation: false`` (its ``step`` is the accumulation boundary, whatever number of passes
came before), so ranks may run different numbers of passes: the trainer pads them to the same count with idle
passes (:attr:`lockstep`), because ZeRO-3 gathers parameters in every forward and ZeRO-2/3 reduce-scatter
gradients in every backward. Forward passes must go through DeepSpeed's engine (:attr:`runner`): its
``forward`` starts the backward bookkeeping that ZeRO-3 accumulates gradients by.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from services.learner.settings import DeepSpeedBackendSettings, OptimSettings
from services.learner.training.backends.base import TrainEngine, make_schedule
from services.learner.training.precision import Precision


def deepspeed_config(backend: DeepSpeedBackendSettings, optim: OptimSettings, bf16: bool) -> dict:
    """The DeepSpeed JSON config equivalent of our settings (``lr`` is set by the engine)."""
    zero: dict = {"stage": backend.zero_stage, "overlap_comm": True, "contiguous_gradients": True}
    if backend.adam_offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if backend.param_offload and backend.zero_stage == 3:
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    return {
        # the caller owns the update boundary: backward() per pass, step() per update (see the module docstring)
        "managed_gradient_accumulation": False,
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": optim.max_grad_norm or 0.0,
        "zero_optimization": zero,
        "bf16": {"enabled": bf16},
        "optimizer": {
            "type": "AdamW",
            # torch's AdamW (the torch backend's) unless Adam states live on the CPU (DeepSpeedCPUAdam, a JIT op)
            "params": {"lr": 0.0, "betas": list(optim.betas), "eps": optim.eps, "weight_decay": optim.weight_decay,
                       "torch_adam": not backend.adam_offload},
        },
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
    }


def use_bf16(backend: DeepSpeedBackendSettings, precision: Precision | None, device: torch.device) -> bool:
    """``backend.bf16``, or (unset) whether the learner computes in bf16 (``model.dtype``: ``auto`` on CUDA,
    ``bfloat16``). On the CPU the backend trains in fp32: bf16 there has not run."""
    compute = (precision.compute or precision.storage) if precision is not None else torch.float32
    if precision is not None and precision.storage == torch.float16:
        raise ValueError("model.dtype float16 does not work with backend deepspeed: use bfloat16 or auto")
    bf16 = backend.bf16 if backend.bf16 is not None else compute == torch.bfloat16
    if device.type == "cpu":
        if bf16:
            raise ValueError("backend deepspeed on the CPU trains in float32: set model.dtype to float32 or auto "
                             "and leave backend.bf16 unset (bf16 with DeepSpeed has only been written for CUDA)")
        if backend.adam_offload or backend.param_offload:
            raise ValueError("backend.adam_offload / backend.param_offload move state from the GPU to the CPU; "
                             "this learner is on the CPU already (model.device cpu): leave them false")
    return bf16


def import_deepspeed(device: torch.device) -> Any:
    """``deepspeed`` with the accelerator of ``device``: the CPU one (gloo) for a CPU learner even where a GPU is
    present (DeepSpeed would pick CUDA by itself)."""
    if device.type == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # read on first use, before anything else asks
    import deepspeed  # lazy: only this backend needs it
    from deepspeed.accelerator import get_accelerator

    if get_accelerator().device_name() != device.type:
        raise RuntimeError(f"DeepSpeed's accelerator is {get_accelerator().device_name()!r} but model.device is "
                           f"{device.type!r}: set DS_ACCELERATOR={device.type} (or unset it)")
    return deepspeed


def join_process_group(device: torch.device) -> None:
    """Hand DeepSpeed the learner's process group (the launcher's ranks), or a one-rank group of its own on one
    rank (gloo on the CPU, nccl on CUDA).

    DeepSpeed's CPU accelerator JIT-compiles a shared-memory all-reduce (``deepspeed_shm_comm``: ~3 min of g++
    here, measured) when it wraps the group, for inference only (``inference_all_reduce``, and then only with
    ``LOCAL_SIZE`` set): training never calls it, so it is marked unavailable, as DeepSpeed itself marks it off
    Linux (``deepspeed.ops.__compatible_ops__`` is the module's cache of those answers, meant to be edited)."""
    import deepspeed
    import deepspeed.ops
    import torch.distributed as dist

    if not dist.is_initialized():  # one rank: no launcher group (collectives.active() stays False)
        dist.init_process_group("gloo" if device.type == "cpu" else "nccl", store=dist.HashStore(), rank=0,
                                world_size=1)
    if device.type == "cpu":
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend=dist.get_backend())


class DeepSpeedEngine(TrainEngine):
    def __init__(self, backend: DeepSpeedBackendSettings, model: nn.Module, lr: float, optim: OptimSettings,
                 total_steps: int, precision: Precision | None = None) -> None:
        device = next(model.parameters()).device
        bf16 = use_bf16(backend, precision, device)
        deepspeed = import_deepspeed(device)
        join_process_group(device)
        config = deepspeed_config(backend, optim, bf16)
        config["optimizer"]["params"]["lr"] = lr
        schedule = make_schedule(optim, total_steps)
        params = [p for p in model.parameters() if p.requires_grad]
        if not params:
            raise ValueError("the model has no trainable parameters")
        self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=model, model_parameters=params, config=config,
            lr_scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, schedule),
        )
        self.model = self.engine.module

    @property
    def runner(self) -> nn.Module:
        return self.engine

    def backward(self, loss: torch.Tensor) -> None:
        # our losses are divided by global (all-rank) counts; ZeRO averages gradients over ranks: undo the mean
        self.engine.backward(loss * self.engine.dp_world_size, scale_wrt_gas=False)

    def step(self) -> float:
        self.engine.step()  # the boundary: reduce what is left, clip, AdamW, the schedule, zero the gradients
        norm = self.engine.get_global_grad_norm()
        return float(norm) if norm is not None else 0.0

    def lr(self) -> float:
        return float(self.scheduler.get_last_lr()[0])

    @property
    def optimizer_steps(self) -> int:
        return int(self.engine.global_steps)

    @property
    def zero3(self) -> bool:
        return self.engine.zero_optimization_stage() == 3

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The whole model (ZeRO-3: gathered; collective, only rank 0's is complete, the others get ``{}``)."""
        return self.gathered(self.model.state_dict)

    @property
    def owns_parameter_memory(self) -> bool:
        return True

    @property
    def lockstep(self) -> bool:
        return True

    @property
    def shards_parameters(self) -> bool:
        return self.zero3

    def gathered(self, fn: Callable[[], dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """ZeRO-3: every rank enters ``GatheredParameters`` (a collective all-gather); rank 0 copies the full
        weights to host memory inside it, tied tensors (embeddings and head) once, as one tensor under both names
        as in an unsharded model's state dict. ZeRO-2 keeps full parameters on every rank."""
        if not self.zero3:
            return fn()
        import deepspeed
        import torch.distributed as dist

        with deepspeed.zero.GatheredParameters(list(self.model.parameters()), modifier_rank=None):
            if dist.get_rank() != 0:
                return {}
            copies: dict[tuple[int, torch.dtype, torch.Size], torch.Tensor] = {}
            out = {}
            for name, t in fn().items():
                key = (t.data_ptr(), t.dtype, t.shape)
                if key not in copies:
                    copies[key] = t.detach().to("cpu", copy=True)
                out[name] = copies[key]
            return out

    def save_state(self, out_dir: Path) -> None:
        """DeepSpeed's own files (collective: every rank writes its partitions of the optimizer state)."""
        self.engine.save_checkpoint(str(out_dir), tag="ds", save_latest=False)

    def load_state(self, in_dir: Path) -> None:
        path, _ = self.engine.load_checkpoint(str(in_dir), tag="ds", load_module_strict=False,
                                              load_optimizer_states=True, load_lr_scheduler_states=True)
        if path is None:
            raise FileNotFoundError(f"{in_dir}: no DeepSpeed checkpoint (tag ds) to resume from")


def build_deepspeed_engine(backend: DeepSpeedBackendSettings, model: nn.Module, lr: float, optim: OptimSettings,
                           total_steps: int, accumulation: int, precision: Precision | None = None) -> TrainEngine:
    """``accumulation`` is the trainer's business (:meth:`DeepSpeedEngine.step` is the boundary)."""
    return DeepSpeedEngine(backend, model, lr, optim, total_steps, precision)
