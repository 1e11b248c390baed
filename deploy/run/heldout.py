"""Held-out accuracy during a run: the held-out prompts of the spec, answered greedily by a rollout replica
(whatever version it serves) and judged by the reward service (a reward >= 0.999 is correct). A run whose
rollout workers run another rollout function than ``single_turn`` (``multi_turn``: an agent with tools) is
evaluated by that function: one greedy episode per held-out prompt (``deploy/local/evaluate_agent.py``)."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from deploy.local.evaluate import greedy_accuracy
from services.learner.data import check_fields, field_value, read_rows, row_metadata

from .progress import EvalPoint
from .spec import RunSpec


def heldout_rows(spec: RunSpec) -> list[dict]:
    """``[{"input": prompt text, "label": label, "metadata": the row's data.metadata_keys}]`` of ``eval.data``,
    rendered as the learner renders prompts and labelled as it labels them."""
    rows = read_rows(spec.eval.data, spec.data.split)[: spec.eval.max_samples]
    check_fields(rows, spec.data)
    out = []
    for n, row in enumerate(rows):
        value = field_value(row, spec.data.input_key)
        if not isinstance(value, str) or spec.data.apply_chat_template:
            raise ValueError(f"eval.data row {n}: held-out evaluation takes text prompts without a chat template")
        text = spec.data.input_template.format(value) if spec.data.input_template else value
        out.append({"input": text, "label": field_value(row, spec.data.label_key, None) if spec.data.label_key else None,
                    "metadata": row_metadata(row, spec.data)})
    return out


def episode_worker(rollout_config: dict) -> Any | None:
    """The rollout workers' settings when held-out prompts are episodes of their rollout function (one other
    than ``single_turn``), else None."""
    from services.rollout.settings import WorkerSettings

    worker = WorkerSettings.model_validate(rollout_config.get("worker") or {})
    return worker if worker.rollout_function != "single_turn" else None


def evaluate(rollout_url: str, reward_url: str, rows: list[dict], step: int, max_new_tokens: int,
             log_path: Path | None = None, attempts: int = 3, worker: Any | None = None,
             reward_token: str | None = None) -> EvalPoint:
    """Greedy accuracy at ``step``; a pass whose answers span a weight update is taken again, and the last of
    ``attempts`` is kept anyway, its weight version said as the range (``"83-84"``: under async RL the learner
    can publish faster than a pass takes, and a missing point would hide the curve). With ``worker``
    (:func:`episode_worker`), each prompt is a greedy episode of its rollout function, and the first few are
    written beside ``log_path`` as ``heldout_samples_step<step>.md`` (turns, tool calls, reward), and the log
    line has ``tool_call_rate``: the share of episodes in which the model called a tool."""
    extra: dict[str, float] = {}
    for attempt in range(attempts):
        try:
            if worker is None:
                acc, version = greedy_accuracy(rollout_url, reward_url, rows, max_new_tokens=max_new_tokens,
                                               mixed_ok=attempt == attempts - 1, reward_token=reward_token)
            else:
                from deploy.local.evaluate_agent import greedy_success

                samples = None if log_path is None else (
                    log_path.parent / f"heldout_samples_step{step}.md", f"held-out episodes at step {step} (greedy)")
                res = greedy_success(rollout_url, reward_url, rows, worker, max_new_tokens=max_new_tokens,
                                     samples=samples, mixed_ok=attempt == attempts - 1)
                acc, version = res.accuracy, res.weight_version
                extra = {"tool_call_rate": res.tool_calls / len(rows)}
            break
        except RuntimeError:  # answers from several weight versions (the fleet updated mid-pass), or a failed episode
            if attempt == attempts - 1:
                raise
    point = EvalPoint(step=step, accuracy=acc, weight_version=version)
    if log_path is not None:
        with log_path.open("a") as f:
            f.write(json.dumps({**asdict(point), **extra, "time": time.time(), "n": len(rows)}) + "\n")
    return point
