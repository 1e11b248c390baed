"""A missing optional package is named when a service or mode starts, with the ``pip install 'fleetrl[...]'`` that
brings it: never a ``ModuleNotFoundError`` at the first request (issue 41: Tinker mode without peft served the
API and failed the client's first training request)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from services.learner.settings import LearnerSettings
from shared.extras import extras_problem
from tests.procs import REPO

# a Python that cannot import peft (as an install without the learner extra), then the fleetrl CLI
WITHOUT_PEFT = """
import sys
class NoPeft:
    def find_spec(self, name, path=None, target=None):
        if name == "peft" or name.startswith("peft."):
            raise ModuleNotFoundError("No module named 'peft'")
        return None
sys.meta_path.insert(0, NoPeft())
from deploy.cli import main
sys.argv = ["fleetrl", *sys.argv[1:]]
main()
"""


@pytest.fixture()
def no_peft(monkeypatch):
    class NoPeft:
        def find_spec(self, name, path=None, target=None):
            if name == "peft":
                raise ModuleNotFoundError("No module named 'peft'")

    for name in [m for m in sys.modules if m == "peft" or m.startswith("peft.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [NoPeft(), *sys.meta_path])


def test_a_missing_package_is_one_line_with_the_pip_install_that_brings_it(no_peft):
    assert extras_problem({"json": "anything"}) is None
    assert extras_problem({"peft": "model.lora (LoRA adapters)"}) == \
        "model.lora (LoRA adapters) needs peft, which is not installed: pip install 'fleetrl[learner]'"
    two = extras_problem({"peft": "mode: tinker", "no_such_module_x": "y"})
    assert two.endswith("which are not installed: pip install 'fleetrl[learner,no_such_module_x]'")


def test_learner_settings_say_what_they_need():
    base = {"model": {"actor": "/m"}, "data": {"path": "/d.jsonl"}}
    assert LearnerSettings.model_validate(base).optional_packages() == {}
    lora = LearnerSettings.model_validate({**base, "model": {"actor": "/m", "lora": {"rank": 4}}})
    assert lora.optional_packages() == {"peft": "model.lora (LoRA adapters)"}


@pytest.mark.process
def test_tinker_mode_without_peft_refuses_at_start_naming_the_extra(tmp_path):
    spec = REPO / "examples" / "tinker" / "fleetrl.yaml"
    out = subprocess.run([sys.executable, "-c", WITHOUT_PEFT, "run", str(spec)], cwd=REPO, capture_output=True,
                         text=True, timeout=120, check=False, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 2, out.stdout + out.stderr
    (line,) = [x for x in out.stderr.splitlines() if x.strip()]
    assert line == (f"error: {spec}: mode: tinker (it trains LoRA adapters) needs peft, which is not installed: "
                    "pip install 'fleetrl[tinker]'")
