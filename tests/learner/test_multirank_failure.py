"""One learner rank killed mid-step: rank 0 fails at once (no hang) with one line naming the rank and the reason,
and the next start of both ranks resumes from the last checkpoint with nothing lost or trained twice (the
queue's rules hold as for one rank: acks only at checkpoints, replayed steps count once)."""

import asyncio
import os
import signal
import time

import pytest

from shared import keys
from shared.experience_queue import StreamQueue
from shared.ports import free_port
from shared.schemas import Experience
from tests.learner.fake_rollout import FakeFleet
from tests.learner.test_multirank import GROUP, rank_env, write_config
from tests.learner.test_process import lineage_sample_ids, status, wait_exit, wait_for
from tests.procs import kill9, spawn, stop, wait_http_ok

pytestmark = [pytest.mark.slow, pytest.mark.process]  # two learner processes, started twice (~1-2 min idle)

N_PROMPTS = 10  # 5 steps of 2 groups; checkpoints at steps 2 and 4


@pytest.mark.timeout(900)  # four learner starts; minutes on a loaded 2-core machine
async def test_a_killed_rank_fails_the_learner_in_one_line_and_the_next_start_resumes(
        tmp_path, tiny_model_dir, redis_server, redis_client):
    cfg, run_dir, url = write_config(tmp_path, "kill", tiny_model_dir, redis_server.url, n_prompts=N_PROMPTS)
    fleet = FakeFleet(redis_client, "kill", budget=6)  # groups for 3 steps, then the fleet holds back
    task = asyncio.create_task(fleet.run_forever(consumer="fake-kill"))
    args = ["-m", "services.learner", "--config", str(cfg)]
    master = free_port()
    procs = [spawn(args, tmp_path / f"a{r}.log", rank_env(r, 2, master)) for r in (0, 1)]
    try:
        await asyncio.to_thread(wait_http_ok, f"{url}/health", procs[0], 300, tmp_path / "a0.log")
        await wait_for(lambda: status(url)["step"] == 3, 300, "step 3")
        os.killpg(procs[1].pid, signal.SIGSTOP)  # rank 1 stops answering ...
        fleet.budget += 2  # ... while rank 0 takes step 4's groups, ships them and trains its shard
        await asyncio.sleep(3.0)
        killed_at = time.monotonic()
        kill9(procs[1])  # ... and dies in the middle of the step
        code = await wait_exit(procs[0], 60)
        failed_in = time.monotonic() - killed_at
    finally:
        for p in procs:
            stop(p)
    log0 = (tmp_path / "a0.log").read_text()
    assert code != 0, log0[-3000:]
    assert failed_in < 30, failed_in  # no hang: far inside distributed.timeout_s (60 s)
    line = next((x for x in log0.splitlines() if "RankFailed: learner rank 1 (" in x), None)
    assert line is not None, log0[-3000:]
    assert "is gone (no beat for" in line and "start it again to resume" in line, line

    try:  # the next start of both ranks resumes from step 2's checkpoint and finishes the run
        fleet.budget = 10**6
        master = free_port()
        procs = [spawn(args, tmp_path / f"b{r}.log", rank_env(r, 2, master)) for r in (0, 1)]
        codes = [await wait_exit(p, 600) for p in procs]
    finally:
        for p in procs:
            stop(p)
        await fleet.stop(task)
    assert codes == [0, 0], [(tmp_path / f"b{r}.log").read_text()[-3000:] for r in (0, 1)]
    assert "resuming from" in (tmp_path / "b0.log").read_text()
    trained = lineage_sample_ids(run_dir)
    assert len(trained) == len(set(trained)) == N_PROMPTS * GROUP  # nothing lost, nothing trained twice
    stats = await StreamQueue(redis_client, keys.experiences_stream("kill"), "learner", Experience).stats()
    assert stats.pending == 0 and stats.backlog == 0
