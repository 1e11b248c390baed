"""``fleetrl run FILE`` with ``mode: tinker``: the Tinker API on the learner, and with ``replicas: {rollout: N}``
(N >= 1) a rollout fleet that samples for it — an (embedded) Redis and N rollout replicas with the weight sidecar,
started first, then the learner's Tinker mode pointed at them (``rollout_urls``); everything stops with Ctrl-C.

The file's ``rollout:`` section (optional) is each replica's own settings (services/rollout/settings.py); the
other keys are the Tinker settings (services/learner/tinker/settings.py), paths relative to the file."""

from __future__ import annotations

import secrets
import signal
import sys
from pathlib import Path

import typer

from deploy.local.fleet import Fleet, FleetError
from shared.settings import SettingsError, read_config_file

from .derive import deep_merge

SCORE = "services.rollout.routes.score:scoring"


def serve_tinker(file: Path) -> int:
    from services.learner.tinker.cli import missing_extras, serve_run_file

    missing = missing_extras()  # before any replica starts
    if missing:
        typer.echo(f"error: {file}: {missing}", err=True)
        return 2

    try:
        raw = {k: v for k, v in read_config_file(file).items() if k != "mode"}
    except SettingsError as exc:
        typer.echo(f"error: {exc}", err=True)
        return 2
    replicas = raw.pop("replicas", None) or {}
    rollout = raw.pop("rollout", None) or {}
    n = replicas.get("rollout", 0) if isinstance(replicas, dict) else None
    if not isinstance(n, int) or isinstance(n, bool) or n < 0 or set(replicas) - {"rollout"}:
        typer.echo(f"error: {file}: replicas: give `rollout: N` (N >= 0 rollout replicas that sample for the Tinker "
                   "API); a mode: tinker file has no other replicas", err=True)
        return 2
    if not isinstance(rollout, dict):
        typer.echo(f"error: {file}: rollout: a mapping of rollout settings (services/rollout/settings.py)", err=True)
        return 2
    if n == 0:
        if rollout:
            typer.echo(f"error: {file}: a rollout: section needs replicas: {{rollout: N}} with N >= 1", err=True)
            return 2
        return serve_run_file(file, raw)
    for key in ("base_model", "run_dir"):
        if isinstance(raw.get(key), str) and not Path(raw[key]).is_absolute():
            raw[key] = str((file.parent / raw[key]).resolve())
    if not isinstance(raw.get("base_model"), str):
        typer.echo(f"error: {file}: base_model: the local model directory to train and sample", err=True)
        return 2
    run_dir = Path(raw.get("run_dir") or (file.parent / "runs" / "tinker"))
    run_name = raw.setdefault("run_name", "tinker")
    fleet = Fleet(run_dir / "fleet", redis_url=raw.get("redis_url"))
    # uvicorn re-raises the SIGTERM it served under once it stops: exit through ``finally`` (stopping the fleet),
    # as Ctrl-C does, not by the signal's default action
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        raw["redis_url"] = fleet.start_redis()
        token = secrets.token_hex(16)  # the replicas' control routes (weights, drain): this launcher's only
        base = {"model": raw["base_model"], "run_name": run_name, "weight_sidecar": True, "control_token": token}
        for i in range(n):
            config = deep_merge(base, rollout)
            if SCORE not in config.setdefault("extensions", []):  # prompt logprobs (compute_logprobs) on the replica
                config["extensions"] = [*config["extensions"], SCORE]
            fleet.start(f"rollout-{i}", "services.rollout", config, wait=False)
        for i in range(n):
            fleet.wait_healthy(f"rollout-{i}")
        raw["rollout_urls"] = [fleet.services[f"rollout-{i}"].url for i in range(n)]
        typer.echo(f"# {n} rollout replica(s) sample for the Tinker API: {', '.join(raw['rollout_urls'])} "
                   f"(logs in {run_dir / 'fleet' / 'logs'})")
        return serve_run_file(file, raw)
    except FleetError as exc:
        typer.echo(f"error: {file}: a rollout replica did not start: {str(exc).splitlines()[0]} "
                   f"(its log: {run_dir / 'fleet' / 'logs'})", err=True)
        return 1
    finally:
        fleet.stop_all()


def _exit_on_sigterm(signum: int, frame: object) -> None:
    sys.exit(128 + signum)
