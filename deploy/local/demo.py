"""``make demo``: the whole fleet on one machine, training a tiny model with GRPO until it gets better.

1. Start (or reuse, with --redis-url / $REDIS_URL) Redis; build a tiny Llama-shaped model and the sort-four-digits
   task (train and held-out prompts disjoint).
2. Warm up with a short SFT run of the learner (its `sft` algorithm): the checkpoint RL starts from.
3. Start the reward service (exact-answer rule), the rollout service (hf engine + rollout worker +
   weight sidecar) and measure greedy held-out accuracy of the warm-up checkpoint through them.
4. Start the learner (GRPO). It feeds prompts to the queue, trains on the experiences the rollout
   fleet produces and publishes weights to it after every step.
5. When the learner is done, measure held-out accuracy again through the rollout service (now
   serving the learner's last published version) and print before / after, steps and wall time.

Everything runs as separate processes and is shut down on exit, Ctrl-C included.
Options: ``python -m deploy.local.demo --help``.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import sys
import threading
import time
from pathlib import Path

import httpx

from deploy.local.evaluate import greedy_accuracy
from deploy.local.fleet import Fleet, FleetError
from deploy.local.sort_task import prepare_run

MAX_NEW_TOKENS = 8


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="make demo", description=__doc__.splitlines()[0])
    ap.add_argument("--run-dir", type=Path, default=None, help="default: runs/demo-<time>")
    ap.add_argument("--sft-steps", type=int, default=40, help="supervised warm-up steps (batch 64)")
    ap.add_argument("--rl-steps", type=int, default=500, help="GRPO learner steps")
    ap.add_argument("--groups-per-step", type=int, default=16, help="prompt groups per learner step")
    ap.add_argument("--group-size", type=int, default=8, help="samples per prompt")
    ap.add_argument("--lr", type=float, default=5e-4, help="GRPO actor learning rate")
    ap.add_argument("--heldout", type=int, default=200, help="held-out prompts")
    ap.add_argument("--hidden-size", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--redis-url", default=os.environ.get("REDIS_URL") or None,
                    help="an external Redis (default: $REDIS_URL; unset: an embedded server under the run dir)")
    return ap.parse_args(argv)


def say(msg: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def sft_config(run: Path, base_model: Path, args, redis_url: str) -> dict:
    return {
        "run_name": "demo-sft", "redis_url": redis_url, "run_dir": str(run / "sft"),
        "model": {"actor": str(base_model)},
        "algorithm": {"name": "sft", "batch_size": 64, "max_steps": args.sft_steps},
        "optim": {"actor_lr": 3e-3, "schedule": "constant", "warmup_ratio": 0.0},
        "data": {"path": str(run / "data" / "train.jsonl"), "input_key": "input", "output_key": "output"},
        "train": {"seed": args.seed, "torch_threads": 2, "micro_batch_size": 64},
        "checkpoint": {"export_dir": str(run / "sft-model"), "every": 10_000, "resume": False},
        "observability": {"progress_bar": False, "plot": False},
    }


def grpo_config(run: Path, actor: Path, args, redis_url: str, token: str) -> dict:
    return {
        "run_name": "demo", "redis_url": redis_url, "run_dir": str(run / "learner"), "control_token": token,
        "model": {"actor": str(actor)},
        "algorithm": {"name": "grpo", "policy_loss": {"kind": "ppo", "eps_low": 0.2, "eps_high": 0.28},
                      "correction": {"kind": "tis", "cap": 2.0}},
        "optim": {"actor_lr": args.lr, "schedule": "constant", "warmup_ratio": 0.0},
        "train": {"groups_per_step": args.groups_per_step, "micro_batch_size": 64, "max_steps": args.rl_steps,
                  "seed": args.seed, "torch_threads": 1},
        "rollout": {"group_size": args.group_size, "window": 2 * args.groups_per_step, "max_staleness": 1,
                    "sampling": {"max_new_tokens": MAX_NEW_TOKENS, "temperature": 1.0}},
        "data": {"path": str(run / "data" / "train.jsonl"), "input_key": "input", "label_key": "label", "epochs": 10},
        "publish": {"every": 1},
        "checkpoint": {"every": 50, "export_dir": str(run / "final-model")},
        "observability": {"progress_bar": False},
    }


def reward_config() -> dict:
    return {"scorers": [{"name": "exact", "kind": "rule", "weight": 1.0, "check": {"type": "exact"}}]}


def rollout_config(model: Path, redis_url: str, reward_url: str, token: str) -> dict:
    return {
        "run_name": "demo", "redis_url": redis_url, "model": str(model), "control_token": token,
        "engine": {"kind": "hf", "device": "cpu", "max_batch_size": 256, "torch_threads": 1},
        "worker": {"enabled": True, "reward_url": reward_url, "concurrency": 32, "max_staleness": 1,
                   "sampling": {"max_new_tokens": MAX_NEW_TOKENS, "temperature": 1.0}},
    }


_interrupted = threading.Event()


def wait_for_exit(fleet: Fleet, name: str, timeout: float, progress_url: str | None = None) -> int:
    svc = fleet.services[name]
    deadline = time.monotonic() + timeout
    last_step = -1
    while svc.alive:
        if _interrupted.is_set():  # a signal whose KeyboardInterrupt a library swallowed
            raise KeyboardInterrupt("interrupted")
        if time.monotonic() > deadline:
            raise FleetError(f"{name} did not finish within {timeout:.0f}s:\n{svc.log_tail()}")
        for other in fleet.services:
            if other != name:
                fleet.check_alive(other)
        if progress_url:
            try:
                st = httpx.get(progress_url, timeout=5).json()
                if st.get("step", -1) != last_step and st.get("step", 0) % 10 == 0:
                    last_step = st["step"]
                    m = st.get("last_metrics") or {}
                    say(f"learner step {st['step']:4d}  weight_version {st.get('weight_version')}  "
                        f"reward {m.get('reward_mean', float('nan')):.3f}")
            except (httpx.HTTPError, ValueError):
                pass
        time.sleep(1.0)
    return svc.proc.returncode


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    run = (args.run_dir or Path("runs") / time.strftime("demo-%Y%m%d-%H%M%S")).resolve()
    run.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(16)
    t0 = time.monotonic()

    def on_signal(signum, _frame):
        _interrupted.set()
        raise KeyboardInterrupt(f"signal {signum}")

    for sig in (signal.SIGINT, signal.SIGTERM):  # explicit: a shell may start us with SIGINT ignored
        signal.signal(sig, on_signal)
    fleet = Fleet(run_dir=run, redis_url=args.redis_url)
    try:
        redis_url = fleet.start_redis()
        say(f"run dir {run}; Redis at {redis_url}")
        train, heldout, base = prepare_run(run, seed=args.seed, heldout=args.heldout, hidden_size=args.hidden_size,
                                           layers=args.layers)
        say(f"task: sort four digits ('sort 3721=' -> '1237'); {len(train)} train / {len(heldout)} held-out prompts")

        say(f"SFT warm-up: {args.sft_steps} steps")
        fleet.start("sft", "services.learner", sft_config(run, base, args, redis_url), wait=False)
        code = wait_for_exit(fleet, "sft", timeout=600)
        if code != 0:
            raise FleetError(f"SFT warm-up failed with code {code}:\n{fleet.services['sft'].log_tail()}")
        fleet.stop("sft")
        sft_model = run / "sft-model"

        say("starting reward and rollout services")
        reward = fleet.start("reward", "services.reward", reward_config())
        rollout = fleet.start("rollout", "services.rollout", rollout_config(sft_model, redis_url, reward.url, token))
        acc_before, v_before = greedy_accuracy(rollout.url, reward.url, heldout, max_new_tokens=MAX_NEW_TOKENS)
        say(f"held-out greedy accuracy of the warm-up checkpoint: {acc_before:.1%} (weight_version {v_before})")

        say(f"GRPO: {args.rl_steps} steps x {args.groups_per_step} prompts x {args.group_size} samples")
        t_rl = time.monotonic()
        learner = fleet.start("learner", "services.learner", grpo_config(run, sft_model, args, redis_url, token))
        code = wait_for_exit(fleet, "learner", timeout=1800, progress_url=f"{learner.url}/status")
        if code != 0:
            raise FleetError(f"learner failed with code {code}:\n{fleet.services['learner'].log_tail()}")
        rl_wall = time.monotonic() - t_rl
        acc_after, v_after = greedy_accuracy(rollout.url, reward.url, heldout, max_new_tokens=MAX_NEW_TOKENS)
        wall = time.monotonic() - t0
        steps = _learner_steps(run / "learner")
        summary = {
            "heldout_accuracy_before": acc_before, "heldout_accuracy_after": acc_after,
            "gain_points": 100 * (acc_after - acc_before), "weight_version_before": v_before,
            "weight_version_after": v_after, "learner_steps": steps, "rl_wall_s": round(rl_wall, 1),
            "total_wall_s": round(wall, 1), "reward_curve": str(run / "learner" / "reward_curve.png"),
            "metrics": str(run / "learner" / "metrics.jsonl"),
        }
        (run / "summary.json").write_text(json.dumps(summary, indent=2))
        print()
        print("=" * 72)
        print(f"held-out greedy accuracy: {acc_before:.1%} (warm-up) -> {acc_after:.1%} (after GRPO), "
              f"{summary['gain_points']:+.1f} points")
        print(f"learner steps: {steps}   weight versions: {v_before} -> {v_after}")
        print(f"wall time: {wall:.0f}s total ({rl_wall:.0f}s of RL)   reward curve: {summary['reward_curve']}")
        print(f"summary: {run / 'summary.json'}   logs: {run / 'logs'}")
        print("=" * 72)
        return 0
    except KeyboardInterrupt:
        say("interrupted: shutting everything down")
        return 130
    except FleetError as exc:
        say(f"failed: {exc}")
        return 1
    finally:
        fleet.stop_all()


def _learner_steps(learner_dir: Path) -> int:
    path = learner_dir / "metrics.jsonl"
    if not path.exists():
        return 0
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return max((int(x.get("step", 0)) for x in lines), default=0)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
