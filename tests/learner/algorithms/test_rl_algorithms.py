"""Every registered algorithm end to end on small hand-computed batches."""

import pytest
import torch
from pydantic import TypeAdapter

from services.learner.algorithms.algorithm_settings import (
    ALGORITHMS,
    AlgorithmSettings,
    GRPOSettings,
    KLSettings,
    PPOSettings,
    ReinforcePPSettings,
    RLOOSettings,
)
from services.learner.algorithms.rl_algorithms import AdvantageInputs, build_algorithm

T = torch.tensor


def close(a, b, tol=1e-4):
    assert torch.allclose(a, T(b, dtype=a.dtype), atol=tol), f"{a.tolist()} != {b}"


def test_registry_names():
    assert ALGORITHMS.kinds() == ["ppo", "grpo", "reinforce_pp", "rloo", "sft", "rm", "dpo", "rejection_sampling",
                                  "online_dpo"]


@pytest.mark.parametrize("name", ALGORITHMS.kinds())
def test_settings_union_discriminates_on_name(name):
    parsed = TypeAdapter(AlgorithmSettings).validate_python({"name": name})
    assert parsed.name == name and type(parsed) is ALGORITHMS.settings_model(name)


def test_settings_union_rejects_unknown_name_and_keys():
    with pytest.raises(Exception, match="grpo"):
        TypeAdapter(AlgorithmSettings).validate_python({"name": "a2c"})
    with pytest.raises(Exception, match="lambd"):
        TypeAdapter(AlgorithmSettings).validate_python({"name": "grpo", "lambd": 0.9})


def test_grpo():
    # group [1, 0]: mean .5, unbiased std sqrt(.5) -> +-.7071 at the end token, returns-to-go with gamma 1
    algo = build_algorithm(GRPOSettings())
    inputs = AdvantageInputs(scores=T([1.0, 0.0]), groups=T([0, 0]), mask=T([[1.0, 1.0], [1.0, 0.0]]),
                             kl=torch.zeros(2, 2))
    adv, _ = algo.advantages(inputs)
    close(adv, [[0.7071, 0.7071], [-0.7071, 0.0]])
    assert not algo.needs_critic and not algo.needs_reference and algo.kl_loss_coef == 0.0


def test_grpo_kl_as_loss_does_not_touch_rewards():
    algo = build_algorithm(GRPOSettings(kl=KLSettings(coef=0.5, estimator="k3", placement="loss")))
    inputs = AdvantageInputs(scores=T([1.0, 0.0]), groups=T([0, 0]), mask=torch.ones(2, 2), kl=torch.ones(2, 2))
    adv, _ = algo.advantages(inputs)
    close(adv, [[0.7071, 0.7071], [-0.7071, -0.7071]])
    assert algo.kl_loss_coef == 0.5 and algo.kl_reward_coef == 0.0 and algo.needs_reference


def test_reinforce_pp_kl_in_reward_and_global_whitening():
    # kl coef .1: token rewards [[-.05, 1-.05], [0, -.1]] -> returns [[.9, .95], [-.1, -.1]]
    # whitened over 4 tokens: mean .4125, population std .51281 -> [.9507, 1.0482, -.9994, -.9994]
    algo = build_algorithm(ReinforcePPSettings(kl=KLSettings(coef=0.1, estimator="k1", placement="reward")))
    inputs = AdvantageInputs(scores=T([1.0, 0.0]), groups=T([0, 1]), mask=torch.ones(2, 2),
                             kl=T([[0.5, 0.5], [0.0, 1.0]]))
    adv, ret = algo.advantages(inputs)
    close(ret, [[0.9, 0.95], [-0.1, -0.1]])
    close(adv, [[0.9507, 1.0482], [-0.9994, -0.9994]], tol=1e-3)


def test_rloo():
    # scores [1,0,0,1]: baseline (2 - r)/3 -> adv [2/3, -2/3, -2/3, 2/3]
    algo = build_algorithm(RLOOSettings(kl=KLSettings(coef=0.0)))
    inputs = AdvantageInputs(scores=T([1.0, 0.0, 0.0, 1.0]), groups=T([5, 5, 5, 5]), mask=torch.ones(4, 1),
                             kl=torch.zeros(4, 1))
    adv, _ = algo.advantages(inputs)
    close(adv, [[2 / 3], [-2 / 3], [-2 / 3], [2 / 3]])


def test_ppo_gae_with_values():
    # same numbers as test_gae_full_mask
    algo = build_algorithm(PPOSettings(lambd=0.5, normalize_advantages=False, kl=KLSettings(coef=0.0)))
    inputs = AdvantageInputs(scores=T([1.0]), groups=T([0]), mask=torch.ones(1, 3), kl=torch.zeros(1, 3),
                             values=T([[0.5, 0.6, 0.7]]))
    adv, ret = algo.advantages(inputs)
    close(adv, [[0.225, 0.25, 0.3]])
    close(ret, [[0.725, 0.85, 1.0]])
    assert algo.needs_critic
    with pytest.raises(ValueError, match="critic"):
        algo.advantages(AdvantageInputs(scores=T([1.0]), groups=T([0]), mask=torch.ones(1, 3), kl=torch.zeros(1, 3)))


ADVANTAGE_BASED = ["ppo", "grpo", "reinforce_pp", "rloo"]  # the others train on samples, pairs or best samples


@pytest.mark.parametrize("name", ADVANTAGE_BASED)
def test_every_algorithm_zero_on_padding(name):
    settings = TypeAdapter(AlgorithmSettings).validate_python({"name": name})
    algo = build_algorithm(settings)
    torch.manual_seed(0)
    mask = T([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    inputs = AdvantageInputs(scores=T([1.0, 0.0, 0.5, 0.2]), groups=T([0, 0, 1, 1]), mask=mask,
                             kl=torch.rand(4, 3), values=torch.randn(4, 3))
    adv, ret = algo.advantages(inputs)
    assert adv.shape == ret.shape == (4, 3)
    assert (adv[mask == 0] == 0).all() and (ret[mask == 0] == 0).all()
    assert torch.isfinite(adv).all()


def test_each_algorithm_names_its_runner_and_sft_is_not_an_rl_algorithm():
    from services.learner.algorithms.algorithm_settings import SFTSettings
    from services.learner.algorithms.rl_algorithms import runner_class
    from services.learner.preference.runner import PreferenceRunner
    from services.learner.rl.runner import RLRunner
    from services.learner.sft.runner import SFTRunner

    own = {"sft": SFTRunner, "rm": PreferenceRunner, "dpo": PreferenceRunner}
    for name in ALGORITHMS.kinds():
        settings = TypeAdapter(AlgorithmSettings).validate_python({"name": name})
        assert runner_class(settings) is own.get(name, RLRunner), name
    with pytest.raises(TypeError, match="not an RL algorithm"):
        build_algorithm(SFTSettings())


def test_the_rl_runner_builds_each_algorithms_trainer():
    from services.learner.algorithms.rl_algorithms import trainer_class
    from services.learner.training.online_trainers import OnlineDPOTrainer, RejectionSamplingTrainer
    from services.learner.training.rl_trainer import RLTrainer

    own = {"online_dpo": OnlineDPOTrainer, "rejection_sampling": RejectionSamplingTrainer}
    for name in ["ppo", "grpo", "reinforce_pp", "rloo", "online_dpo", "rejection_sampling"]:
        settings = TypeAdapter(AlgorithmSettings).validate_python({"name": name})
        assert trainer_class(settings) is own.get(name, RLTrainer), name
