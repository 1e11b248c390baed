"""``python -m services.learner --config FILE`` / ``fleetrl learner``: settings first, then torch and the app.

This entry point composes the process: a run that needs Redis and is given no ``redis_url`` (flag,
``FLEETRL_LEARNER_REDIS_URL``, the file or ``$REDIS_URL``) gets a private embedded server under
``<run_dir>/redis``, started here, handed to the service as its ``redis_url`` and stopped on exit; the
service object itself always gets a URL."""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from services.learner.settings import LearnerSettings
    from shared.redis_server import EmbeddedRedis

app = typer.Typer(add_completion=False, help="FleetRL learner: consumes experiences, trains, publishes weights.")


@app.callback(invoke_without_command=True)
def main(
    config: Annotated[Path | None, typer.Option("--config", "-c", help="YAML/TOML learner settings "
                                                "(see services/learner/configs/).")] = None,
    host: Annotated[str | None, typer.Option(help="Bind address (default 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help="HTTP port (default 8003).")] = None,
    run_name: Annotated[str | None, typer.Option(help="Run namespace of the Redis keys.")] = None,
    redis_url: Annotated[str | None, typer.Option(help="Redis URL (default: $REDIS_URL, else an embedded server "
                                                  "under run_dir).")] = None,
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

    from shared.extras import extras_problem

    missing = extras_problem(settings.optional_packages())
    if missing:
        typer.echo(f"error: {missing}", err=True)
        raise typer.Exit(2)

    from services.learner.distributed.env import RankInfo
    from shared.telemetry import setup_logging

    ranks = RankInfo.from_env()
    if ranks.multi and not getattr(settings.algorithm, "data_parallel", settings.algorithm.name != "sft"):
        typer.echo(f"error: algorithm {settings.algorithm.name} runs on one rank (WORLD_SIZE=1); data-parallel ranks "
                   "are for the RL algorithms", err=True)
        raise typer.Exit(2)
    setup_logging(settings.log_level, service="learner")
    if not ranks.owner:  # a follower rank: no HTTP, no Redis; trains on the shards rank 0 ships
        from services.learner.distributed.ranks import Follower

        Follower(settings, ranks).run()
        raise typer.Exit(0)

    import uvicorn

    from services.learner.app import create_app

    _refuse_unsigned_records(settings)
    settings, embedded = _embedded_redis_if_needed(settings)
    _refuse_bad_redis_credentials(settings, embedded)
    _refuse_a_used_run_name(settings, embedded)
    _refuse_a_disagreeing_run(settings, embedded)
    server: uvicorn.Server | None = None
    exit_code = {"code": 0}

    def on_exit(code: int) -> None:
        exit_code["code"] = code
        if server is not None:
            server.should_exit = True

    try:
        config_ = uvicorn.Config(create_app(settings, on_exit=on_exit), host=settings.host, port=settings.port,
                                 log_level=settings.log_level.lower(), timeout_graceful_shutdown=10)
        server = uvicorn.Server(config_)
        server.run()
    finally:
        if embedded is not None:
            embedded.stop()
    raise typer.Exit(exit_code["code"])


def _refuse_unsigned_records(settings: LearnerSettings) -> None:
    """An RL learner on a Redis it is given (``redis_url``: shared with the rollout fleet) trusts the experiences
    there only when they are signed: no ``run_key`` (and no ``allow_unsigned_records``) is a one-line error, exit 2.
    A private embedded server (no ``redis_url``; its password only in ``run_dir``) is not shared."""
    from services.learner.algorithms.rl_algorithms import runner_class

    shares = bool(settings.redis_url) and runner_class(settings.algorithm).needs_redis
    problem = settings.unsigned_records_problem(shares)
    if problem is not None:
        typer.echo(f"error: {problem}", err=True)
        raise typer.Exit(2)


def _refuse(problem: str | None, embedded: EmbeddedRedis | None) -> None:
    """A start-up check's finding: one line on stderr, the private Redis stopped, exit 2 (None: nothing found)."""
    if problem is not None:
        if embedded is not None:
            embedded.stop()
        typer.echo(f"error: {problem}", err=True)
        raise typer.Exit(2)


def _read_redis(redis_url: str, check: Callable[[], str | None]) -> str | None:
    """A start-up check that reads Redis: its finding, or why Redis could not be read (naming redis_url)."""
    from shared.redact import redact_text, redact_url
    from shared.redis_errors import REDIS_FAILED

    try:
        return check()
    except REDIS_FAILED as exc:
        return f"cannot read Redis at {redact_url(redis_url)} (redis_url): {redact_text(str(exc))}"


def _refuse_bad_redis_credentials(settings: LearnerSettings, embedded: EmbeddedRedis | None) -> None:
    """A Redis that refuses this learner's credentials: a one-line error naming redis_url, exit 2."""
    from shared.redis_auth import redis_auth_problem

    problem = redis_auth_problem(settings.redis_url) if settings.redis_url else None
    _refuse(problem, embedded)


def _refuse_a_used_run_name(settings: LearnerSettings, embedded: EmbeddedRedis | None) -> None:
    """A fresh learner on a run name whose processed sample ids are still in Redis would train nothing: say so
    and exit 2 (services/learner/run_guard.py)."""
    from services.learner.algorithms.rl_algorithms import runner_class
    from services.learner.run_guard import stale_run_problem

    url = settings.redis_url
    if not runner_class(settings.algorithm).needs_redis or not url:
        return
    problem = _read_redis(url, lambda: stale_run_problem(url, settings.run_name, settings.checkpoint_dir,
                                                         settings.checkpoint.resume))
    _refuse(problem, embedded)


def _refuse_a_disagreeing_run(settings: LearnerSettings, embedded: EmbeddedRedis | None) -> None:
    """Write the run's record of its run-wide settings, or compare with it: a difference is one line naming the
    field, exit 2 (shared/run_settings.py)."""
    from services.learner.algorithms.rl_algorithms import runner_class
    from shared.run_settings import check_run_record

    url = settings.redis_url
    if not runner_class(settings.algorithm).needs_redis or not url:
        return
    problem = _read_redis(url, lambda: check_run_record(url, settings.run_name, settings.run, settings.run_key,
                                                        "learner"))
    _refuse(problem, embedded)


def _embedded_redis_if_needed(settings: LearnerSettings) -> tuple[LearnerSettings, EmbeddedRedis | None]:
    """A run that needs Redis and has no ``redis_url``: start a private server under ``<run_dir>/redis`` and
    return the settings that name it, with the server (stopped by the caller, or by SIGTERM here)."""
    from services.learner.algorithms.rl_algorithms import runner_class

    if settings.redis_url or not runner_class(settings.algorithm).needs_redis:
        return settings, None
    from shared.redis_server import EmbeddedRedis, RedisServerError

    try:
        server = EmbeddedRedis(data_dir=Path(settings.run_dir) / "redis").start()
    except RedisServerError as exc:
        typer.echo(f"error: no redis_url given and the embedded Redis did not start: {exc}", err=True)
        raise typer.Exit(1) from exc
    logging.getLogger("services.learner").info("no redis_url given: a private embedded Redis at %s (data in %s)",
                                               server.display_url, server.data_dir)

    def terminate(signum: int, _frame: object) -> None:
        # uvicorn re-raises a SIGTERM once it has shut down: stop the server cleanly (SHUTDOWN flushes its AOF),
        # then end by the signal as a learner without one does
        server.stop()
        signal.signal(signum, signal.SIG_DFL)
        signal.raise_signal(signum)

    signal.signal(signal.SIGTERM, terminate)
    return settings.model_copy(update={"redis_url": server.url}), server
