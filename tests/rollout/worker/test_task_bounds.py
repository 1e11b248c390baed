"""A prompt task's sampling is bounded as a request's is: stop strings past limits.max_stop_strings fail its group
with the reason (they would be checked on every token of the decode thread all sequences share)."""

from __future__ import annotations

import pytest

from services.rollout.engines.types import SamplingParams
from services.rollout.service import RolloutService
from services.rollout.settings import RolloutSettings
from services.rollout.worker.contract import GroupFailed, RolloutContext
from shared.schemas import PromptTask
from tests.rollout.agents.scripted_engine import ScriptedEngine


@pytest.mark.parametrize(("stop", "said"), [(tuple(f"s{i}" for i in range(65)), "limits.max_stop_strings"),
                                            (("x" * 257,), "limits.max_stop_string_chars")])
async def test_a_task_asking_for_too_many_stop_strings_fails_its_group(tiny_model_dir, stop, said):
    settings = RolloutSettings(model=str(tiny_model_dir))
    svc = RolloutService(settings, engine=ScriptedEngine(str(tiny_model_dir), lambda p: "x"))
    await svc.start()
    try:
        ctx = RolloutContext(PromptTask(id="t", prompt="q"), SamplingParams(max_new_tokens=2), settings.worker, svc,
                             None)
        with pytest.raises(GroupFailed, match=f"bad prompt task: .*{said}"):
            await ctx.generate([1, 2], SamplingParams(max_new_tokens=2, stop=stop))
        (out,) = await ctx.generate([1, 2], SamplingParams(max_new_tokens=2, stop=("ok",)))  # within: generated
        assert out.output_ids
    finally:
        await svc.stop()
