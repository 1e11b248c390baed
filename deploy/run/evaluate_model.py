"""``fleetrl eval``: held-out greedy accuracy (and, with ``--samples K``, sampled accuracy and pass@k) of a model directory (a checkpoint, an export) or of a rollout
service already running, on the spec's ``eval.data``, judged by the spec's reward — the code ``fleetrl run``
evaluates with during a run (``deploy/run/heldout.py``)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from deploy.local.fleet import Fleet, FleetError
from shared.ports import free_port

from .derive import deep_merge, service_config, validate
from .heldout import episode_worker, evaluate, heldout_rows
from .plan import KINDS, run_dir_of
from .preflight import context_problem, preflight, remote_problems, service_url_problem
from .progress import fleet_error_line
from .sampled_eval import sampled_accuracy
from .spec import RunSpec


def evaluate_model(spec: RunSpec, spec_file: Path, model: str | None = None, rollout_url: str | None = None,
                   samples: int = 0, temperature: float | None = None,
                   seed: int | None = None, skip_preflight: bool = False) -> dict[str, Any]:
    """``{"accuracy" (greedy), "n", "weight_version", "model", "eval_data"}``, and with ``samples`` > 0
    ``"sampled"``: that many answers per prompt at ``temperature`` (default: the spec's sampling; ``seed``: the
    same answers on every call), their accuracy
    and pass@k (:mod:`.sampled_eval`). Starts what it needs (a reward service for the spec's scorers, a rollout
    replica without a worker for ``model``) under ``run_dir/evals/<time>`` (its logs, and ``result.json``) and
    stops it. Paths and reward functions are checked first (:mod:`.preflight`); a service that fails to start
    is one line with the reason from its log and the log's path (ValueError)."""
    if spec.eval.data is None:
        raise ValueError("eval.data is not set: name the held-out prompts (--set eval.data=FILE)")
    if spec.reward is None:
        raise ValueError("reward is not set: held-out answers are judged by the spec's reward")
    worker = episode_worker(service_config(spec, "rollout", spec_file))
    if worker is not None and samples > 0:
        raise ValueError(f"--samples draws single-turn answers; this spec's held-out prompts are "
                         f"{worker.rollout_function} episodes (each evaluated once, greedy): leave --samples out")
    problems = [p for p in [rollout_url and service_url_problem("--rollout-url", rollout_url, "/get_model_info",
                                                               "rollout")] if p]
    problems = problems or preflight(spec, spec_file) or ([] if skip_preflight else remote_problems(spec))
    if not problems and rollout_url is None:  # a replica on the model, with the spec's sampling
        problems = [p for p in [context_problem(spec, service_config(spec, "rollout", spec_file), model)] if p]
    if problems:
        raise ValueError(problems[0])
    rows = heldout_rows(spec, model=model)
    what = rollout_url or str(model or spec.model)
    where = eval_dir(spec)
    try:
        result = _evaluate(spec, spec_file, rows, where, model, rollout_url, samples, temperature, seed,
                           probe=not skip_preflight)
    except FleetError as exc:
        raise ValueError(fleet_error_line(exc, where / "logs")) from exc
    answers, sampled_answers = result.pop("answers"), result.pop("sampled_answers", None)
    out = {"measured": measured(spec, spec_file), **result, "model": what, "eval_data": spec.eval.data}
    if worker is not None:  # the share of episodes in which the model called a tool
        out["tool_call_rate"] = sum(bool(a.get("called_tool")) for a in answers) / len(answers) if answers else 0.0
    if sampled_answers is not None:  # every sampled answer (--samples), with its reward
        with (where / "sampled.jsonl").open("w") as f:
            f.writelines(json.dumps(a) + "\n" for a in sampled_answers)
        out["sampled_file"] = str(where / "sampled.jsonl")
    (where / "result.json").write_text(json.dumps(out, indent=2))
    with (where / "samples.jsonl").open("w") as f:  # every held-out answer, with its reward and length
        f.writelines(json.dumps(a) + "\n" for a in answers)
    return {**out, "answers": answers}


def measured(spec: RunSpec, spec_file: Path) -> str:
    """What ``fleetrl eval``'s ``accuracy`` counts, in words: one greedy answer per held-out prompt, or one
    greedy episode of the workers' rollout function (an agent with tools)."""
    worker = episode_worker(service_config(spec, "rollout", spec_file))
    if worker is None:
        return "one greedy answer per held-out prompt"
    turns = getattr(getattr(worker, "agent", None), "max_turns", None)
    return f"one greedy {worker.rollout_function} episode per held-out prompt" + \
        (f" (up to {turns} model turns)" if turns else "")


def eval_dir(spec: RunSpec) -> Path:
    """Where one ``fleetrl eval`` keeps its logs and result: ``run_dir/evals/<time>`` (one folder for all)."""
    base = run_dir_of(spec) / "evals"
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out, n = base / stamp, 1
    while out.exists():
        n += 1
        out = base / f"{stamp}-{n}"
    return out


def _evaluate(spec: RunSpec, spec_file: Path, rows: list[dict], where: Path, model: str | None,
              rollout_url: str | None, samples: int, temperature: float | None, seed: int | None,
              probe: bool = True) -> dict[str, Any]:
    with Fleet(run_dir=where) as fleet:
        reward_url = spec.reward.url
        if reward_url is None:
            cfg = {**service_config(spec, "reward", spec_file), "port": free_port(), "probe_remote_scorers": probe}
            validate(KINDS["reward"].settings_cls, "reward", cfg, spec)
            reward_url = fleet.start("reward-0", "services.reward", cfg, wait=False).url
        if rollout_url is None:
            cfg = deep_merge(service_config(spec, "rollout", spec_file),
                             {"port": free_port(), "model": str(model or spec.model), "worker": {"enabled": False}})
            validate(KINDS["rollout"].settings_cls, "rollout", cfg, spec)
            rollout_url = fleet.start("rollout-0", "services.rollout", cfg, wait=False).url
        for name in list(fleet.services):
            fleet.wait_healthy(name)
        answers: list[dict] = []
        point = evaluate(rollout_url.rstrip("/"), reward_url.rstrip("/"), rows, 0, spec.sampling.max_new_tokens,
                         worker=episode_worker(service_config(spec, "rollout", spec_file)),
                         success_threshold=spec.eval.success_threshold, samples_out=answers)
        sampled_answers: list[dict] = []
        sampled = None if samples <= 0 else sampled_accuracy(
            rollout_url.rstrip("/"), reward_url.rstrip("/"), rows, samples=samples,
            max_new_tokens=spec.sampling.max_new_tokens,
            temperature=spec.sampling.temperature if temperature is None else temperature, top_p=spec.sampling.top_p,
            seed=seed, success_threshold=spec.eval.success_threshold, answers_out=sampled_answers)
    out = {"accuracy": point.accuracy, "mean_reward": point.mean_reward,
           "success_threshold": spec.eval.success_threshold, "n": len(rows), "weight_version": point.weight_version,
           "answers": answers}
    return out if sampled is None else {**out, "sampled": sampled, "sampled_answers": sampled_answers}
