"""``fleetrl eval`` (and a run's held-out evaluation) of an agent spec says what it measured: one greedy episode
per held-out prompt of the workers' rollout function, its success against ``eval.success_threshold`` (as for a
single-turn run, not a fixed 0.999) with the mean reward beside it, the share of episodes that called a tool,
and with ``--show`` the episodes themselves; ``--samples`` (single-turn answers) is refused for such a spec."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from transformers import AutoTokenizer

from deploy.local.evaluate_agent import summarize
from deploy.run.cli import show_answer
from deploy.run.derive import service_config
from deploy.run.evaluate_model import evaluate_model, measured
from deploy.run.heldout import episode_worker
from deploy.run.load import load_spec
from services.rollout.worker.trajectory import Trajectory, Turn
from shared.schemas import SamplingRecord
from tests.deploy.run.conftest import tiny_spec


def episode(tokenizer, prompt: str, turns: list[tuple[str, str]], reward: float, finish: str = "stop") -> Trajectory:
    ids, built = [], []
    for kind, text in turns:
        part = tuple(tokenizer.encode(text, add_special_tokens=False))
        built.append(Turn(kind=kind, start=len(ids), ids=part))
        ids += part
    mask = tuple(1 if t.kind == "model" else 0 for t in built for _ in t.ids)
    return Trajectory(prompt_ids=tuple(tokenizer.encode(prompt)), response_ids=tuple(ids),
                      response_logprobs=(0.0,) * len(ids), action_mask=mask, version_spans=((0, 7),),
                      finish_reason=finish, reward=reward, sampling=SamplingRecord(temperature=0.0, max_tokens=8),
                      prompt_text=prompt, turns=tuple(built))


def test_episodes_are_counted_against_the_success_threshold_with_mean_reward_and_answers(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    rows = [{"input": "2*3?", "label": "6"}, {"input": "4*5?", "label": "20"}, {"input": "7*8?", "label": "56"}]
    episodes = [episode(tok, "2*3?", [("model", "<call>"), ("environment", "6"), ("model", "6")], 1.0),
                episode(tok, "4*5?", [("model", "21")], 0.6),
                episode(tok, "7*8?", [("model", "12345678")], 0.0, finish="length")]
    full = summarize(episodes, rows, tok, success_threshold=1.0)
    assert (full.accuracy, full.mean_reward, full.tool_calls) == (pytest.approx(1 / 3), pytest.approx(1.6 / 3), 1)
    partial = summarize(episodes, rows, tok, success_threshold=0.5)
    assert partial.accuracy == pytest.approx(2 / 3)  # eval.success_threshold decides, as for single-turn answers
    first, _, last = partial.answers
    model_tokens = len(tok.encode("<call>", add_special_tokens=False)) + len(tok.encode("6", add_special_tokens=False))
    assert first == {"prompt": "2*3?", "completion": "<call>66", "label": "6", "reward": 1.0, "tokens": model_tokens,
                     "model_turns": 2, "called_tool": True, "hit_max_new_tokens": False}
    assert last["hit_max_new_tokens"] and last["model_turns"] == 1 and not last["called_tool"]
    # fleetrl eval --show prints an episode with its turns and whether it called a tool
    assert show_answer(first).splitlines() == [
        f"--- reward 1.000, {model_tokens} tokens, 2 model turns (called a tool), label '6'",
        "prompt:     '2*3?'", "completion: '<call>66'"]


def test_fleetrl_eval_says_what_it_measured(tmp_path, tiny_model_dir):
    spec_file = tiny_spec(tmp_path, tiny_model_dir)
    assert measured(load_spec(spec_file), spec_file) == "one greedy answer per held-out prompt"
    agent = _agent_spec(spec_file)
    assert measured(load_spec(agent), agent) == \
        "one greedy multi_turn episode per held-out prompt (up to 3 model turns)"


def test_sampled_answers_are_refused_for_an_agent_spec_before_anything_starts(tmp_path, tiny_model_dir):
    agent = _agent_spec(tiny_spec(tmp_path, tiny_model_dir))
    assert episode_worker(service_config(load_spec(agent), "rollout", agent)) is not None
    with pytest.raises(ValueError) as refused:
        evaluate_model(load_spec(agent), agent, samples=4)
    assert str(refused.value).startswith("--samples draws single-turn answers; this spec's held-out prompts are "
                                         "multi_turn episodes")
    assert not (tmp_path / "run" / "evals").exists()  # nothing was started


def _agent_spec(spec_file: Path) -> Path:
    raw = yaml.safe_load(spec_file.read_text())
    raw["services"]["rollout"]["worker"] = {"rollout_function": "multi_turn",
                                            "agent": {"environment": "calculator", "max_turns": 3}}
    out = spec_file.with_name("agent.yaml")
    out.write_text(yaml.safe_dump(raw, sort_keys=False))
    return out
