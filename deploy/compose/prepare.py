"""The compose stack's one-shot init service: the demo's tiny model, task data and SFT warm-up, on a volume.

The same steps as ``make demo`` (deploy/local/demo.py) before RL starts: build a tiny Llama-shaped
model, write the sort-four-digits train / held-out prompts, run the learner's ``sft`` algorithm as a
process, and leave the warm-up checkpoint at ``<out>/sft-model``. A ``READY`` file written last marks a
complete volume: rollout and learner wait for it, and a second ``up`` skips the work.

    python -m deploy.compose.prepare --out /models
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

from deploy.local.demo import RECIPE
from deploy.local.sort_task import prepare_run
from deploy.run.display import make_display
from deploy.run.launch import run_spec
from deploy.run.load import load_spec

READY = "READY"


class WarmUpFailed(RuntimeError):
    """The SFT warm-up's ``fleetrl run`` exited non-zero (its logs say why)."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    env = os.environ.get
    ap = argparse.ArgumentParser(prog="python -m deploy.compose.prepare", description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(env("FLEETRL_MODELS_DIR", "/models")))
    ap.add_argument("--sft-steps", type=int, default=int(env("FLEETRL_DEMO_SFT_STEPS", "30")))
    ap.add_argument("--heldout", type=int, default=int(env("FLEETRL_DEMO_HELDOUT", "200")))
    ap.add_argument("--hidden-size", type=int, default=int(env("FLEETRL_DEMO_HIDDEN_SIZE", "128")))
    ap.add_argument("--layers", type=int, default=int(env("FLEETRL_DEMO_LAYERS", "2")))
    ap.add_argument("--seed", type=int, default=int(env("FLEETRL_DEMO_SEED", "0")))
    return ap.parse_args(argv)


def say(msg: str) -> None:
    print(f"[prepare {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def prepare(args: argparse.Namespace) -> Path:
    out: Path = args.out
    if (out / READY).is_file():
        say(f"{out} is ready already: {(out / READY).read_text().strip()}")
        return out / "sft-model"
    work = out / ".prepare"
    shutil.rmtree(work, ignore_errors=True)
    (work / "data").mkdir(parents=True)
    train, heldout, base = prepare_run(work, seed=args.seed, heldout=args.heldout, hidden_size=args.hidden_size,
                                       layers=args.layers)
    say(f"tiny model at {base}; {len(train)} train / {len(heldout)} held-out prompts; SFT {args.sft_steps} steps")
    # the recipe's warm-up (examples/sort-digits/sft.yaml), on this volume's model and data
    sets = [f"model={base}", f"data.path={work / 'data' / 'train.jsonl'}", f"run_dir={work / 'sft'}",
            f"export={work / 'sft-model'}", f"algorithm.max_steps={args.sft_steps}", f"train.seed={args.seed}"]
    t0 = time.monotonic()
    code = run_spec(load_spec(RECIPE / "sft.yaml", sets), RECIPE / "sft.yaml", make_display(False))
    if code != 0:
        raise WarmUpFailed(code)
    say(f"SFT warm-up done in {time.monotonic() - t0:.0f}s")
    for name in ("data", "base-model", "sft-model"):  # publish the finished pieces, then the marker
        shutil.rmtree(out / name, ignore_errors=True)
        (work / name).rename(out / name)
    (out / READY).write_text(json.dumps({"sft_steps": args.sft_steps, "seed": args.seed, "time": time.time()}) + "\n")
    shutil.rmtree(work, ignore_errors=True)
    return out / "sft-model"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        path = prepare(args)
    except WarmUpFailed as exc:
        say(f"SFT warm-up failed with code {exc.args[0]}; logs under {args.out / '.prepare' / 'sft' / 'logs'}")
        return 1
    say(f"warm-up checkpoint: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
