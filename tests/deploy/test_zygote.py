"""The zygote (deploy/local/zygote.py): a service forked from it is what ``python -m`` would start — its own
session, stdin /dev/null, output in its log, its exit code and signals seen by the launcher — with the zygote's
imports already done; it refuses to fork when it has threads or another environment, and the fleet then spawns."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from deploy.local.fleet import Fleet, _stop_group, service_env
from deploy.local.zygote import REPO, ForkedProcess, Zygote, ZygoteError, model_module, runtime_overlay

pytestmark = pytest.mark.process

PROBE = "tests.deploy.zygote_probe"


def start(tmp_path: Path, preload: tuple[str, ...] = ("decimal", "fractions")) -> Zygote:
    zygote = Zygote.start(service_env(1), tmp_path / "zygote.log", preload=preload)
    assert zygote is not None
    return zygote


def probe(zygote: Zygote, tmp_path: Path, name: str, env: dict[str, str] | None = None,
          **config) -> tuple[ForkedProcess, Path, Path]:
    report, log = tmp_path / f"{name}.json", tmp_path / f"{name}.log"
    cfg = tmp_path / f"{name}.cfg"
    cfg.write_text(json.dumps({"report": str(report), **config}))
    return zygote.fork(PROBE, ["--config", str(cfg)], log, env or service_env(1)), report, log


def running(pid: int) -> bool:
    """Alive and not a zombie (a process re-parented to init is reaped by it, or not, depending on the host)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_forked_service_is_a_fresh_python_m_with_the_imports_done(tmp_path):
    zygote = start(tmp_path)
    try:
        proc, report, log = probe(zygote, tmp_path, "a", exit=3)
        assert proc.wait(timeout=30) == 3  # waitpid works: it is this process's child, with its exit code
        seen = json.loads(report.read_text())
        assert seen["preloaded"] == ["decimal", "fractions"]  # imported by the zygote, not by the service
        assert seen["pid"] == proc.pid == seen["pgid"] == seen["sid"]  # its own session and process group
        assert seen["stdin"] == os.devnull and seen["name"] == "__main__" and seen["threads"] == 1
        assert seen["argv"] == ["--config", str(tmp_path / "a.cfg")]
        text = log.read_text()
        assert "hello on stdout" in text and "hello on stderr" in text
        # the next one from the same zygote: a second service
        proc2, report2, _ = probe(zygote, tmp_path, "b")
        assert proc2.wait(timeout=30) == 0 and json.loads(report2.read_text())["pid"] != seen["pid"]
        assert "forked tests.deploy.zygote_probe" in (tmp_path / "zygote.log").read_text()
    finally:
        zygote.close()


def test_a_forked_service_may_run_in_another_directory_with_stderr_apart(tmp_path):
    """What tests/procs.run_module needs to stand for ``subprocess.run(capture_output=True, cwd=...)``: stdout in
    the log, stderr in a file of its own, the working directory asked for."""
    zygote = start(tmp_path)
    try:
        report, out, err = tmp_path / "r.json", tmp_path / "out.txt", tmp_path / "err.txt"
        (tmp_path / "r.cfg").write_text(json.dumps({"report": str(report)}))
        (work := tmp_path / "work").mkdir()
        proc = zygote.fork(PROBE, ["--config", str(tmp_path / "r.cfg")], out, service_env(1), cwd=work,
                           err_path=err)
        assert proc.wait(timeout=30) == 0
        assert json.loads(report.read_text())["cwd"] == str(work)
        assert out.read_text() == "probe says hello on stdout\n"
        assert err.read_text() == "probe says hello on stderr\n"
    finally:
        zygote.close()


def test_a_rank_and_fleetrl_settings_are_set_in_the_forked_service_and_nothing_else_may_differ(tmp_path, monkeypatch):
    monkeypatch.setenv("FLEETRL_PROBE_GONE", "zygote's")  # in the zygote's environment, unset for the service
    zygote = start(tmp_path)
    try:
        base = service_env(1)
        env = {**base, "RANK": "1", "WORLD_SIZE": "2", "FLEETRL_LEARNER__RUN_NAME": "r"}
        del env["FLEETRL_PROBE_GONE"]
        proc, report, _ = probe(zygote, tmp_path, "rank", env=env)
        assert proc.wait(timeout=30) == 0
        assert json.loads(report.read_text())["env"] == {"RANK": "1", "WORLD_SIZE": "2",
                                                        "FLEETRL_LEARNER__RUN_NAME": "r"}
        # the zygote's own environment is untouched: the next service sees the zygote's
        proc, report, _ = probe(zygote, tmp_path, "plain")
        assert proc.wait(timeout=30) == 0 and json.loads(report.read_text())["env"] == {"FLEETRL_PROBE_GONE": "zygote's"}
        for other in ({**base, "HF_HUB_OFFLINE": "0"}, {**base, "FLEETRL_ZYGOTE": "1"}):  # read at import / by us
            with pytest.raises(ZygoteError, match="environment differs"):
                probe(zygote, tmp_path, "other", env=other)
    finally:
        zygote.close()


def test_runtime_overlay_names_what_a_service_sets_and_unsets():
    base = {"PATH": "/bin", "RANK": "0", "FLEETRL_X": "1"}
    assert runtime_overlay(base, dict(base)) == {}
    assert runtime_overlay(base, {"PATH": "/bin", "RANK": "3", "MASTER_PORT": "29500"}) == {
        "RANK": "3", "MASTER_PORT": "29500", "FLEETRL_X": None}
    assert runtime_overlay(base, {**base, "PATH": "/usr/bin"}) is None
    assert runtime_overlay(base, {**base, "OMP_NUM_THREADS": "2"}) is None
    # torch writes its compile cache's directory into the environment of a process that touched it (a test
    # worker, after an FSDP test): every later service of that worker was started afresh, not forked
    assert runtime_overlay(base, {**base, "TORCHINDUCTOR_CACHE_DIR": "/tmp/torchinductor_x"}) == {
        "TORCHINDUCTOR_CACHE_DIR": "/tmp/torchinductor_x"}


def test_a_crash_is_exit_1_with_the_services_own_traceback(tmp_path):
    zygote = start(tmp_path)
    try:
        proc, _, log = probe(zygote, tmp_path, "c", **{"raise": True})
        assert proc.wait(timeout=30) == 1
        text = log.read_text()
        assert "RuntimeError: probe failed on purpose" in text
        assert "_serve" not in text and "_BecomeService" not in text  # none of the zygote's frames
    finally:
        zygote.close()


def test_the_fleet_stops_a_forked_service_by_its_process_group(tmp_path):
    zygote = start(tmp_path)
    try:
        proc, report, _ = probe(zygote, tmp_path, "d", sleep=60)
        deadline = time.monotonic() + 30
        while not report.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None
        assert _stop_group(proc, timeout=10) == -signal.SIGTERM
    finally:
        zygote.close()


def test_the_services_live_on_after_the_zygote_ends(tmp_path):
    zygote = start(tmp_path)
    proc, report, _ = probe(zygote, tmp_path, "e", sleep=1)
    zygote.close()
    assert zygote.proc.returncode == 0
    assert proc.wait(timeout=30) == 0 and report.exists()


def test_closing_stops_a_service_whose_answer_was_never_read_and_kills_a_zygote_that_forked_nothing(tmp_path):
    zygote = start(tmp_path)
    cfg, report = tmp_path / "h.cfg", tmp_path / "h.json"
    cfg.write_text(json.dumps({"report": str(report), "sleep": 60}))
    zygote.ready = zygote._read(60)
    zygote._asked = True  # as fork() does; then the caller is interrupted before it reads the answer
    zygote.proc.stdin.write((json.dumps({"module": PROBE, "argv": ["--config", str(cfg)], "log": str(tmp_path / "h.log"),
                                         "cwd": str(REPO), "env": service_env(1)}) + "\n").encode())
    zygote.proc.stdin.flush()
    deadline = time.monotonic() + 30
    while not report.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    pid = json.loads(report.read_text())["pid"]
    zygote.close()
    deadline = time.monotonic() + 30
    while running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not running(pid)
    # a zygote still importing (it forked nothing) is killed, not waited for
    slow = start(tmp_path / "slow", preload=("tests.deploy.zygote_slow",))
    slow.close()
    assert slow.proc.returncode == -signal.SIGKILL


def test_a_zygote_with_threads_or_another_environment_does_not_fork_and_the_fleet_spawns(tmp_path):
    zygote = start(tmp_path, preload=("tests.deploy.zygote_thread",))
    try:
        with pytest.raises(ZygoteError, match="threads; forking it is not safe"):
            probe(zygote, tmp_path, "f")
        cfg = tmp_path / "g.cfg"
        cfg.write_text("{}")
        with pytest.raises(ZygoteError, match="environment differs"):
            zygote.fork(PROBE, ["--config", str(cfg)], tmp_path / "g.log", service_env(2))
        # a fleet with that zygote still starts its service, spawned, and says so in the service's log
        fleet = Fleet(run_dir=tmp_path / "run", zygote=zygote)
        svc = fleet.start("reward-0", "services.reward", {"scorers": [{"name": "exact", "kind": "rule",
                                                                         "check": {"type": "exact"}}]}, timeout=120)
        try:
            assert isinstance(svc.proc, subprocess.Popen)
            assert httpx.get(f"{svc.url}/health", timeout=5).status_code == 200
            assert "spawned, not forked from the zygote (the zygote has" in svc.log_tail()
        finally:
            fleet.stop_all()
        assert fleet.zygote is None and zygote.proc.returncode is not None  # stop_all ended the zygote
    finally:
        zygote.close()


def test_fleet_forks_a_real_service_from_the_zygote(tmp_path):
    zygote = start(tmp_path, preload=("fastapi", "uvicorn", "services.reward.cli", "services.reward.app"))
    fleet = Fleet(run_dir=tmp_path / "run", zygote=zygote)
    try:
        svc = fleet.start("reward-0", "services.reward", {"scorers": [{"name": "exact", "kind": "rule",
                                                                     "check": {"type": "exact"}}]}, timeout=120)
        assert isinstance(svc.proc, ForkedProcess)
        r = httpx.get(f"{svc.url}/scorers", timeout=10)
        assert r.status_code == 200 and "exact" in r.text, r.text
        fleet.restart("reward-0", timeout=120)  # a restart forks again
        assert isinstance(fleet.services["reward-0"].proc, ForkedProcess)
    finally:
        fleet.stop_all()


def test_model_module_names_the_transformers_modeling_module(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert model_module(tmp_path) == "transformers.models.llama.modeling_llama"
    assert model_module(tmp_path / "missing") is None


def test_no_zygote_with_fleetrl_zygote_0_or_on_a_host_with_an_nvidia_driver(tmp_path, monkeypatch):
    import deploy.local.zygote as zygote_module

    monkeypatch.setenv("FLEETRL_ZYGOTE", "0")
    assert Zygote.start(service_env(1), tmp_path / "z.log") is None
    monkeypatch.delenv("FLEETRL_ZYGOTE")
    # CUDA does not survive a fork once initialised, and an import may initialise it: GPU hosts spawn
    monkeypatch.setattr(zygote_module.shutil, "which", lambda name: f"/usr/bin/{name}")
    assert Zygote.start(service_env(1), tmp_path / "z.log") is None
    assert not (tmp_path / "z.log").exists()
