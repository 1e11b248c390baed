"""``python -m services.rollout`` / ``fleetrl rollout``: parse settings first, then import the heavy parts."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from shared.settings import SettingsError, load_settings

if TYPE_CHECKING:
    from services.rollout.settings import RolloutSettings

app = typer.Typer(add_completion=False, help="FleetRL rollout service (generation fleet).")

Opt = typer.Option
# uvicorn's wait for open requests on SIGTERM, before the service stops (and the worker drains): part of what a
# container's stop grace period must cover (tests/deploy/test_compose_file.py)
GRACEFUL_SHUTDOWN_S = 10


@app.callback(invoke_without_command=True)
def main(
    config: Annotated[Path | None, Opt("--config", "-c", help="Settings file (.yaml/.yml/.toml).")] = None,
    model: Annotated[str | None, Opt(help="Model directory (Hugging Face format).")] = None,
    engine: Annotated[str | None, Opt(help="Engine kind: hf | sglang | vllm.")] = None,
    engine_url: Annotated[str | None, Opt(help="Base URL of the SGLang / vLLM server (sglang, vllm).")] = None,
    device: Annotated[str | None, Opt(help="hf engine device: auto | cpu | cuda[:i].")] = None,
    host: Annotated[str | None, Opt(help="Bind address (default 127.0.0.1).")] = None,
    port: Annotated[int | None, Opt(help="HTTP port (default 8001).")] = None,
    served_model_name: Annotated[str | None, Opt(help="Model name in the OpenAI routes.")] = None,
    redis_url: Annotated[str | None, Opt(help="Redis URL (worker).")] = None,
    run_name: Annotated[str | None, Opt(help="Run namespace of Redis keys.")] = None,
    worker: Annotated[bool | None, Opt("--worker/--no-worker", help="Run the rollout worker loop.")] = None,
    reward_url: Annotated[str | None, Opt(help="Reward service base URL (worker).")] = None,
    log_level: Annotated[str | None, Opt(help="Logging level.")] = None,
) -> None:
    """Serve /generate, the OpenAI routes, health, metrics and control (and the worker, if enabled)."""
    engine_over = {k: v for k, v in (("kind", engine), ("base_url", engine_url), ("device", device)) if v is not None}
    worker_over = {k: v for k, v in (("enabled", worker), ("reward_url", reward_url)) if v is not None}
    from services.rollout.settings import RolloutSettings

    try:
        settings = load_settings(
            RolloutSettings, config_file=config, model=model, host=host, port=port,
            served_model_name=served_model_name, redis_url=redis_url, run_name=run_name, log_level=log_level,
            engine=engine_over or None, worker=worker_over or None,
        )
    except SettingsError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    unsigned = settings.unsigned_records_problem(settings.shares_records)
    if unsigned is not None:
        typer.echo(f"error: {unsigned}", err=True)
        raise typer.Exit(2)
    if settings.redis_url:
        from shared.redis_auth import redis_auth_problem

        problem = redis_auth_problem(settings.redis_url)
        if problem is None and settings.shares_records:  # joins the run's streams: its run-wide settings must agree
            problem = _run_record_problem(settings)
        if problem is not None:
            typer.echo(f"error: {problem}", err=True)
            raise typer.Exit(2)

    import uvicorn

    from services.rollout.app import create_app
    from shared.telemetry import setup_logging

    setup_logging(settings.log_level, "rollout")
    from services.rollout.service import RolloutService, exit_process

    service = RolloutService(settings)
    service.on_drained = exit_process  # POST /drain ends this process (through uvicorn's own shutdown)
    uvicorn.run(create_app(settings, service=service), host=settings.host, port=settings.port, log_level=settings.log_level.lower(),
                access_log=False, timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S)


def _run_record_problem(settings: RolloutSettings) -> str | None:
    """The run's record of its run-wide settings, written if this replica is the run's first service, else
    compared: a difference is one line naming the field (shared/run_settings.py)."""
    from shared.redact import redact_text, redact_url
    from shared.redis_errors import REDIS_FAILED
    from shared.run_settings import check_run_record

    assert settings.redis_url is not None
    try:
        return check_run_record(settings.redis_url, settings.run_name, settings.run, settings.run_key, "rollout")
    except REDIS_FAILED as exc:
        return f"cannot read Redis at {redact_url(settings.redis_url)} (redis_url): {redact_text(str(exc))}"
