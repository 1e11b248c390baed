"""Where the tests find DeepSpeed. ``make install`` puts it beside the environment, not in it
(``<venv>/deepspeed-site``, ``pip install --target``): installed in the environment, DeepSpeed is imported by every
process that saves a model (accelerate's ``extract_model_from_parallel`` imports it when it is importable: ~1.5
CPU-seconds and a line on stdout each), so the whole suite paid for the few tests that train through it. Those
tests start their ranks with :func:`deepspeed_env` (``PYTHONPATH``: fresh interpreters, not zygote forks). A user's
``pip install 'fleetrl[deepspeed]'`` puts it in the environment, where :func:`deepspeed_env` adds nothing."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from tests.procs import REPO

SITE = Path(sys.prefix) / "deepspeed-site"


def deepspeed_env() -> dict[str, str] | None:
    """What a process needs in its environment to import DeepSpeed ({} when it is installed in this environment);
    None when it is nowhere (the tests that need it skip)."""
    if importlib.util.find_spec("deepspeed") is not None:
        return {}
    if (SITE / "deepspeed" / "__init__.py").is_file():
        return {"PYTHONPATH": os.pathsep.join([str(SITE), str(REPO)])}
    return None


NO_DEEPSPEED = deepspeed_env() is None
SKIP_REASON = ("deepspeed is neither installed nor in <venv>/deepspeed-site (make install puts it there; or pip "
               "install -c constraints/cpu.txt -e '.[deepspeed]')")
