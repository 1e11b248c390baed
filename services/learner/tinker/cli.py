"""``fleetrl tinker --config FILE`` / ``python -m services.learner.tinker``, and ``fleetrl run FILE`` of a file with
``mode: tinker``: the Tinker API on the learner (settings first, then torch). Prints the TINKER_BASE_URL /
TINKER_API_KEY lines a client exports."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from services.learner.tinker.settings import TinkerSettings

app = typer.Typer(add_completion=False, help="FleetRL learner, Tinker mode: serve the Tinker API.")


@app.callback(invoke_without_command=True)
def main(
    config: Annotated[Path | None, typer.Option("--config", "-c", help="YAML/TOML Tinker settings.")] = None,
    host: Annotated[str | None, typer.Option(help="Bind address (default 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help="HTTP port (default 8010).")] = None,
    base_model: Annotated[str | None, typer.Option(help="Local HF model directory to serve.")] = None,
    run_dir: Annotated[str | None, typer.Option(help="Where checkpoints go.")] = None,
    log_level: Annotated[str | None, typer.Option(help="Python logging level.")] = None,
) -> None:
    """Serve until SIGTERM / Ctrl-C."""
    from services.learner.tinker.settings import TinkerSettings
    from shared.settings import SettingsError, load_settings

    try:
        settings = load_settings(TinkerSettings, config_file=config, host=host, port=port, base_model=base_model,
                                 run_dir=run_dir, log_level=log_level)
    except SettingsError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    serve(settings)


def missing_extras() -> str | None:
    """One line when the Tinker mode's optional packages (peft, tinker) are not installed, else None."""
    from shared.extras import extras_problem

    return extras_problem({"peft": "mode: tinker (it trains LoRA adapters)",
                           "tinker": "mode: tinker (the client's wire schema)"}, extra="tinker")


def serve_run_file(file: Path, raw: dict | None = None) -> int:
    """``fleetrl run FILE`` with ``mode: tinker``: the file's other keys (or ``raw``, what the launcher made of
    them) are Tinker settings, paths relative to the file; without an api_key (file or FLEETRL_TINKER_API_KEY) a
    fresh one is made and printed."""
    import os

    from services.learner.tinker.settings import TinkerSettings
    from shared.settings import SettingsError, load_settings, read_config_file

    missing = missing_extras()
    if missing:
        typer.echo(f"error: {file}: {missing}", err=True)
        return 2
    if raw is None:
        try:
            raw = {k: v for k, v in read_config_file(file).items() if k != "mode"}
        except SettingsError as exc:
            typer.echo(f"error: {exc}", err=True)
            return 2
    raw = dict(raw)
    for key in ("base_model", "run_dir"):
        if isinstance(raw.get(key), str) and not Path(raw[key]).is_absolute():
            raw[key] = str((file.parent / raw[key]).resolve())
    if "api_key" not in raw and not os.environ.get("FLEETRL_TINKER_API_KEY"):
        raw["api_key"] = f"tml-{secrets.token_hex(16)}"
    try:
        settings = load_settings(TinkerSettings, **raw)
    except SettingsError as exc:
        typer.echo(f"error: {file}: {exc}", err=True)
        return 2
    serve(settings)
    return 0


def serve(settings: TinkerSettings) -> None:
    import uvicorn

    from services.learner.tinker.app import create_app
    from shared.telemetry import setup_logging

    setup_logging(settings.log_level, service="tinker")
    if settings.port:
        typer.echo(f"export TINKER_BASE_URL=http://{settings.host}:{settings.port}")
        typer.echo(f"export TINKER_API_KEY={settings.api_key.get_secret_value()}")
        typer.echo(f"# base_model for create_lora_training_client: {settings.public_name()}")
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level=settings.log_level.lower(),
                timeout_graceful_shutdown=10)
