"""``shared/`` holds the contracts every service speaks, so it imports without torch: every module under it,
imported in a fresh interpreter, leaves ``torch`` out of ``sys.modules`` (modules that handle tensors import
torch inside the functions that do)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.procs import REPO

pytestmark = pytest.mark.process  # imports shared/ in a fresh interpreter

PROBE = """
import importlib, json, pkgutil, sys
import shared
names = sorted(m.name for m in pkgutil.walk_packages(shared.__path__, "shared."))
loaded = {}
for name in names:
    importlib.import_module(name)
    loaded[name] = "torch" in sys.modules
print(json.dumps({"modules": names, "torch_after": loaded}))
"""


def test_no_shared_module_imports_torch():
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=120,
                         check=False)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert "shared.weight_sync.group" in report["modules"] and "shared.weight_sync.tensors" in report["modules"]
    first = next((name for name in report["modules"] if report["torch_after"][name]), None)
    assert first is None, f"importing {first} imported torch"
