"""End-to-end throughput of the whole fleet: synchronous vs asynchronous (bounded-staleness) GRPO.

Both modes run the same three services as separate processes (reward: exact-answer rule; rollout: hf
engine + rollout worker + weight sidecar; learner: GRPO, weights published after every step) on the
sort-four-digits task with a tiny model, for the same number of learner steps:

- ``sync``:  window = groups_per_step and max_staleness = 0 — generation and training alternate
  (on-policy; the fleet idles while the learner trains and vice versa).
- ``async``: window = 2 x groups_per_step and max_staleness = 1 — the fleet generates the next batch
  while the learner trains on this one (one-step off-policy, corrected by truncated IS).

Printed per mode, measured in this run from the learner's metrics.jsonl (first to last step, so
start-up is excluded): steps/s, samples/s, the share of learner time spent waiting for experiences,
mean staleness, experiences dropped as stale; then the async / sync throughput ratio.

    .venv/bin/python benchmarks/e2e.py [--steps 12] [--groups-per-step 8] [--group-size 8]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from deploy.local.demo import MAX_NEW_TOKENS, reward_config, rollout_config
from deploy.local.fleet import Fleet, FleetError
from deploy.local.sort_task import make_splits, write_jsonl

MODES = {
    "sync": lambda g: {"window": g, "max_staleness": 0},
    "async": lambda g: {"window": 2 * g, "max_staleness": 1},
}


def learner_config(run: Path, mode: str, actor: Path, args, redis_url: str) -> dict:
    g = args.groups_per_step
    return {
        "run_name": f"e2e-{mode}", "redis_url": redis_url, "run_dir": str(run / mode / "learner"),
        "model": {"actor": str(actor)},
        "algorithm": {"name": "grpo", "policy_loss": {"kind": "ppo", "eps_high": 0.28}, "correction": {"kind": "tis", "cap": 2.0}},
        "optim": {"actor_lr": 5e-4, "schedule": "constant", "warmup_ratio": 0.0},
        "train": {"groups_per_step": g, "micro_batch_size": 64, "max_steps": args.steps, "torch_threads": 1},
        "rollout": {"group_size": args.group_size, **MODES[mode](g),
                    "sampling": {"max_new_tokens": MAX_NEW_TOKENS, "temperature": 1.0}},
        "data": {"path": str(run / "train.jsonl"), "input_key": "input", "label_key": "label", "epochs": 10},
        "publish": {"every": 1},
        "checkpoint": {"every": 10_000},
        "observability": {"progress_bar": False, "plot": False},
    }


def run_mode(run: Path, mode: str, actor: Path, args) -> dict:
    fleet = Fleet(run_dir=run / mode, redis_url=args.redis_url)
    try:
        redis_url = fleet.start_redis()
        reward = fleet.start("reward", "services.reward", reward_config())
        rcfg = rollout_config(actor, redis_url, reward.url, token="bench-token")
        rcfg["run_name"] = f"e2e-{mode}"
        rcfg["worker"]["max_staleness"] = MODES[mode](args.groups_per_step)["max_staleness"]
        fleet.start("rollout", "services.rollout", rcfg)
        learner = fleet.start("learner", "services.learner", learner_config(run, mode, actor, args, redis_url),
                              wait=False)
        deadline = time.monotonic() + args.timeout
        while learner.alive:
            if time.monotonic() > deadline:
                raise FleetError(f"{mode}: learner did not finish in {args.timeout}s:\n{learner.log_tail()}")
            fleet.check_alive("reward", "rollout")
            time.sleep(0.5)
        if learner.proc.returncode != 0:
            raise FleetError(f"{mode}: learner exited {learner.proc.returncode}:\n{learner.log_tail()}")
    finally:
        fleet.stop_all()
    rows = [json.loads(x) for x in (run / mode / "learner" / "metrics.jsonl").read_text().splitlines()]
    span = rows[-1]["time"] - rows[0]["time"]  # from the end of step 1 to the end of the last step
    steps = len(rows) - 1
    samples = sum(r["samples"] for r in rows[1:])
    busy = sum(r["step_time_s"] for r in rows[1:])
    wait = sum(r["wait_time_s"] for r in rows[1:])
    return {
        "mode": mode, "steps_timed": steps, "wall_s": span, "steps_per_s": steps / span,
        "samples_per_s": samples / span, "learner_train_share": busy / span, "learner_wait_share": wait / span,
        "staleness_mean": sum(r["staleness_mean"] for r in rows) / len(rows),
        "dropped_stale": rows[-1]["experiences_dropped_stale"], "reward_last": rows[-1]["reward_mean"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--groups-per-step", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--modes", default="sync,async")
    ap.add_argument("--run-dir", type=Path, default=None)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--redis-url", default=os.environ.get("REDIS_URL") or None,
                    help="an external Redis (default: $REDIS_URL; unset: an embedded server per mode)")
    args = ap.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    run = (args.run_dir or REPO / "runs" / time.strftime("bench-e2e-%Y%m%d-%H%M%S")).resolve()
    run.mkdir(parents=True, exist_ok=True)
    train, _ = make_splits(0, 50)
    write_jsonl(train, run / "train.jsonl")
    from deploy.local.tiny_model import build_tiny_causal_lm

    actor = build_tiny_causal_lm(run / "model", hidden_size=128, layers=2, heads=4, max_positions=64)
    results = []
    for mode in args.modes.split(","):
        print(f"[e2e] {mode}: {args.steps} steps x {args.groups_per_step} groups x {args.group_size} samples",
              flush=True)
        results.append(run_mode(run, mode, actor, args))
    print()
    cols = ["mode", "steps_timed", "wall_s", "steps_per_s", "samples_per_s", "learner_train_share",
            "learner_wait_share", "staleness_mean", "dropped_stale"]
    print("  ".join(f"{c:>18}" for c in cols))
    for r in results:
        print("  ".join(f"{r[c]:>18.3f}" if isinstance(r[c], float) else f"{r[c]:>18}" for c in cols))
    by_mode = {r["mode"]: r for r in results}
    if {"sync", "async"} <= set(by_mode):
        ratio = by_mode["async"]["samples_per_s"] / by_mode["sync"]["samples_per_s"]
        print(f"\nasync / sync throughput: {ratio:.2f}x  (cores on this machine: {os.cpu_count()})")
    (run / "e2e.json").write_text(json.dumps(results, indent=2))
    print(f"results: {run / 'e2e.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
