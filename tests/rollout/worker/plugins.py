"""Rollout functions for the contract tests, loaded by import path (``tests.rollout.worker.plugins:<name>``)."""

from __future__ import annotations

from dataclasses import replace

from services.rollout.worker.contract import RolloutContext
from services.rollout.worker.group import sampling_record
from services.rollout.worker.trajectory import Trajectory, TrajectoryBuilder


async def length_rewarded(ctx: RolloutContext) -> list[Trajectory]:
    """A custom rollout: token-in/token-out generation on the replica's engine, its own reward (the length)."""
    if ctx.task.metadata.get("explode"):
        raise RuntimeError("this plug-in has a bug")
    ids, _ = ctx.prompt()
    params = replace(ctx.params, max_new_tokens=3, ignore_eos=True)
    outs = await ctx.generate(ids, params, n=ctx.task.n)
    out = []
    for o in outs:
        b = TrajectoryBuilder(ids)
        b.model(o.output_ids, o.logprobs, o.weight_version)
        out.append(b.build(finish_reason=o.finish.type, reward=float(len(o.output_ids)), sampling=sampling_record(params),
                           reward_components={"length": float(len(o.output_ids))}, metadata={"custom": True}))
    return out


async def one_too_few(ctx: RolloutContext) -> list[Trajectory]:
    return (await length_rewarded(ctx))[1:]


async def not_trajectories(ctx: RolloutContext) -> list[Trajectory]:
    return [{"ids": [1]}] * ctx.task.n  # type: ignore[list-item]


async def two_args(ctx: RolloutContext, other) -> list[Trajectory]:
    return []


def not_async(ctx: RolloutContext) -> list[Trajectory]:
    return []


NOT_CALLABLE = 42
