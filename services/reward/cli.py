"""``python -m services.reward`` / ``fleetrl reward``: parse settings first, then import the app and serve."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(add_completion=False, help="FleetRL reward service: /score, /get_reward (OpenRLHF), /scorers.")


@app.callback(invoke_without_command=True)
def main(
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="YAML/TOML file with `scorers` (see examples/reward/).")
    ] = None,
    host: Annotated[str | None, typer.Option(help="Bind address (default 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help="HTTP port (default 8002).")] = None,
    log_level: Annotated[str | None, typer.Option(help="Python logging level.")] = None,
) -> None:
    """Serve the reward service until SIGTERM / Ctrl-C."""
    from services.reward.settings import RewardSettings
    from shared.settings import SettingsError, load_settings

    try:
        settings = load_settings(RewardSettings, config_file=config, host=host, port=port, log_level=log_level)
    except SettingsError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc

    if settings.probe_remote_scorers:  # a wrong URL is refused now, not at the first request (or never)
        from services.reward.scorers.probe import probe_problems

        problems = probe_problems(settings.scorers)
        if problems:
            for line in problems:
                typer.echo(f"error: {line} (probed at start; probe_remote_scorers: false skips the probe)", err=True)
            raise typer.Exit(2)

    import uvicorn

    from services.reward.app import create_app
    from shared.telemetry import setup_logging

    setup_logging(settings.log_level, service="reward")
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level=settings.log_level.lower(),
                timeout_graceful_shutdown=10)
