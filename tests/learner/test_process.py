"""The learner as a real process: HTTP surface, control plane, and SIGKILL mid-run -> exact resume."""

import asyncio
import json
import subprocess
import time

import httpx
import pytest
import yaml

from services.learner.observability import read_history
from shared import keys
from shared.experience_queue import ProcessedIds, StreamQueue
from shared.ports import free_port
from shared.schemas import Experience
from tests.learner.fake_rollout import FakeFleet
from tests.procs import kill9, one_error_line, run_module, spawn, stop, wait_http_ok

pytestmark = pytest.mark.process  # the learner as a process

TOKEN = "s3cret"
ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def write_config(tmp_path, tiny_model_dir, redis_url, n_prompts, **extra) -> tuple:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"input": f"question {i}", "label": i}) + "\n" for i in range(n_prompts)))
    port = free_port()
    cfg = {
        "port": port, "redis_url": redis_url, "run_name": "proc", "run_dir": str(tmp_path / "run"),
        "control_token": TOKEN, "log_level": "INFO",
        "model": {"actor": str(tiny_model_dir), "device": "cpu"},
        "optim": {"actor_lr": 1e-3, "warmup_ratio": 0.0},
        "train": {"groups_per_step": 2, "micro_batch_size": 8, "torch_threads": 1},
        "algorithm": {"name": "grpo"},
        "data": {"path": str(prompts)},
        "rollout": {"group_size": 4, "window": 4}, "run": {"max_staleness": 3},
        "queue": {"block_ms": 200},
        "checkpoint": {"every": 2},
        "observability": {"progress_bar": False, "log_sample_ids": True},
        "allow_unsigned_records": True,  # these tests play the rollout fleet by hand, without a run_key
        **extra,
    }
    path = tmp_path / "learner.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path, f"http://127.0.0.1:{port}"


async def test_without_a_redis_url_the_learner_runs_a_private_redis_under_its_run_dir(tmp_path, tiny_model_dir,
                                                                                    monkeypatch):
    """The entry point composes the process: no redis_url anywhere -> an embedded server under run_dir/redis,
    handed to the service, stopped when the learner exits."""
    import re
    import socket

    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.delenv("FLEETRL_LEARNER_REDIS_URL", raising=False)
    cfg, url = write_config(tmp_path, tiny_model_dir, None, n_prompts=8)
    log = tmp_path / "learner.log"
    proc = spawn(["-m", "services.learner", "--config", str(cfg)], log, ENV)
    try:
        await asyncio.to_thread(wait_http_ok, f"{url}/health", proc, 90, log)
        await wait_for(lambda: status(url)["phase"] == "running", 60, "running")
        assert status(url)["prompts_in_flight"] == 4  # issued to the prompts stream: the queue works
        async with httpx.AsyncClient(base_url=url, timeout=5) as http:
            assert (await http.get("/health")).json()["redis"] == "ok"
        embedded = re.search(r"a private embedded Redis at redis://:\*\*\*@127\.0\.0\.1:(\d+)/0", log.read_text())
        assert embedded, log.read_text()[-3000:]
        stop(proc)
        assert "User requested shutdown" in (tmp_path / "run" / "redis" / "redis.log").read_text()  # a clean stop
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", int(embedded.group(1)))) != 0, "the embedded Redis outlived the learner"
    finally:
        stop(proc)


def status(url: str) -> dict:
    return httpx.get(f"{url}/status", timeout=5).json()


async def wait_for(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = pred()
            if last:
                return last
        except httpx.HTTPError:
            pass
        await asyncio.sleep(0.2)
    raise TimeoutError(f"timed out waiting for {what} (last: {last})")


async def wait_exit(proc: subprocess.Popen, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        assert time.monotonic() < deadline, "learner did not exit"
        await asyncio.sleep(0.2)
    return proc.returncode


def test_bad_config_exits_2_with_a_message(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"model": {"actor": "x"}, "data": {"path": "p.jsonl"}, "algorithm": {"name": "a2c"}}))
    out = run_module(["-m", "services.learner", "--config", str(bad)], timeout=60)
    assert out.returncode == 2 and "algorithm" in out.stderr and "a2c" in out.stderr


def test_a_learner_that_disagrees_with_the_runs_record_exits_2_naming_the_field(tmp_path, tiny_model_dir,
                                                                             redis_server):
    """A rollout replica started first wrote the run's record (shared/run_settings.py); a learner given another
    run.max_staleness refuses before it loads anything, in one line."""
    import redis

    from shared.run_settings import RunSettings, check_run_record

    run = "proc-disagree"  # a name of its own: the record stays in this Redis after the test
    with redis.Redis.from_url(redis_server.url, socket_timeout=10) as client:
        client.delete(keys.run_settings(run))
    assert check_run_record(redis_server.url, run, RunSettings(max_staleness=1), None, "rollout") is None
    cfg, _ = write_config(tmp_path, tiny_model_dir, redis_server.url, n_prompts=8, run_name=run)  # staleness 3
    out = run_module(["-m", "services.learner", "--config", str(cfg)], timeout=120)
    assert one_error_line(out).startswith(f"error: run '{run}': run.max_staleness is 3 here but 1 in the run's record "
                                "(written by rollout at ")
    assert not (tmp_path / "run" / "checkpoints").exists()


async def test_http_surface_and_control(tmp_path, tiny_model_dir, redis_server, redis_client):
    cfg, url = write_config(tmp_path, tiny_model_dir, redis_server.url, n_prompts=8)
    fleet = FakeFleet(redis_client, "proc", budget=0)  # nothing arrives: the learner waits for experiences
    fleet_task = asyncio.create_task(fleet.run_forever())
    proc = spawn(["-m", "services.learner", "--config", str(cfg)], tmp_path / "learner.log", ENV)
    try:
        await asyncio.to_thread(wait_http_ok, f"{url}/health", proc, 90, tmp_path / "learner.log")
        await wait_for(lambda: status(url)["phase"] == "running", 60, "running")
        st = status(url)
        assert st["step"] == 0 and st["weight_version"] == 0 and st["prompts_in_flight"] == 4
        assert st["counters"]["experiences_consumed"] == 0 and st["algorithm"] == "grpo"
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            metrics = (await http.get("/metrics")).text
            assert "fleetrl_learner_prompts_issued_total 4.0" in metrics
            assert "fleetrl_learner_staleness_bucket" in metrics
            assert (await http.post("/checkpoint")).status_code == 401
            bad = await http.post("/stop", headers={"Authorization": "Bearer nope"})
            assert bad.status_code == 401
            auth = {"Authorization": f"Bearer {TOKEN}"}
            r = await http.post("/checkpoint", headers=auth)
            assert r.status_code == 200 and r.json()["step"] == 0, r.text
            assert (tmp_path / "run" / "checkpoints" / "step-00000000" / "COMPLETE").is_file()
            assert (await http.get("/status")).json()["last_checkpoint"].endswith("step-00000000")
            r = await http.post("/stop", headers=auth)
        assert r.status_code == 202 and r.json()["stopping"] is True
        assert await wait_exit(proc, 60) == 0
    finally:
        stop(proc)
        await fleet.stop(fleet_task)


async def test_sigkill_mid_run_resumes_without_losing_or_double_training(tmp_path, tiny_model_dir, redis_server,
                                                                        redis_client):
    n_prompts, group = 12, 4
    cfg, url = write_config(tmp_path, tiny_model_dir, redis_server.url, n_prompts=n_prompts)
    fleet = FakeFleet(redis_client, "proc", budget=6)  # enough groups for 3 steps, then the fleet stalls
    fleet_task = asyncio.create_task(fleet.run_forever())
    log1, log2 = tmp_path / "learner1.log", tmp_path / "learner2.log"
    proc = spawn(["-m", "services.learner", "--config", str(cfg)], log1, ENV)
    try:
        await asyncio.to_thread(wait_http_ok, f"{url}/health", proc, 90, log1)
        await wait_for(lambda: status(url)["step"] == 3, 90, "step 3")
        await asyncio.sleep(0.3)
        kill9(proc)  # checkpoint at step 2; step 3 trained but not committed

        exp_q = StreamQueue(redis_client, keys.experiences_stream("proc"), "learner", Experience)
        pending = (await exp_q.stats()).pending
        assert pending >= 2 * group, "step 3's experiences must still be pending (ack only at a checkpoint)"
        processed = ProcessedIds(redis_client, keys.processed_ids("proc", "learner"))
        assert await processed.count() == 2 * 2 * group  # steps 1-2 committed
        ckpts = sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("step-*"))
        assert ckpts[-1] == "step-00000002"
        version_at_crash = int(await redis_client.get(keys.weights_version("proc")))

        fleet.budget = 10**6
        proc = spawn(["-m", "services.learner", "--config", str(cfg)], log2, ENV)
        assert await wait_exit(proc, 120) == 0, log2.read_text()[-3000:]
    finally:
        stop(proc)
        await fleet.stop(fleet_task)

    log_text = log2.read_text()
    assert "resuming from" in log_text and "step-00000002" in log_text
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [int(x["step"]) for x in lines]
    assert steps == [1, 2, 3, 3, 4, 5, 6], steps  # step 3 replayed after the crash, then the count continues
    # the committed history: each step's last record. No sample twice, every prompt's group once.
    history = read_history(tmp_path / "run" / "metrics.jsonl")
    trained = [sid for row in history.values() for sid in row["sample_ids"]]
    assert len(trained) == len(set(trained)) == n_prompts * group
    assert {sid.split("#")[0] for sid in trained} == {f"e0-{i}" for i in range(n_prompts)}
    # versions keep rising across the restart (the restored weights were published as a new version)
    assert lines[3]["weight_version"] > version_at_crash
    assert int(await redis_client.get(keys.weights_version("proc"))) == lines[-1]["weight_version"]
    # everything settled: nothing pending, every sample marked processed exactly once
    stats = await StreamQueue(redis_client, keys.experiences_stream("proc"), "learner", Experience).stats()
    assert stats.pending == 0 and stats.backlog == 0
    assert await ProcessedIds(redis_client, keys.processed_ids("proc", "learner")).count() == n_prompts * group
    final = json.loads((tmp_path / "run" / "checkpoints" / "step-00000006" / "run_state.json").read_text())
    assert final["counters"]["samples_trained"] == n_prompts * group and final["in_flight"] == {}
    assert (tmp_path / "run" / "reward_curve.png").is_file()


def lineage_sample_ids(run_dir) -> list[str]:
    """Sample ids of the committed history: each step's last record (a step replayed after a crash counts once)."""
    return [sid for row in read_history(run_dir / "metrics.jsonl").values() for sid in row["sample_ids"]]


@pytest.mark.slow  # three learner starts, two crashes: 51-70 s in make test's two workers at load 8-12
async def test_two_crashes_between_checkpoints_dead_letter_nothing_and_the_run_finishes(
        tmp_path, tiny_model_dir, redis_server, redis_client):
    """After a crash the learner holds more pending experiences than one read returns (consume_count 3). The
    restarted learner must page through them once, without raising their delivery counts: a second crash
    before the next checkpoint must find them all still pending (not dead-lettered), and the run finishes."""
    n_prompts, group = 12, 4
    cfg, url = write_config(tmp_path, tiny_model_dir, redis_server.url, n_prompts=n_prompts,
                            queue={"block_ms": 100, "consume_count": 3, "max_deliveries": 3})
    fleet = FakeFleet(redis_client, "proc", budget=6)  # groups for 3 steps, then the fleet stalls
    fleet_task = asyncio.create_task(fleet.run_forever())
    logs = [tmp_path / f"learner{i}.log" for i in range(3)]
    exp_q = StreamQueue(redis_client, keys.experiences_stream("proc"), "learner", Experience)
    proc = spawn(["-m", "services.learner", "--config", str(cfg)], logs[0], ENV)
    try:
        await asyncio.to_thread(wait_http_ok, f"{url}/health", proc, 90, logs[0])
        await wait_for(lambda: status(url)["step"] == 3, 90, "step 3")
        await asyncio.sleep(0.3)
        kill9(proc)  # checkpoint at step 2; step 3 trained, not committed; more groups held, buffered
        held = (await exp_q.stats()).pending
        assert held > 3
        proc = spawn(["-m", "services.learner", "--config", str(cfg)], logs[1], ENV)
        await asyncio.to_thread(wait_http_ok, f"{url}/health", proc, 90, logs[1])
        await wait_for(lambda: status(url)["step"] == 3, 90, "step 3 replayed")
        await asyncio.sleep(3.0)  # the fleet is stalled: the learner keeps reading while it waits for groups
        kill9(proc)  # the second crash, before the next checkpoint
        stats = await exp_q.stats()
        assert stats.dead_letters == 0, await exp_q.dead_letters()
        assert stats.pending == held, "every held experience is still pending for the next restart"
        fleet.budget = 10**6
        proc = spawn(["-m", "services.learner", "--config", str(cfg)], logs[2], ENV)
        assert await wait_exit(proc, 120) == 0, logs[2].read_text()[-3000:]
    finally:
        stop(proc)
        await fleet.stop(fleet_task)
    trained = lineage_sample_ids(tmp_path / "run")
    assert len(trained) == len(set(trained)) == n_prompts * group
    stats = await exp_q.stats()
    assert stats.dead_letters == 0 and stats.pending == 0 and stats.backlog == 0


async def test_redis_restart_mid_run_is_waited_out(tmp_path, tiny_model_dir):
    """Redis (AOF) is SIGKILLed mid-run and comes back 3 s later on the same port: the learner waits,
    says so in /status, reconnects, and finishes with every prompt trained once."""
    import os
    import signal

    import redis.asyncio as aioredis

    from shared.redis_server import EmbeddedRedis

    n_prompts, group = 12, 4
    server = EmbeddedRedis(data_dir=tmp_path / "redis").start()
    client = aioredis.from_url(server.url, socket_timeout=5, socket_connect_timeout=2)
    cfg, url = write_config(tmp_path, tiny_model_dir, server.url, n_prompts=n_prompts)
    fleet = FakeFleet(client, "proc", budget=4)  # two steps' worth, then the fleet waits
    fleet_task = asyncio.create_task(fleet.run_forever())
    log = tmp_path / "learner.log"
    proc = spawn(["-m", "services.learner", "--config", str(cfg)], log, ENV)
    try:
        await asyncio.to_thread(wait_http_ok, f"{url}/health", proc, 90, log)
        await wait_for(lambda: status(url)["step"] == 2, 90, "step 2")
        await asyncio.sleep(0.5)
        os.kill(server._proc.pid, signal.SIGKILL)
        server._proc.wait(10)
        server._proc = None
        seen = await wait_for(lambda: status(url)["phase"] == "waiting_for_redis" and status(url), 20,
                              "the learner to say it waits for Redis")
        assert "Redis unavailable" in seen["error"]
        await asyncio.sleep(3.0)
        assert proc.poll() is None, log.read_text()[-3000:]
        server.start()  # same port, same AOF
        fleet.budget = 10**6
        assert await wait_exit(proc, 120) == 0, log.read_text()[-3000:]
    finally:
        stop(proc)
        await fleet.stop(fleet_task)
        await client.aclose()
    try:
        text = log.read_text()
        assert "Redis answers again" in text
        trained = lineage_sample_ids(tmp_path / "run")
        assert len(trained) == len(set(trained)) == n_prompts * group
    finally:
        server.stop()
