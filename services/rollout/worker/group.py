"""One prompt task -> its sampling and single-turn trajectories (pure mappings, no I/O); the group's records are
written by :func:`services.rollout.experiences.experiences`, as a session's are."""

from __future__ import annotations

from services.rollout.engines.types import SamplingParams, SequenceOutput
from services.rollout.trajectory import Trajectory, TrajectoryBuilder
from services.rollout.worker.settings import WorkerSampling
from shared.schemas import PromptTask, SamplingRecord


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
