"""The named tensors of one module across publishes, without walking the module tree every time.

Walking a model of thousands of modules (a mixture of experts: layers x experts x projections) to list its
parameters costs milliseconds of Python per publish, every step. :class:`ModuleWalk` walks once and then
only checks that the structure is unchanged: every module still sits under its parent at the same key and
holds as many child modules, parameters and buffers (and the same non-persistent buffer names) as before.
Tensors are read afresh from their module on every call, so a replaced parameter (``mod.weight = ...``)
is picked up without a walk; any other change (a module added, replaced or removed, a parameter or buffer
added or removed) makes the next call walk again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the publisher imports this module; torch only where tensors are handled
    import torch

# (module, its parent's _modules dict or None for the root, key under the parent,
#  #children, #parameters, #buffers, non-persistent buffer names)
_Shape = tuple[Any, "dict | None", str, int, int, int, frozenset]


class ModuleWalk:
    """``module_tensors`` of one module (see :func:`shared.weight_sync.tensors.module_tensors`), cached."""

    def __init__(self) -> None:
        self._root: Any = None
        self._shape: list[_Shape] = []
        self._entries: list[tuple[str, dict, str]] = []  # (state-dict name, the dict holding it, its key)
        self.walks = 0  # full walks done (for tests and logs)

    def tensors(self, module: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
        if self._root is not module or not self._unchanged():
            self._walk(module)
        try:
            out = [(name, d[key]) for name, d, key in self._entries]
        except KeyError:  # a tensor renamed away without changing any count
            self._walk(module)
            out = [(name, d[key]) for name, d, key in self._entries]
        if any(t is None for _, t in out):  # a parameter set to None: not in the state dict any more
            self._walk(module)
            out = [(name, d[key]) for name, d, key in self._entries]
        return out

    def _unchanged(self) -> bool:
        for mod, parent, key, n_mod, n_par, n_buf, skip in self._shape:
            if (parent is not None and parent.get(key) is not mod) or len(mod._modules) != n_mod \
                    or len(mod._parameters) != n_par or len(mod._buffers) != n_buf \
                    or mod._non_persistent_buffers_set != skip:
                return False
        return True

    def _walk(self, module: torch.nn.Module) -> None:
        shape: list[_Shape] = []
        entries: list[tuple[str, dict, str]] = []

        def visit(mod: torch.nn.Module, prefix: str, parent: dict | None, key: str) -> None:
            skip = frozenset(mod._non_persistent_buffers_set)
            shape.append((mod, parent, key, len(mod._modules), len(mod._parameters), len(mod._buffers), skip))
            for name, p in mod._parameters.items():
                if p is not None:
                    entries.append((prefix + name, mod._parameters, name))
            for name, b in mod._buffers.items():
                if b is not None and name not in skip:
                    entries.append((prefix + name, mod._buffers, name))
            for name, child in mod._modules.items():
                if child is not None:
                    visit(child, f"{prefix}{name}.", mod._modules, name)

        visit(module, "", None, "")
        self._root, self._shape, self._entries = module, shape, entries
        self.walks += 1
