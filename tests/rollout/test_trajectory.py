"""TrajectoryBuilder: ids append turn by turn; the mask, logprob placeholders and version spans follow."""

from __future__ import annotations

import pytest

from services.rollout.experiences import experiences
from services.rollout.trajectory import TrajectoryBuilder
from shared.schemas import PromptTask, SamplingRecord

REC = SamplingRecord(temperature=1.0, max_tokens=8)


def test_turns_concatenate_with_mask_logprobs_and_versions():
    b = TrajectoryBuilder([1, 2])
    b.model([10, 11], [-0.1, -0.2], weight_version=3)
    b.environment([20, 21, 22])
    b.model([12], [-0.3], weight_version=3)  # same version: no new span
    b.environment([23])
    b.model([13, 14], [-0.4, -0.5], weight_version=4)  # the weights changed between turns
    t = b.build(finish_reason="stop", reward=1.0, sampling=REC)
    assert t.response_ids == (10, 11, 20, 21, 22, 12, 23, 13, 14)
    assert t.action_mask == (1, 1, 0, 0, 0, 1, 0, 1, 1)
    assert t.response_logprobs == pytest.approx((-0.1, -0.2, 0, 0, 0, -0.3, 0, -0.4, -0.5))
    assert t.version_spans == ((0, 3), (7, 4)) and t.weight_version == 3
    assert [(x.kind, x.start, len(x.ids)) for x in t.turns] == [
        ("model", 0, 2), ("environment", 2, 3), ("model", 5, 1), ("environment", 6, 1), ("model", 7, 2)]
    (e,) = experiences(PromptTask(id="p", prompt="x"), [t])
    assert list(e.action_mask) == list(t.action_mask) and e.version_spans == [(0, 3), (7, 4)]
    assert e.token_versions() == [3] * 7 + [4] * 2 and e.weight_version == 3


def test_the_one_turn_case_has_no_mask_on_the_wire():
    b = TrajectoryBuilder([1])
    b.model([5, 6], [-1.0, -1.0], weight_version=0)
    (e,) = experiences(PromptTask(id="p", prompt="x"), [b.build(finish_reason="length", reward=0.0, sampling=REC)])
    assert e.action_mask is None and e.version_spans == [(0, 0)] and e.finish_reason == "length"


def test_versions_changing_inside_a_turn_partial_rollouts():
    b = TrajectoryBuilder([1])
    b.model([5, 6, 7], [-1.0] * 3, weight_version=2, version_spans=[(0, 2), (2, 3)])
    b.environment([8, 9])
    b.model([10, 11], [-1.0] * 2, weight_version=3, version_spans=[(0, 3), (1, 4)])
    t = b.build(finish_reason="stop", reward=0.0, sampling=REC)
    assert t.version_spans == ((0, 2), (2, 3), (6, 4)) and t.weight_version == 2
    (e,) = experiences(PromptTask(id="p", prompt="x"), [t])
    assert e.token_versions() == [2, 2, 3, 3, 3, 3, 4]


def test_an_empty_last_model_turn_opens_no_span():
    b = TrajectoryBuilder([1])
    b.model([5], [-1.0], weight_version=1)
    b.environment([7])
    b.model([], [], weight_version=2)
    t = b.build(finish_reason="length", reward=0.0, sampling=REC)
    assert t.version_spans == ((0, 1),)


@pytest.mark.parametrize(("build", "error"), [
    (lambda b: b.environment([1]), "cannot come before the first model turn"),
    (lambda b: b.model([1, 2], [-1.0], weight_version=0), "2 ids but 1 logprobs"),
])
def test_malformed_turns_are_refused(build, error):
    with pytest.raises(ValueError, match=error):
        build(TrajectoryBuilder([1]))


def test_a_reward_must_be_finite():
    b = TrajectoryBuilder([1])
    b.model([5], [-1.0], weight_version=0)
    with pytest.raises(ValueError, match="finite"):
        b.build(finish_reason="stop", reward=float("nan"), sampling=REC)


def test_a_model_turn_generated_across_weight_switches_keeps_its_version_spans():
    from services.rollout.trajectory import TrajectoryBuilder

    b = TrajectoryBuilder([1, 2])
    b.model([10, 11], [-0.1, -0.2], 3)
    b.environment([20, 21, 22])
    # the second model turn: its first token from version 3, the rest from version 4 (a partial rollout)
    b.model([12, 13, 14], [-0.3, -0.4, -0.5], 3, version_spans=[(0, 3), (1, 4)])
    assert b.spans == [(0, 3), (6, 4)]
