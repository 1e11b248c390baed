"""The replica's side of adapter rounds: a LoRA adapter applied to the module's own base weights (hf engine), and
a version's adapter written as a PEFT directory that an engine server loads (vLLM, SGLang).

Every version is **base + that version's adapter**: the base is the weights the engine loaded at start, kept
pristine, so applying version after version never drifts (no merge on top of a previous merge). Two ways
(``weights.adapter_apply``):

- ``merge``: each adapted module's weight becomes ``base + scaling * B @ A``, computed from a copy of its base
  weight taken at the first adapter round into a merge buffer of its own (memory: the base copies and the merged
  weights, one copy of the adapted modules' weights more than the model). Generation then runs the plain model.
  A version is served at once, hooked as ``unmerged`` does, while it is merged beside generation; the merged
  weights are then swapped in (pointers, no copy) and the hooks removed (:class:`ModuleAdapters`). The merge
  writes into reused buffers (:func:`merge_into`), bit for bit the plain formula.
- ``unmerged``: the base weights stay as they are; a forward hook on each adapted module adds
  ``scaling * (x A^T) B^T`` (memory: the adapter only; every forward pays the two small matmuls).

Which is faster at generation was measured on the tiny model (``benchmarks/lora_apply.py``, docs/weight-sync.md).
"""

from __future__ import annotations

import json
import threading
import time
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


class MergeScratch:
    """Flat scratch buffers (one per dtype, grown to the largest module) that :func:`merge_into` computes in, so that
    a merge allocates nothing per module: fresh temporaries of this size cost more in page faults than the
    arithmetic (``benchmarks/lora_apply.py --merge-profile``). One merge at a time per scratch."""

    def __init__(self) -> None:
        self._flat: dict[tuple[torch.dtype, torch.device, int], torch.Tensor] = {}

    def get(self, shape: tuple[int, int], dtype: torch.dtype, device: torch.device, slot: int = 0) -> torch.Tensor:
        n = shape[0] * shape[1]
        key = (dtype, device, slot)
        flat = self._flat.get(key)
        if flat is None or flat.numel() < n:
            flat = self._flat[key] = torch.empty(n, dtype=dtype, device=device)
        return flat[:n].view(shape)


@torch.no_grad()
def merge_into(out: torch.Tensor, base: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scaling: float,
               fan_in_fan_out: bool, scratch: MergeScratch) -> None:
    """``out = (base + delta_weight(a, b, scaling, fan_in_fan_out)).to(out.dtype)``, bit for bit, with the same
    operations in the same dtypes, each written into ``scratch`` (or ``out``) instead of a fresh tensor: the matmul
    (``out=``), the cast back to the adapter's dtype (``copy_``, round to nearest even as ``.to``), the scaling (in
    place), then the add into ``out`` (or into scratch and one cast, where the promoted dtype is not ``out``'s)."""
    dtype = b.dtype
    shape = (b.shape[0], a.shape[1])
    if a.device.type == "cpu" and dtype in (torch.float16, torch.bfloat16):
        wide = scratch.get(shape, torch.float32, a.device)
        torch.mm(b.float(), a.float(), out=wide)
        delta = scratch.get(shape, dtype, a.device)
        delta.copy_(wide)
    else:
        delta = scratch.get(shape, torch.promote_types(a.dtype, b.dtype), a.device)
        torch.mm(b, a, out=delta)
    if fan_in_fan_out:
        delta = delta.T
    delta.mul_(scaling)
    summed = torch.promote_types(base.dtype, delta.dtype)
    if summed == out.dtype:
        torch.add(base, delta, out=out)
    else:
        wide_sum = scratch.get((out.shape[0], out.shape[1]), summed, out.device, slot=1)
        torch.add(base, delta, out=wide_sum)
        out.copy_(wide_sum)


def _weight_of(module: torch.nn.Module) -> torch.Tensor:
    """A LoRA-targeted module's weight (a linear layer's: ``check`` refused modules without a 2-d one)."""
    weight = getattr(module, "weight", None)
    if not isinstance(weight, torch.Tensor):
        raise ValueError(f"adapter module {type(module).__name__} has no weight tensor")  # noqa: TRY004 - as check()
    return weight


class ModuleAdapters:
    """Applies adapter versions to ``model`` (``mode``: merge or unmerged, module docstring); :meth:`clear` drops
    what it holds (a full round replaces the weights: the sink then drops this object).

    ``merge`` in three steps, so that a replica serves a version at once and merges it off the update path:
    :meth:`stage` (paused; microseconds a module) points each adapted module's weight at its base copy and hooks the
    adapter on, as ``unmerged`` does: the model is base + this adapter from then on; :meth:`merge` (blocking, not
    paused, beside generation) writes base + this adapter into a merge buffer per module that no forward reads;
    :meth:`swap` (between two forwards) points each weight at its merge buffer and removes the hooks. Every step
    carries the ticket :meth:`stage` returned: a later :meth:`stage` or :meth:`clear` supersedes it (the merge stops at
    the next module, a late swap does nothing), so no forward ever mixes two versions. :meth:`apply` runs all three.
    The weights are re-pointed, never written: a module's weight is its base copy (hooked) or its merge buffer
    (merged), so memory is what a merge always took (a base copy and a merged weight per adapted module)."""

    def __init__(self, model: torch.nn.Module, mode: str, base: dict[str, torch.Tensor] | None = None) -> None:
        """``base``: base weights of modules whose weight holds something else now (after a LoRA learner's merged
        full round: those it merged); every other module's weight is taken as its base."""
        self.model, self.mode = model, mode
        self.base: dict[str, torch.Tensor] = {}  # merge: each adapted module's base weight (a copy; never written)
        if mode == "merge":
            self.base.update(base or {})  # the first stage points those its adapter leaves alone back at them
        self._restore_first = dict(base or {}) if mode != "merge" else {}  # unmerged: put back at the first apply
        self.live: dict[str, tuple[torch.Tensor, torch.Tensor, float]] = {}  # what each hook adds
        self.hooks: dict[str, Any] = {}
        self.tensors: dict[str, torch.Tensor] = {}  # the adapter applied now, by wire name (served to peers)
        self._ticket = 0  # bumped by every stage and clear
        self._pending: tuple[int, list[tuple[str, torch.Tensor, torch.Tensor, float, bool]]] = (0, [])
        self._buffers: dict[str, torch.Tensor] = {}  # merge: each adapted module's merge buffer
        self._ready = -1  # the ticket whose merge the buffers hold, complete
        self._lock = threading.Lock()  # one merge at a time (the buffers, the scratch)
        self._scratch = MergeScratch()
        self.merge_seconds = 0.0  # the last complete merge's duration
        self._by_name: dict[str, torch.nn.Module] = {}  # get_submodule, looked up once (it walks the path)

    def _module(self, name: str) -> torch.nn.Module:
        module = self._by_name.get(name)
        if module is None:
            module = self._by_name[name] = self.model.get_submodule(name)
        return module

    @property
    def merged(self) -> bool:
        """merge: the weights hold the staged version merged (no hooks left)."""
        return self.mode == "merge" and not self.hooks and self._ready == self._ticket

    def check(self, info: AdapterInfo, tensors: dict[str, torch.Tensor]) -> None:
        """Raise ``ValueError`` (naming the module) unless every adapted module exists with matching shapes.
        Nothing is written before this passes."""
        for m in info.modules:
            try:
                module = self._module(m.name)
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
        """Make the model base + this adapter, merged or hooked (blocking; generation must be paused)."""
        if self.mode == "merge":
            ticket = self.stage(info, tensors)
            self.merge(ticket)
            self.swap(ticket)
            return
        names = {m.name for m in info.modules}
        for name, weight in self._restore_first.items():  # unmerged: the base back in place before any hook
            _weight_of(self._module(name)).copy_(weight)
        self._restore_first = {}
        for gone in [n for n in self.live if n not in names]:
            self._unhook(gone)  # a module the new adapter leaves alone is the base again
        for m in info.modules:
            weight = _weight_of(self._module(m.name))
            self._hook_on(m.name, tensors[f"{m.name}.lora_A"].to(weight.device),
                          tensors[f"{m.name}.lora_B"].to(weight.device), m.scaling)
        self.tensors = tensors

    @torch.no_grad()
    def prepare(self, info: AdapterInfo) -> None:
        """merge: a copy of the base weight of each module ``info`` adapts that has none yet (the first adapter
        round; blocking, need not be paused: only the sink writes weights, and only during its rounds)."""
        for m in info.modules:
            if m.name not in self.base:
                self.base[m.name] = _weight_of(self._module(m.name)).detach().clone()

    @torch.no_grad()
    def stage(self, info: AdapterInfo, tensors: dict[str, torch.Tensor]) -> int:
        """merge, paused: the model serves base + this adapter from now on (each adapted weight pointed at its base
        copy, the adapter hooked on; a module it leaves alone points at its base again). Supersedes any merge under
        way. Returns the ticket :meth:`merge` and :meth:`swap` take."""
        assert self.mode == "merge"
        self.prepare(info)
        self._ticket += 1
        names = {m.name for m in info.modules}
        for name, base in list(self.base.items()):
            _point(_weight_of(self._module(name)), base)
            if name not in names:  # the base again, for good: the copy is the weight now
                self._unhook(name)
                del self.base[name]
        pending = []
        for m in info.modules:
            weight = _weight_of(self._module(m.name))
            a = tensors[f"{m.name}.lora_A"].to(weight.device)
            b = tensors[f"{m.name}.lora_B"].to(weight.device)
            self._hook_on(m.name, a, b, m.scaling)
            pending.append((m.name, a, b, m.scaling, m.fan_in_fan_out))
        self._pending = (self._ticket, pending)
        self.tensors = tensors
        return self._ticket

    @torch.no_grad()
    def merge(self, ticket: int) -> bool:
        """merge: base + the staged adapter into each module's merge buffer (blocking; beside generation: no
        forward reads these buffers before :meth:`swap`). False if superseded (it stops at the next module)."""
        with self._lock:
            t0 = time.perf_counter()
            staged, pending = self._pending
            buffers = self._buffers  # (clear() starts a new dict: this one is then no one's)
            if staged != ticket:
                return False
            for name in [n for n in buffers if n not in {p[0] for p in pending}]:
                del buffers[name]
            for name, a, b, scaling, fan_in_fan_out in pending:
                if self._ticket != ticket:
                    return False
                base = self.base.get(name)
                if base is None:
                    return False
                out = buffers.get(name)
                if out is None:
                    out = buffers[name] = torch.empty_like(base)
                merge_into(out, base, a, b, scaling, fan_in_fan_out, self._scratch)
            if self._ticket != ticket:
                return False
            self._ready = ticket
            self.merge_seconds = time.perf_counter() - t0
            return True

    def swap(self, ticket: int) -> bool:
        """merge, between two forwards (the sink holds generation at a step boundary): each adapted weight pointed
        at its merged buffer, the hooks removed. False (nothing done) unless ``ticket`` is staged and merged."""
        if ticket != self._ticket or self._ready != ticket:
            return False
        for name, *_ in self._pending[1]:
            _point(_weight_of(self._module(name)), self._buffers[name])
            self._unhook(name)
        return True

    def _hook_on(self, name: str, a: torch.Tensor, b: torch.Tensor, scaling: float) -> None:
        compute = _weight_of(self._module(name)).dtype
        self.live[name] = (a.to(compute), b.to(compute), scaling)
        if name not in self.hooks:
            self.hooks[name] = self._module(name).register_forward_hook(self._hook(name))

    def _hook(self, name: str):
        live = self.live

        def add_lora(module: torch.nn.Module, args: tuple, out: torch.Tensor) -> torch.Tensor:
            a, b, scaling = live[name]
            x = args[0].to(a.dtype)
            return out + (torch.nn.functional.linear(torch.nn.functional.linear(x, a), b) * scaling).to(out.dtype)

        return add_lora

    def _unhook(self, name: str) -> None:
        self.live.pop(name, None)
        hook = self.hooks.pop(name, None)
        if hook is not None:
            hook.remove()

    def clear(self) -> None:
        """Drop what this holds: hooks removed, base copies and merge buffers freed, any merge under way stopped at
        its next module (the weights are about to be replaced whole; until then they are the base or the last
        merged version)."""
        self._ticket += 1
        for hook in self.hooks.values():
            hook.remove()
        self.hooks.clear()
        self.live.clear()
        self.base.clear()
        self._buffers = {}
        self._pending = (self._ticket, [])
        self._restore_first = {}
        self.tensors = {}


def _point(weight: torch.Tensor, storage: torch.Tensor) -> None:
    """Re-point ``weight`` (a parameter: its identity kept) at ``storage``, unless it already is."""
    if weight.data_ptr() != storage.data_ptr():
        weight.data = storage


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
