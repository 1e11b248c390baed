"""The agent demo's task (deploy/local/agent_task.py): SFT transcripts in exactly the token format the
``multi_turn`` rollout produces, disjoint splits, a tokenizer that keeps digits one per token; the calculator
environment leaving the answer to the reward service when asked."""

import asyncio
import json

import pytest

from deploy.local.agent_task import make_questions, prepare_run, transcript_text
from services.rollout.agents.envs.calculator import CALCULATOR, CalculatorEnv
from services.rollout.agents.tool_calls import parse_tool_calls
from services.rollout.chat_tokens import ChatTokens
from shared.schemas import PromptTask


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory):
    run = tmp_path_factory.mktemp("agent-task")
    prepare_run(run, seed=3, train=60, sft=40, heldout=20, hidden_size=32, layers=1, direct=0.25)
    return run


def rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_splits_are_disjoint_and_labels_are_the_calculators(task_dir):
    data = {name: rows(task_dir / "data" / f"{name}.jsonl") for name in ("train", "sft", "heldout")}
    assert [len(v) for v in data.values()] == [60, 40, 20]
    questions = {name: {r["input"] if name != "sft" else r["input"].split("user\n")[1].split("<|im_end|>")[0]
                        for r in v} for name, v in data.items()}
    assert not questions["train"] & questions["heldout"] and not questions["sft"] & questions["heldout"]
    assert not questions["train"] & questions["sft"]
    for q in make_questions(50, seed=1):
        a, op, b = q["expression"].replace("+", " + ").replace("*", " * ").split()
        assert int(q["label"]) == (int(a) + int(b) if op == "+" else int(a) * int(b))


def test_sft_transcripts_are_the_token_ids_a_multi_turn_rollout_produces(task_dir):
    """What the learner's SFT trains on (prompt ids, answer ids and loss mask as PromptSet.sft_pair tokenises
    them) equals a multi-turn trajectory of the calculator environment: the chat template's prompt, the model's
    tool call turn, the template's turn ending + delta of the tool message (masked, as the rollout masks it), the
    answer turn; or, for the direct answers of the mix, the one answer turn."""
    from transformers import AutoTokenizer

    from services.learner.data import PromptSet
    from services.learner.settings import DataSettings

    tok = AutoTokenizer.from_pretrained(task_dir / "base-model")
    chat = ChatTokens(tok, tools=[CALCULATOR.schema()])
    data = PromptSet.load(DataSettings(path=str(task_dir / "data" / "sft.jsonl"), label_key=None, shuffle=False), 0,
                          tok, need_output=True)
    direct = 0
    for n, row in enumerate(rows(task_dir / "data" / "sft.jsonl")):
        prompt, answer, mask = data.sft_pair(0, n)
        question = row["input"].split("user\n")[1].split("<|im_end|>")[0]
        assert prompt == chat.prompt([{"role": "user", "content": question}])
        if row["output"][0]["text"] == "The answer is ":  # a direct answer: no call; the label is context
            direct += 1
            _, label, end = row["output"]
            assert label == {"text": CALCULATOR.fn(question[8:-1]), "train": False} and end["text"] == "<|im_end|>"
            ids = [list(tok(seg["text"], add_special_tokens=False)["input_ids"]) for seg in row["output"]]
            assert answer == ids[0] + ids[1] + ids[2] + [tok.eos_token_id]
            assert mask == [1] * len(ids[0]) + [0] * len(ids[1]) + [1] * (len(ids[2]) + 1)
            assert not parse_tool_calls(transcript_text(row)).calls
            continue
        call_text, _, _ = row["output"][0]["text"].partition("<|im_end|>")
        (call,) = parse_tool_calls(call_text).calls
        assert call.name == "calculator" and f"What is {call.arguments['expression']}?" == question
        result = CALCULATOR.fn(**call.arguments)
        model_turn = list(tok(call_text + "<|im_end|>", add_special_tokens=False)["input_ids"])
        env_turn = chat.close_turn(model_turn) + chat.delta([{"role": "tool", "name": "calculator",
                                                               "content": result}])
        final = list(tok("The answer is " + result + "<|im_end|>", add_special_tokens=False)["input_ids"])
        assert answer == model_turn + env_turn + final + [tok.eos_token_id]
        assert mask == [1] * len(model_turn) + [0] * len(env_turn) + [1] * (len(final) + 1)
        assert model_turn[-1] in chat.stop_token_ids and final[-1] in chat.stop_token_ids
    assert direct == 10  # direct=0.25 of 40


def test_the_tokenizer_keeps_digits_one_per_token_and_shortens_the_call(task_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(task_dir / "base-model")
    ids = tok("What is 4821*7390?", add_special_tokens=False)["input_ids"]
    pieces = [tok.decode([i]) for i in ids]
    assert [p for p in pieces if p.isdigit()] == list("48217390")
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "4821*7390"}}</tool_call>'
    assert len(tok(call, add_special_tokens=False)["input_ids"]) < len(call) // 3
    assert tok.decode(tok(call, add_special_tokens=False)["input_ids"]) == call


def test_calculator_environment_leaves_the_answer_to_the_reward_service():
    task = PromptTask(id="t", prompt="What is 2*3?", label="6")
    own, judged = CalculatorEnv(), CalculatorEnv(judge="reward_service")
    for env in (own, judged):
        asyncio.run(env.reset(task))
    assert asyncio.run(own.step({"role": "assistant", "content": "6"})).reward == 1.0
    reply = asyncio.run(judged.step({"role": "assistant", "content": "6"}))
    assert reply.done and reply.reward is None
    with pytest.raises(ValueError, match="judge"):
        CalculatorEnv(judge="nobody")


def test_heldout_prompts_are_episodes_of_the_recipes_rollout_function():
    """fleetrl run / fleetrl eval evaluate the agent recipe with greedy multi_turn episodes (the workers' agent
    settings), the sort-digits recipe with single-turn /generate as before."""
    from pathlib import Path

    from deploy.run.derive import service_config
    from deploy.run.heldout import episode_worker
    from deploy.run.load import load_spec

    examples = Path(__file__).resolve().parents[2] / "examples"
    agent = examples / "agent-calculator" / "fleetrl.yaml"
    worker = episode_worker(service_config(load_spec(agent), "rollout", agent))
    assert worker.rollout_function == "multi_turn" and worker.agent.environment == "calculator"
    assert worker.agent.environment_args == {"judge": "reward_service"}
    sort = examples / "sort-digits" / "fleetrl.yaml"
    assert episode_worker(service_config(load_spec(sort), "rollout", sort)) is None
