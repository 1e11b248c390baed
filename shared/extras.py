"""Optional packages (the ``fleetrl[...]`` extras) a service or mode needs, checked when it starts: a missing one
is one line naming what needs it and the ``pip install`` that brings it, not a ``ModuleNotFoundError`` at the
first request. Finds modules without importing them (``importlib.util.find_spec``)."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping

#: import name -> the extra of pyproject.toml that installs it
EXTRA_OF = {
    "peft": "learner", "matplotlib": "learner", "pyarrow": "learner", "tinker": "tinker", "datasets": "data",
    "vllm": "vllm", "sglang": "sglang", "deepspeed": "deepspeed", "ray": "ray", "reasoning_gym": "agents",
    "openenv": "agents",
}


def installed(module: str) -> bool:
    """Whether ``module`` can be imported here (looked up, not imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def extras_problem(needs: Mapping[str, str], extra: str | None = None) -> str | None:
    """``needs``: import name -> what needs it (``"model.lora"``). One line for the missing ones, else None:
    ``model.lora needs peft, which is not installed: pip install 'fleetrl[learner]'`` (``extra``: the one
    extra that brings them all, when a mode has its own)."""
    gone = {m: why for m, why in needs.items() if not installed(m)}
    if not gone:
        return None
    whys = "; ".join(f"{why} needs {m}" for m, why in gone.items())
    extras = extra or ",".join(sorted({EXTRA_OF.get(m, m) for m in gone}))
    return f"{whys}, which {'is' if len(gone) == 1 else 'are'} not installed: pip install 'fleetrl[{extras}]'"
