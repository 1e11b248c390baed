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

from itertools import repeat
from operator import attrgetter, is_
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the publisher imports this module; torch only where tensors are handled
    import torch

_SKIP = attrgetter("_non_persistent_buffers_set")


class ModuleWalk:
    """``module_tensors`` of one module (see :func:`services.learner.weights.packing.module_tensors`), cached.

    The structure check and the tensor reads run as C-level ``map`` passes over lists kept from the walk
    (a few hundred microseconds for thousands of modules, instead of milliseconds of Python loops)."""

    def __init__(self) -> None:
        self._root: Any = None
        self.walks = 0  # full walks done (for tests and logs)
        # from the last walk, one entry per module: the module, its parent's _modules dict and key there,
        # its own three dicts, their sizes, and its non-persistent buffer names
        self._mods: list[Any] = []
        self._parents: list[dict] = []
        self._keys: list[str] = []
        self._dicts: tuple[list[dict], list[dict], list[dict]] = ([], [], [])
        self._sizes: list[int] = []
        self._skips: list[Any] = []
        # one entry per tensor: its state-dict name, the dict holding it, its key there
        self._names: list[str] = []
        self._holders: list[dict] = []
        self._slots: list[str] = []

    def tensors(self, module: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
        if self._root is not module or not self._unchanged():
            self._walk(module)
        try:
            found = list(map(dict.__getitem__, self._holders, self._slots))
        except KeyError:  # a tensor renamed away without changing any count
            self._walk(module)
            found = list(map(dict.__getitem__, self._holders, self._slots))
        if any(map(is_, found, repeat(None))):  # a parameter set to None: not in the state dict any more
            self._walk(module)
            found = list(map(dict.__getitem__, self._holders, self._slots))
        return list(zip(self._names, found))

    def _unchanged(self) -> bool:
        mods = self._mods
        mods_d, params_d, bufs_d = self._dicts
        # each module still under its parent at the same key (parents[i], keys[i] are those of mods[i + 1])
        if not all(map(is_, map(dict.get, self._parents, self._keys), mods[1:])):
            return False
        # ... with as many children, parameters and buffers, and the same non-persistent buffers (a module's
        # own three dicts are assumed to stay the same objects: torch and the libraries around it mutate
        # them, none replaces them)
        sizes = [*map(len, mods_d), *map(len, params_d), *map(len, bufs_d)]
        return sizes == self._sizes and list(map(_SKIP, mods)) == self._skips

    def _walk(self, module: torch.nn.Module) -> None:
        mods: list[Any] = []
        parents: list[dict] = []
        keys: list[str] = []
        names: list[str] = []
        holders: list[dict] = []
        slots: list[str] = []

        def visit(mod: torch.nn.Module, prefix: str) -> None:
            mods.append(mod)
            skip = mod._non_persistent_buffers_set
            for name, p in mod._parameters.items():
                if p is not None:
                    names.append(prefix + name)
                    holders.append(mod._parameters)
                    slots.append(name)
            for name, b in mod._buffers.items():
                if b is not None and name not in skip:
                    names.append(prefix + name)
                    holders.append(mod._buffers)
                    slots.append(name)
            for name, child in mod._modules.items():
                if child is not None:
                    parents.append(mod._modules)
                    keys.append(name)
                    visit(child, f"{prefix}{name}.")

        visit(module, "")
        dicts = ([m._modules for m in mods], [m._parameters for m in mods], [m._buffers for m in mods])
        self._root, self._mods, self._parents, self._keys, self._dicts = module, mods, parents, keys, dicts
        self._sizes = [*map(len, dicts[0]), *map(len, dicts[1]), *map(len, dicts[2])]
        self._skips = [set(m._non_persistent_buffers_set) for m in mods]
        self._names, self._holders, self._slots = names, holders, slots
        self.walks += 1
