"""``python -m services.learner --config FILE`` / ``fleetrl learner``: settings first, then torch and the app."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(add_completion=False, help="FleetRL learner: consumes experiences, trains, publishes weights.")


@app.callback(invoke_without_command=True)
def main(
    config: Annotated[Path | None, typer.Option("--config", "-c", help="YAML/TOML learner settings "
                                                "(see services/learner/configs/).")] = None,
    host: Annotated[str | None, typer.Option(help="Bind address (default 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help="HTTP port (default 8003).")] = None,
    run_name: Annotated[str | None, typer.Option(help="Run namespace of the Redis keys.")] = None,
    redis_url: Annotated[str | None, typer.Option(help="Redis URL (default: $REDIS_URL, else embedded).")] = None,
    run_dir: Annotated[str | None, typer.Option(help="Where metrics, plots and checkpoints go.")] = None,
    log_level: Annotated[str | None, typer.Option(help="Python logging level.")] = None,
) -> None:
    """Train until the prompt set is done (or POST /stop, SIGTERM); checkpoint on the way out."""
    from services.learner.settings import LearnerSettings
    from shared.settings import SettingsError, load_settings

    try:
        settings = load_settings(LearnerSettings, config_file=config, host=host, port=port, run_name=run_name,
                                 redis_url=redis_url, run_dir=run_dir, log_level=log_level)
    except SettingsError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc

    from services.learner.distributed.env import RankInfo
    from shared.telemetry import setup_logging

    ranks = RankInfo.from_env()
    if ranks.multi and settings.algorithm.name == "sft":
        typer.echo("error: SFT runs on one rank (WORLD_SIZE=1); data-parallel ranks are for RL algorithms", err=True)
        raise typer.Exit(2)
    setup_logging(settings.log_level, service="learner")
    if not ranks.owner:  # a follower rank: no HTTP, no Redis; trains on the shards rank 0 ships
        from services.learner.distributed.ranks import Follower

        Follower(settings, ranks).run()
        raise typer.Exit(0)

    import uvicorn

    from services.learner.app import create_app
    server: uvicorn.Server | None = None
    exit_code = {"code": 0}

    def on_exit(code: int) -> None:
        exit_code["code"] = code
        if server is not None:
            server.should_exit = True

    config_ = uvicorn.Config(create_app(settings, on_exit=on_exit), host=settings.host, port=settings.port,
                             log_level=settings.log_level.lower(), timeout_graceful_shutdown=10)
    server = uvicorn.Server(config_)
    server.run()
    raise typer.Exit(exit_code["code"])
