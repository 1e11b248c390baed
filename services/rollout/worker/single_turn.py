"""``single_turn``: the default rollout function — one prompt, ``n`` samples as one batch, one ``/score`` call.

A group with aborted samples (a weight switch in abort mode) is regenerated whole, up to
``worker.group_retries`` times, so a group never mixes versions or carries a truncated sample.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from services.rollout.engines.types import SequenceOutput
from services.rollout.trajectory import Trajectory
from services.rollout.worker.contract import GroupFailed, RolloutContext
from services.rollout.worker.group import single_turn_trajectory
from shared.reward_api import ScoreItem

log = logging.getLogger(__name__)


async def single_turn(ctx: RolloutContext) -> list[Trajectory]:
    task = ctx.task
    ids, prompt = await ctx.prompt_async()  # tokenised off the event loop, bounded first
    params = replace(ctx.params, max_new_tokens=max(1, ctx.room(ids, ctx.params.max_new_tokens)))
    outs = await _whole_group(ctx, ids, params)
    prompt_text = prompt if isinstance(prompt, str) else await ctx.off_loop(
        lambda: ctx.tokenizer.decode(ids, skip_special_tokens=False))
    items = [ScoreItem(prompt=prompt, response=o.text, label=task.label, metadata=task.metadata) for o in outs]
    scores = await ctx.score(items)
    return [
        single_turn_trajectory(ids, prompt_text, out, score, comps, params)
        for out, (score, comps) in zip(outs, scores.scored())
    ]


async def _whole_group(ctx: RolloutContext, ids: list[int], params) -> list[SequenceOutput]:
    aborted_attempts = 0
    while True:
        outs = await ctx.generate(ids, params, n=ctx.task.n)
        if all(o.finish is not None and o.finish.type != "abort" for o in outs):
            return outs
        aborted_attempts += 1
        if aborted_attempts > ctx.settings.group_retries:
            raise GroupFailed(f"group {ctx.task.id} was aborted {aborted_attempts} times")
        log.info("group %s had aborted samples; regenerating the whole group", ctx.task.id)
