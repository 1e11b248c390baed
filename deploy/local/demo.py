"""``make demo``: the sort-digits recipe (examples/sort-digits/) through ``fleetrl run``, twice: a supervised
warm-up, then GRPO with held-out accuracy before and after.

1. Build a tiny Llama-shaped model and the sort-four-digits task under the run dir (train and held-out prompts
   disjoint): ``deploy/local/sort_task.py``.
2. ``fleetrl run sft.yaml``: the learner alone, exporting the warm-up checkpoint RL starts from.
3. ``fleetrl run fleetrl.yaml``: Redis (embedded, or --redis-url), the reward service, the rollout service and
   the GRPO learner; held-out greedy accuracy through the rollout service before and after.

Everything runs as separate processes and is shut down on exit, Ctrl-C included.
Options: ``python -m deploy.local.demo --help``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from deploy.local.sort_task import prepare_run
from deploy.local.two_stage import overrides, sft_then_rl

RECIPE = Path(__file__).resolve().parents[2] / "examples" / "sort-digits"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="make demo", description=__doc__.splitlines()[0])
    ap.add_argument("--run-dir", type=Path, default=None, help="default: runs/demo-<time>")
    ap.add_argument("--sft-steps", type=int, default=None, help="supervised warm-up steps (default: the recipe's)")
    ap.add_argument("--rl-steps", type=int, default=None, help="GRPO learner steps (default: the recipe's)")
    ap.add_argument("--groups-per-step", type=int, default=None, help="prompt groups per learner step")
    ap.add_argument("--group-size", type=int, default=None, help="samples per prompt")
    ap.add_argument("--lr", type=float, default=None, help="GRPO actor learning rate")
    ap.add_argument("--heldout", type=int, default=200, help="held-out prompts")
    ap.add_argument("--hidden-size", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--redis-url", default=os.environ.get("REDIS_URL") or None,
                    help="an external Redis (default: $REDIS_URL; unset: an embedded server under the run dir)")
    ap.add_argument("--lines", action="store_true", help="plain progress lines even on a terminal")
    return ap.parse_args(argv)


def say(msg: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    run = (args.run_dir or Path("runs") / time.strftime("demo-%Y%m%d-%H%M%S")).resolve()
    run.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    train, heldout, _ = prepare_run(run, seed=args.seed, heldout=args.heldout, hidden_size=args.hidden_size,
                                    layers=args.layers)
    say(f"run dir {run}; task: sort four digits ('sort 3721=' -> '1237'); {len(train)} train / {len(heldout)} "
        f"held-out prompts; recipe {RECIPE}")
    sft_sets, rl_sets = overrides(run, args)
    code, result, rl_wall = sft_then_rl(run, RECIPE, sft_sets, rl_sets, lines=args.lines, say=say,
                                        sft_line=lambda s: f"SFT warm-up: {s.algorithm.max_steps} steps",
                                        rl_line=lambda s: f"GRPO: {s.train.max_steps} steps x "
                                                          f"{s.train.groups_per_step} prompts x "
                                                          f"{s.sampling.group_size} samples")
    if code != 0:
        return code
    wall = time.monotonic() - t0
    before, after = result["heldout"][0], result["heldout"][-1]
    summary = {
        "heldout_accuracy_before": before["accuracy"], "heldout_accuracy_after": after["accuracy"],
        "gain_points": 100 * (after["accuracy"] - before["accuracy"]),
        "weight_version_before": before["weight_version"], "weight_version_after": after["weight_version"],
        "learner_steps": result["steps"], "rl_wall_s": round(rl_wall, 1), "total_wall_s": round(wall, 1),
        "reward_curve": str(run / "rl" / "learner" / "reward_curve.png"), "metrics": result["metrics"],
    }
    (run / "summary.json").write_text(json.dumps(summary, indent=2))
    print()
    print("=" * 72)
    print(f"held-out greedy accuracy: {before['accuracy']:.1%} (warm-up) -> {after['accuracy']:.1%} (after GRPO), "
          f"{summary['gain_points']:+.1f} points")
    print(f"learner steps: {result['steps']}   weight versions: {before['weight_version']} -> "
          f"{after['weight_version']}")
    print(f"wall time: {wall:.0f}s total ({rl_wall:.0f}s of RL)   reward curve: {summary['reward_curve']}")
    print(f"summary: {run / 'summary.json'}   logs: {run / 'rl' / 'logs'}")
    print("=" * 72)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
