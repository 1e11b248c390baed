"""The ``fleetrl`` command: run a service, an embedded Redis, build a tiny model, inspect the queue and the
weight sync.

Service commands are the services' own typer apps (``services/<svc>/cli.py``); they parse settings
before importing anything heavy, so ``fleetrl --help`` stays fast.
"""

from __future__ import annotations

import asyncio
import json
import signal
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False, help="FleetRL: RL training for LLMs as services.")
queue_app = typer.Typer(no_args_is_help=True, help="Inspect the experience queue.")
app.add_typer(queue_app, name="queue")
weights_app = typer.Typer(no_args_is_help=True, help="Inspect the weight sync.")
app.add_typer(weights_app, name="weights")


def _add_service(name: str, module: str, help_text: str) -> None:
    """Register a service's own typer app (its module imports nothing heavy at import time)."""
    from shared.service_kit.loader import load_object

    app.add_typer(load_object(f"{module}:app", typer.Typer, what="service command"), name=name, help=help_text)


_add_service("rollout", "services.rollout.cli", "Run the rollout (generation) service and its worker.")
_add_service("reward", "services.reward.cli", "Run the reward service (/score, /get_reward).")
_add_service("learner", "services.learner.cli", "Run the learner (PPO / GRPO / REINFORCE++ / RLOO / SFT).")
_add_service("tinker", "services.learner.tinker.cli", "Serve the Tinker API (tinker client programs) from the learner.")


def _add_run_commands() -> None:
    """``fleetrl run`` / ``fleetrl settings``: a whole run from one spec (deploy/run/)."""
    from deploy.run.cli import eval_cmd, run_cmd, settings_cmd
    from deploy.run.render_cli import render_cmd, with_on

    app.command("run")(with_on(run_cmd))
    app.command("render")(render_cmd)
    app.command("settings")(settings_cmd)
    app.command("eval")(eval_cmd)


_add_run_commands()


@app.command("export")
def export_cmd(
    run_dir: Annotated[Path, typer.Argument(help="A run dir (fleetrl run's, or a learner's run_dir), a checkpoints "
                                            "directory, or one step-* checkpoint: its newest complete checkpoint "
                                            "is exported.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="The Hugging Face directory to write (weights, config, "
                                      "tokenizer): what the rollout service and fleetrl eval load.")],
) -> None:
    """Write a checkpoint's policy as a plain Hugging Face model directory, whatever number of learner ranks
    wrote it (sharded checkpoints are read whole on this machine's CPU)."""
    from services.learner.training.export_checkpoint import ExportError, export_checkpoint, find_trainer_dir

    try:
        trainer_dir = find_trainer_dir(run_dir)
        export_checkpoint(trainer_dir, out)
    except (ExportError, OSError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    step = json.loads((trainer_dir / "trainer.json").read_text()).get("global_step")
    typer.echo(f"exported step {step} ({trainer_dir.parent}) to {out}")


@app.command("redis")
def redis_cmd(
    data_dir: Annotated[Path, typer.Option(help="Where the AOF files live.")] = Path("runs/redis"),
    port: Annotated[int, typer.Option(help="TCP port (0 picks a free one).")] = 6390,
    host: Annotated[str, typer.Option(help="Bind address.")] = "127.0.0.1",
) -> None:
    """Run the embedded Redis-compatible server in the foreground until Ctrl-C."""
    from shared.redis_server import EmbeddedRedis, RedisServerError

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):  # before the server starts, so no signal can orphan it
        signal.signal(sig, lambda *_: stop.set())
    server = EmbeddedRedis(data_dir=data_dir, host=host, port=port)
    try:
        server.start()
    except RedisServerError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    # the password stays in its 0600 file; what is printed is a line a shell can use as it is
    typer.echo(f"REDIS_URL=redis://:$(cat {server.password_file})@{server.host}:{server.port}/0  "
               f"(password in {server.password_file}; data in {server.data_dir}; Ctrl-C stops it)")
    while not stop.wait(0.5) and server.running:
        pass
    server.stop()


@app.command("tiny-model")
def tiny_model_cmd(
    out_dir: Annotated[Path, typer.Argument(help="Directory to write the Hugging Face checkpoint to.")],
    kind: Annotated[str, typer.Option(help="causal-lm or reward-model.")] = "causal-lm",
    hidden_size: Annotated[int, typer.Option(min=8, help="Hidden size.")] = 64,
    layers: Annotated[int, typer.Option(min=1, help="Transformer layers.")] = 2,
    heads: Annotated[int, typer.Option(min=1, help="Attention heads.")] = 4,
    seed: Annotated[int, typer.Option(help="Initialisation seed.")] = 0,
) -> None:
    """Write a tiny randomly initialised model + byte-level tokenizer in Hugging Face format."""
    from deploy.local import tiny_model

    if hidden_size % heads:
        raise typer.BadParameter(f"hidden_size {hidden_size} must be divisible by heads {heads}")
    builders = {"causal-lm": tiny_model.build_tiny_causal_lm, "reward-model": tiny_model.build_tiny_reward_model}
    if kind not in builders:
        raise typer.BadParameter(f"kind must be one of {sorted(builders)}, got {kind!r}")
    try:
        path = builders[kind](out_dir, hidden_size=hidden_size, layers=layers, heads=heads, seed=seed)
    except OSError as exc:  # a directory that cannot be made or written: one line, not a traceback
        typer.echo(f"error: cannot write the model to {out_dir}: {exc.strerror or exc}", err=True)
        raise typer.Exit(2) from exc
    typer.echo(f"wrote {kind} to {path}")


def _redis_url(value: str) -> str:
    """``--redis-url`` as Redis reads it; a URL without its scheme (``localhost:6379``) is a one-line usage error
    naming the option (redis-py raised a ValueError out of the command, a traceback)."""
    from shared.settings import redis_url_with_scheme

    try:
        return redis_url_with_scheme(value) or value
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


RedisUrlOption = Annotated[str, typer.Option("--redis-url", envvar="REDIS_URL", callback=_redis_url,
                                             help="Redis URL of the run.")]


def _print_from_redis(redis_url: str, collect: Callable[[Any], Awaitable[dict]]) -> None:
    """Run ``collect(client)`` against ``redis_url`` and print its result as JSON; an unreachable or failing
    Redis is a one-line error and exit code 1, not a traceback."""
    import redis.asyncio as aioredis

    from shared.redis_errors import REDIS_FAILED

    async def run() -> dict:
        client = aioredis.from_url(redis_url, socket_timeout=10, socket_connect_timeout=5)
        try:
            return await collect(client)
        finally:
            await client.aclose()

    try:
        typer.echo(json.dumps(asyncio.run(run()), indent=2))
    except REDIS_FAILED as exc:
        from shared.redact import redact_text, redact_url

        typer.echo(f"error: cannot read from Redis at {redact_url(redis_url)}: {redact_text(str(exc))}", err=True)
        raise typer.Exit(1) from exc


@queue_app.command("stats")
def queue_stats(
    redis_url: RedisUrlOption,
    run_name: str = typer.Option("default", help="Run namespace."),
) -> None:
    """Print length, backlog, pending per consumer, dead letters and oldest pending age of both streams."""
    from shared import keys
    from shared.experience_queue import StreamQueue
    from shared.schemas import Experience, PromptTask

    async def collect(client: Any) -> dict:
        out = {}
        for name, stream, group, rec in (
            ("prompts", keys.prompts_stream(run_name), "rollout", PromptTask),
            ("experiences", keys.experiences_stream(run_name), "learner", Experience),
        ):
            out[name] = (await StreamQueue(client, stream, group, rec).stats()).as_dict()
        return out

    _print_from_redis(redis_url, collect)


@queue_app.command("clear")
def queue_clear(
    run_name: Annotated[str, typer.Option(help="Run namespace whose keys to delete.")],
    redis_url: RedisUrlOption,
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask for confirmation.")] = False,
) -> None:
    """Delete every Redis key of a run (prompts, experiences, dead letters, processed ids, weight sync), so a
    learner can start that run name afresh. Its checkpoints are not touched."""
    from services.learner.run_guard import clear_run
    from shared.redact import redact_text, redact_url
    from shared.redis_errors import REDIS_FAILED

    if not yes and not typer.confirm(f"delete every key of run {run_name!r} at {redact_url(redis_url)}?"):
        raise typer.Exit(1)
    try:
        n = clear_run(redis_url, run_name)
    except REDIS_FAILED as exc:
        typer.echo(f"error: cannot clear run {run_name!r} at {redact_url(redis_url)}: {redact_text(str(exc))}",
                   err=True)
        raise typer.Exit(1) from exc
    typer.echo(f"deleted {n} keys of run {run_name!r}")


@weights_app.command("status")
def weights_status(
    redis_url: RedisUrlOption,
    run_name: str = typer.Option("default", help="Run namespace."),
) -> None:
    """Print the latest weight version, every registered replica (alive or not, its version, how far behind)
    and the last update round with each member's report."""
    from shared.weight_sync.status import weight_sync_status

    _print_from_redis(redis_url, lambda client: weight_sync_status(client, run_name))


@app.command("plugins")
def plugins_cmd(
    spec: Annotated[Path | None, typer.Argument(
        help="A run spec: its `plugins` are imported first (as fleetrl run imports them).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the listing as JSON.")] = False,
    load: Annotated[list[str] | None, typer.Option(
        "--import", help="A module of yours that registers plug-ins (as a service's `plugins` setting imports it); "
        "repeatable.")] = None,
) -> None:
    """List every plug-in point (engines, scorers, rollout functions, environments, algorithms, losses,
    corrections, weight transports), its kinds and each kind's settings."""
    from deploy.plugins_doc import catalogue, render

    if spec is not None:
        from deploy.run.load import SpecError, import_spec_file_plugins

        try:
            import_spec_file_plugins(spec)
        except SpecError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from exc
    try:
        text = json.dumps(catalogue(tuple(load or ())), indent=2) if as_json else render(tuple(load or ()))
    except ValueError as exc:  # a module of --import that does not load
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    typer.echo(text)


def main() -> None:
    """The ``fleetrl`` console script (and ``python -m deploy.cli``): the app, then leave with its status without
    the interpreter's teardown of every module (``fleetrl learner`` had ~3,300 to tear down, seconds after its
    orderly shutdown; shared/service_kit/process_exit.py): what ``python -m services.<svc>`` already does."""
    from shared.service_kit.process_exit import run_main

    run_main(app)


if __name__ == "__main__":
    main()
