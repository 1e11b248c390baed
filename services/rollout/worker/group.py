"""One prompt task -> its group of experiences (pure mapping, no I/O)."""

from __future__ import annotations

import time

from services.rollout.engines.types import SamplingParams, SequenceOutput
from services.rollout.settings import WorkerSampling
from shared.reward_api import ScoreResponse
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


def experiences(task: PromptTask, prompt_ids: list[int], prompt_text: str, outs: list[SequenceOutput],
                scores: ScoreResponse, params: SamplingParams) -> list[Experience]:
    """One experience per sample of a single-turn group: every response token is the model's, from one version."""
    now = time.time()
    record = sampling_record(params)
    group = []
    for i, (out, score, comps) in enumerate(zip(outs, scores.scores, scores.components)):
        assert score is not None and out.finish is not None
        group.append(Experience(
            id=sample_id(task.id, i), prompt_id=task.id, group_id=task.id, group_size=task.n, index=i,
            prompt_token_ids=prompt_ids, response_token_ids=out.output_ids, response_logprobs=out.logprobs,
            finish_reason=out.finish.type, reward=float(score),
            reward_components={k: float(v) for k, v in comps.items() if v is not None},
            weight_version=out.weight_version, prompt_text=prompt_text, response_text=out.text, label=task.label,
            metadata=task.metadata, created_at=task.created_at, generated_at=now,
            version_spans=[(0, out.weight_version)], sampling=record,
        ))
    return group
