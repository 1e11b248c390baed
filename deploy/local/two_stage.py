"""The demos' shape: a recipe's two run specs through ``fleetrl run``, a supervised warm-up (``sft.yaml``) and then
RL (``fleetrl.yaml``), copied into the run dir so their relative paths name it."""

from __future__ import annotations

import argparse
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from deploy.run.display import make_display
from deploy.run.launch import run_spec
from deploy.run.load import SpecError, load_spec
from deploy.run.spec import RunSpec


def overrides(run: Path, args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """A demo's command-line knobs as ``--set`` overrides of its recipe's two run specs (``None``: the recipe's
    value): ``(sft sets, rl sets)``."""
    sft = [f"run_name={run.name}-sft", f"run_dir={run / 'sft'}", f"train.seed={args.seed}"]
    rl = [f"run_name={run.name}", f"run_dir={run / 'rl'}", f"train.seed={args.seed}"]
    knobs = [(sft, "algorithm.max_steps", args.sft_steps), (rl, "train.max_steps", args.rl_steps),
             (rl, "train.groups_per_step", args.groups_per_step), (rl, "sampling.group_size", args.group_size),
             (rl, "optim.actor_lr", args.lr)]
    for sets, key, value in knobs:
        if value is not None:
            sets.append(f"{key}={value}")
    if args.redis_url:
        rl.append(f"redis.url={args.redis_url}")
    return sft, rl


def sft_then_rl(run: Path, recipe: Path, sft_sets: list[str], rl_sets: list[str], *, lines: bool,
                say: Callable[[str], None], sft_line: Callable[[RunSpec], str],
                rl_line: Callable[[RunSpec], str]) -> tuple[int, dict | None, float]:
    """Run both stages; ``(exit code, the RL run's summary.json, RL wall seconds)`` (code 2: a spec is invalid)."""
    for name in ("sft.yaml", "fleetrl.yaml"):
        shutil.copy(recipe / name, run / name)
    try:
        sft, rl = load_spec(run / "sft.yaml", sft_sets), load_spec(run / "fleetrl.yaml", rl_sets)
    except SpecError as exc:
        say(f"failed: {exc}")
        return 2, None, 0.0
    live = False if lines else None
    say(sft_line(sft))
    code = run_spec(sft, run / "sft.yaml", make_display(live))
    if code != 0:
        return code, None, 0.0
    say(rl_line(rl))
    started = time.monotonic()
    code = run_spec(rl, run / "fleetrl.yaml", make_display(live))
    if code != 0:
        return code, None, 0.0
    return 0, json.loads((run / "rl" / "summary.json").read_text()), time.monotonic() - started
