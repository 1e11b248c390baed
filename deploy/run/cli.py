"""``fleetrl run FILE``, ``fleetrl settings learner|rollout|reward|run`` (every setting, documented) and
``fleetrl settings FILE`` (the settings each service of a run spec gets), ``fleetrl eval FILE``. Imports nothing
heavy at import time (``fleetrl --help`` stays fast)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

SpecFile = Annotated[Path, typer.Argument(help="The run spec (fleetrl.yaml; see examples/).")]
SkipPreflight = Annotated[bool, typer.Option(
    "--skip-preflight", help="Do not probe the remote (http) reward scorers before starting (for a server that "
    "cannot take a probe item).")]
Sets = Annotated[list[str] | None, typer.Option("--set", help="Override a setting: --set train.max_steps=20 "
                                                 "(repeatable; validated like the file; a list's item by its "
                                                 "index: --set reward.scorers.0.url=...).")]


def _load(file: Path, sets: list[str] | None):
    from .load import SpecError, load_spec

    try:
        return load_spec(file, sets or [])
    except SpecError as exc:
        for line in str(exc).splitlines():
            typer.echo(f"error: {line}", err=True)
        raise typer.Exit(2) from exc


def command_line(verb: str, file: Path, sets: list[str] | None) -> str:
    """The command the user ran, as hints repeat it: ``fleetrl run FILE --set k=v ...`` (``--set`` decides the
    run, e.g. its run_name, so a hint without it would name another run)."""
    import shlex

    return " ".join(["fleetrl", verb, shlex.quote(str(file)), *(f"--set {shlex.quote(s)}" for s in sets or [])])


def _remote_refused(spec, live: bool | None) -> bool:
    """The remote reward scorers' probe (:func:`.preflight.remote_problems`), first of all: before the zygote's
    imports (torch, transformers) take the CPU, so a wrong URL is refused in seconds even on a busy machine (it
    took 10.3 s beside them in a full ``make test``). True when refused (the lines are shown)."""
    from .preflight import remote_problems

    problems = remote_problems(spec)
    if problems:
        from .display import make_display

        display = make_display(live)
        for line in problems:
            display.event(f"error: {line}")
        display.close()
    return bool(problems)


def _mode(file: Path) -> str | None:
    """A spec file's top-level ``mode`` (``tinker``), or None; an unreadable file is left to the spec loader."""
    from shared.settings import SettingsError, read_config_file

    try:
        mode = read_config_file(file).get("mode")
    except SettingsError:
        return None
    return mode if isinstance(mode, str) else None


def run_cmd(
    file: SpecFile,
    set_: Sets = None,
    reset: Annotated[bool, typer.Option("--reset", help="Start the run over: delete its Redis keys and the "
                                        "learner's checkpoints and logs in run_dir.")] = False,
    live: Annotated[bool | None, typer.Option("--live/--lines", help="Live panel or plain lines (default: a "
                                              "live panel on a terminal).")] = None,
    skip_preflight: SkipPreflight = False,
) -> None:
    """Start the whole fleet of a run spec on this machine and follow it (Ctrl-C stops; the same command
    resumes)."""
    if _mode(file) == "tinker":  # serve the Tinker API instead of driving a loop (docs/tinker.md)
        if set_ or reset:
            typer.echo("error: --set and --reset are for run specs; a mode: tinker file is served as it is", err=True)
            raise typer.Exit(2)
        from .tinker import serve_tinker

        raise typer.Exit(serve_tinker(file.resolve()))
    spec = _load(file, set_)
    if not skip_preflight and _remote_refused(spec, live):
        raise typer.Exit(1)
    from deploy.local.zygote import Zygote

    # the services' imports (torch, transformers, ...) start now, in the zygote that forks them, while this process
    # imports the launcher and checks the run (deploy/local/zygote.py)
    run_dir = Path(spec.run_dir) if spec.run_dir else (Path("runs") / spec.run_name).resolve()  # plan.run_dir_of
    zygote = Zygote.for_run(spec.model, run_dir)
    from shared.service_kit.process_exit import leave

    from .display import make_display
    from .launch import run_spec

    code = run_spec(spec, file.resolve(), make_display(live), reset=reset, zygote=zygote,
                    command=command_line("run", file, set_), skip_preflight=True)  # probed above
    # every process, the zygote and the Redis of the run are stopped and the display is closed: leave without
    # the interpreter's teardown of the launcher's modules (0.5-0.7 s at load 5; shared/service_kit/process_exit.py)
    leave(code)


def settings_cmd(
    target: Annotated[str, typer.Argument(help="learner, rollout, reward or run: every setting of that class, "
                                          "documented; or a run spec FILE: the settings each of its processes gets.")],
    section: Annotated[str | None, typer.Argument(help="Only this section (learner optim, rollout engine, ...).")]
    = None,
    set_: Sets = None,
    service: Annotated[str | None, typer.Option(help="With a spec FILE: only this process (learner, rollout-0, "
                                                "reward-0, ...).")] = None,
) -> None:
    """Every setting of a service (fleetrl settings learner|rollout|reward|run [SECTION]: type, default, bounds,
    description), or the settings each process of a run spec gets (fleetrl settings FILE [--service NAME]; ports
    and Redis as placeholders where fleetrl run picks them at start)."""
    from .settings_doc import TARGETS, render

    if target in TARGETS and not Path(target).is_file():
        if set_ or service:
            typer.echo(f"error: --set and --service go with a run spec file, not with {target}", err=True)
            raise typer.Exit(2)
        try:
            typer.echo(render(target, section), nl=False)
        except ValueError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from exc
        return
    if not Path(target).is_file():
        typer.echo(f"error: {target}: neither a settings class ({', '.join(TARGETS)}) nor a run spec file", err=True)
        raise typer.Exit(2)
    _derived_settings(Path(target), set_, service)


def _derived_settings(file: Path, set_: list[str] | None, service: str | None) -> None:
    import yaml

    from shared.settings import SettingsError

    from .plan import plan

    spec = _load(file, set_)
    try:
        from shared.redact import redact_url

        procs = plan(spec, file.resolve(), "redis://<embedded: run_dir/redis>" if spec.redis.url is None
                     else redact_url(spec.redis.url), "<generated per run>")
    except SettingsError as exc:
        for line in str(exc).splitlines():
            typer.echo(f"error: {line}", err=True)
        raise typer.Exit(2) from exc
    chosen = [p for p in procs if service in (None, p.name, p.kind)]
    if not chosen:
        typer.echo(f"error: --service {service}: the run has {', '.join(p.name for p in procs)}", err=True)
        raise typer.Exit(2)
    for p in chosen:
        typer.echo(f"# {p.name}: python -m {p.module} --config <run_dir>/configs/{p.name}.yaml")
        typer.echo(yaml.safe_dump(p.config, sort_keys=False))


def eval_cmd(
    file: SpecFile,
    set_: Sets = None,
    model: Annotated[str | None, typer.Option(help="A model directory to evaluate (a checkpoint's export); "
                                              "default: the spec's model.")] = None,
    rollout_url: Annotated[str | None, typer.Option(help="Evaluate what a running rollout service serves "
                                                    "instead.")] = None,
    samples: Annotated[int, typer.Option(min=0, help="Also sample this many answers per prompt: their accuracy "
                                         "and pass@k for k = 1, 2, 4, ..., samples (unbiased estimator; "
                                         "single-turn specs only).")] = 0,
    temperature: Annotated[float | None, typer.Option(min=0.0, help="Temperature of --samples (default: the "
                                                      "spec's sampling.temperature).")] = None,
    seed: Annotated[int | None, typer.Option(min=0, help="Seed of --samples: answer j of every prompt uses seed + j, "
                                             "so the same model gives the same figures again (default: unseeded).")]
    = None,
    show: Annotated[int, typer.Option(min=0, help="Also print this many held-out prompts with the greedy "
                                      "completion, its reward and its length (all of them go to samples.jsonl).")] = 0,
    skip_preflight: SkipPreflight = False,
) -> None:
    """Held-out greedy accuracy (the share of answers whose reward is >= eval.success_threshold, default 1.0) and
    mean reward (eval.data, judged by the spec's reward) of a model or a running rollout service, with --samples
    K also sampled accuracy and pass@k; prints a JSON summary whose "measured" says what was counted (and with
    --show N, N answers first). An agent spec (a rollout function other than single_turn): one greedy episode
    per prompt, with tool_call_rate; --samples is refused."""
    import json

    import httpx

    from deploy.local.evaluate import RewardUnavailable
    from deploy.local.fleet import FleetError
    from shared.settings import SettingsError

    from .evaluate_model import evaluate_model
    from .preflight import local_model

    spec = _load(file, set_)
    try:
        model = None if model is None else local_model(model, "--model")  # against the current directory
        result = evaluate_model(spec, file.resolve(), model=model, rollout_url=rollout_url, samples=samples,
                                temperature=temperature, seed=seed, skip_preflight=skip_preflight)
    except RewardUnavailable as exc:
        typer.echo(f"error: the held-out answers could not be scored: {str(exc).splitlines()[0]}", err=True)
        raise typer.Exit(1) from exc
    except (ValueError, SettingsError, FleetError, httpx.HTTPError, OSError) as exc:
        typer.echo(f"error: {str(exc).splitlines()[0]}", err=True)
        raise typer.Exit(1) from exc
    answers = result.pop("answers")
    for a in answers[:show]:
        typer.echo(show_answer(a))
    typer.echo(json.dumps(result, indent=2))


def show_answer(answer: dict) -> str:
    """One held-out answer as ``fleetrl eval --show`` prints it: the prompt, the completion, the label, the
    reward and the length (``max`` when it hit max_new_tokens); an agent's episode also its model turns and
    whether it called a tool."""
    reward = "failed" if answer.get("reward") is None else f"{answer['reward']:.3f}"
    length = f"{answer.get('tokens')} tokens" + (" (hit max_new_tokens)" if answer.get("hit_max_new_tokens") else "")
    if "model_turns" in answer:  # an agent's episode (its completion holds the environment's turns too)
        length += f", {answer['model_turns']} model turns" + (" (called a tool)" if answer.get("called_tool") else "")
    return (f"--- reward {reward}, {length}, label {answer.get('label')!r}\n"
            f"prompt:     {answer.get('prompt')!r}\ncompletion: {answer.get('completion')!r}")
