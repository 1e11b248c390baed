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
from collections.abc import Sequence
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
)
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)
from torch.distributed.fsdp._fully_shard._fsdp_api import (  # the interfaces set_custom_all_gather / _reduce_scatter take
    AllGather,
    ReduceScatter,
)
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


class GlooAllGather(AllGather):
    """FSDP's all-gather over gloo without gloo's full-size staging copy, and its output freed once copied out.

    gloo's ``all_gather_into_tensor`` gathers into a flat tensor of its own and copies it into the output, so
    each gather held the layer twice (plus FSDP's copy-out: three times). FSDP copies this rank's shard into its
    slice of the output before the call (an in-place all-gather), so one broadcast per rank, from each rank's
    slice into the same slice everywhere, fills the output where it lies: the same bytes on the wire, no copy.

    FSDP then copies the output into the unit's parameters and, in a forward, keeps the output until the next
    unit's gather (for CUDA streams): the last unit's stayed through the whole backward. One instance serves
    every unit of a model, whose units are gathered one at a time on CPU (no prefetch, :func:`_gloo_units`);
    :meth:`release` frees the last output's storage, here, on this thread (not whenever gloo's worker drops its
    reference), and runs once FSDP has copied it out: from hooks that run after FSDP's own (a unit's forward
    pre-hook, a tensor hook on its outputs beside FSDP's pre-backward one) and before the next gather."""

    def __init__(self) -> None:
        self._last: torch.Tensor | None = None

    def release(self, *_: Any) -> None:
        if self._last is not None:
            self._last.untyped_storage().resize_(0)
            self._last = None

    def allocate(self, size: Sequence[int | torch.SymInt], *, dtype: torch.dtype,
                 device: torch.device) -> torch.Tensor:
        self.release()
        self._last = torch.empty(*size, dtype=dtype, device=device)
        return self._last

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup,
                 async_op: bool = False) -> dist.Work | None:
        world = group.size()
        for src, part in enumerate(output_tensor.chunk(world)):
            if src == group.rank() and part.data_ptr() != input_tensor.data_ptr():
                part.copy_(input_tensor)
            dist.broadcast(part, group_src=src, group=group)
        return None

    def after_forward(self, module: nn.Module, args: Any, output: Any) -> None:
        """A forward hook: release the output once FSDP has gathered this unit again for its backward."""
        for t in _grad_tensors(output):
            t.register_hook(self.release)


def _grad_tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value] if value.requires_grad else []
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _grad_tensors(v)]
    return []


class GlooReduceScatter(ReduceScatter):
    """FSDP's gradient reduce-scatter over gloo without gloo's staging copy, and with its input freed at once.

    gloo's ``reduce_scatter_tensor`` reduces a full-size copy of the input; FSDP then keeps the input buffer (a
    layer's unsharded gradients) alive until the next layer's reduce-scatter, for CUDA streams that a CPU run
    does not have. Here the input (FSDP's scratch copy of the gradients) is all-reduced in place, this rank's
    slice copied out and the input's storage released: one layer's gradients fewer at the backward's peak."""

    def allocate(self, size: Sequence[int | torch.SymInt], *, dtype: torch.dtype,
                 device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup,
                 op: Any, async_op: bool = False) -> dist.Work | None:
        world = group.size()
        avg = op == dist.ReduceOp.AVG
        dist.all_reduce(input_tensor, op=dist.ReduceOp.SUM if avg else op, group=group)
        output_tensor.copy_(input_tensor.chunk(world)[group.rank()])
        if avg:
            output_tensor.div_(world)
        input_tensor.untyped_storage().resize_(0)  # FSDP only holds it for stream ordering from here on
        return None


def _gloo_units(units: list[nn.Module]) -> None:
    """On gloo (CPU): the copy-free collectives above, and no backward prefetch. Prefetching gathers the next
    layer while this one computes its gradients, which overlaps on CUDA streams; on CPU the gather runs at once,
    so it only holds a second layer gathered. A unit told to prefetch itself (already gathered: a no-op) turns
    FSDP's default prefetch off."""
    gather, reduce = GlooAllGather(), GlooReduceScatter()
    for unit in units:
        if not isinstance(unit, FSDPModule):
            continue
        unit.set_custom_all_gather(gather)
        unit.set_custom_reduce_scatter(reduce)
        unit.register_forward_pre_hook(gather.release)  # after FSDP's pre-forward (prepended): copied out
        unit.register_forward_hook(gather.after_forward)  # after FSDP's post-forward and its pre-backward hooks
        unit.set_modules_to_backward_prefetch([unit])


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
    if dist.get_backend() == "gloo":
        _gloo_units([*layers, model])
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

    @property
    def dtensor_parameters(self) -> bool:
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
