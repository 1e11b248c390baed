"""Held-out accuracy during a run: the held-out prompts of the spec, answered greedily by a rollout replica
(whatever version it serves) and judged by the reward service (a reward >= ``eval.success_threshold``,
default 1.0, is correct; the mean reward is kept beside the accuracy). A run whose
rollout workers run another rollout function than ``single_turn`` (``multi_turn``: an agent with tools) is
evaluated by that function: one greedy episode per held-out prompt (``deploy/local/evaluate_agent.py``)."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from deploy.local.evaluate import SUCCESS_THRESHOLD, greedy_pass
from services.learner.data import check_fields, field_value, read_rows, row_metadata, row_prompt
from shared.chat_prompt import ChatPromptError, chat_prompt_ids, chat_prompt_text

from .progress import EvalPoint
from .spec import RunSpec


def heldout_rows(spec: RunSpec, model: str | None = None) -> list[dict]:
    """``[{"input": prompt text, "prompt": what the reward service gets, "input_ids": ids or absent, "label",
    "metadata": the row's data.metadata_keys}]`` of ``eval.data``: each prompt made as the learner makes it
    (:func:`~services.learner.data.row_prompt`). A chat prompt (verl / OpenRLHF chat messages, or any prompt
    with ``data.apply_chat_template``) is rendered by the chat template of ``model`` (default: the spec's) into
    the same token ids the rollout fleet trains on (:mod:`shared.chat_prompt`), and its messages go to the
    reward service as in training. Raises ValueError naming the row and the setting."""
    rows = read_rows(spec.eval.data, spec.data.split)[: spec.eval.max_samples]
    check_fields(rows, spec.data)
    tokenizer = None
    out = []
    for n, row in enumerate(rows):
        try:
            prompt = row_prompt(row, spec.data)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"eval.data row {n}: data.input_key {spec.data.input_key!r} is neither text nor chat "
                             f"messages ({{role, content}}): {str(exc).splitlines()[0]}") from exc
        item: dict[str, Any] = {"label": field_value(row, spec.data.label_key, None) if spec.data.label_key else None,
                                "metadata": row_metadata(row, spec.data)}
        if isinstance(prompt, list):
            tokenizer = tokenizer or load_tokenizer(model or spec.model)
            messages = [m.model_dump() for m in prompt]
            try:
                item.update(input=chat_prompt_text(tokenizer, messages), input_ids=chat_prompt_ids(tokenizer, messages),
                            prompt=messages)
            except ChatPromptError as exc:
                raise ValueError(f"eval.data row {n}: {exc} (model {model or spec.model})") from exc
        else:
            item["input"] = prompt
        out.append(item)
    return out


def load_tokenizer(model: str) -> Any:
    """The tokenizer of a local model directory (the one its rollout replica serves)."""
    from transformers import AutoTokenizer  # only for chat prompts

    try:
        return AutoTokenizer.from_pretrained(model)
    except (OSError, ValueError) as exc:
        raise ValueError(f"model {model}: cannot load its tokenizer to render chat prompts: "
                         f"{str(exc).splitlines()[0]}") from exc


def next_eval_step(step: int, every: int) -> int:
    """The step of the next held-out evaluation after ``step``: the next multiple of ``eval.every`` (a resumed
    run at step 64 with every 25 evaluates at 75, 100, ..., not at 64, 90, 115)."""
    return (step // every + 1) * every


def episode_worker(rollout_config: dict) -> Any | None:
    """The rollout workers' settings when held-out prompts are episodes of their rollout function (one other
    than ``single_turn``), else None."""
    from services.rollout.settings import WorkerSettings

    worker = WorkerSettings.model_validate(rollout_config.get("worker") or {})
    return worker if worker.rollout_function != "single_turn" else None


def evaluate(rollout_url: str, reward_url: str, rows: list[dict], step: int, max_new_tokens: int,
             log_path: Path | None = None, attempts: int = 3, worker: Any | None = None,
             reward_token: str | None = None, success_threshold: float = SUCCESS_THRESHOLD,
             samples_out: list[dict] | None = None) -> EvalPoint:
    """Greedy accuracy at ``step``; a pass whose answers span a weight update is taken again, and the last of
    ``attempts`` is kept anyway, its weight version said as the range (``"83-84"``: under async RL the learner
    can publish faster than a pass takes, and a missing point would hide the curve). With ``worker``
    (:func:`episode_worker`), each prompt is a greedy episode of its rollout function, and the first few are
    written beside ``log_path`` as ``heldout_samples_step<step>.md`` (turns, tool calls, reward), and the log
    line has ``tool_call_rate``: the share of episodes in which the model called a tool. An answer is correct
    when its reward is >= ``success_threshold`` (``eval.success_threshold``); the mean reward is kept beside
    the accuracy; ``samples_out`` gets every answer (an episode: its whole response, turns, tool call) with its
    reward and length."""
    extra: dict[str, float] = {}
    mean_reward = None
    for attempt in range(attempts):
        try:
            if worker is None:
                done = greedy_pass(rollout_url, reward_url, rows, max_new_tokens=max_new_tokens,
                                   mixed_ok=attempt == attempts - 1, reward_token=reward_token,
                                   success_threshold=success_threshold)
                acc, version, mean_reward = done.accuracy, done.weight_version, done.mean_reward
                if samples_out is not None:
                    samples_out[:] = done.samples
            else:
                from deploy.local.evaluate_agent import greedy_success

                samples = None if log_path is None else (
                    log_path.parent / f"heldout_samples_step{step}.md", f"held-out episodes at step {step} (greedy)")
                res = greedy_success(rollout_url, reward_url, rows, worker, max_new_tokens=max_new_tokens,
                                     samples=samples, mixed_ok=attempt == attempts - 1,
                                     success_threshold=success_threshold)
                acc, version, mean_reward = res.accuracy, res.weight_version, res.mean_reward
                extra = {"tool_call_rate": res.tool_calls / len(rows)}
                if samples_out is not None:
                    samples_out[:] = res.answers
            break
        except RuntimeError:  # answers from several weight versions (the fleet updated mid-pass), or a failed episode
            if attempt == attempts - 1:
                raise
    point = EvalPoint(step=step, accuracy=acc, weight_version=version, mean_reward=mean_reward)
    if log_path is not None:
        with log_path.open("a") as f:
            f.write(json.dumps({**asdict(point), **extra, "time": time.time(), "n": len(rows)}) + "\n")
    return point
