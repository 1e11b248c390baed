"""``python -m services.rollout`` / ``fleetrl rollout``: parse settings first, then import the heavy parts."""

from __future__ import annotations

from pathlib import Path

import typer

from shared.settings import SettingsError, load_settings

app = typer.Typer(add_completion=False, help="FleetRL rollout service (generation fleet).")


@app.callback(invoke_without_command=True)
def main(
    config: Path | None = typer.Option(None, "--config", "-c", help="Settings file (.yaml/.yml/.toml)."),
    model: str | None = typer.Option(None, help="Model directory (Hugging Face format)."),
    engine: str | None = typer.Option(None, help="Engine kind: hf | sglang | vllm."),
    engine_url: str | None = typer.Option(None, help="Base URL of the SGLang / vLLM server (sglang, vllm)."),
    device: str | None = typer.Option(None, help="hf engine device: auto | cpu | cuda[:i]."),
    host: str | None = typer.Option(None, help="Bind address (default 127.0.0.1)."),
    port: int | None = typer.Option(None, help="HTTP port."),
    served_model_name: str | None = typer.Option(None, help="Model name in the OpenAI routes."),
    redis_url: str | None = typer.Option(None, help="Redis URL (worker)."),
    run_name: str | None = typer.Option(None, help="Run namespace of Redis keys."),
    worker: bool | None = typer.Option(None, "--worker/--no-worker", help="Run the rollout worker loop."),
    reward_url: str | None = typer.Option(None, help="Reward service base URL (worker)."),
    log_level: str | None = typer.Option(None, help="Logging level."),
) -> None:
    """Serve /generate, the OpenAI routes, health, metrics and control."""
    engine_over: dict = {}
    if engine is not None:
        engine_over["kind"] = engine
    if engine_url is not None:
        engine_over["base_url"] = engine_url
    if device is not None:
        engine_over["device"] = device
    worker_over: dict = {}
    if worker is not None:
        worker_over["enabled"] = worker
    if reward_url is not None:
        worker_over["reward_url"] = reward_url
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

    import uvicorn

    from services.rollout.app import create_app
    from shared.telemetry import setup_logging

    setup_logging(settings.log_level, "rollout")
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level=settings.log_level.lower(),
                access_log=False, timeout_graceful_shutdown=10)
