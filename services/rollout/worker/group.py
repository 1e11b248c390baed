"""One prompt task -> its group of experiences (pure mappings, no I/O)."""

from __future__ import annotations

import time

from services.rollout.engines.types import SamplingParams, SequenceOutput
from services.rollout.worker.settings import WorkerSampling
from services.rollout.worker.trajectory import Trajectory, TrajectoryBuilder
from shared.schemas import Experience, PromptTask, SamplingRecord, sample_id


def task_sampling(defaults: WorkerSampling, task: PromptTask) -> SamplingParams:
    """The worker's default sampling with the task's overrides applied."""
    o = task.sampling
    pick = lambda name: getattr(o, name) if getattr(o, name) is not None else getattr(defaults, name)
    return SamplingParams(
        max_new_tokens=pick("max_new_tokens"), temperature=pick("temperature"), top_p=pick("top_p"),
        top_k=pick("top_k"), min_p=defaults.min_p, stop=tuple(pick("stop")),
        stop_token_ids=tuple(pick("stop_token_ids")), ignore_eos=pick("ignore_eos"),
    )


def sampling_record(params: SamplingParams) -> SamplingRecord:
    """What the learner needs to know of how a sample was drawn (the sampling contract of every experience)."""
    return SamplingRecord(temperature=params.temperature, top_p=params.top_p, top_k=params.top_k,
                          min_p=params.min_p, max_tokens=params.max_new_tokens)


def single_turn_trajectory(prompt_ids: list[int], prompt_text: str, out: SequenceOutput, reward: float,
                           components: dict[str, float], params: SamplingParams) -> Trajectory:
    """A single-turn sample as the one-turn trajectory: one model turn, every response token the model's."""
    assert out.finish is not None
    b = TrajectoryBuilder(prompt_ids)
    b.model(out.output_ids, out.logprobs, out.weight_version, out.version_spans)
    return b.build(finish_reason=out.finish.type, reward=reward, sampling=sampling_record(params),
                   reward_components=components, prompt_text=prompt_text, response_text=out.text)


def experiences(task: PromptTask, trajectories: list[Trajectory]) -> list[Experience]:
    """One experience per trajectory, in group order. ``action_mask`` is left out (None) when every response
    token is the model's, as single-turn samples always are."""
    now = time.time()
    group = []
    for i, t in enumerate(trajectories):
        group.append(Experience(
            id=sample_id(task.id, i), prompt_id=task.id, group_id=task.id, group_size=task.n, index=i,
            prompt_token_ids=list(t.prompt_ids), response_token_ids=list(t.response_ids),
            response_logprobs=list(t.response_logprobs), finish_reason=t.finish_reason, reward=t.reward,
            reward_components=dict(t.reward_components), weight_version=t.weight_version,
            prompt_text=t.prompt_text, response_text=t.response_text, label=task.label,
            metadata={**task.metadata, **t.metadata}, created_at=task.created_at, generated_at=now,
            action_mask=None if all(t.action_mask) else list(t.action_mask),
            version_spans=[(s[0], s[1]) for s in t.version_spans], sampling=t.sampling, grant=task.grant,
        ))
    return group
