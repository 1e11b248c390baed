"""``fleetrl render k8s|compose|ray SPEC [-o DIR]`` and ``fleetrl run --on local|ray``: hooks the ``fleetrl``
command (deploy/cli.py) adds around deploy/run/cli.py's commands."""

from __future__ import annotations

import functools
import inspect
import typing
from pathlib import Path
from typing import Annotated

import typer

Target = Annotated[str, typer.Argument(help="k8s (manifests for kubectl apply -k), compose (a compose file) or "
                                       "ray (the Ray launcher's settings).")]


def render_cmd(
    target: Target,
    file: Annotated[Path, typer.Argument(help="The run spec (fleetrl.yaml; see examples/).")],
    out: Annotated[Path | None, typer.Option("-o", "--out", help="Where to write (default: rendered/<target>/ "
                                             "beside the spec).")] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="Override a setting, as fleetrl run.")] = None,
) -> None:
    """Write the run spec as Kubernetes manifests, a compose file or Ray launcher settings: each service's settings
    derived from the spec as fleetrl run derives them; secrets only by reference."""
    from .cli import _load
    from .render import RenderError, render

    spec = _load(file, set_)
    out_dir = out or file.resolve().parent / "rendered" / target
    try:
        carried, written = render(target, spec, file.resolve(), out_dir)
    except RenderError as exc:
        typer.echo(f"error: {file}: {exc}", err=True)
        raise typer.Exit(2) from exc
    for path in written:
        typer.echo(f"wrote {path}")
    for note in carried.notes:
        typer.echo(f"note: {note}")


def with_on(run_cmd):
    """``run_cmd`` with an ``--on local|ray`` option (and ``--ray-address``): local is run_cmd itself."""

    @functools.wraps(run_cmd)
    def run(*args, on: str = "local", ray_address: str | None = None, **kwargs):
        if on == "local":
            if ray_address:
                typer.echo("error: --ray-address is for --on ray", err=True)
                raise typer.Exit(2)
            return run_cmd(*args, **kwargs)
        if on != "ray":
            typer.echo(f"error: --on {on!r}: local or ray", err=True)
            raise typer.Exit(2)
        bound = inspect.signature(run_cmd).bind(*args, **kwargs)
        bound.apply_defaults()
        params = bound.arguments
        if params.get("reset") or params.get("live"):
            typer.echo("error: --reset and --live are for fleetrl run on this machine", err=True)
            raise typer.Exit(2)
        from .cli import _load
        from .on_ray import run_on_ray

        spec = _load(params["file"], params.get("set_"))
        raise typer.Exit(run_on_ray(spec, params["file"].resolve(), address=ray_address,
                                    say=lambda *a, **k: typer.echo(*a, err=bool(k.get("file")))))

    hints = typing.get_type_hints(run_cmd, include_extras=True)  # the Annotated options, not their strings
    sig = inspect.signature(run_cmd)
    params = [p.replace(annotation=hints.get(p.name, p.annotation)) for p in sig.parameters.values()]
    extra = [
        inspect.Parameter("on", inspect.Parameter.KEYWORD_ONLY, default="local", annotation=Annotated[
            str, typer.Option("--on", help="Where the run's services go: local (this machine) or ray (a Ray cluster "
                              "through deploy/ray/launcher.py; local Ray without --ray-address).")]),
        inspect.Parameter("ray_address", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Annotated[
            str | None, typer.Option("--ray-address", help="With --on ray: the cluster ('auto', 'ray://head:10001')."
                                     )]),
    ]
    del run.__wrapped__  # typer reads __signature__ / __annotations__ of this function, not run_cmd's
    run.__signature__ = sig.replace(parameters=[*params, *extra], return_annotation=None)
    run.__annotations__ = {p.name: p.annotation for p in [*params, *extra]}
    return run
