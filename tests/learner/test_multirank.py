"""Two learner ranks (real processes, gloo) fed by the fake fleet through real Redis.

Rank 0 serves HTTP, consumes the queue and ships each rank its shard; rank 1 only trains. With the replicated
``torch`` backend both ranks hold byte-identical weights after the run; with ``fsdp`` (the default on more than
one rank) each holds half of them: rank 0 publishes them gathered from both, each rank writes its shards into
the checkpoint, and the final export is read from the last checkpoint. Either way the 2-rank run equals a 1-rank
run on the same batches.
"""

import asyncio
import json

import httpx
import pytest
import yaml
from safetensors.torch import load_file

from services.learner.checkpoint import CheckpointManager
from services.learner.observability import read_history
from shared import keys
from shared.experience_queue import StreamQueue
from shared.ports import free_port
from shared.schemas import Experience
from tests.learner.deepspeed_site import NO_DEEPSPEED, SKIP_REASON, deepspeed_env
from tests.learner.fake_rollout import FakeFleet
from tests.learner.test_process import ENV, status, wait_exit, wait_for
from tests.procs import spawn, stop, wait_http_ok

pytestmark = pytest.mark.process  # multi-rank: one learner process per rank

N_PROMPTS, GROUP = 5, 4  # steps of 2, 2 and 1 groups: rank 1 gets an empty shard in the last one


def write_config(tmp_path, name, tiny_model_dir, redis_url, n_prompts=N_PROMPTS, **extra) -> tuple:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"input": f"question {i}", "label": i}) + "\n" for i in range(n_prompts)))
    run_dir = tmp_path / name
    cfg = {
        "port": free_port(), "redis_url": redis_url, "run_name": name, "run_dir": str(run_dir), "log_level": "INFO",
        "model": {"actor": str(tiny_model_dir), "device": "cpu"},
        "optim": {"actor_lr": 1e-3, "warmup_ratio": 0.0},
        "train": {"groups_per_step": 2, "micro_batch_size": 8, "torch_threads": 1},
        # group baselines (shards keep groups whole), reward statistics and whitening over the whole batch
        "algorithm": {"name": "grpo", "normalize_rewards": True, "normalize_advantages": True},
        "data": {"path": str(prompts), "shuffle": False},
        "rollout": {"group_size": GROUP, "window": 2}, "run": {"max_staleness": 100},
        "queue": {"block_ms": 100},
        "checkpoint": {"every": 2, "export_dir": str(run_dir / "export")},
        "observability": {"progress_bar": False, "log_sample_ids": True, "plot": False},
        "distributed": {"timeout_s": 60, "heartbeat_s": 2},
        "backend": {"name": "torch"},  # the replicated backend (its replica digests); a test may name another
        "allow_unsigned_records": True,  # the test feeds the experiences by hand, without a run_key
    }
    for key, value in extra.items():
        cfg[key] = {**cfg.get(key, {}), **value} if isinstance(value, dict) else value
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path, run_dir, f"http://127.0.0.1:{cfg['port']}"


def rank_env(rank: int, world: int, master_port: int) -> dict[str, str]:
    return {**ENV, "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(master_port)}


async def two_ranks_beside_one(tmp_path, model, redis_server, redis_client, name: str, backend: dict,
                               extra_env: dict[str, str] | None = None) -> tuple:
    """Run ``name`` (two learner ranks on ``backend``) and ``one`` (one ``torch`` rank) to the end against fake
    fleets on the same prompts; each must exit 0. Returns both run dirs and the logs' tails by process name."""
    cfg, run_dir, _ = write_config(tmp_path, name, model, redis_server.url, backend=backend)
    one_cfg, one_dir, _ = write_config(tmp_path, "one", model, redis_server.url)
    fleets = [FakeFleet(redis_client, name), FakeFleet(redis_client, "one")]
    tasks = [asyncio.create_task(f.run_forever(consumer=f"fake-{f.run}")) for f in fleets]
    master = free_port()
    args = ["-m", "services.learner", "--config"]
    procs = [spawn([*args, str(cfg)], tmp_path / f"{name}{r}.log", {**rank_env(r, 2, master), **(extra_env or {})})
             for r in (0, 1)]
    procs.append(spawn([*args, str(one_cfg)], tmp_path / "one.log", ENV))
    try:
        codes = [await wait_exit(p, 330) for p in procs]
    finally:
        for p in procs:
            stop(p)
        for f, t in zip(fleets, tasks):
            await f.stop(t)
    logs = {n: (tmp_path / f"{n}.log").read_text()[-3000:] for n in (f"{name}0", f"{name}1", "one")}
    assert codes == [0, 0, 0], logs
    return run_dir, one_dir, logs


@pytest.mark.timeout(360)
@pytest.mark.parametrize("backend", ["torch", "auto"])  # auto: fsdp on two ranks
async def test_two_ranks_match_each_other_and_one_rank(tmp_path, tiny_model_dir, redis_server, redis_client, backend):
    dp_dir, one_dir, logs = await two_ranks_beside_one(tmp_path, tiny_model_dir, redis_server, redis_client, "dp",
                                                       {"name": backend})
    assert "following rank 0" in logs["dp1"] and "stopping after 3 steps" in logs["dp1"], logs["dp1"]
    assert "Uvicorn running" not in logs["dp1"]  # followers serve no HTTP

    # the same batches, step by step, in both runs
    dp_hist, one_hist = read_history(dp_dir / "metrics.jsonl"), read_history(one_dir / "metrics.jsonl")
    assert sorted(dp_hist) == sorted(one_hist) == [1, 2, 3]
    for step in dp_hist:
        assert sorted(dp_hist[step]["sample_ids"]) == sorted(one_hist[step]["sample_ids"])
        assert dp_hist[step]["samples"] == one_hist[step]["samples"] == (2 if step < 3 else 1) * GROUP

    final = CheckpointManager(dp_dir / "checkpoints", 2).latest()
    assert final is not None and final.name == "step-00000003"
    assert ("learner backend fsdp" in (tmp_path / "dp0.log").read_text()) == (backend == "auto"), logs["dp0"]
    for ckpt in (dp_dir / "checkpoints").glob("step-*"):
        replicas = ckpt / "trainer" / "replicas.json"
        assert len(list((ckpt / "trainer" / "state").glob("*.safetensors"))) == 2  # each rank wrote its shards
        if backend == "torch":  # rank 0 and rank 1 hold byte-identical weights (digests gathered from both ranks)
            digests = json.loads(replicas.read_text())["actor_sha256"]
            assert len(digests) == 2 and digests[0] == digests[1], digests
        else:  # sharded: no rank holds a replica, and none gathers the weights into the checkpoint
            assert not replicas.exists() and not (ckpt / "trainer" / "actor" / "model.safetensors").exists()

    # 2 ranks x 4 samples == 1 rank x 8 samples (float summation order aside)
    base = load_file(str(tiny_model_dir / "model.safetensors"))
    dp_w = load_file(str(dp_dir / "export" / "model.safetensors"))
    one_w = load_file(str(one_dir / "export" / "model.safetensors"))
    assert dp_w.keys() == one_w.keys()
    moved = max(float((one_w[k].float() - base[k].float()).abs().max()) for k in base if k in one_w)
    assert moved > 1e-3  # training did change the weights
    worst = max(float((dp_w[k].float() - one_w[k].float()).abs().max()) for k in dp_w)
    assert worst < 1e-5, worst

    # rank 0 settled everything it consumed
    for run in ("dp", "one"):
        stats = await StreamQueue(redis_client, keys.experiences_stream(run), "learner", Experience).stats()
        assert stats.pending == 0, (run, stats)


@pytest.mark.timeout(120)
async def test_checkpoint_and_stop_on_rank0_reach_the_follower(tmp_path, tiny_model_dir, redis_server, redis_client):
    cfg, run_dir, url = write_config(tmp_path, "ctl", tiny_model_dir, redis_server.url, control_token="tok")
    fleet = FakeFleet(redis_client, "ctl", budget=0)  # nothing arrives: rank 0 waits and heartbeats the follower
    task = asyncio.create_task(fleet.run_forever(consumer="fake-ctl"))
    master = free_port()
    procs = [spawn(["-m", "services.learner", "--config", str(cfg)], tmp_path / f"ctl{r}.log", rank_env(r, 2, master))
             for r in (0, 1)]
    auth = {"Authorization": "Bearer tok"}
    try:
        await asyncio.to_thread(wait_http_ok, f"{url}/health", procs[0], 90, tmp_path / "ctl0.log")
        await wait_for(lambda: status(url)["phase"] == "running", 60, "running")
        await asyncio.sleep(2.5)  # longer than heartbeat_s: the follower got a NOOP and is still in step
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            r = await http.post("/checkpoint", headers=auth)
            assert r.status_code == 200 and r.json()["step"] == 0, r.text
            st = (await http.get("/status")).json()
            assert st["ranks"] == 2 and len(st["replica_digests"]) == 2
            assert st["replica_digests"][0] == st["replica_digests"][1]
            assert (await http.post("/stop", headers=auth)).status_code == 202
        codes = [await wait_exit(p, 60) for p in procs]
    finally:
        for p in procs:
            stop(p)
        await fleet.stop(task)
    assert codes == [0, 0], [(tmp_path / f"ctl{r}.log").read_text()[-3000:] for r in (0, 1)]
    assert (run_dir / "checkpoints" / "step-00000000" / "trainer" / "replicas.json").is_file()
    assert "stopping after 0 steps" in (tmp_path / "ctl1.log").read_text()


@pytest.mark.slow
@pytest.mark.timeout(360)
@pytest.mark.skipif(NO_DEEPSPEED, reason=SKIP_REASON)
async def test_two_cpu_ranks_deepspeed_zero3_match_one_torch_rank(tmp_path, tiny_model_dir, redis_server,
                                                                   redis_client):
    """``backend: {name: deepspeed, zero_stage: 3}`` through the learner service on two CPU ranks (DeepSpeed's CPU
    accelerator, gloo): the fake fleet's steps (the last one leaves rank 1 an empty shard), weights published
    from the ZeRO-3 partitions each step, DeepSpeed's own checkpoint files from both ranks, the export read from
    the last checkpoint; the exported model equals a one-rank torch run's."""
    ds_dir, one_dir, logs = await two_ranks_beside_one(tmp_path, tiny_model_dir, redis_server, redis_client, "ds",
                                                       {"name": "deepspeed", "zero_stage": 3}, deepspeed_env())
    assert "learner backend deepspeed on cpu" in (tmp_path / "ds0.log").read_text(), logs["ds0"]
    assert sorted(read_history(ds_dir / "metrics.jsonl")) == [1, 2, 3]
    assert int(await redis_client.get(keys.weights_version("ds"))) >= 3  # published after each step
    final = CheckpointManager(ds_dir / "checkpoints", 2).latest()
    assert final is not None and final.name == "step-00000003"
    ds_files = sorted(p.name for p in (final / "trainer" / "actor_optim" / "ds").iterdir())
    assert sum("optim_states" in n for n in ds_files) == 2, ds_files  # each rank wrote its partition

    base = load_file(str(tiny_model_dir / "model.safetensors"))
    ds_w = load_file(str(ds_dir / "export" / "model.safetensors"))
    one_w = load_file(str(one_dir / "export" / "model.safetensors"))
    assert ds_w.keys() == one_w.keys()
    assert max(float((one_w[k].float() - base[k].float()).abs().max()) for k in base if k in one_w) > 1e-3
    worst = max(float((ds_w[k].float() - one_w[k].float()).abs().max()) for k in ds_w)
    assert worst < 1e-5, worst


@pytest.mark.gpu
@pytest.mark.timeout(600)
async def test_two_gpu_ranks_deepspeed_zero3(tmp_path, tiny_model_dir, redis_server, redis_client):
    """Two GPUs, DeepSpeed ZeRO-3: rank 0 publishes gathered weights, checkpoints are written by both ranks."""
    torch = pytest.importorskip("torch")

    if NO_DEEPSPEED or torch.cuda.device_count() < 2:
        pytest.skip("needs deepspeed and two CUDA GPUs")
    cfg, run_dir, _ = write_config(tmp_path, "ds", tiny_model_dir, redis_server.url, n_prompts=6,  # even shards
                                model={"device": "cuda", "dtype": "bfloat16"},
                                backend={"name": "deepspeed", "zero_stage": 3, "bf16": True},
                                train={"micro_batch_size": 4})
    fleet = FakeFleet(redis_client, "ds")
    task = asyncio.create_task(fleet.run_forever(consumer="fake-ds"))
    master = free_port()
    procs = [spawn(["-m", "services.learner", "--config", str(cfg)], tmp_path / f"ds{r}.log",
                   {**rank_env(r, 2, master), **(deepspeed_env() or {})})
             for r in (0, 1)]
    try:
        codes = [await wait_exit(p, 500) for p in procs]
    finally:
        for p in procs:
            stop(p)
        await fleet.stop(task)
    assert codes == [0, 0], [(tmp_path / f"ds{r}.log").read_text()[-3000:] for r in (0, 1)]
    assert sorted(read_history(run_dir / "metrics.jsonl")) == [1, 2, 3]
    assert int(await redis_client.get(keys.weights_version("ds"))) >= 3
    final = CheckpointManager(run_dir / "checkpoints", 2).latest()
    assert final is not None and (final / "trainer" / "actor_optim" / "ds").is_dir()
