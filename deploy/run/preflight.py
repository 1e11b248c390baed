"""Checks made before anything of a run starts: every path the spec names exists (relative paths in a spec are
resolved against the spec file's directory, ``--model`` against the current directory), and every plug-in the
reward service will import (``kind: python`` scorers) imports and fits its signature — tried in a short-lived
subprocess, as the reward service would, so the user's module never runs inside the launcher. Each problem is
one line naming the setting."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from shared.model_dir import looks_like_hub_id

from .spec import RunSpec

IMPORT_TIMEOUT_S = 120.0

_TRY_IMPORTS = """
import json, sys
from services.reward.scorers.python_fn import SIGNATURES, load_function
problems = []
for where, function, signature, sys_path in json.loads(sys.argv[1]):
    try:
        load_function(function, SIGNATURES[signature].protocol, sys_path)
    except Exception as exc:
        problems.append(f"{where}: " + (str(exc).splitlines() or [type(exc).__name__])[0])
print(json.dumps(problems))
"""


def local_model(value: str, setting: str, base: Path | None = None) -> str:
    """``value`` as an absolute local directory (relative to ``base``, default the current directory), or as it
    is when it can only be a model hub id (``org/name`` with no such directory). Raises ValueError naming
    ``setting`` when it names a directory that does not exist."""
    path = ((base or Path.cwd()) / Path(value).expanduser()).resolve()
    if path.is_dir():
        return str(path)
    if looks_like_hub_id(value):
        return value
    raise ValueError(f"{setting} {value}: no model directory at {path}" +
                     ("" if base else " (a relative path is relative to the current directory)"))


def _model_problem(setting: str, value: str, rel: str) -> str | None:
    """Why a model setting of the spec (resolved against its directory) cannot load: no such directory and no
    ``org/name`` hub id, or a directory without a Hugging Face ``config.json``; None when it can."""
    path = Path(value)
    if not path.is_dir():
        return None if looks_like_hub_id(value) else f"{setting}: no model directory at {path} {rel}"
    if not (path / "config.json").is_file():
        return f"{setting}: {path} is not a Hugging Face model directory (no config.json in it)"
    return None


def path_problems(spec: RunSpec, spec_file: Path) -> list[str]:
    """One line per path of ``spec`` that does not exist."""
    rel = f"(relative paths in a spec are relative to its directory, {spec_file.parent})"
    problems = []
    if problem := _model_problem("model", spec.model, rel):
        problems.append(f"{spec_file}: {problem}")
    for j, entry in enumerate(spec.sys_path or []):
        if not Path(entry).is_dir():
            problems.append(f"{spec_file}: sys_path[{j}]: no directory at {entry} {rel}")
    for setting, value in (("data.path", spec.data.path), ("eval.data", spec.eval.data)):
        if value is not None and not Path(value).exists():
            problems.append(f"{spec_file}: {setting}: {value} does not exist {rel}")
    for i, scorer in enumerate((spec.reward.scorers or []) if spec.reward else []):
        for j, entry in enumerate(getattr(scorer, "sys_path", [])):
            if not Path(entry).is_dir():
                problems.append(f"{spec_file}: reward.scorers[{i}].sys_path[{j}]: no directory at {entry} {rel}")
        rm = getattr(scorer, "model", None)
        if scorer.kind == "hf_rm" and rm and (problem := _model_problem(f"reward.scorers[{i}].model", rm, rel)):
            problems.append(f"{spec_file}: {problem}")
    for name in ("learner", "rollout", "reward"):
        own = getattr(spec.services, name)
        if isinstance(own, str) and not Path(own).is_file():
            problems.append(f"{spec_file}: services.{name}: no settings file at {own} {rel}")
    return problems


def import_problems(spec: RunSpec, spec_file: Path) -> list[str]:
    """One line per reward function of ``spec`` that does not import or does not fit its signature."""
    todo = [(f"{spec_file}: reward.scorers[{i}].function {s.function!r}", s.function, s.signature, list(s.sys_path))
            for i, s in enumerate((spec.reward.scorers or []) if spec.reward else []) if s.kind == "python"]
    if not todo:
        return []
    repo = str(Path(__file__).resolve().parents[2])
    try:
        out = subprocess.run([sys.executable, "-c", _TRY_IMPORTS, json.dumps(todo)], cwd=repo, capture_output=True,
                             text=True, timeout=IMPORT_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return [f"{todo[0][0]}: importing the reward functions took over {IMPORT_TIMEOUT_S:.0f}s"]
    try:
        return list(json.loads(out.stdout.strip().splitlines()[-1]))
    except (ValueError, IndexError):
        tail = [line for line in out.stderr.splitlines() if line.strip()]
        return [f"{todo[0][0]}: importing it failed: {tail[-1] if tail else f'exit code {out.returncode}'}"]


def remote_problems(spec: RunSpec) -> list[str]:
    """One line per remote reward the run depends on that does not answer as it should: each ``http`` scorer
    gets one probe item in its protocol (:mod:`services.reward.scorers.probe`), a ``reward.url`` its ``/health``.
    Each line names the scorer and its URL and ends with how to skip the check."""
    if spec.reward is None:
        return []
    skip = " (fleetrl run --skip-preflight skips this check)"
    if spec.reward.url is not None:
        return [p + skip for p in [_reward_url_problem(spec.reward.url)] if p]
    from services.reward.scorers.probe import probe_problems

    return [p + skip for p in probe_problems(spec.reward.scorers or [])]


def _reward_url_problem(url: str) -> str | None:
    return service_url_problem("reward.url", url, "/health", "reward")


def service_url_problem(setting: str, url: str, route: str, kind: str) -> str | None:
    """Why ``url`` (given as ``setting``) is not the base URL of a running FleetRL ``kind`` service, in one line
    naming the setting, or None: ``route`` is fetched once (GET, 10 s at most). A URL with no scheme, a refused
    connection or a 404 (a path such as ``/v1`` on the base URL, another service's port) each say so."""
    import httpx

    from services.reward.scorers.http_remote import short_reason
    from shared.redact import redact_url

    shown = redact_url(url)
    if not url.startswith(("http://", "https://")):
        return f"{setting} {shown}: not an http:// or https:// URL (write http://{shown.split('://')[-1]})"
    try:
        r = httpx.get(f"{url.rstrip('/')}{route}", timeout=httpx.Timeout(10.0, connect=5.0))
    except httpx.HTTPError as exc:
        return f"{setting} {shown}: cannot connect ({short_reason(exc)})"
    if r.status_code == 404:
        return (f"{setting} {shown}: answered 404 to {route} (is it a FleetRL {kind} service's base URL? no path "
                "such as /v1 after the port)")
    return None


def context_problem(spec: RunSpec, rollout_config: dict[str, Any], model: str | None = None) -> str | None:
    """Why ``sampling.max_new_tokens`` cannot fit the model's context with any prompt, or None: the rollout's
    ``engine.context_length`` if set, else the model's ``config.json`` (as the hf engine reads it). The workers cut
    each answer to the room left, but every held-out pass was refused (a 400 per evaluation, the whole run long)."""
    engine = rollout_config.get("engine") or {}
    ctx, source = engine.get("context_length"), "services.rollout.engine.context_length"
    if not isinstance(ctx, int):
        try:
            data = json.loads((Path(model or spec.model) / "config.json").read_text())
        except (OSError, ValueError):
            return None  # a hub id, or a checkpoint the paths check speaks of
        key = next((k for k in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length")
                    if isinstance(data.get(k), int)), None)
        if key is None:
            return None
        ctx, source = data[key], f"{key} in the model's config.json"
    wanted = spec.sampling.max_new_tokens
    if wanted < ctx:
        return None
    return (f"sampling.max_new_tokens {wanted} leaves no room for a prompt in the model's context of {ctx} tokens "
            f"({source}): set it below {ctx}, with room for the longest prompt")


def redis_problem(url: str, timeout_s: float = 5.0) -> str | None:
    """Why the spec's external Redis (``redis.url``) cannot be used, in one line naming the setting, or None: one
    PING within ``timeout_s`` (a Redis that is down, a wrong port or a refused password was a redis-py traceback
    out of ``fleetrl run``, from its first read of the run's keys)."""
    import redis

    from services.reward.scorers.http_remote import short_reason
    from shared.redact import redact_text, redact_url
    from shared.redis_errors import REDIS_FAILED, REDIS_REFUSED

    client = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
    try:
        client.ping()
    except REDIS_REFUSED as exc:
        return f"redis.url {redact_url(url)}: Redis refused the credentials ({redact_text(str(exc))})"
    except REDIS_FAILED as exc:
        return (f"redis.url {redact_url(url)}: cannot connect ({short_reason(exc)}); start that Redis, or leave "
                "redis.url unset for an embedded one under run_dir")
    finally:
        client.close()
    return None


def extras_problems(procs) -> list[str]:
    """One line per process of a plan (:func:`deploy.run.plan.plan`) whose settings need an optional package that
    is not installed (``optional_packages()`` of its settings), with the ``pip install`` that brings it."""
    from shared.extras import extras_problem

    from .derive import validate
    from .plan import KINDS

    problems = []
    for p in procs:
        settings = validate(KINDS[p.kind].settings_cls, p.kind, p.config)
        needs = getattr(settings, "optional_packages", None)
        missing = extras_problem(needs()) if needs else None
        if missing and f"{p.kind}: {missing}" not in problems:
            problems.append(f"{p.kind}: {missing}")
    return problems


def preflight(spec: RunSpec, spec_file: Path) -> list[str]:
    """Every problem found before anything starts (paths first; imports only when the paths are right)."""
    return path_problems(spec, spec_file) or import_problems(spec, spec_file)
