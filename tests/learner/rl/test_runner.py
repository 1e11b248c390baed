"""The RL run owner in-process against a real Redis and a fake rollout fleet."""

import asyncio
import json
import time

import pytest

from services.learner.observability import read_history
from services.learner.service import LearnerService
from shared import keys
from shared.experience_queue import ProcessedIds, StreamQueue
from shared.schemas import Experience, PromptTask
from tests.learner.fake_rollout import FakeFleet
from tests.learner.helpers import settings

N_PROMPTS = 8


@pytest.fixture()
def prompts_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"input": f"question {i}", "label": i}) + "\n" for i in range(N_PROMPTS)))
    return path


def learner_settings(tiny_model_dir, tmp_path, redis_server, **sections):
    base = {"redis_url": redis_server.url, "exit_when_done": False, "algorithm": {"name": "grpo"},
            "rollout": {"window": 4}, "run": {"max_staleness": 1},
            "observability": {"progress_bar": False, "log_sample_ids": True},
            "checkpoint": {"every": 2}}
    for k, v in sections.items():
        base[k] = {**base[k], **v} if isinstance(base.get(k), dict) and k != "algorithm" else v
    return settings(tiny_model_dir, tmp_path, **base)


async def run_to_end(svc: LearnerService, timeout: float = 90.0) -> dict:
    await svc.start()
    deadline = asyncio.get_running_loop().time() + timeout
    while svc.runner.phase not in ("finished", "failed", "stopped"):
        assert asyncio.get_running_loop().time() < deadline, svc.status()
        await asyncio.sleep(0.05)
    status = svc.status()
    await svc.stop()
    return status


async def run_with_fleet(s, redis_client, **fleet_options) -> tuple[dict, LearnerService, FakeFleet]:
    """Run a learner to the end against a fake rollout fleet; the fleet is stopped however the run ends."""
    fleet = FakeFleet(redis_client, s.run_name, **fleet_options)
    fleet_task = asyncio.create_task(fleet.run_forever())
    svc = LearnerService(s)
    try:
        status = await run_to_end(svc)
    finally:
        await fleet.stop(fleet_task)
    return status, svc, fleet


def trained_items(run_dir) -> dict[str, int]:
    """Prompt item -> samples trained, from the last metrics line of each step."""
    out: dict[str, int] = {}
    for row in read_history(run_dir / "metrics.jsonl").values():
        for sid in row["sample_ids"]:
            item = "-".join(sid.split("#")[0].split("-")[:2])
            out[item] = out.get(item, 0) + 1
    return out


async def test_trains_every_prompt_once_and_acks_everything(tiny_model_dir, tmp_path, redis_server, redis_client,
                                                            prompts_file):
    s = learner_settings(tiny_model_dir, tmp_path, redis_server)
    status, svc, _ = await run_with_fleet(s, redis_client)
    assert status["phase"] == "finished", status
    assert status["step"] == status["total_steps"] == N_PROMPTS // 2
    # /status says the run's health (shared/training_health.py) from the learner's recent steps: a KL spike
    assert isinstance(status["health"], list)
    svc.runner.recent.extend([{"step": 100 + i, "kl": 0.01} for i in range(15)] + [{"step": 115, "kl": 0.9}])
    assert "kl" in [w["signal"] for w in svc.runner.status()["health"]]
    # plain torch, no LoRA: the actor was laid out flat and every bucket went out from its memory
    pub = svc.runner.publisher
    assert pub.outbox.in_place and all(pub.outbox.in_place) and all(b is None for b in pub.outbox.buffers)
    c = status["counters"]
    assert c["samples_trained"] == N_PROMPTS * 4 and c["groups_trained"] == N_PROMPTS
    assert c["experiences_deduplicated"] == 0 and c["experiences_dropped_stale"] == 0
    # weights published every step; the key holds the last version
    assert status["weight_version"] == 4 == int(await redis_client.get(keys.weights_version(s.run_name)))
    # every experience acknowledged and marked processed; nothing pending
    exp_q = StreamQueue(redis_client, keys.experiences_stream(s.run_name), "learner", Experience)
    stats = await exp_q.stats()
    assert stats.backlog == 0 and stats.pending == 0
    assert await ProcessedIds(redis_client, keys.processed_ids(s.run_name, "learner")).count() == N_PROMPTS * 4
    run_dir = tmp_path / "run"
    assert trained_items(run_dir) == {f"e0-{i}": 4 for i in range(N_PROMPTS)}
    # each publish is in the step's metrics and in Prometheus (the fake fleet has no weight receivers)
    rows = read_history(run_dir / "metrics.jsonl")
    assert all(r["publish_s"] > 0 and r["publish_loaded"] == r["publish_dropped"] == 0 for r in rows.values())
    assert svc.registry.get_sample_value("fleetrl_learner_publish_seconds_count") == 4
    # where the loop spent each step (benchmarks/vs_trl_trace.py prints it): every step trained and published; the
    # first waited for its experiences; from the second step on, writing the step before's line is in it too
    loops = [r["loop_s"] for _, r in sorted(rows.items())]
    assert all({"train", "publish", "feed", "log_samples", "pool_signal"} <= set(x) for x in loops), loops
    assert "receive" in loops[0], loops
    assert all("log_step" in x for x in loops[1:]) and all(v >= 0 for x in loops for v in x.values())
    last = status["last_publish"]  # also in GET /status
    assert last["version"] == 4 and last["loaded"] == [] and last["replicas_waiting"] == []
    assert set(last["phases"]) == {"plan", "manifest", "finish"}  # no replica: planned, nothing sent
    assert svc.registry.get_sample_value("fleetrl_learner_publish_phase_seconds", {"phase": "plan"}) > 0
    assert (run_dir / "reward_curve.png").stat().st_size > 1000
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("step-*")) == ["step-00000002", "step-00000004"]
    assert sum(status["staleness_histogram"].values()) == N_PROMPTS * 4


async def test_a_fresh_runs_first_prompts_go_out_while_the_trainer_loads(tiny_model_dir, tmp_path, redis_server,
                                                                          redis_client, prompts_file, monkeypatch):
    """Launch -> first step: the rollout fleet generates the first window while the learner builds its trainer
    (the trainer, built for real, looks at the prompt stream first; before the overlap it stayed empty)."""
    import redis as sync_redis

    from services.learner.training import rl_trainer

    s = learner_settings(tiny_model_dir, tmp_path, redis_server)
    stream = keys.prompts_stream(s.run_name)
    seen: list[int] = []

    class Observed(rl_trainer.RLTrainer):
        def __init__(self, *args, **kwargs) -> None:  # runs in the learner's loading thread
            client = sync_redis.Redis.from_url(redis_server.url)

            def added() -> int:  # prompts ever added (the fake fleet deletes what it took)
                try:
                    return int(client.xinfo_stream(stream)["entries-added"])
                except sync_redis.ResponseError:  # no stream yet
                    return 0

            deadline = time.monotonic() + 30.0
            while added() == 0 and time.monotonic() < deadline:
                time.sleep(0.05)
            seen.append(added())
            client.close()
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(rl_trainer, "RLTrainer", Observed)
    status, _, _ = await run_with_fleet(s, redis_client)
    assert status["phase"] == "finished", status
    assert status["step"] == status["total_steps"] == N_PROMPTS // 2
    assert len(seen) == 1 and seen[0] >= 1, seen  # prompts were out before the trainer existed


async def test_window_bounds_prompts_in_flight(tiny_model_dir, tmp_path, redis_server, redis_client, prompts_file):
    s = learner_settings(tiny_model_dir, tmp_path, redis_server, rollout={"window": 3}, train={"groups_per_step": 1})
    fleet = FakeFleet(redis_client, s.run_name, budget=0)  # a fleet that produces nothing yet
    fleet_task = asyncio.create_task(fleet.run_forever())
    svc = LearnerService(s)
    await svc.start()
    try:
        prompts = StreamQueue(redis_client, keys.prompts_stream(s.run_name), "rollout", PromptTask)
        for _ in range(200):
            if svc.runner.phase == "running" and (await prompts.stats()).length == 3:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
        assert (await prompts.stats()).length == 3 and svc.status()["prompts_in_flight"] == 3
        fleet.budget = 1  # one group through -> one step -> exactly one more prompt issued
        for _ in range(200):
            if svc.status()["step"] == 1 and svc.status()["counters"]["prompts_issued"] == 4:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        st = svc.status()
        assert st["step"] == 1 and st["counters"]["prompts_issued"] == 4 and st["prompts_in_flight"] == 3
    finally:
        await fleet.stop(fleet_task)
        await svc.stop()


async def test_stale_groups_are_dropped_and_their_prompts_reissued(tiny_model_dir, tmp_path, redis_server,
                                                                   redis_client, prompts_file):
    s = learner_settings(tiny_model_dir, tmp_path, redis_server, rollout={"window": 2}, run={"max_staleness": 1},
                         train={"groups_per_step": 1})
    # the fleet answers two prompts late (with weight version 0) after the learner moved on
    status, _, fleet = await run_with_fleet(s, redis_client, stale_prompt_ids={"e0-5", "e0-6"})
    assert status["phase"] == "finished", status
    c = status["counters"]
    assert c["experiences_dropped_stale"] == 8 and c["prompts_reissued"] == 2
    assert c["samples_trained"] == N_PROMPTS * 4
    assert {"e0-5-r1", "e0-6-r1"} <= set(fleet.produced_groups)
    assert trained_items(tmp_path / "run") == {f"e0-{i}": 4 for i in range(N_PROMPTS)}
    histogram = status["staleness_histogram"]
    assert set(histogram) <= {"0", "1"}  # max_staleness 1: nothing older was trained


async def test_malformed_experiences_are_rejected_and_the_prompt_retried(tiny_model_dir, tmp_path, redis_server,
                                                                      redis_client, prompts_file):
    s = learner_settings(tiny_model_dir, tmp_path, redis_server, rollout={"prompt_timeout_s": 1.0})
    status, _, fleet = await run_with_fleet(s, redis_client, bad_prompt_ids={"e0-3"})  # out-of-vocabulary ids
    c = status["counters"]
    assert status["phase"] == "finished", status
    assert c["experiences_rejected"] == 4 and c["prompts_reissued"] >= 1 and "e0-3-r1" in fleet.produced_groups
    assert trained_items(tmp_path / "run") == {f"e0-{i}": 4 for i in range(N_PROMPTS)}


async def test_redelivered_duplicates_are_dropped(tiny_model_dir, tmp_path, redis_server, redis_client, prompts_file):
    s = learner_settings(tiny_model_dir, tmp_path, redis_server)
    status, _, _ = await run_with_fleet(s, redis_client, duplicate=True)
    c = status["counters"]
    assert status["phase"] == "finished"
    assert c["samples_trained"] == N_PROMPTS * 4
    assert c["experiences_deduplicated"] >= N_PROMPTS * 4 - 8  # copies that arrived before the run ended
    assert trained_items(tmp_path / "run") == {f"e0-{i}": 4 for i in range(N_PROMPTS)}


async def test_sft_run_exports_a_model(tiny_model_dir, tmp_path, redis_server):
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps({"input": f"{i}+{i}=", "output": str(2 * i)}) + "\n" for i in range(6)))
    s = settings(tiny_model_dir, tmp_path, algorithm={"name": "sft", "batch_size": 4, "epochs": 2},
                 data={"path": str(path)}, exit_when_done=False,
                 observability={"progress_bar": False}, checkpoint={"export_dir": str(tmp_path / "sft-out")})
    status = await run_to_end(LearnerService(s))
    assert status["phase"] == "finished" and status["step"] == 4 and status["epoch"] == 2
    assert (tmp_path / "sft-out" / "config.json").is_file() and (tmp_path / "sft-out" / "tokenizer.json").is_file()
    history = read_history(tmp_path / "run" / "metrics.jsonl")
    assert history[4]["sft_loss"] < history[1]["sft_loss"]


async def test_dead_lettered_prompts_are_reissued_at_once_then_given_up_with_the_reason(
        tiny_model_dir, tmp_path, redis_server, redis_client, prompts_file):
    """The fleet dead-letters every attempt of one prompt. The learner must not wait prompt_timeout_s (900 s)
    for a group that will never come: it re-issues the prompt at once, gives the position up after
    dead_letter_retries, says why, and finishes the run."""
    s = learner_settings(tiny_model_dir, tmp_path, redis_server, rollout={"dead_letter_retries": 1})
    assert s.rollout.prompt_timeout_s == 900
    status, _, _ = await run_with_fleet(s, redis_client, poison_keys={"e0-3"})
    assert status["phase"] == "finished", status
    c = status["counters"]
    assert c["prompts_abandoned"] == 1 and c["samples_trained"] == (N_PROMPTS - 1) * 4
    assert c["prompts_reissued"] == 1  # attempt 0 dead-lettered -> re-issued once -> dead-lettered -> given up
    assert "e0-3" in status["abandoned"] and "longer than the context" in status["abandoned"]["e0-3"]
    assert trained_items(tmp_path / "run") == {f"e0-{i}": 4 for i in range(N_PROMPTS) if i != 3}


async def test_a_prompt_dead_lettered_as_permanent_is_given_up_at_once_not_reissued(
        tiny_model_dir, tmp_path, redis_server, redis_client, prompts_file):
    """A worker that knows a task can never succeed dead-letters it as permanent (PermanentTaskError): issuing it
    again cannot help, so the learner gives the position up at once, whatever dead_letter_retries allows."""
    s = learner_settings(tiny_model_dir, tmp_path, redis_server, rollout={"dead_letter_retries": 3})
    status, _, _ = await run_with_fleet(s, redis_client, poison_keys={"e0-3"}, permanent=True)
    assert status["phase"] == "finished", status
    c = status["counters"]
    assert c["prompts_abandoned"] == 1 and c["prompts_reissued"] == 0
    assert "can never succeed" in status["abandoned"]["e0-3"] and "longer than the context" in status["abandoned"]["e0-3"]
    assert trained_items(tmp_path / "run") == {f"e0-{i}": 4 for i in range(N_PROMPTS) if i != 3}


async def test_a_prompt_that_never_completes_is_given_up_after_max_attempts_with_the_reason(
        tiny_model_dir, tmp_path, redis_server, redis_client, prompts_file):
    """Every retry has a limit (issue 26): the fleet never answers one prompt. Its timeouts re-issue it until
    rollout.max_attempts, then the position is given up with the reason and the run finishes (it re-issued the
    prompt for ever before, and the run never ended)."""
    s = learner_settings(tiny_model_dir, tmp_path, redis_server, rollout={"prompt_timeout_s": 1.0, "max_attempts": 2})
    status, _, _ = await run_with_fleet(s, redis_client, hold_keys={"e0-3"})
    assert status["phase"] == "finished", status
    c = status["counters"]
    assert c["prompts_abandoned"] == 1 and c["prompts_reissued"] == 1 and c["samples_trained"] == (N_PROMPTS - 1) * 4
    assert "rollout.max_attempts=2" in status["abandoned"]["e0-3"] and "prompt_timeout_s" in status["abandoned"]["e0-3"]
    assert trained_items(tmp_path / "run") == {f"e0-{i}": 4 for i in range(N_PROMPTS) if i != 3}


async def test_dynamic_sampling_drops_groups_without_signal_and_fills_each_step_with_fresh_prompts(
        tiny_model_dir, tmp_path, redis_server, redis_client, prompts_file):
    s = learner_settings(tiny_model_dir, tmp_path, redis_server,
                         algorithm={"name": "grpo", "dynamic_sampling": {"enabled": True}})
    status, _, fleet = await run_with_fleet(s, redis_client, flat_keys={"e0-2", "e0-5"})
    assert status["phase"] == "finished", status
    c = status["counters"]
    assert c["groups_filtered"] == 2 and c["dynamic_sampling_cap_reached"] == 0
    # the other six positions are trained, in three full steps of two groups; the flat ones never
    assert trained_items(tmp_path / "run") == {f"e0-{i}": 4 for i in (0, 1, 3, 4, 6, 7)}
    rows = read_history(tmp_path / "run" / "metrics.jsonl")
    assert [r["groups"] for r in rows.values()] == [2, 2, 2]
    assert c["prompts_reissued"] == 0 and {"e0-2", "e0-5"} <= set(fleet.produced_groups)


async def test_dynamic_sampling_trains_groups_without_signal_once_a_steps_refills_are_used_up(
        tiny_model_dir, tmp_path, redis_server, redis_client, prompts_file):
    s = learner_settings(tiny_model_dir, tmp_path, redis_server,
                         algorithm={"name": "grpo", "dynamic_sampling": {"enabled": True, "max_refills_per_step": 0}})
    status, _, _ = await run_with_fleet(s, redis_client, flat_keys={"e0-2", "e0-5"})
    c = status["counters"]
    assert status["phase"] == "finished", status
    assert c["groups_filtered"] == 0 and c["dynamic_sampling_cap_reached"] >= 1
    assert trained_items(tmp_path / "run") == {f"e0-{i}": 4 for i in range(N_PROMPTS)}


@pytest.mark.parametrize("bound", [0, 1])
async def test_no_trained_sample_is_older_than_the_staleness_bound_while_the_fleet_runs_ahead(
        bound, tiny_model_dir, tmp_path, redis_server, redis_client, prompts_file):
    s = learner_settings(tiny_model_dir, tmp_path, redis_server, rollout={"window": 4}, run={"max_staleness": bound},
                         train={"groups_per_step": 1})
    # the fleet answers with weights up to 3 versions behind the published ones (a fleet running ahead on old
    # weights): every group past the bound must be dropped and regenerated, none trained
    status, _, _ = await run_with_fleet(s, redis_client, lag=3)
    assert status["phase"] == "finished", status
    trained = [int(k) for k, n in status["staleness_histogram"].items() for _ in range(n)]
    assert len(trained) == N_PROMPTS * 4 and max(trained) <= bound
    assert status["counters"]["experiences_dropped_stale"] > 0  # the lag did reach past the bound
    rows = read_history(tmp_path / "run" / "metrics.jsonl")
    assert max(r["staleness_max"] for r in rows.values()) <= bound
    assert trained_items(tmp_path / "run") == {f"e0-{i}": 4 for i in range(N_PROMPTS)}

