"""The elastic pool's demand signal: the formula (pure) and its publication in Redis (a real server)."""

import json

import pytest
from pydantic import ValidationError

from services.learner.watches.pool import PoolWatch
from services.learner.watches.pool_signal import PoolSignalSettings, PoolWindow, pool_signal
from shared import keys
from shared.weight_sync.registry import ReplicaRegistry
from shared.weight_sync.wire import ReplicaInfo

S = PoolSignalSettings(window_steps=4, min_steps=1, wait_high=0.25, wait_low=0.05, max_replicas=8, warmup_steps=0)


def window(*steps: tuple, waiting: int = 0, in_flight: int = 0) -> PoolWindow:
    """Steps ``(wall, wait, tokens[, waiting, in_flight])``; the stream numbers default to the keywords."""
    w = PoolWindow(S.window_steps)
    for wall, wait, tokens, *queue in steps:
        q, g = queue if queue else (waiting, in_flight)
        w.add(wall, wait, tokens, waiting=q, in_flight=g)
    return w


def test_a_starved_learner_asks_for_the_replicas_that_meet_its_demand():
    # 1 replica, the learner waits 3 of every 4 s: it could take 4x the tokens, so 4 replicas; 12 prompts wait
    # behind the 4 the replica holds, so 3 more replicas would each find 4 to take
    sig = pool_signal(window((4.0, 3.0, 400), (4.0, 3.0, 400), waiting=12, in_flight=4), replicas=1,
                      prompts_waiting=5, groups_in_flight=4, settings=S)
    assert sig.wait_share == pytest.approx(0.75)
    assert sig.tokens_per_s_per_replica == pytest.approx(100.0)
    assert sig.learner_tokens_per_s == pytest.approx(400.0)
    assert sig.desired_replicas == 4 == round(sig.learner_tokens_per_s / sig.tokens_per_s_per_replica)
    assert "waited 75%" in sig.reason


def test_up_rule_asks_for_at_least_one_more_and_is_capped():
    big = {"waiting": 100, "in_flight": 3}  # a deep backlog: the wait share sizes the step
    sig = pool_signal(window((10.0, 2.6, 100), **big), replicas=3, prompts_waiting=0, groups_in_flight=0, settings=S)
    assert sig.desired_replicas == 5  # ceil(3 / 0.74) = 5
    sig = pool_signal(window((10.0, 2.5, 100), **big), replicas=1, prompts_waiting=0, groups_in_flight=0, settings=S)
    assert sig.desired_replicas == 2  # 1 / 0.75 = 1.33: at least one more
    sig = pool_signal(window((10.0, 9.99, 100), **big), replicas=4, prompts_waiting=0, groups_in_flight=0,
                      settings=S)
    assert sig.desired_replicas == 8  # max_replicas (the wait share is capped at max_wait_share too)


def test_grows_when_prompts_wait_and_the_learner_starves():
    # 1 replica holding 8 groups (a step), 8 more wait in the stream: one more replica takes them, a third would find
    # nothing, though the wait share alone (75 %) asks for 4
    starved = [(4.0, 3.0, 400, 8, 8)] * 3
    sig = pool_signal(window(*starved), replicas=1, prompts_waiting=8, groups_in_flight=8, settings=S)
    assert (sig.desired_replicas, sig.backlog) == (2, 8)
    assert "8 prompt(s) wait for a replica (~8 per replica)" in sig.reason
    # 2 replicas holding 2 each, 6 waiting: 3 more find 2 each
    sig = pool_signal(window(*[(4.0, 3.0, 400, 6, 4)] * 3), replicas=2, prompts_waiting=6, groups_in_flight=4,
                      settings=S)
    assert sig.desired_replicas == 5


def test_a_starved_learner_does_not_grow_when_no_prompt_waits_for_a_replica():
    # the benchmark's case: every prompt issued is held by a replica (the others idle); the learner waits 54 % for
    # the pipeline (staleness bound, a step's groups on one replica), which a replica more cannot shorten
    idle = window((2.0, 1.08, 400, 0, 8), (2.0, 1.08, 400, 0, 8), (2.0, 1.08, 400, 0, 8))
    sig = pool_signal(idle, replicas=3, prompts_waiting=0, groups_in_flight=8, settings=S)
    assert sig.wait_share == pytest.approx(0.54)
    assert sig.desired_replicas == 3 and "no prompt waits for a replica" in sig.reason
    # a passing burst (one step of four saw prompts waiting) is no backlog: the median is 0
    burst = window((2.0, 1.08, 400, 16, 8), (2.0, 1.08, 400, 0, 8), (2.0, 1.08, 400, 0, 8), (2.0, 1.08, 400, 0, 8))
    assert pool_signal(burst, replicas=3, prompts_waiting=0, groups_in_flight=8, settings=S).desired_replicas == 3


def test_the_start_up_fill_does_not_make_the_pool_grow():
    # the run's first steps: the replica loads weights, the learner waits for the first groups and the whole window
    # of prompts waits in the stream; then one replica keeps up (nothing waits at a step's end)
    s = PoolSignalSettings(window_steps=8, min_steps=3)  # the defaults: wait_high 0.25, warmup_steps 2
    w = PoolWindow(8, warmup=s.warmup_steps)
    fill = [(6.0, 5.8, 100, 16, 0), (3.0, 2.5, 100, 8, 8)]
    steady = [(0.4, 0.1, 100, 0, 8)] * 6  # waits 25 % (>= wait_high), no backlog
    asked = []
    for wall, wait, tokens, q, g in fill + steady:
        w.add(wall, wait, tokens, replicas=1, waiting=q, in_flight=g)
        asked.append(pool_signal(w, replicas=1, prompts_waiting=q, groups_in_flight=g, settings=s))
    assert [a.desired_replicas for a in asked] == [1] * 8
    assert asked[0].reason == asked[1].reason == "no step measured yet"  # the fill is not measured at all
    assert len(w.steps) == 6 and w.backlog == 0
    # the same fill without the warm-up left out would have read as demand
    w = PoolWindow(8)
    for wall, wait, tokens, q, g in fill + steady[:1]:
        w.add(wall, wait, tokens, replicas=1, waiting=q, in_flight=g)
    assert pool_signal(w, replicas=1, prompts_waiting=0, groups_in_flight=8, settings=s).desired_replicas > 1


def test_down_rule_takes_one_away_only_when_nothing_waits():
    calm = window((2.0, 0.0, 100), (2.0, 0.05, 100), waiting=4, in_flight=6)  # a backlog does not grow a fed learner
    assert pool_signal(calm, replicas=3, prompts_waiting=0, groups_in_flight=6, settings=S).desired_replicas == 2
    # a prompt waits for a replica: keep the pool
    assert pool_signal(calm, replicas=3, prompts_waiting=2, groups_in_flight=6, settings=S).desired_replicas == 3
    # never below one
    assert pool_signal(calm, replicas=1, prompts_waiting=0, groups_in_flight=0, settings=S).desired_replicas == 1


def test_inside_the_band_the_pool_stays():
    sig = pool_signal(window((10.0, 1.5, 100), waiting=8), replicas=2, prompts_waiting=0, groups_in_flight=2,
                      settings=S)
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
        w.add(*starved, replicas=replicas, waiting=32, in_flight=replicas)
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
    assert (sig.replicas, sig.prompts_waiting, sig.groups_in_flight, sig.backlog) == (2, 3, 2, 3)
    assert sig.desired_replicas == 4  # 2 / (1 - 0.5); 3 waiting, 1 held per replica: 3 more would take one each
    stored = json.loads(await redis_client.get(keys.pool_signal(run)))
    assert stored["desired_replicas"] == 4 and stored["step"] == 7 and stored["wait_share"] == 0.5
    assert stored["backlog"] == 3
    assert 0 < await redis_client.ttl(keys.pool_signal(run)) <= 600


async def test_the_backlog_is_what_waited_for_a_replica_while_the_learner_waited(redis_client):
    # one replica holds a step's 8 prompts and the next 8 wait for it while the learner waits; by the step's end the
    # replica took them (the learner feeds the next prompts only after the step), so the stream then shows nothing
    run = "pool-backlog"
    stream = keys.prompts_stream(run)
    await redis_client.xgroup_create(stream, "rollout", id="0", mkstream=True)
    for i in range(16):
        await redis_client.xadd(stream, {"p": str(i)})
    first = [e[0] for e in (await redis_client.xreadgroup("rollout", "r0", {stream: ">"}, count=8))[0][1]]
    await ReplicaRegistry(redis_client, run).put(ReplicaInfo(replica_id="a", name="a", transport="collective"),
                                                 ttl_s=30)
    watch = PoolWatch(redis_client, run, S)
    watch.step_done(0.0, 0, now=0.0)
    await watch.sample_wait(1.5, now=1.5)  # 8 waiting, 8 held
    await watch.sample_wait(0.5, now=1.51)  # merged into the next sample (closer than SAMPLE_EVERY_S)
    await redis_client.xack(stream, "rollout", *first)  # the first 8 done (a replica deletes what it acknowledges)
    await redis_client.xdel(stream, *first)
    await redis_client.xreadgroup("rollout", "r0", {stream: ">"}, count=8)  # the next 8 taken
    watch.step_done(2.0, 100, now=3.0)
    sig = await watch.publish(step=3)
    assert (sig.prompts_waiting, sig.groups_in_flight) == (0, 8)  # at the step's end: nothing waits
    assert sig.backlog == 8  # while the learner waited: 8 did
    assert sig.desired_replicas == 2  # 2 / 3 waited: ceil(1 / (1 - 2/3)) = 3, but only 1 more finds prompts
    assert "8 prompt(s) wait for a replica (~8 per replica)" in sig.reason
