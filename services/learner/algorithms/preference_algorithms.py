"""The preference algorithms' classes (the algorithm plug-in point's implementations; settings in
:mod:`.preference_settings`). Offline ones (``rm``, ``dpo``) are run by the preference run owner; online ones
(``rejection_sampling``, ``online_dpo``) by the RL run owner, exactly as GRPO, with their own trainer: only the
"train on a batch of complete groups" step differs (:mod:`services.learner.training.online_trainers`)."""

from __future__ import annotations

from services.learner.algorithms.rl_algorithms import LearnerAlgorithm


class RewardModel(LearnerAlgorithm):
    """Bradley-Terry reward-model training on preference pairs."""

    name = "rm"
    runner = "services.learner.preference.runner:PreferenceRunner"


class DPO(LearnerAlgorithm):
    """Offline DPO on preference pairs."""

    name = "dpo"
    runner = "services.learner.preference.runner:PreferenceRunner"


class RejectionSampling(LearnerAlgorithm):
    """Best-of-n through the fleet: each group's best sample above the threshold is SFT data."""

    name = "rejection_sampling"
    trainer = "services.learner.training.online_trainers:RejectionSamplingTrainer"


class OnlineDPO(LearnerAlgorithm):
    """Online DPO through the fleet: each group's best and worst sample, far enough apart, form a pair."""

    name = "online_dpo"
    trainer = "services.learner.training.online_trainers:OnlineDPOTrainer"
