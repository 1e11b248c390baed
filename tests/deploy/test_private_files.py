"""Config files that carry the control token are readable by their owner only (0600, in a 0700 directory),
whatever the umask, and a file that already existed with a wider mode is tightened."""

from __future__ import annotations

import os
import stat

import pytest
import yaml

from deploy.local.fleet import Fleet
from deploy.private_files import write_private


@pytest.fixture()
def permissive_umask():
    old = os.umask(0o022)  # the usual default: files 0644, directories 0755
    try:
        yield
    finally:
        os.umask(old)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_fleet_writes_configs_0600_in_a_private_directory(tmp_path, permissive_umask):
    fleet = Fleet(tmp_path / "run")
    path = fleet.write_config("learner", {"port": 1, "control_token": "s3cret"})
    assert yaml.safe_load(path.read_text())["control_token"] == "s3cret"
    assert mode(path) == 0o600, oct(mode(path))
    assert mode(path.parent) == 0o700, oct(mode(path.parent))


def test_an_existing_wider_file_is_tightened(tmp_path, permissive_umask):
    path = tmp_path / "config.yaml"
    path.write_text("control_token: old\n")
    path.chmod(0o644)
    write_private(path, "control_token: new\n")
    assert mode(path) == 0o600 and path.read_text() == "control_token: new\n"
    # a run dir made before (configs 0755) is made private when a fleet uses it again
    (tmp_path / "run" / "configs").mkdir(parents=True)
    (tmp_path / "run" / "configs").chmod(0o755)
    Fleet(tmp_path / "run")
    assert mode(tmp_path / "run" / "configs") == 0o700
