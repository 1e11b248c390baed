"""The elastic pool's demand signal: the formula (pure) and its publication in Redis (a real server)."""

import json

import pytest
from pydantic import ValidationError

from services.learner.pool_signal import PoolSignalSettings, PoolWindow, pool_signal
from services.learner.pool_watch import PoolWatch
from shared import keys
from shared.weight_sync.registry import ReplicaRegistry
from shared.weight_sync.wire import ReplicaInfo

S = PoolSignalSettings(window_steps=4, min_steps=1, wait_high=0.25, wait_low=0.05, max_replicas=8)


def window(*steps: tuple[float, float, int]) -> PoolWindow:
    w = PoolWindow(S.window_steps)
    for wall, wait, tokens in steps:
        w.add(wall, wait, tokens)
    return w


def test_a_starved_learner_asks_for_the_replicas_that_meet_its_demand():
    # 1 replica, the learner waits 3 of every 4 s: it could take 4x the tokens, so 4 replicas
    sig = pool_signal(window((4.0, 3.0, 400), (4.0, 3.0, 400)), replicas=1, prompts_waiting=5, groups_in_flight=4,
                      settings=S)
    assert sig.wait_share == pytest.approx(0.75)
    assert sig.tokens_per_s_per_replica == pytest.approx(100.0)
    assert sig.learner_tokens_per_s == pytest.approx(400.0)
    assert sig.desired_replicas == 4 == round(sig.learner_tokens_per_s / sig.tokens_per_s_per_replica)
    assert "waited 75%" in sig.reason


def test_up_rule_asks_for_at_least_one_more_and_is_capped():
    sig = pool_signal(window((10.0, 2.6, 100)), replicas=3, prompts_waiting=0, groups_in_flight=0, settings=S)
    assert sig.desired_replicas == 5  # ceil(3 / 0.74) = 5
    sig = pool_signal(window((10.0, 2.5, 100)), replicas=1, prompts_waiting=0, groups_in_flight=0, settings=S)
    assert sig.desired_replicas == 2  # 1 / 0.75 = 1.33: at least one more
    sig = pool_signal(window((10.0, 9.99, 100)), replicas=4, prompts_waiting=0, groups_in_flight=0, settings=S)
    assert sig.desired_replicas == 8  # max_replicas (the wait share is capped at max_wait_share too)


def test_down_rule_takes_one_away_only_when_nothing_waits():
    calm = window((2.0, 0.0, 100), (2.0, 0.05, 100))
    assert pool_signal(calm, replicas=3, prompts_waiting=0, groups_in_flight=6, settings=S).desired_replicas == 2
    # a prompt waits for a replica: keep the pool
    assert pool_signal(calm, replicas=3, prompts_waiting=2, groups_in_flight=6, settings=S).desired_replicas == 3
    # never below one
    assert pool_signal(calm, replicas=1, prompts_waiting=0, groups_in_flight=0, settings=S).desired_replicas == 1


def test_inside_the_band_the_pool_stays():
    sig = pool_signal(window((10.0, 1.5, 100)), replicas=2, prompts_waiting=0, groups_in_flight=2, settings=S)
    assert sig.desired_replicas == 2 and "within the band" in sig.reason


def test_no_replica_or_no_step_yet():
    assert pool_signal(window(), replicas=0, prompts_waiting=3, groups_in_flight=0, settings=S).desired_replicas == 1
    sig = pool_signal(window(), replicas=2, prompts_waiting=3, groups_in_flight=0, settings=S)
    assert sig.desired_replicas == 2 and sig.reason == "no step measured yet"


def test_the_window_forgets_old_steps():
    w = window((4.0, 3.0, 10))
    for _ in range(S.window_steps):
        w.add(4.0, 0.0, 10)
    assert w.wait_s == 0.0 and len(w.steps) == S.window_steps


def test_a_change_in_the_live_replicas_starts_the_window_again():
    w = PoolWindow(8)
    assert w.add(4.0, 3.0, 100, replicas=1) and w.add(4.0, 3.0, 100, replicas=1)
    # the step in which a second replica joined: what one replica delivered says nothing about two
    assert not w.add(2.0, 0.5, 100, replicas=2)
    assert len(w.steps) == 0 and w.replicas == 2
    assert w.add(2.0, 0.0, 100, replicas=2) and len(w.steps) == 1 and w.wait_s == 0.0


def test_the_signal_measures_min_steps_at_a_pool_size_before_it_moves():
    s = PoolSignalSettings(window_steps=8, min_steps=3)
    w = PoolWindow(8)
    starved = (4.0, 3.0, 100)
    asked = []
    for replicas in (1, 1, 1, 1, 2, 2, 2, 2):
        w.add(*starved, replicas=replicas)
        asked.append(pool_signal(w, replicas=replicas, prompts_waiting=4, groups_in_flight=1,
                                 settings=s).desired_replicas)
    # 1 replica: measuring for 2 steps, then 4; the join (step 5) empties the window and is left out: 3 more steps
    assert asked == [1, 1, 4, 4, 2, 2, 2, 8]
    sig = pool_signal(PoolWindow(8), replicas=2, prompts_waiting=0, groups_in_flight=0, settings=s)
    assert sig.reason == "no step measured yet"
    w = PoolWindow(8)
    w.add(*starved, replicas=2)
    assert "measuring: 1 of min_steps 3" in pool_signal(w, replicas=2, prompts_waiting=0, groups_in_flight=0,
                                                        settings=s).reason


def test_band_must_be_ordered():
    with pytest.raises(ValidationError, match="wait_low .* must be below pool.wait_high"):
        PoolSignalSettings(wait_low=0.3, wait_high=0.2)
    with pytest.raises(ValidationError, match="min_steps .* must be at most pool.window_steps"):
        PoolSignalSettings(window_steps=4, min_steps=5)


async def test_the_signal_lands_in_redis_with_the_live_replicas_and_the_queue(redis_client):
    run = "pool-sig"
    stream = keys.prompts_stream(run)
    await redis_client.xgroup_create(stream, "rollout", id="0", mkstream=True)
    for i in range(5):
        await redis_client.xadd(stream, {"p": str(i)})
    await redis_client.xreadgroup("rollout", "r0", {stream: ">"}, count=2)  # 2 held, 3 waiting
    reg = ReplicaRegistry(redis_client, run)
    for rid in ("a", "b"):
        await reg.put(ReplicaInfo(replica_id=rid, name=rid, transport="collective"), ttl_s=30)
    watch = PoolWatch(redis_client, run, S)
    watch.step_done(0.0, 0, now=0.0)
    watch.step_done(2.0, 100, now=4.0)  # waited half the step
    sig = await watch.publish(step=7)
    assert (sig.replicas, sig.prompts_waiting, sig.groups_in_flight) == (2, 3, 2)
    assert sig.desired_replicas == 4  # 2 / (1 - 0.5)
    stored = json.loads(await redis_client.get(keys.pool_signal(run)))
    assert stored["desired_replicas"] == 4 and stored["step"] == 7 and stored["wait_share"] == 0.5
    assert 0 < await redis_client.ttl(keys.pool_signal(run)) <= 600
