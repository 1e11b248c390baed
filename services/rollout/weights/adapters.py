"""The replica's side of adapter rounds: a LoRA adapter applied to the module's own base weights (hf engine), and
a version's adapter written as a PEFT directory that an engine server loads (vLLM, SGLang).

Every version is **base + that version's adapter**: the base is the weights the engine loaded at start, kept
pristine, so applying version after version never drifts (no merge on top of a previous merge). Two ways
(``weights.adapter_apply``):

- ``merge``: each adapted module's weight becomes ``base + scaling * B @ A``, computed from a copy of its base
  weight taken at the first adapter round (memory: one copy of the adapted modules' weights). Generation then
  runs the plain model.
- ``unmerged``: the base weights stay as they are; a forward hook on each adapted module adds
  ``scaling * (x A^T) B^T`` (memory: the adapter only; every forward pays the two small matmuls).

Which is faster at generation was measured on the tiny model (``benchmarks/lora_apply.py``, docs/weight-sync.md).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from shared.weight_sync.wire import AdapterInfo


def delta_weight(a: torch.Tensor, b: torch.Tensor, scaling: float, fan_in_fan_out: bool) -> torch.Tensor:
    """``scaling * B @ A`` (transposed for fan-in-fan-out layers) in the adapter's dtype, as peft's
    ``get_delta_weight`` computes it (half precision on a CPU goes through float32 and back)."""
    dtype = b.dtype
    if a.device.type == "cpu" and dtype in (torch.float16, torch.bfloat16):
        out = (b.float() @ a.float()).to(dtype)
    else:
        out = b @ a
    if fan_in_fan_out:
        out = out.T
    return out * scaling


def _weight_of(module: torch.nn.Module) -> torch.Tensor:
    """A LoRA-targeted module's weight (a linear layer's: ``check`` refused modules without a 2-d one)."""
    weight = getattr(module, "weight", None)
    if not isinstance(weight, torch.Tensor):
        raise ValueError(f"adapter module {type(module).__name__} has no weight tensor")  # noqa: TRY004 - as check()
    return weight


class ModuleAdapters:
    """Applies adapter versions to ``model`` (``mode``: merge or unmerged, module docstring); :meth:`clear` puts
    the base back (a full round replaces the weights: the sink then drops this object)."""

    def __init__(self, model: torch.nn.Module, mode: str, base: dict[str, torch.Tensor] | None = None) -> None:
        """``base``: base weights of modules whose weight holds something else now (after a LoRA learner's merged
        full round: those it merged); every other module's weight is taken as its base."""
        self.model, self.mode = model, mode
        self.base: dict[str, torch.Tensor] = {}  # merge: each adapted module's base weight, copied once
        if mode == "merge":
            self.base.update(base or {})  # the first apply restores those its adapter leaves alone
        self._restore_first = dict(base or {}) if mode != "merge" else {}  # unmerged: put back at the first apply
        self.live: dict[str, tuple[torch.Tensor, torch.Tensor, float]] = {}  # unmerged: what each hook adds
        self.hooks: dict[str, Any] = {}
        self.tensors: dict[str, torch.Tensor] = {}  # the adapter applied now, by wire name (served to peers)

    def check(self, info: AdapterInfo, tensors: dict[str, torch.Tensor]) -> None:
        """Raise ``ValueError`` (naming the module) unless every adapted module exists with matching shapes.
        Nothing is written before this passes."""
        for m in info.modules:
            try:
                module = self.model.get_submodule(m.name)
            except AttributeError:
                raise ValueError(f"adapter module {m.name!r} is not in this model") from None
            weight = getattr(module, "weight", None)
            if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
                raise ValueError(f"adapter module {m.name!r} has no 2-d weight")
            a, b = tensors[f"{m.name}.lora_A"], tensors[f"{m.name}.lora_B"]
            out_f, in_f = weight.shape[::-1] if m.fan_in_fan_out else weight.shape
            if a.dim() != 2 or b.dim() != 2 or a.shape != (info.rank, in_f) or b.shape != (out_f, info.rank):
                raise ValueError(f"adapter module {m.name!r}: lora_A {tuple(a.shape)} / lora_B {tuple(b.shape)} do "
                                 f"not fit its weight {tuple(weight.shape)} at rank {info.rank}")

    @torch.no_grad()
    def apply(self, info: AdapterInfo, tensors: dict[str, torch.Tensor]) -> None:
        """Make the model base + this adapter (blocking; generation must be paused)."""
        names = {m.name for m in info.modules}
        for name, weight in self._restore_first.items():  # unmerged: the base back in place before any hook
            _weight_of(self.model.get_submodule(name)).copy_(weight)
        self._restore_first = {}
        for gone in [n for n in (self.base if self.mode == "merge" else self.live) if n not in names]:
            self._restore(gone)  # a module the new adapter leaves alone is the base again
        for m in info.modules:
            module = self.model.get_submodule(m.name)
            weight = _weight_of(module)
            a = tensors[f"{m.name}.lora_A"].to(weight.device)
            b = tensors[f"{m.name}.lora_B"].to(weight.device)
            if self.mode == "merge":
                base = self.base.get(m.name)
                if base is None:
                    base = self.base[m.name] = weight.detach().clone()
                # one rounding, as the learner's merge: add in the promoted dtype, then cast
                weight.copy_((base + delta_weight(a, b, m.scaling, m.fan_in_fan_out)).to(weight.dtype))
            else:
                compute = weight.dtype
                self.live[m.name] = (a.to(compute), b.to(compute), m.scaling)
                if m.name not in self.hooks:
                    self.hooks[m.name] = module.register_forward_hook(self._hook(m.name))
        self.tensors = tensors

    def _hook(self, name: str):
        live = self.live

        def add_lora(module: torch.nn.Module, args: tuple, out: torch.Tensor) -> torch.Tensor:
            a, b, scaling = live[name]
            x = args[0].to(a.dtype)
            return out + (torch.nn.functional.linear(torch.nn.functional.linear(x, a), b) * scaling).to(out.dtype)

        return add_lora

    @torch.no_grad()
    def _restore(self, name: str) -> None:
        if self.mode == "merge":
            _weight_of(self.model.get_submodule(name)).copy_(self.base.pop(name))
        else:
            self.live.pop(name, None)
            hook = self.hooks.pop(name, None)
            if hook is not None:
                hook.remove()

    def clear(self) -> None:
        """Drop what this holds: hooks removed, base copies freed (the weights are about to be replaced whole)."""
        for hook in self.hooks.values():
            hook.remove()
        self.hooks.clear()
        self.live.clear()
        self.base.clear()
        self._restore_first = {}
        self.tensors = {}


def write_peft_dir(out: Path, info: AdapterInfo, tensors: dict[str, torch.Tensor]) -> Path:
    """A PEFT adapter directory (``adapter_config.json``, ``adapter_model.safetensors``) holding ``tensors`` under
    PEFT's names (``base_model.model.<module>.lora_A.weight``): what vLLM's and SGLang's adapter loaders read."""
    from safetensors.torch import save_file

    if any(abs(m.scaling - _scaling(info)) > 1e-9 * max(1.0, abs(m.scaling)) for m in info.modules):
        raise ValueError("the adapter's modules scale differently (per-module rank or alpha): a PEFT config with "
                         "one r and lora_alpha cannot say it")
    out.mkdir(parents=True, exist_ok=True)
    leaves = sorted({m.name.rsplit(".", 1)[-1] for m in info.modules})
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": info.rank, "lora_alpha": info.alpha,
              "use_rslora": info.use_rslora, "target_modules": leaves, "lora_dropout": 0.0, "bias": "none",
              "fan_in_fan_out": any(m.fan_in_fan_out for m in info.modules), "base_model_name_or_path": None}
    (out / "adapter_config.json").write_text(json.dumps(config, indent=1))
    peft = {f"base_model.model.{name.rsplit('.', 1)[0]}.{name.rsplit('.', 1)[1]}.weight": t.contiguous()
            for name, t in tensors.items()}
    save_file(peft, str(out / "adapter_model.safetensors"))
    return out


def _scaling(info: AdapterInfo) -> float:
    return info.alpha / (info.rank ** 0.5 if info.use_rslora else info.rank)
