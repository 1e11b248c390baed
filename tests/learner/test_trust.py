"""What the learner trains on is what the fleet produced, for groups the learner issued (issue 26).

One learner run against a real Redis and a fake rollout fleet that signs with the run key; meanwhile an attacker
who can reach Redis (or a token holder opening sessions on a rollout replica, which signs what it pushes) writes:
a short "group" for an in-flight position, a full-size group with a chosen group id and no grant, and copies of a
real experience that are unsigned or signed under another run's key. None of it is trained; each kind is counted.
"""

import asyncio

from services.learner.service import LearnerService
from shared import keys
from shared.codec import decode
from shared.experience_queue import StreamQueue
from shared.schemas import Experience, PromptTask, sample_id
from shared.signing import RecordSigner
from tests.learner.fake_rollout import FakeFleet
from tests.learner.rl.test_runner import N_PROMPTS, learner_settings, prompts_file, trained_items  # noqa: F401

RUN_KEY = "k" * 32


def forged(group_id: str, index: int, size: int, grant: str | None = None) -> Experience:
    return Experience(id=sample_id(group_id, index), prompt_id=group_id, group_id=group_id, group_size=size,
                      index=index, prompt_token_ids=[1, 2, 3], response_token_ids=[7, 7], response_logprobs=[-1.0, -1.0],
                      finish_reason="stop", reward=1.0, weight_version=0, grant=grant)


async def wait_for(check, what: str, timeout: float = 60.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def test_only_signed_experiences_of_groups_the_learner_issued_are_trained(
        tiny_model_dir, tmp_path, redis_server, redis_client, prompts_file):  # noqa: F811
    s = learner_settings(tiny_model_dir, tmp_path, redis_server, run_key=RUN_KEY)
    run = s.run_name
    fleet = FakeFleet(redis_client, run, hold_keys={"e0-0", "e0-1"})
    fleet.prompts.signer = fleet.experiences.signer = RecordSigner(RUN_KEY)  # the run's own fleet holds the key
    fleet_task = asyncio.create_task(fleet.run_forever())
    svc = LearnerService(s)
    await svc.start()
    try:
        # the attacker reads the prompt task of e0-1 (grant included) from Redis
        async def issued() -> bool:
            return len(await redis_client.xrange(keys.prompts_stream(run))) >= 2 or bool(fleet._waiting)
        await wait_for(issued, "the first prompts")
        tasks = [decode(f[b"p"], expect=PromptTask) for _, f in await redis_client.xrange(keys.prompts_stream(run))]
        tasks += [d.record for d in fleet._waiting]
        grant_1 = next(t.grant for t in tasks if t.id == "e0-1")
        assert grant_1
        signed = StreamQueue(redis_client, keys.experiences_stream(run), "learner", Experience,
                             signer=RecordSigner(RUN_KEY))
        unsigned = StreamQueue(redis_client, keys.experiences_stream(run), "learner", Experience)
        other_run = StreamQueue(redis_client, keys.experiences_stream(run), "learner", Experience,
                                signer=RecordSigner("another run's key, 32 chars...."))
        await signed.produce([forged("e0-0", 0, 1)])  # a one-sample "group" for an in-flight position
        await signed.produce([forged("e0-1", i, 4) for i in range(4)])  # full size, chosen group id, no grant
        await unsigned.produce([forged("e0-1", 0, 4, grant_1)])  # right grant, written without the run key
        await other_run.produce([forged("e0-1", 1, 4, grant_1)])  # right grant, another run's key
        # a dead letter written straight to the dead-letter stream, around a genuine prompt task copied from Redis:
        # the learner would re-issue (and in the end give up) that position for it
        genuine = next(f[b"p"] for _, f in await redis_client.xrange(keys.prompts_stream(run)))
        await redis_client.xadd(keys.dead_letter_stream(keys.prompts_stream(run)), {
            "payload": genuine, "error": "failed 5 times: made up", "original_id": "1-0"})

        async def all_seen() -> bool:
            c = svc.status()["counters"]
            return c.get("experiences_unissued", 0) >= 5 and c.get("experiences_unsigned", 0) >= 2
        await wait_for(all_seen, "the learner to see the forged experiences")
        await asyncio.sleep(1.5)  # the learner polls dead letters every second
        fleet.hold_keys.clear()  # the real fleet answers e0-0 and e0-1 now
        deadline = asyncio.get_running_loop().time() + 120
        while svc.runner.phase not in ("finished", "failed", "stopped"):
            assert asyncio.get_running_loop().time() < deadline, svc.status()
            await asyncio.sleep(0.05)
        status = svc.status()
    finally:
        await svc.stop()
        await fleet.stop(fleet_task)
    assert status["phase"] == "finished", status
    c = status["counters"]
    assert c["experiences_unissued"] == 5 and c["experiences_unsigned"] == 2, c
    assert svc.registry.get_sample_value("fleetrl_learner_experiences_unissued_total") == 5  # and in Prometheus
    assert svc.registry.get_sample_value("fleetrl_learner_experiences_unsigned_total") == 2
    assert status["records_signed"] is True
    assert c["experiences_deduplicated"] == 0, c  # no real sample was displaced by a forged one
    assert c["prompts_reissued"] == 0 and c["prompts_abandoned"] == 0, c  # forged dead letters named no prompt
    assert trained_items(tmp_path / "run") == {f"e0-{i}": 4 for i in range(N_PROMPTS)}
    dead = await StreamQueue(redis_client, keys.experiences_stream(run), "learner", Experience).dead_letters()
    assert sorted(d["error"].split(":")[0] for d in dead) == ["signature", "signature"]
    assert any("unsigned" in d["error"] for d in dead) and any("bad signature" in d["error"] for d in dead)


def test_the_configuration_recorded_for_tensorboard_and_wandb_shows_no_secret(tiny_model_dir, tmp_path):
    from services.learner.service import shown_config
    from tests.learner.helpers import settings

    s = settings(tiny_model_dir, tmp_path, redis_url="redis://:hunter2hunter2@127.0.0.1:1/0", run_key=RUN_KEY,
                 control_token="tok-tok-tok-tok")
    shown = str(shown_config(s))
    assert "hunter2" not in shown and RUN_KEY not in shown and "tok-tok" not in shown
    assert "redis://:***@127.0.0.1:1/0" in shown
