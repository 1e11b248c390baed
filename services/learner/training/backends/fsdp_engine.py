"""torch FSDP2: ``fully_shard`` per decoder layer and at the root, AdamW over the shards.

Each of N ranks holds 1/N of every parameter (a ``DTensor`` sharded on dim 0), of its gradient and of its Adam
moments; a layer's full parameters exist only while it runs (all-gathered before its forward and again before
its backward, then freed). Gradients are reduce-scattered after each backward. Works on CPU over gloo and on
CUDA over nccl; on CUDA ``model.dtype: auto`` computes in bf16 and reduces gradients in fp32 over fp32 master
weights (``MixedPrecisionPolicy``).

Every forward and backward is a collective, so every rank runs the same passes (:mod:`..lockstep`); the trainer
pads a rank with fewer micro-batches with idle passes. FSDP averages gradients over ranks while our losses are
divided by global counts and the replicated backend sums gradients: ``backward`` scales the loss by N (gloo has
no pre-multiplied sum to do it inside the reduce-scatter).

The engine exposes ``model`` (the sharded module) and ``optimizer`` as they are, so that
``torch.distributed.checkpoint.state_dict.get_state_dict(engine.model, engine.optimizer)`` and
``set_state_dict`` work on them: checkpoints are DCP shards, every rank writing its own
(:mod:`services.learner.training.sharded_state`).
"""

from __future__ import annotations

import logging
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
)
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.tensor import DTensor

from services.learner.settings import FSDPBackendSettings, OptimSettings
from services.learner.training.backends.base import TrainEngine, make_schedule
from services.learner.training.precision import Precision

log = logging.getLogger(__name__)


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The modules that get an FSDP unit of their own: those of the classes Hugging Face names as never split
    across devices (``_no_split_modules``: the decoder layers), outermost first, none inside another."""
    names: set[str] = set()
    for m in model.modules():
        names.update(getattr(m, "_no_split_modules", None) or ())
    out: list[nn.Module] = []
    inside: set[int] = set()
    for m in model.modules():
        if id(m) in inside or type(m).__name__ not in names:
            continue
        out.append(m)
        inside.update(id(sub) for sub in m.modules())
    return out


def shard_module(model: nn.Module, backend: FSDPBackendSettings, precision: Precision | None) -> nn.Module:
    """``fully_shard`` each decoder layer, then the root (embeddings, final norm, head, tied weights), over
    every rank of the default group. Returns ``model`` (now an ``FSDPModule`` too)."""
    mp = MixedPrecisionPolicy()
    if precision is not None and precision.mixed:
        mp = MixedPrecisionPolicy(param_dtype=precision.compute, reduce_dtype=torch.float32)
    offload: OffloadPolicy = CPUOffloadPolicy() if backend.cpu_offload else OffloadPolicy()
    layers = decoder_layers(model)
    if not layers:
        log.warning("%s names no decoder layers (_no_split_modules): one FSDP unit for the whole model "
                    "(every forward gathers all parameters at once)", type(model).__name__)
    for layer in layers:
        fully_shard(layer, reshard_after_forward=backend.reshard_after_forward, mp_policy=mp, offload_policy=offload)
    fully_shard(model, reshard_after_forward=backend.reshard_after_forward, mp_policy=mp, offload_policy=offload)
    return model


def enable_activation_checkpointing(model: nn.Module) -> None:
    """Hugging Face's non-reentrant checkpointing of each decoder layer (the critic: of its inner model)."""
    inner: Any = getattr(model, "inner", model)  # duck-typed: the HF model (a critic's inner one) has the method
    if hasattr(inner, "gradient_checkpointing_enable") and not getattr(inner, "is_gradient_checkpointing", False):
        inner.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


class FSDPEngine(TrainEngine):
    def __init__(self, backend: FSDPBackendSettings, model: nn.Module, lr: float, optim: OptimSettings,
                 total_steps: int, precision: Precision | None = None) -> None:
        if not dist.is_initialized():
            raise RuntimeError("backend fsdp needs a process group (a launcher's RANK / WORLD_SIZE); one rank "
                               "without one: use backend torch")
        if backend.activation_checkpointing:
            enable_activation_checkpointing(model)
        self.model = shard_module(model, backend, precision)
        self.world = dist.get_world_size()
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError("the model has no trainable parameters")
        self.max_grad_norm = optim.max_grad_norm
        # torch picks the multi-tensor (foreach) AdamW for DTensors, even on CPU, where it picks the per-tensor loop
        # for plain tensors: foreach's temporaries span every parameter at once (on CPU ~2x the shards, more than
        # the activations of a step); keep the per-tensor loop on CPU, as the torch backend gets, foreach on CUDA
        on_cpu = _local(self.params[0]).device.type == "cpu"
        self.optimizer = torch.optim.AdamW(self.params, lr=lr, betas=optim.betas, eps=optim.eps,
                                           weight_decay=optim.weight_decay, foreach=False if on_cpu else None)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, make_schedule(optim, total_steps))
        self._steps = 0

    def backward(self, loss: torch.Tensor) -> None:
        (loss * self.world).backward()  # FSDP averages over ranks; our losses want the sum (see module doc)

    def step(self) -> float:
        """Clip by the norm over every rank's shards (a DTensor: its ``full_tensor`` all-reduces the squares)."""
        for p in self.params:  # a parameter no pass reached has no gradient: zeros, so every rank steps alike
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        if self.max_grad_norm is not None:
            norm = torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm, foreach=True)
        else:
            norm = torch.nn.utils.get_total_norm([p.grad for p in self.params], foreach=True)
        norm = norm.full_tensor() if isinstance(norm, DTensor) else norm
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
    def owns_parameter_memory(self) -> bool:
        return True  # FSDP lays out the shards and swaps the gathered parameters in and out itself

    @property
    def shards_parameters(self) -> bool:
        return True

    @property
    def dcp_checkpoints(self) -> bool:
        return True

    @property
    def lockstep(self) -> bool:
        return True

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The whole model on rank 0, in host memory (collective: every rank calls it; the others get ``{}``).
        Tied parameters (embeddings and head) come back as one tensor under both names, as in an unsharded
        model's state dict, so a save drops the tied copy the same way."""
        state = cast("dict[str, torch.Tensor]",  # full_state_dict: every value a plain tensor
                     get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)))
        first: dict[int, str] = {}
        for name, p in self.model.named_parameters(remove_duplicate=False):
            owner = first.setdefault(id(p), name)
            if owner != name and owner in state and name in state:
                state[name] = state[owner]
        return state

    def local_bytes(self) -> int:
        """Bytes of parameters, gradients and optimizer state this rank holds (its shards)."""
        seen: set[int] = set()
        total = 0
        tensors = [*self.params, *(p.grad for p in self.params if p.grad is not None)]
        tensors += [v for st in self.optimizer.state.values() for v in st.values() if isinstance(v, torch.Tensor)]
        for t in tensors:
            loc = _local(t)
            if loc.data_ptr() not in seen:
                seen.add(loc.data_ptr())
                total += loc.numel() * loc.element_size()
        return total


def build_fsdp_engine(backend: FSDPBackendSettings, model: nn.Module, lr: float, optim: OptimSettings,
                      total_steps: int, accumulation: int, precision: Precision | None = None) -> TrainEngine:
    return FSDPEngine(backend, model, lr, optim, total_steps, precision)


def shard_frozen(backend: FSDPBackendSettings, model: nn.Module, precision: Precision | None = None) -> nn.Module:
    """A forward-only model (the reference) sharded like the actor: each rank holds 1/N of it."""
    model.requires_grad_(False)
    return shard_module(model, backend, precision)
