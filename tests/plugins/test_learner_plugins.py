"""Third-party algorithms, policy losses and off-policy corrections: each registered with its settings model,
configured in the learner settings (``algorithm: {name: ...}``, ``policy_loss: {kind: ...}``,
``correction: {kind: ...}``) and run by the real learner: the RL trainer trains with them (rewarded responses
become more likely), and the learner service starts the runner the algorithm registered."""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from typing import Any, ClassVar, Literal

import pytest
import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from services.learner.algorithms.algorithm_settings import ALGORITHMS, RLAlgorithmSettings
from services.learner.algorithms.correction_settings import CORRECTIONS, CorrectionSettingsBase
from services.learner.algorithms.corrections import Correction, truncated_is
from services.learner.algorithms.policy_loss_settings import POLICY_LOSSES, PolicyLossSettingsBase
from services.learner.algorithms.policy_losses import PolicyLossInputs, PolicyLossOutput
from services.learner.algorithms.rl_algorithms import Algorithm, LearnerAlgorithm
from tests.learner.helpers import BAD, GOOD, good_bad_batch, response_logprob, settings

CALLS: Counter[str] = Counter()


# ---- an RL algorithm: advantages are the sign of the reward against its group's mean, times a scale -------
class SignSettings(RLAlgorithmSettings):
    name: Literal["sign_test"] = "sign_test"
    scale: float = Field(default=1.0, gt=0, description="Size of every advantage.")


class SignAlgorithm(Algorithm):
    name = "sign_test"
    settings: SignSettings

    def shape_scores(self, scores: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
        CALLS["algorithm"] += 1
        counts = torch.bincount(groups).to(scores.dtype)
        means = torch.zeros_like(counts).index_add_(0, groups, scores) / counts
        return self.settings.scale * torch.sign(scores - means[groups])


# ---- a policy loss: REINFORCE with a temperature on the advantages ------------------------------------
class TemperedSettings(PolicyLossSettingsBase):
    kind: Literal["tempered_test"] = "tempered_test"
    temperature: float = Field(default=1.0, gt=0)


def tempered_loss(x: PolicyLossInputs, temperature: float) -> PolicyLossOutput:
    CALLS["loss"] += 1
    loss = -(x.advantages / temperature) * x.logp * x.weights * x.mask
    return PolicyLossOutput(loss=loss, ratio=(x.logp - x.old_logp).exp().detach(), clipped=x.mask * 0.0)


# ---- a correction: truncated IS with a cap given as a log ----------------------------------------------
class LogCapSettings(CorrectionSettingsBase):
    kind: Literal["logcap_test"] = "logcap_test"
    log_cap: float = Field(default=0.7, gt=0)


def logcap_is(learner_lp: torch.Tensor, engine_lp: torch.Tensor, mask: torch.Tensor, log_cap: float) -> Correction:
    CALLS["correction"] += 1
    return truncated_is(learner_lp, engine_lp, mask, math.exp(log_cap))


def custom_correction(learner_lp: torch.Tensor, engine_lp: torch.Tensor, mask: torch.Tensor,
                      cap: float = 2.0) -> Correction:
    """A correction by import path (``correction: {kind: custom, path: ...}``)."""
    CALLS["custom correction"] += 1
    return truncated_is(learner_lp, engine_lp, mask, cap)


def trains(tiny_model_dir, tmp_path, algorithm: dict[str, Any]) -> dict[str, float]:
    """Six real training steps on the tiny model; rewarded responses must become more likely."""
    from services.learner.training.rl_trainer import RLTrainer

    trainer = RLTrainer(settings(tiny_model_dir, tmp_path, algorithm=algorithm), total_steps=6)
    good0, bad0 = response_logprob(trainer, [GOOD] * 3), response_logprob(trainer, [BAD] * 3)
    for step in range(6):
        metrics = trainer.train_step(good_bad_batch(step))
        assert all(math.isfinite(v) for v in metrics.values()), metrics
    good1, bad1 = response_logprob(trainer, [GOOD] * 3), response_logprob(trainer, [BAD] * 3)
    assert good1 - bad1 > (good0 - bad0) + 1.0, (good0, bad0, good1, bad1)
    return metrics


def test_a_registered_algorithm_loss_and_correction_are_configured_and_train(tiny_model_dir, tmp_path, registered):
    algorithm = {"name": "sign_test", "scale": 2.0, "policy_loss": {"kind": "tempered_test", "temperature": 0.5},
                 "correction": {"kind": "logcap_test", "log_cap": 0.5}}
    with pytest.raises(ValidationError, match="unknown algorithm name 'sign_test'"):
        settings(tiny_model_dir, tmp_path, algorithm=algorithm)
    registered(ALGORITHMS, "sign_test", SignSettings, SignAlgorithm)
    with pytest.raises(ValidationError, match="unknown policy loss kind 'tempered_test'"):
        settings(tiny_model_dir, tmp_path, algorithm=algorithm)
    registered(POLICY_LOSSES, "tempered_test", TemperedSettings, tempered_loss)
    with pytest.raises(ValidationError, match="unknown correction kind 'logcap_test'"):
        settings(tiny_model_dir, tmp_path, algorithm=algorithm)
    registered(CORRECTIONS, "logcap_test", LogCapSettings, "tests.plugins.test_learner_plugins:logcap_is")
    with pytest.raises(ValidationError, match=r"algorithm.policy_loss.temperature"):
        settings(tiny_model_dir, tmp_path, algorithm={**algorithm, "policy_loss": {"kind": "tempered_test",
                                                                                    "temperature": 0}})
    s = settings(tiny_model_dir, tmp_path, algorithm=algorithm)
    assert isinstance(s.algorithm, SignSettings) and isinstance(s.algorithm.policy_loss, TemperedSettings)
    assert isinstance(s.algorithm.correction, LogCapSettings) and s.algorithm.correction.log_cap == 0.5
    CALLS.clear()
    metrics = trains(tiny_model_dir, tmp_path, algorithm)
    assert CALLS["algorithm"] >= 6 and CALLS["loss"] >= 6 and CALLS["correction"] >= 6
    assert 0 < metrics["is_weight_mean"] <= math.exp(0.5)


def test_a_correction_of_your_own_by_import_path(tiny_model_dir, tmp_path):
    """Corrections take ``custom`` with an import path, as losses do (before: no such kind)."""
    algorithm = {"name": "grpo", "correction": {"kind": "custom", "path": "tests.plugins.test_learner_plugins:"
                                                "custom_correction", "kwargs": {"cap": 1.5}}}
    CALLS.clear()
    metrics = trains(tiny_model_dir, tmp_path, algorithm)
    assert CALLS["custom correction"] >= 6 and 0 < metrics["is_weight_mean"] <= 1.5
    with pytest.raises(ValidationError, match="correction.path"):
        settings(tiny_model_dir, tmp_path, algorithm={"name": "grpo", "correction": {"kind": "custom",
                                                                                      "path": "not a path"}})


def test_a_loss_or_correction_returning_the_wrong_thing_fails_with_its_name(tiny_model_dir, tmp_path, registered):
    from services.learner.algorithms.corrections import build_correction

    registered(CORRECTIONS, "logcap_test", LogCapSettings, lambda lp, elp, m, log_cap: m)
    fn = build_correction(LogCapSettings())
    with pytest.raises(TypeError, match="correction logcap_test returned Tensor, not Correction"):
        fn(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2))


# ---- an algorithm with a runner of its own, started by the learner service ----------------------------
class CountSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: Literal["count_test"] = "count_test"
    up_to: int = Field(default=3, ge=1)


class CountRunner:
    """Owns the run: counts to ``up_to`` and is done (needs no Redis)."""

    needs_redis: ClassVar[bool] = False

    def __init__(self, settings: Any, redis: Any, sink: Any) -> None:
        self.settings, self.phase, self.error, self.step = settings, "starting", None, 0

    async def run(self, stop: asyncio.Event) -> None:
        self.phase = "running"
        while self.step < self.settings.algorithm.up_to and not stop.is_set():
            self.step += 1
            await asyncio.sleep(0)
        self.phase = "done"

    def status(self) -> dict[str, Any]:
        return {"phase": self.phase, "step": self.step, "algorithm": "count_test"}

    def request_checkpoint(self) -> asyncio.Future:
        raise NotImplementedError


class Count(LearnerAlgorithm):
    name = "count_test"
    runner = CountRunner


async def test_the_learner_service_starts_the_runner_the_algorithm_registered(tiny_model_dir, tmp_path, registered):
    from services.learner.service import LearnerService

    registered(ALGORITHMS, "count_test", CountSettings, Count)
    s = settings(tiny_model_dir, tmp_path, algorithm={"name": "count_test", "up_to": 4}, exit_when_done=False,
                 observability={"progress_bar": False})
    service = LearnerService(s)
    await service.start()
    await asyncio.wait_for(service._task, 10)
    assert isinstance(service.runner, CountRunner) and service.redis is None
    assert service.status()["step"] == 4 and service.exit_code == 0
    await service.stop()


def test_an_algorithm_without_a_runner_class_is_refused_when_the_learner_starts(registered):
    from services.learner.algorithms.rl_algorithms import runner_class
    from shared.service_kit.loader import LoadError

    class NoRunner(LearnerAlgorithm):
        runner = "tests.plugins.test_learner_plugins:CountSettings"  # a class, but not a runner

    registered(ALGORITHMS, "count_test", CountSettings, NoRunner)
    with pytest.raises(LoadError, match=r"runner of algorithm 'count_test': class CountSettings is not a Runner \(missing: needs_redis, run, "):
        runner_class(CountSettings())
