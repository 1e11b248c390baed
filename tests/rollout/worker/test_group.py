"""The sampling contract: every single-turn experience says how it was sampled (``sampling``) and by which
weight version each token was produced (``version_spans``), and both survive the queue's codec."""

from __future__ import annotations

import pytest

from services.rollout.engines.types import Finish, SequenceOutput
from services.rollout.experiences import experiences
from services.rollout.worker.group import sampling_record, single_turn_trajectory, task_sampling
from services.rollout.worker.settings import WorkerSampling
from shared.codec import decode, encode
from shared.schemas import Experience, PromptTask, SamplingOverrides, SamplingRecord


def _out(ids: list[int], version: int) -> SequenceOutput:
    return SequenceOutput(rid="r", prompt_ids=(1, 2), output_ids=ids, logprobs=[-0.5] * len(ids), text="x" * len(ids),
                          finish=Finish("stop", matched=4), weight_version=version)


def test_task_overrides_reach_the_sampling_record():
    defaults = WorkerSampling(max_new_tokens=64, temperature=0.7, top_p=0.9, top_k=20, min_p=0.05)
    task = PromptTask(id="t", prompt="hi", n=2, sampling=SamplingOverrides(temperature=1.3, max_new_tokens=5))
    params = task_sampling(defaults, task)
    assert sampling_record(params) == SamplingRecord(temperature=1.3, top_p=0.9, top_k=20, min_p=0.05, max_tokens=5)


@pytest.mark.parametrize("versions", [(0, 0), (3, 3)])
def test_every_single_turn_experience_carries_sampling_and_version_spans(versions):
    task = PromptTask(id="t", prompt="hi", n=2, label="a")
    params = task_sampling(WorkerSampling(max_new_tokens=7, temperature=0.0), task)
    outs = [_out([5, 6, 4], versions[0]), _out([], versions[1])]  # an empty response is still a sample
    trajectories = [single_turn_trajectory([1, 2], "hi", o, r, {"r": r}, params) for o, r in zip(outs, (1.0, 0.0))]
    group = experiences(task, trajectories)
    for e, v in zip(group, versions):
        assert e.sampling == SamplingRecord(temperature=0.0, top_p=1.0, top_k=-1, min_p=0.0, max_tokens=7)
        assert e.version_spans == [(0, v)] and e.weight_version == v
        assert e.action_mask is None  # the one-turn case: every response token is the model's
        assert e.reward_components == {"r": e.reward} and e.response_text == "x" * len(e.response_token_ids)
        back = decode(encode(e), Experience)
        assert back.sampling == e.sampling and back.version_spans == e.version_spans
        assert back.token_versions() == [v] * len(e.response_token_ids)


def test_the_tasks_grant_goes_into_every_experience_and_through_the_codec():
    """The learner trains only groups it issued: a worker copies the task's grant into each experience (and the
    codec carries it, schema v3), and passes it nowhere else."""
    task = PromptTask(id="e0-1", prompt="hi", n=2, grant="f" * 40)
    params = task_sampling(WorkerSampling(max_new_tokens=7, temperature=0.0), task)
    trajectories = [single_turn_trajectory([1, 2], "hi", _out([5], 0), 1.0, {}, params) for _ in range(2)]
    group = experiences(task, trajectories)
    assert [decode(encode(e), Experience).grant for e in group] == ["f" * 40] * 2
    assert "grant" not in group[0].metadata and decode(encode(task), PromptTask).grant == "f" * 40
