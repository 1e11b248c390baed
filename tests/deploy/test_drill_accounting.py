"""Drill accounting: every dataset position ends up trained once, given up with a reason, or lost; every
reward is checked against a recomputation."""

import json

from deploy.local.drill_accounting import account, position_of


def write(tmp_path, steps: dict[int, list[str]], rewards: dict[str, float], replayed: dict[int, list[str]] = ()):
    """metrics.jsonl / samples.jsonl as a learner writes them (a replayed step appears twice, last wins)."""
    metrics, samples = [], []
    for step, ids in [*steps.items(), *dict(replayed).items()]:
        metrics.append({"step": step, "sample_ids": ids})
        samples += [{"step": step, "id": s, "label": "ab", "response_text": "ab" if rewards[s] else "x",
                     "reward": rewards[s]} for s in ids]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))


def exact(response, label):
    return 1.0 if response == label else 0.0


def run(tmp_path, positions, run_state=None, dead=()):
    return account(positions=positions, group_size=2, metrics_jsonl=tmp_path / "metrics.jsonl",
                   samples_jsonl=tmp_path / "samples.jsonl", run_state=run_state or {}, dead_letters=list(dead),
                   reward_of=exact)


def test_positions_of_sample_and_group_ids():
    assert position_of("e0-3#1") == position_of("e0-3-r2#0") == position_of("e0-3-r2") == "e0-3"


def test_a_clean_run_with_a_replayed_step_counts_each_position_once(tmp_path):
    rewards = {"e0-0#0": 1.0, "e0-0#1": 0.0, "e0-1#0": 0.0, "e0-1#1": 1.0, "e0-2-r1#0": 1.0, "e0-2-r1#1": 1.0}
    write(tmp_path, {1: ["e0-0#0", "e0-0#1"], 2: ["e0-1#0", "e0-1#1"]}, rewards,
          replayed={2: ["e0-2-r1#0", "e0-2-r1#1"], 3: ["e0-1#0", "e0-1#1"]})
    a = run(tmp_path, ["e0-0", "e0-1", "e0-2"])
    assert (a.issued, a.trained_once, a.trained_twice, a.lost, a.rewards_checked, a.rewards_wrong) == (3, 3, 0, 0, 6, 0)
    assert a.ok


def test_twice_lost_given_up_dead_letters_and_wrong_rewards_are_each_reported(tmp_path):
    rewards = {"e0-0#0": 1.0, "e0-0#1": 0.0, "e0-0-r1#0": 0.0, "e0-0-r1#1": 0.0, "e0-1#0": 0.5, "e0-1#1": 0.0}
    write(tmp_path, {1: ["e0-0#0", "e0-0#1"], 2: ["e0-0-r1#0", "e0-0-r1#1"], 3: ["e0-1#0", "e0-1#1"]}, rewards)
    a = run(tmp_path, ["e0-0", "e0-1", "e0-2", "e0-3"], run_state={"abandoned": {"e0-3": "poison: too long"}},
            dead=[{"stream": "prompts", "error": "failed 5 times"}])
    assert a.trained_twice == 1 and a.trained_once == 1 and a.lost == 1 and a.dead_lettered == 1
    assert a.valid_dead_lettered == 1 and a.rewards_wrong == 1 and not a.ok
    text = "\n".join(a.details)
    for needle in ("trained twice: e0-0", "lost: e0-2", "given up: e0-3: poison", "failed 5 times",
                   "reward of e0-1#0: 0.5 recorded, 1.0 recomputed"):
        assert needle in text
