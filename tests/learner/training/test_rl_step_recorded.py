"""RLTrainer.train_step's metrics, three steps of each case, against values recorded from the trainer's code
before its step was cut into named stages (commit e43feb5). A change of the step's structure must leave them
where they were: same RNG draws, same losses, same metric keys.

The cases between them take every branch of the step: the fused one-pass update, the reference and the
critic, several epochs of mini-batches, a frozen actor, KL in the reward and in the loss, each overlong kind,
reward normalisation and clipping, a rejecting correction, passes by token budget, and a shard of a larger
(two-rank) batch whose statistics come from ``batch_scores``.

Re-record (``python -m tests.learner.training.test_rl_step_recorded``) only on the commit *before* a change
of the step, or when a new torch / transformers changes the tiny model's numbers; never to make a change pass.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from services.learner.training.rl_trainer import RLTrainer
from tests.learner.helpers import good_bad_batch, settings

RECORDED = Path(__file__).with_name("rl_step_recorded.json")
STEPS = 3
TIMING = {"step_time_s", "tokens_per_s"}  # wall-clock: not the step's numbers

CASES: dict[str, dict] = {
    "grpo_one_pass": {"algorithm": {"name": "grpo", "correction": {"kind": "tis", "cap": 2.0}},
                      "train": {"micro_batch_size": 8}},
    "ppo_frozen_first_two_epochs": {
        "algorithm": {"name": "ppo", "kl": {"coef": 0.01, "estimator": "k2"}, "ppo_epochs": 2,
                      "normalize_rewards": True},
        "train": {"mini_batch_size": 4, "micro_batch_size": 2, "freeze_actor_steps": 1}},
    "grpo_kl_loss_soft_penalty": {
        "algorithm": {"name": "grpo", "kl": {"coef": 0.05, "estimator": "k3", "placement": "loss"},
                      "overlong": {"kind": "soft_penalty", "budget": 4, "buffer": 2, "coef": 0.5},
                      "normalize_rewards": True, "reward_clip": 1.2, "entropy_coef": 0.01},
        "truncate": True},
    "rloo_mask_mis_token_budget": {
        "algorithm": {"name": "rloo", "overlong": {"kind": "mask"},
                      "correction": {"kind": "mis", "level": "token", "low": 0.55, "high": 2.0}},
        "train": {"micro_batch_tokens": 24}, "truncate": True},
    "reinforce_pp_shard_of_two_ranks": {
        "algorithm": {"name": "reinforce_pp", "overlong": {"kind": "soft_penalty", "budget": 5, "buffer": 3},
                      "normalize_rewards": True, "correction": {"kind": "geo_seq", "cap": 1.5}},
        "train": {"mini_batch_size": 8}, "truncate": True, "other_rank_scores": [0.25, 0.5, 2.0, 0.0] * 2},
}


def _batch(step: int, truncate: bool) -> list:
    """The test batch of ``step``; with ``truncate`` the longest response of each group was cut by length."""
    batch = good_bad_batch(step)
    if truncate:
        batch = [e.model_copy(update={"finish_reason": "length"}) if e.index == 2 else e for e in batch]
    return batch


def run_case(name: str, model_dir: Path, tmp_path: Path) -> list[dict[str, float]]:
    """The metrics of ``STEPS`` steps of case ``name`` (timings left out)."""
    case = CASES[name]
    sections = {k: v for k, v in case.items() if k in ("algorithm", "train")}
    trainer = RLTrainer(settings(model_dir, tmp_path, **sections), total_steps=STEPS)
    out = []
    for step in range(STEPS):
        batch = _batch(step, case.get("truncate", False))
        kwargs = {}
        if "other_rank_scores" in case:  # this rank's shard of a batch twice its size
            scores = [float(e.reward) for e in batch] + case["other_rank_scores"]
            kwargs = {"batch_scores": scores, "batch_samples": len(scores)}
        metrics = trainer.train_step(batch, **kwargs)
        out.append({k: v for k, v in metrics.items() if k not in TIMING})
    return out


@pytest.mark.parametrize("name", sorted(CASES))
def test_step_metrics_are_the_recorded_ones(name, tiny_model_dir, tmp_path):
    recorded = json.loads(RECORDED.read_text())[name]
    got = run_case(name, tiny_model_dir, tmp_path)
    assert len(got) == len(recorded) == STEPS
    for step, (g, want) in enumerate(zip(got, recorded)):
        assert sorted(g) == sorted(want), (step, set(g) ^ set(want))
        for key, value in want.items():
            # bit-identical where recorded; the tolerance is for another machine's float kernels
            assert g[key] == pytest.approx(value, rel=1e-5, abs=1e-7), (name, step, key)


def test_the_cases_cover_every_overlong_kind_and_the_fused_and_sharded_steps():
    kinds = {c["algorithm"].get("overlong", {"kind": "none"})["kind"] for c in CASES.values()}
    assert kinds == {"none", "mask", "soft_penalty"}
    assert any(c.get("train", {}).get("micro_batch_size") == 8 for c in CASES.values())  # one pass: fused
    assert any("other_rank_scores" in c for c in CASES.values())


if __name__ == "__main__":
    from deploy.local.tiny_model import build_tiny_causal_lm

    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_causal_lm(Path(tmp) / "tiny-lm")
        recorded = {name: run_case(name, model, Path(tmp) / name) for name in sorted(CASES)}
    RECORDED.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")
    print(f"recorded {len(recorded)} cases in {RECORDED}")
