"""The multi_turn rollout function on a scripted model (so the model calls tools, writes broken JSON or answers
exactly when the test says): tool calls run and come back as tool messages, token-in/token-out ids, turn and
context limits end with finish reason length, and every way an environment or tool can fail fails the
trajectory with its reason, retried, then the group — never a made-up reward."""

from __future__ import annotations

import json

import pytest

from services.rollout.agents.multi_turn import multi_turn
from services.rollout.chat_tokens import ChatTokens
from services.rollout.engines.types import SamplingParams
from services.rollout.experiences import experiences
from services.rollout.service import RolloutService
from services.rollout.settings import RolloutSettings
from services.rollout.worker.contract import GroupFailed, RolloutContext
from shared.reward_api import ScoreResponse
from shared.schemas import PromptTask
from tests.rollout.agents import sample_envs
from tests.rollout.agents.scripted_engine import IM_END, ScriptedEngine

ENVS = "tests.rollout.agents.sample_envs"


class RecordingRewards:
    """The reward client's interface, answering 0.5 and keeping what it was asked."""

    def __init__(self) -> None:
        self.items = []

    async def score(self, items):
        self.items.extend(items)
        return ScoreResponse(scores=[0.5] * len(items), components=[{"judge": 0.5}] * len(items))


def calculator_script(prompt: str) -> str:
    """Call the calculator until a tool result is in context, then answer with it."""
    if "<|im_start|>tool" not in prompt:
        return '<tool_call>{"name": "calculator", "arguments": {"expression": "12345 * 6789"}}</tool_call>'
    result = prompt.rsplit("<|im_start|>tool\n", 1)[1].split("<|im_end|>", 1)[0]
    return f"The answer is {result}"


async def run(tiny_model_dir, script, agent: dict, task: PromptTask, rewards=None, context_length: int = 512,
              max_new_tokens: int = 256):
    settings = RolloutSettings(model=str(tiny_model_dir), worker={
        "rollout_function": "multi_turn", "agent": agent, "group_retries": 1,
        "sampling": {"max_new_tokens": max_new_tokens}})
    engine = ScriptedEngine(str(tiny_model_dir), script, context_length=context_length)
    svc = RolloutService(settings, engine=engine)
    await svc.start()
    try:
        ctx = RolloutContext(task, SamplingParams(max_new_tokens=max_new_tokens), settings.worker, svc,
                             rewards or RecordingRewards())
        return await multi_turn(ctx), svc
    finally:
        await svc.stop()


async def test_tool_calls_run_and_their_results_are_appended_as_template_deltas(tiny_model_dir):
    task = PromptTask(id="calc", prompt="What is 12345 * 6789?", label=83810205, n=2)
    trajs, svc = await run(tiny_model_dir, calculator_script, {"environment": "calculator"}, task)
    chat = ChatTokens(svc.tokenizer, tools=None)
    for t in trajs:
        assert t.finish_reason == "stop" and t.reward == 1.0 and t.reward_components == {"environment": 1.0}
        kinds = [turn.kind for turn in t.turns]
        assert kinds == ["model", "environment", "model"]
        call, env, answer = t.turns
        assert call.ids[-1] == IM_END  # the model ended its turn itself: only the glue follows
        tool_msg = {"role": "tool", "content": "83810205"}
        assert list(env.ids) == chat.close_turn(list(call.ids)) + chat.delta([tool_msg])
        assert svc.tokenizer.decode(list(answer.ids), skip_special_tokens=True) == "The answer is 83810205"
        assert list(t.action_mask) == [1] * len(call.ids) + [0] * len(env.ids) + [1] * len(answer.ids)
        assert [lp for lp, m in zip(t.response_logprobs, t.action_mask) if not m] == [0.0] * len(env.ids)
    exps = experiences(task, trajs)
    assert exps[0].action_mask is not None and exps[0].metadata["turns"] == 2
    assert exps[0].sampling.max_tokens == 256 and exps[0].version_spans == [(0, 0)]


async def test_malformed_tool_call_json_is_an_observation_the_model_reads(tiny_model_dir):
    def script(prompt: str) -> str:
        if "<|im_start|>tool" not in prompt:
            return '<tool_call>{"name": "calculator", "arguments": {"expression": </tool_call>'
        return "I could not compute it: 7"

    task = PromptTask(id="bad-json", prompt="What is 3 + 4?", label=7, n=1)
    (t,), svc = await run(tiny_model_dir, script, {"environment": "calculator"}, task)
    env_turn = t.turns[1]
    observation = svc.tokenizer.decode(list(env_turn.ids), skip_special_tokens=False)
    assert "<|im_start|>tool\nerror: the tool call is not valid JSON" in observation
    assert t.finish_reason == "stop" and t.reward == 1.0  # the model went on, and its answer was scored


async def test_the_model_misusing_a_tool_is_an_observation(tiny_model_dir):
    def script(prompt: str) -> str:
        if "<|im_start|>tool" not in prompt:
            return ('<tool_call>{"name": "calculator", "arguments": {"expression": "__import__(\'os\')"}}</tool_call>'
                    '<tool_call>{"name": "search", "arguments": {}}</tool_call>')
        return "no idea"

    (t,), svc = await run(tiny_model_dir, script, {"environment": "calculator"}, PromptTask(id="m", prompt="q", label=1))
    observation = svc.tokenizer.decode(list(t.turns[1].ids), skip_special_tokens=False)
    assert "error: not arithmetic" in observation and "there is no tool named 'search'" in observation
    assert t.reward == 0.0


async def test_no_environment_reward_means_the_reward_service_scores_the_final_answer(tiny_model_dir):
    rewards = RecordingRewards()
    turn = iter(range(100))
    (t,), _ = await run(tiny_model_dir, lambda p: f"answer {next(turn)}", {"environment": f"{ENVS}:NoReward"},
                        PromptTask(id="nr", prompt="q", label="x"), rewards=rewards)
    assert t.finish_reason == "stop" and t.reward == 0.5 and t.reward_components == {"judge": 0.5}
    assert [i.response for i in rewards.items] == ["answer 1"] and rewards.items[0].label == "x"


@pytest.mark.parametrize(("on_length", "reward", "scored"), [("keep", 0.5, 1), ("mask", 0.5, 1), ("penalize", -2.0, 0)])
async def test_the_turn_limit_ends_with_length(tiny_model_dir, on_length, reward, scored):
    rewards = RecordingRewards()
    agent = {"environment": f"{ENVS}:NeverDone", "max_turns": 3, "on_length": on_length, "length_penalty": -2.0}
    (t,), _ = await run(tiny_model_dir, lambda p: "more", agent, PromptTask(id="tl", prompt="q"), rewards=rewards)
    assert t.finish_reason == "length" and t.reward == reward and len(rewards.items) == scored
    assert [x.kind for x in t.turns] == ["model", "environment"] * 2 + ["model"]
    assert any(t.action_mask) is (on_length != "mask")


async def test_the_context_limit_ends_with_length(tiny_model_dir):
    agent = {"environment": f"{ENVS}:NeverDone", "max_turns": 100}
    (t,), _ = await run(tiny_model_dir, lambda p: "a fairly long reply " * 3, agent, PromptTask(id="cl", prompt="q"),
                        context_length=160)
    assert t.finish_reason == "length"
    assert len(t.prompt_ids) + len(t.response_ids) <= 160
    assert 1 < sum(1 for x in t.turns if x.kind == "model") < 100


@pytest.mark.parametrize(("env", "reason"), [
    ("Raises", "step raised RuntimeError: the environment broke"),
    ("Hangs", "step did not answer within 0.3s"),
    ("BlocksSync", "step did not answer within 0.3s"),
    ("Garbage", "step returned dict, not an EnvReply"),
    ("NanReward", "a reward that is not a finite number"),
    ("BadMessages", "has role 'robot'"),
    ("ResetRaises", "reset raised ConnectionError: cannot reach the environment server"),
    ("ToolRaises", "tool boom raised OSError: disk on fire"),
    ("ToolHangs", "tool boom did not answer within 0.3s"),
])
async def test_a_failing_environment_fails_the_trajectory_then_the_group_with_its_reason(tiny_model_dir, env, reason):
    sample_envs.CALLS.clear()
    agent = {"environment": f"{ENVS}:{env}", "env_timeout_s": 0.3, "tool_timeout_s": 0.3, "trajectory_retries": 2}
    call = '<tool_call>{"name": "boom", "arguments": {"x": "1"}}</tool_call>'
    rewards = RecordingRewards()
    with pytest.raises(GroupFailed, match="failed 3 times") as err:
        await run(tiny_model_dir, lambda p: call, agent, PromptTask(id="f", prompt="q"), rewards=rewards)
    assert reason in str(err.value)
    assert sample_envs.CALLS[f"{env}.reset"] == 3  # a fresh environment per try
    assert sample_envs.CALLS[f"{env}.close"] == 3  # and every one closed
    assert rewards.items == []  # nothing was scored, no reward made up


async def test_a_transient_environment_failure_is_retried(tiny_model_dir):
    sample_envs.CALLS.clear()
    (t,), _ = await run(tiny_model_dir, lambda p: "hi", {"environment": f"{ENVS}:FlakyOnce"},
                        PromptTask(id="fl", prompt="q"))
    assert t.reward == 0.75 and sample_envs.CALLS["FlakyOnce.reset"] == 2


@pytest.mark.parametrize(("metadata", "problem"), [
    ({"environment": "no-such-env"}, "not one this worker allows a task to pick"),
    ({"environment": "broken"}, "has no reset / step / close"),
    ({"environment": "echo", "environment_args": {"no_such_arg": 1}}, "bad prompt task: environment .echo. arguments: no_such_arg: Extra inputs are not permitted"),
])
async def test_a_task_naming_a_bad_environment_fails_its_group(tiny_model_dir, metadata, problem):
    agent = {"environment": "echo", "trajectory_retries": 0, "environments": {"broken": f"{ENVS}:not_an_env"}}
    with pytest.raises(GroupFailed, match=problem):
        await run(tiny_model_dir, lambda p: "x", agent, PromptTask(id="b", prompt="q", metadata=metadata))


@pytest.mark.parametrize("spec", ["subprocess:Popen", "os:system", f"{ENVS}:FlakyOnce", "tests.rollout.agents.canary:X"])
async def test_a_task_naming_an_import_path_is_refused_and_nothing_is_imported(tiny_model_dir, tmp_path, spec):
    """Code runs only where the settings name it: a task's metadata.environment is a name the settings allow,
    never an import path (before, `subprocess:Popen` with environment_args {args: [...]} ran the command)."""
    import sys

    marker = tmp_path / "ran"
    task = PromptTask(id="evil", prompt="q", metadata={
        "environment": spec, "environment_args": {"args": ["touch", str(marker)]}})
    sys.modules.pop("tests.rollout.agents.canary", None)
    with pytest.raises(GroupFailed, match=f"environment '{spec}' is not one this worker allows") as err:
        await run(tiny_model_dir, lambda p: "x", {"environment": "echo", "trajectory_retries": 0}, task)
    assert "worker.agent.environments" in str(err.value)
    assert not marker.exists()
    assert "tests.rollout.agents.canary" not in sys.modules  # looked up, never imported


async def test_a_task_picks_an_environment_the_settings_name(tiny_model_dir):
    agent = {"environment": "echo", "environments": {"flaky": f"{ENVS}:FlakyOnce"}}
    sample_envs.CALLS.clear()
    (t,), _ = await run(tiny_model_dir, lambda p: "hi", agent,
                        PromptTask(id="ok", prompt="q", metadata={"environment": "flaky"}))
    assert t.reward == 0.75 and sample_envs.CALLS["FlakyOnce.reset"] == 2


def test_tool_message_round_trip_matches_the_template(tiny_model_dir):
    """The observation the model sees for a tool result is what the chat template writes for a tool message."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    chat = ChatTokens(tok)
    delta = tok.decode(chat.delta([{"role": "tool", "content": json.dumps({"v": 1})}]), skip_special_tokens=False)
    assert delta == '<|im_start|>tool\n{"v": 1}<|im_end|>\n<|im_start|>assistant\n'
