"""The compose stack's ``demo`` service: shows the learning in the logs, then the held-out result.

Measures greedy held-out accuracy through the rollout fleet (judged by the reward service) once the
fleet is up, follows the learner's ``/status`` (step, weight version, reward), and when the learner has
finished measures the accuracy again — the same figures ``make demo`` prints, but through the stack.

    python -m deploy.compose.watch --learner http://learner:8003 --rollout http://rollout:8001 \
        --reward http://reward:8002 --heldout /models/data/heldout.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import httpx

from deploy.local.evaluate import greedy_accuracy

MAX_NEW_TOKENS = 8


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    env = os.environ.get
    ap = argparse.ArgumentParser(prog="python -m deploy.compose.watch", description=__doc__.splitlines()[0])
    ap.add_argument("--learner", default=env("FLEETRL_DEMO_LEARNER_URL", "http://learner:8003"))
    ap.add_argument("--rollout", default=env("FLEETRL_DEMO_ROLLOUT_URL", "http://rollout:8001"))
    ap.add_argument("--reward", default=env("FLEETRL_DEMO_REWARD_URL", "http://reward:8002"))
    ap.add_argument("--reward-token", default=env("FLEETRL_DEMO_REWARD_TOKEN"),
                    help="the reward service's auth_token (its /score needs it)")
    ap.add_argument("--heldout", type=Path, default=Path(env("FLEETRL_DEMO_HELDOUT_FILE", "/models/data/heldout.jsonl")))
    ap.add_argument("--every", type=int, default=int(env("FLEETRL_DEMO_LOG_EVERY", "5")), help="log every N steps")
    ap.add_argument("--gone-after-s", type=float, default=60.0,
                    help="the learner counts as finished once unreachable this long after it reported steps")
    return ap.parse_args(argv)


def say(msg: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def follow(learner: str, every: int, gone_after_s: float) -> int:
    """Log progress until the learner reports it finished or is gone; returns the last step seen."""
    last_step, last_seen = -1, time.monotonic()
    with httpx.Client(timeout=5.0) as client:
        while True:
            try:
                st = client.get(f"{learner}/status").json()
                last_seen = time.monotonic()
            except (httpx.HTTPError, ValueError):
                if last_step >= 0 and time.monotonic() - last_seen > gone_after_s:
                    return last_step
                time.sleep(1.0)
                continue
            step = int(st.get("step", -1) or 0)
            if step != last_step and (step % every == 0 or st.get("phase") in ("done", "finished")):
                m = st.get("last_metrics") or {}
                say(f"learner step {step:4d}  weight_version {st.get('weight_version')}  "
                    f"reward {m.get('reward_mean', float('nan')):.3f}  phase {st.get('phase')}")
                last_step = step
            if st.get("phase") in ("done", "finished", "failed", "stopped"):
                return step
            time.sleep(1.0)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rows = [json.loads(line) for line in args.heldout.read_text().splitlines() if line.strip()]
    acc0, v0 = greedy_accuracy(args.rollout, args.reward, rows, max_new_tokens=MAX_NEW_TOKENS,
                               reward_token=args.reward_token)
    say(f"held-out greedy accuracy at start: {acc0:.1%} (weight_version {v0})")
    steps = follow(args.learner, args.every, args.gone_after_s)
    acc1, v1 = greedy_accuracy(args.rollout, args.reward, rows, max_new_tokens=MAX_NEW_TOKENS,
                               reward_token=args.reward_token)
    say(f"held-out greedy accuracy after {steps} learner steps: {acc1:.1%} (weight_version {v1}); "
        f"{100 * (acc1 - acc0):+.1f} points")
    return 0


if __name__ == "__main__":
    sys.exit(main())
