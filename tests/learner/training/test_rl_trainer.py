"""Real torch training on the tiny model: rewarded responses become more likely, for every algorithm."""

import math

import pytest
import torch

from services.learner.algorithms.algorithm_settings import ALGORITHMS
from services.learner.algorithms.correction_settings import CORRECTIONS as CORRECTION_KINDS
from services.learner.algorithms.policy_loss_settings import POLICY_LOSSES
from services.learner.algorithms.rl_algorithms import Algorithm
from services.learner.training.rl_trainer import RLTrainer
from tests.learner.helpers import BAD, GOOD, good_bad_batch, response_logprob, settings

#: every registered RL algorithm (an Algorithm: advantages for the RL trainer), with the settings it is tried with
ALGOS = {name: {"name": name} for name in ALGORITHMS.kinds() if issubclass(ALGORITHMS.load(name), Algorithm)} | {
    "rloo": {"name": "rloo", "kl": {"coef": 0.01}},
    "reinforce_pp": {"name": "reinforce_pp", "kl": {"coef": 0.01, "estimator": "k2"}},
    "ppo": {"name": "ppo", "kl": {"coef": 0.01}, "ppo_epochs": 2},
}


@pytest.mark.parametrize("name", sorted(ALGOS))
def test_rewarded_response_becomes_more_likely(name, tiny_model_dir, tmp_path):
    s = settings(tiny_model_dir, tmp_path, algorithm=ALGOS[name])
    trainer = RLTrainer(s, total_steps=6)
    good0, bad0 = response_logprob(trainer, [GOOD] * 3), response_logprob(trainer, [BAD] * 3)
    for step in range(6):
        metrics = trainer.train_step(good_bad_batch(step))
        assert all(math.isfinite(v) for v in metrics.values()), metrics
    good1, bad1 = response_logprob(trainer, [GOOD] * 3), response_logprob(trainer, [BAD] * 3)
    assert good1 > good0 + 1.0, (good0, good1)
    assert good1 - bad1 > (good0 - bad0) + 2.0
    assert trainer.global_step == 6
    assert metrics["reward_mean"] == pytest.approx(0.5)
    assert metrics["samples"] == 8 and metrics["tokens"] > 0 and metrics["actor_grad_norm"] > 0
    assert metrics["environment_tokens_mean"] == 0.0  # single-turn: every response token is the model's
    if name == "ppo":
        assert metrics["value_loss"] >= 0 and "critic_grad_norm" in metrics
    if ALGOS[name].get("kl"):
        assert metrics["kl"] != 0.0  # the policy moved away from the reference


#: every registered policy loss (its defaults, unless given here); ppo is tried with dual clip
LOSSES = {kind: {"kind": kind} for kind in POLICY_LOSSES.kinds() if kind != "ppo"} | {
    "ppo_dual_clip": {"kind": "ppo", "eps_high": 0.28, "dual_clip": 3.0},
    "dr_grpo": {"kind": "dr_grpo", "normalizer": 8},
    "custom": {"kind": "custom", "path": "tests.learner.training.custom_loss:plain_reinforce", "kwargs": {"scale": 1.0}},
}
#: every registered correction (its defaults, unless given here; tis: test_metrics_clip_fraction_and_tis), mis at
#: both levels
CORRECTIONS = {kind: {"kind": kind} for kind in CORRECTION_KINDS.kinds() if kind not in ("tis", "mis")} | {
    "mis_token": {"kind": "mis", "level": "token"},
    "mis_sequence": {"kind": "mis", "level": "sequence"},
    "geo_seq": {"kind": "geo_seq", "cap": 2.0},
    "custom": {"kind": "custom", "path": "services.learner.algorithms.corrections:truncated_is", "kwargs": {"cap": 2.0}},
}


def on_policy(trainer, batch):
    """The batch with the engine logprobs a fleet holding the trainer's current weights would report."""
    from services.learner.training.batch import action_logprobs, build_rl_batch

    rb = build_rl_batch(batch, trainer.pad_id).to(trainer.device)
    with torch.no_grad():
        lp, _ = action_logprobs(trainer.actor.model, rb)
    out = []
    for row, e in enumerate(batch):
        n = len(e.response_token_ids)
        mask = rb.action_mask[row].bool()
        out.append(e.model_copy(update={"response_logprobs": lp[row][mask][:n].tolist()}))
    return out


def rewarded_becomes_more_likely(trainer, steps: int = 6, engine=None) -> dict:
    good0, bad0 = response_logprob(trainer, [GOOD] * 3), response_logprob(trainer, [BAD] * 3)
    for step in range(steps):
        batch = good_bad_batch(step)
        metrics = trainer.train_step(engine(trainer, batch) if engine else batch)
        assert all(math.isfinite(v) for v in metrics.values()), metrics
    good1, bad1 = response_logprob(trainer, [GOOD] * 3), response_logprob(trainer, [BAD] * 3)
    assert good1 > good0 + 1.0, (good0, good1)
    assert good1 - bad1 > (good0 - bad0) + 2.0
    return metrics


@pytest.mark.parametrize("loss", sorted(LOSSES))
def test_rewarded_response_becomes_more_likely_with_every_policy_loss(loss, tiny_model_dir, tmp_path):
    algo = {"name": "grpo", "policy_loss": LOSSES[loss], "norm_std": loss != "dr_grpo"}
    trainer = RLTrainer(settings(tiny_model_dir, tmp_path, algorithm=algo), total_steps=6)
    metrics = rewarded_becomes_more_likely(trainer)
    assert metrics["samples"] == 8 and metrics["actor_grad_norm"] > 0


@pytest.mark.parametrize("correction", sorted(CORRECTIONS))
def test_rewarded_response_becomes_more_likely_with_every_correction(correction, tiny_model_dir, tmp_path):
    algo = {"name": "grpo", "correction": CORRECTIONS[correction]}
    trainer = RLTrainer(settings(tiny_model_dir, tmp_path, algorithm=algo), total_steps=6)
    # the rejecting corrections (mis, icepop) need engine logprobs that follow the policy, as a real fleet's do
    metrics = rewarded_becomes_more_likely(trainer, engine=on_policy)
    assert metrics["is_rejected_frac"] < 0.5  # the engine logprobs (-5.5) are near the model's: little rejected
    assert metrics["mismatch_abs_mean"] < 1e-3  # on policy: the learner scores what the engine sampled


def test_metrics_clip_fraction_and_tis(tiny_model_dir, tmp_path):
    # Several epochs with a large LR push ratios out of the clip range; stale engine logprobs (-5.5 vs the
    # model's ~-5.57) keep TIS weights near 1 and below the cap.
    s = settings(tiny_model_dir, tmp_path, algorithm={"name": "grpo", "ppo_epochs": 4, "correction": {"kind": "tis", "cap": 1.5}},
                 optim={"actor_lr": 5e-3}, train={"mini_batch_size": 4})
    trainer = RLTrainer(s, total_steps=2)
    m = trainer.train_step(good_bad_batch(0))
    assert 0.0 < m["clip_frac"] <= 1.0
    assert 0.0 < m["is_weight_mean"] <= 1.5 and 0.0 <= m["is_capped_frac"] <= 1.0
    assert m["mismatch_abs_mean"] > 0 and m["mismatch_k3"] >= 0 and m["is_rejected_frac"] == 0
    assert m["entropy"] > 0


def test_actor_frozen_during_critic_warmup(tiny_model_dir, tmp_path):
    s = settings(tiny_model_dir, tmp_path, algorithm={"name": "ppo"}, train={"freeze_actor_steps": 1})
    trainer = RLTrainer(s, total_steps=3)
    before = {k: v.clone() for k, v in trainer.actor.model.state_dict().items()}
    critic_before = [p.clone() for p in trainer.critic.model.parameters()]
    m = trainer.train_step(good_bad_batch(0))
    assert m["actor_frozen"] == 1.0
    assert all(torch.equal(before[k], v) for k, v in trainer.actor.model.state_dict().items())
    assert any(not torch.equal(a, b) for a, b in zip(critic_before, trainer.critic.model.parameters()))
    m = trainer.train_step(good_bad_batch(1))
    assert m["actor_frozen"] == 0.0
    assert any(not torch.equal(before[k], v) for k, v in trainer.actor.model.state_dict().items())


def test_critic_from_reward_model_reuses_its_head(tiny_model_dir, tiny_reward_model_dir, tmp_path):
    from transformers import AutoModelForSequenceClassification

    s = settings(tiny_model_dir, tmp_path, algorithm={"name": "ppo"},
                 model={"critic": str(tiny_reward_model_dir)}, optim={"actor_lr": 1e-4, "critic_lr": 2e-3})
    trainer = RLTrainer(s, total_steps=1)
    rm = AutoModelForSequenceClassification.from_pretrained(tiny_reward_model_dir)
    assert torch.equal(trainer.critic.model.inner.score.weight, rm.score.weight)
    m = trainer.train_step(good_bad_batch(0))
    assert m["critic_lr"] == pytest.approx(2e-3) and m["actor_lr"] == pytest.approx(1e-4)


def test_policy_weights_of_a_plain_actor_are_the_module_itself(tiny_model_dir, tmp_path):
    from services.learner.weights import packing

    trainer = RLTrainer(settings(tiny_model_dir, tmp_path, algorithm=ALGOS["grpo"]), total_steps=1)
    weights = trainer.policy_weights()
    model = trainer.actor.model
    assert weights is model  # no state dict built per publish
    # the publisher reads the module's tensors under the names, and from the memory, a state dict would give
    named = packing.named_tensors(weights)
    state = model.state_dict()
    assert [n for n, _ in named] == [n for n, _ in packing.named_tensors(state)]
    assert all(t.data_ptr() == state[n].data_ptr() for n, t in named)


def _forwards(trainer) -> list[int]:
    calls = [0]
    trainer.actor.model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def test_a_one_update_step_runs_the_actor_forward_once_and_trains_as_two_passes_did(tiny_model_dir, tmp_path):
    """A step that is one update of one pass (the whole batch in one micro-batch, one epoch, no reference, no critic)
    takes its old log-probs from the pass that trains (one actor forward, not a no-grad one first); the weights it
    reaches are those of the two-pass path (here: two micro-batches of 4)."""
    algo = {"name": "grpo", "correction": {"kind": "tis", "cap": 2.0}}
    fused = RLTrainer(settings(tiny_model_dir, tmp_path / "a", algorithm=algo, train={"micro_batch_size": 8}),
                      total_steps=3)
    split = RLTrainer(settings(tiny_model_dir, tmp_path / "b", algorithm=algo, train={"micro_batch_size": 4}),
                      total_steps=3)
    calls = _forwards(fused), _forwards(split)
    for step in range(3):
        m_fused, m_split = fused.train_step(good_bad_batch(step)), split.train_step(good_bad_batch(step))
        assert m_fused["policy_loss"] == pytest.approx(m_split["policy_loss"], abs=1e-5)
        assert m_fused["mismatch_abs_mean"] == pytest.approx(m_split["mismatch_abs_mean"], abs=1e-5)
        assert m_fused["ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert calls[0][0] == 3  # one forward per step
    assert calls[1][0] == 3 * (2 + 2)  # a no-grad pass and a training pass, each in two micro-batches
    for (name, p), (_, q) in zip(fused.actor.model.named_parameters(), split.actor.model.named_parameters()):
        assert torch.allclose(p, q, atol=1e-5), name


def test_the_scores_an_owner_hands_its_ranks_are_shaped_as_one_rank_shapes_them(tiny_model_dir, tmp_path):
    """N ranks x B/N = 1 rank x B: the running reward statistics take in the whole batch's scores, which the
    owner of N ranks passes as ``batch_scores``; with a soft overlong penalty they are the penalised ones (the
    owner once passed the raw rewards, so the statistics, and every normalised score, differed from one rank's)."""
    algo = {"name": "grpo", "normalize_rewards": True,
            "overlong": {"kind": "soft_penalty", "budget": 4, "buffer": 2}}
    batch = good_bad_batch(0)
    one = RLTrainer(settings(tiny_model_dir, tmp_path / "one", algorithm=algo), total_steps=1)
    one.train_step(batch)
    owner = RLTrainer(settings(tiny_model_dir, tmp_path / "owner", algorithm=algo), total_steps=1)
    scores = owner.batch_scores(batch)
    assert scores != [e.reward for e in batch]  # responses of 3-4 tokens are penalised under this budget
    owner.train_step(batch, batch_scores=scores, batch_samples=len(batch))
    assert owner.reward_stats.state_dict() == pytest.approx(one.reward_stats.state_dict())
