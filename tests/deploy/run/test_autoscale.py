"""The elastic pool controller's decisions (deploy/run/autoscale.py): pure, no process."""

import pytest
from pydantic import ValidationError

from deploy.run.autoscale import PoolMemory, decide
from deploy.run.spec import ReplicasSpec, RolloutPoolSpec

POOL = RolloutPoolSpec(min=1, max=4, cooldown_up_s=10, cooldown_down_s=30, down_stable_s=20, signal_max_age_s=60)


def sig(desired, at=1000.0, reason="because"):
    return {"desired_replicas": desired, "at": at, "reason": reason}


def test_a_number_is_still_fixed_and_a_mapping_is_a_pool():
    assert ReplicasSpec(rollout=3).pool is None and ReplicasSpec(rollout=3).rollout_max == 3
    spec = ReplicasSpec(rollout={"min": 1, "max": 3})
    assert spec.pool == RolloutPoolSpec(min=1, max=3) and (spec.rollout_start, spec.rollout_max) == (1, 3)
    with pytest.raises(ValidationError, match="min \\(3\\) is above max \\(2\\)"):
        ReplicasSpec(rollout={"min": 3, "max": 2})
    with pytest.raises(ValidationError, match="a number from 1 to 64"):
        ReplicasSpec(rollout=0)
    with pytest.raises(ValidationError):
        ReplicasSpec(rollout={"min": 1, "mx": 3})  # a typo is refused, not ignored


def test_grows_to_the_signal_at_once_then_waits_the_cooldown():
    mem = PoolMemory()
    d = decide(POOL, running=1, died=[], signal=sig(3), now=1001.0, memory=mem)
    assert (d.action, d.count, d.target) == ("up", 2, 3) and "asks for 3" in d.reason and "because" in d.reason
    mem.last_change_at = 1001.0
    d = decide(POOL, running=3, died=[], signal=sig(4, at=1002.0), now=1005.0, memory=mem)
    assert d.action == "hold" and "cooldown_up_s" in d.reason
    d = decide(POOL, running=3, died=[], signal=sig(4, at=1012.0), now=1012.0, memory=mem)
    assert (d.action, d.count) == ("up", 1)


def test_never_shrinks_on_a_signal_that_does_not_see_the_replicas_starting():
    # 1 live replica asked for 3; 2 were started. Before they join, the learner (still on 1) asks for 2: that is
    # "more than 1", not "fewer than 3" (the elastic drill drained a replica still starting on such a signal)
    mem = PoolMemory(last_change_at=900.0)
    early = {**sig(2, at=1000.0), "replicas": 1}
    for now in (1000.0, 1030.0, 1060.0):
        d = decide(POOL, running=3, died=[], signal={**early, "at": now}, now=now, memory=mem)
        assert d.action == "hold" and "waiting for the others to join" in d.reason and mem.fewer_since is None
    # once the signal is measured on all 3, asking for fewer starts the down_stable_s wait as before
    d = decide(POOL, running=3, died=[], signal={**sig(2, at=1061.0), "replicas": 3}, now=1061.0, memory=mem)
    assert d.action == "hold" and "down_stable_s" in d.reason


def test_never_grows_back_on_a_signal_that_still_counts_a_replica_being_drained():
    # 2 live, one drained: the learner, still counting 2, says "2, within the band" (keep what I see); that is not
    # "more than 1" (the elastic drill started the drained replica again on such a signal: 1 -> 3 -> 2 -> 1 -> 2)
    mem = PoolMemory(last_change_at=1000.0)
    d = decide(POOL, running=1, died=[], signal={**sig(2, at=1001.0), "replicas": 2}, now=1015.0, memory=mem)
    assert d.action == "hold" and "waiting for the drain to finish" in d.reason
    # a learner starved on the 2 it counts does ask for more than it sees: grow
    d = decide(POOL, running=1, died=[], signal={**sig(3, at=1001.0), "replicas": 2}, now=1015.0, memory=mem)
    assert (d.action, d.count, d.target) == ("up", 2, 3)
    # once it counts the 1 left, asking for 2 is asking for more
    d = decide(POOL, running=1, died=[], signal={**sig(2, at=1016.0), "replicas": 1}, now=1016.0, memory=mem)
    assert (d.action, d.count) == ("up", 1)


def test_clamped_to_min_and_max():
    mem = PoolMemory()
    assert decide(POOL, running=4, died=[], signal=sig(9), now=1000.0, memory=mem).action == "hold"
    d = decide(POOL, running=0, died=[], signal=None, now=1000.0, memory=mem)
    assert (d.action, d.count) == ("up", 1) and "below min" in d.reason
    d = decide(POOL, running=6, died=[], signal=None, now=1000.0, memory=mem)
    assert (d.action, d.count) == ("down", 2) and "above max" in d.reason


def test_shrinks_one_at_a_time_only_after_the_signal_held_and_the_cooldown():
    mem = PoolMemory(last_change_at=900.0)
    assert decide(POOL, running=3, died=[], signal=sig(1), now=1000.0, memory=mem).action == "hold"  # asked 0 s
    d = decide(POOL, running=3, died=[], signal=sig(1, at=1015.0), now=1015.0, memory=mem)
    assert d.action == "hold" and "down_stable_s" in d.reason
    d = decide(POOL, running=3, died=[], signal=sig(1, at=1021.0), now=1021.0, memory=mem)
    assert (d.action, d.count, d.target) == ("down", 1, 1)
    # hysteresis: a signal back at the pool's size forgets the wait; asking for fewer again starts it over
    mem.last_change_at = 900.0
    assert decide(POOL, running=3, died=[], signal=sig(3, at=1022.0), now=1022.0, memory=mem).action == "hold"
    assert mem.fewer_since is None
    assert decide(POOL, running=3, died=[], signal=sig(2, at=1023.0), now=1023.0, memory=mem).action == "hold"
    # the cooldown after a change holds a drain even once the signal has held long enough
    mem = PoolMemory(last_change_at=1000.0, fewer_since=900.0)
    d = decide(POOL, running=3, died=[], signal=sig(1, at=1010.0), now=1010.0, memory=mem)
    assert d.action == "hold" and "cooldown_down_s" in d.reason


def test_no_stale_or_premature_signal_moves_the_pool():
    mem = PoolMemory()
    d = decide(POOL, running=2, died=[], signal=None, now=1000.0, memory=mem)
    assert d.action == "hold" and "no demand signal" in d.reason
    d = decide(POOL, running=2, died=[], signal=sig(4, at=900.0), now=1000.0, memory=mem)
    assert d.action == "hold" and "100s old" in d.reason
    mem.last_change_at = 990.0
    d = decide(POOL, running=2, died=[], signal=sig(4, at=980.0), now=1000.0, memory=mem)
    assert d.action == "hold" and "after the last change" in d.reason


def test_a_replica_that_died_is_replaced_first():
    d = decide(POOL, running=1, died=["rollout-1 (exit code -9)"], signal=sig(1), now=1000.0, memory=PoolMemory())
    assert (d.action, d.count) == ("replace", 1) and "rollout-1 (exit code -9) died" in d.reason


def test_an_elastic_pool_plans_max_replicas_and_gives_them_its_drain_time(tmp_path, tiny_model_dir):
    from deploy.run.load import load_spec
    from deploy.run.plan import plan
    from tests.deploy.run.conftest import tiny_spec

    path = tiny_spec(tmp_path, tiny_model_dir, replicas={"rollout": {"min": 1, "max": 3, "drain_timeout_s": 7}})
    spec = load_spec(path, [])
    procs = plan(spec, path, "redis://127.0.0.1:1/0", "tok")
    rollouts = [p for p in procs if p.kind == "rollout"]
    assert [p.name for p in rollouts] == ["rollout-0", "rollout-1", "rollout-2"]
    assert len({p.config["port"] for p in rollouts}) == 3
    assert all(p.config["worker"]["drain_timeout_s"] == 7 for p in rollouts)
    assert spec.replicas.rollout_start == 1
    fixed = load_spec(tiny_spec(tmp_path, tiny_model_dir, replicas={"rollout": 2}), [])
    assert "drain_timeout_s" not in plan(fixed, path, "redis://127.0.0.1:1/0", "tok")[1].config["worker"]
