"""The training-health detector: collapses and spikes are flagged with what to try; healthy runs are not."""

from __future__ import annotations

import math

from shared.training_health import check_health


def steps(**series) -> list[dict]:
    n = len(next(iter(series.values())))
    return [{"step": i + 1, **{k: v[i] for k, v in series.items()}} for i in range(n)]


def test_a_learning_run_is_healthy():
    rising = [0.1 + 0.02 * i + (0.05 if i % 2 else -0.05) for i in range(30)]  # noisy but climbing
    entropy = [1.0 - 0.02 * i for i in range(30)]  # narrowing, as learning does
    assert check_health(steps(reward_mean=rising, entropy=entropy, kl=[0.01] * 30, mismatch_k3=[1e-4] * 30),
                        heldout=[(0, 0.2), (10, 0.3), (20, 0.45), (30, 0.5)]) == []
    assert check_health([]) == [] and check_health(steps(reward_mean=[0.5, 0.0])) == []  # too short to judge


def test_heldout_collapse_is_said_with_the_numbers_and_the_learning_rate_hint():
    (w,) = check_health([], heldout=[(0, 0.40), (5, 0.48), (15, 0.2), (30, 0.01)])
    assert w.signal == "heldout"
    assert w.message.startswith("held-out accuracy fell 48% -> 1% in 25 steps: the learning rate may be too high "
                                "(try 1e-5..1e-4")


def test_reward_collapse_is_flagged_but_one_bad_step_or_small_group_noise_is_not():
    collapsed = [0.6] * 20 + [0.05] * 10
    (w,) = check_health(steps(reward_mean=collapsed))
    assert w.signal == "reward" and w.message.startswith("reward fell 0.60 -> 0.05 in 10 steps: the learning rate")
    assert check_health(steps(reward_mean=[0.6] * 25 + [0.0])) == []  # one step: noise, not a collapse
    # 4 samples a step (a tiny CPU run): 0.25 / 0.5 now and then, 0 mostly — seen to raise "reward fell 0.20 -> 0.00"
    noisy = [0.25, 0.0, 0.0, 0.5, 0.0, 0.0, 0.25, 0.0, 0.0, 0.0] * 4
    assert check_health(steps(reward_mean=noisy)) == []


def test_entropy_collapse_and_kl_and_mismatch_spikes():
    entropy = [1.2] * 12 + [0.01] * 6
    kl = [0.01] * 17 + [0.9]
    mismatch = [0.001] * 15 + [0.2] * 3  # a mismatch that lasts
    found = {w.signal: w.message for w in check_health(steps(entropy=entropy, kl=kl, mismatch_k3=mismatch))}
    assert set(found) == {"entropy", "kl", "mismatch"}
    assert found["entropy"].startswith("entropy fell 1.2 -> 0.01 in ") and "temperature" in found["entropy"]
    assert found["kl"].startswith("KL to the reference spiked to 0.9 (0.01 before)")
    assert found["mismatch"].startswith("engine/trainer mismatch spiked to 0.2")


def test_missing_and_nan_values_are_skipped():
    rows = steps(reward_mean=[0.5] * 12) + [{"step": 13, "reward_mean": math.nan}, {"step": 14}]
    assert check_health(rows) == []


def test_a_one_step_mismatch_spike_of_an_async_run_is_not_a_fault():
    # make demo at staleness 1: 0.0599 for one step among ~0.005, then back (it warned before)
    for mismatch in ([0.005] * 20 + [0.0599], [0.005] * 20 + [0.0599, 0.0001, 0.004]):  # at the spike, and after
        assert not [w for w in check_health(steps(mismatch_k3=mismatch)) if w.signal == "mismatch"]
    assert [w for w in check_health(steps(mismatch_k3=[0.005] * 20 + [0.0599] * 3)) if w.signal == "mismatch"]


def test_a_slow_entropy_collapse_is_seen_past_the_recent_history():
    # examples/minmax-digits at lr 5e-4: entropy 0.56 -> 0.03 over 300 steps while held-out stalled; the learner
    # keeps the last 100 steps (HEALTH_HISTORY), over which entropy fell only 0.2 -> 0.03 (not 10x), so nothing
    # was said
    from shared.training_health import Peaks

    run = steps(entropy=[0.56 - (0.53 * i / 299) for i in range(300)])
    recent = run[-100:]
    assert check_health(recent) == []  # what the learner judged on before
    peaks = Peaks()
    for row in run:
        peaks.add(row)
    (w,) = check_health(recent, peaks=peaks)
    assert w.signal == "entropy" and w.message.startswith("entropy fell 0.556 -> 0.0335 in 295 steps")
    healthy = Peaks()  # a run whose entropy narrows as it learns, but not 10x, is still healthy
    for row in steps(entropy=[0.56 - (0.4 * i / 299) for i in range(300)]):
        healthy.add(row)
    assert check_health(steps(entropy=[0.2] * 100), peaks=healthy) == []


def test_a_collapse_with_completions_blowing_up_to_the_limit_is_said_as_length_not_learning_rate():
    """Issue 41: the policy learned to babble up to max_new_tokens for partial prefix credit; the warning said only
    "the learning rate may be too high"."""
    entropy = [0.6] * 10 + [0.02] * 10
    lengths = [6.0] * 10 + [32.0] * 10
    (w,) = check_health(steps(entropy=entropy, response_len_mean=lengths, truncated_frac=[0.0] * 10 + [0.9] * 10))
    assert w.signal == "entropy"
    assert "completions grew 6 -> 32 tokens and 90% hit max_new_tokens" in w.message
    assert "learning rate" not in w.message and "samples.jsonl" in w.message
    # no collapse yet, but the length blew up: said on its own
    (w,) = check_health(steps(response_len_mean=lengths, truncated_frac=[0.0] * 10 + [0.9] * 10))
    assert w.signal == "length" and w.message.startswith("completions grew 6 -> 32 tokens")
    # longer answers that stay under the limit are learning, not a blow-up
    assert check_health(steps(response_len_mean=lengths, truncated_frac=[0.0] * 20)) == []
