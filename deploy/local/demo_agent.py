"""``make demo-agent``: an agent learns to use a tool, through the real services — the agent-calculator recipe
(examples/agent-calculator/) through ``fleetrl run``, twice: a supervised warm-up, then GRPO on multi-turn
rollouts.

1. Build the task (``What is 482*739?``, sums and products of 2- and 3-digit numbers: too large for a tiny
   model) and a tiny Llama-shaped model with a tokenizer trained on the task's text: ``deploy/local/agent_task.py``.
2. ``fleetrl run sft.yaml``: the learner alone, a pass over transcripts in the exact token format of a
   multi-turn rollout, exported as the checkpoint RL starts from. 40% use the tool
   (``<tool_call>{"name": "calculator", ...}</tool_call>``, the ``tool`` message with the result,
   ``The answer is <result>``), 60% answer directly (``--sft-direct``): the warmed-up model can use the tool but,
   greedy, does not, and answers wrong.
3. ``fleetrl run fleetrl.yaml``: Redis, the reward service (the answer's last number against the label), the
   rollout service (hf engine; its worker runs ``multi_turn`` with the ``calculator`` environment: tool calls
   parsed from the model's text, run, their results fed back as ``tool`` messages) and the GRPO learner (trains
   on the model's tokens only). Held-out success — one greedy episode per held-out question, through the same
   rollout function — before and after RL; the first held-out episodes are rendered, tool calls included. What
   RL learns is to call the tool: the reward of the episodes that do is higher.

Everything runs as separate processes and is shut down on exit, Ctrl-C included.
Options: ``python -m deploy.local.demo_agent --help``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from deploy.local.agent_task import DIRECT, prepare_run
from deploy.local.two_stage import overrides, sft_then_rl

RECIPE = Path(__file__).resolve().parents[2] / "examples" / "agent-calculator"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="make demo-agent", description=__doc__.splitlines()[0])
    ap.add_argument("--run-dir", type=Path, default=None, help="default: runs/demo-agent-<time>")
    ap.add_argument("--sft-examples", type=int, default=1000, help="transcripts for the warm-up")
    ap.add_argument("--sft-direct", type=float, default=DIRECT,
                    help="the warm-up's share of transcripts that answer without the tool (RL learns to call it)")
    ap.add_argument("--sft-steps", type=int, default=None, help="warm-up steps (default: the recipe's)")
    ap.add_argument("--rl-steps", type=int, default=None, help="GRPO learner steps (default: the recipe's)")
    ap.add_argument("--groups-per-step", type=int, default=None, help="prompt groups per learner step")
    ap.add_argument("--group-size", type=int, default=None, help="episodes per prompt")
    ap.add_argument("--lr", type=float, default=None, help="GRPO actor learning rate")
    ap.add_argument("--heldout", type=int, default=200, help="held-out questions")
    ap.add_argument("--hidden-size", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--redis-url", default=os.environ.get("REDIS_URL") or None,
                    help="an external Redis (default: $REDIS_URL; unset: an embedded server under the run dir)")
    ap.add_argument("--lines", action="store_true", help="plain progress lines even on a terminal")
    args = ap.parse_args(argv)
    if not 0.0 <= args.sft_direct < 1.0:
        ap.error(f"--sft-direct must be in [0, 1), got {args.sft_direct}")
    return args


def say(msg: str) -> None:
    print(f"[demo-agent {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _curve(metrics: Path, every: int = 10) -> list[tuple[int, float]]:
    """(step, mean training reward over the last ``every`` steps) along the run."""
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    rewards = [(int(r["step"]), r["reward_mean"]) for r in rows if "reward_mean" in r]
    return [(s, sum(v for _, v in rewards[max(0, i - every + 1): i + 1]) / len(rewards[max(0, i - every + 1): i + 1]))
            for i, (s, _) in enumerate(rewards) if (i + 1) % every == 0 or i == len(rewards) - 1]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    run = (args.run_dir or Path("runs") / time.strftime("demo-agent-%Y%m%d-%H%M%S")).resolve()
    run.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    prepare_run(run, seed=args.seed, sft=args.sft_examples, heldout=args.heldout, hidden_size=args.hidden_size,
                layers=args.layers, direct=args.sft_direct)
    say(f"run dir {run}; task: 'What is 482*739?' with a calculator tool; {args.sft_examples} SFT transcripts "
        f"({args.sft_direct:.0%} answering without the tool), "
        f"{args.heldout} held-out questions; recipe {RECIPE}")
    sft_sets, rl_sets = overrides(run, args)
    code, result, rl_wall = sft_then_rl(run, RECIPE, sft_sets, rl_sets, lines=args.lines, say=say,
                                        sft_line=lambda s: f"SFT warm-up: {s.algorithm.max_steps} steps x {s.algorithm.batch_size} transcripts",
                                        rl_line=lambda s: (f"GRPO: {s.train.max_steps} steps x {s.train.groups_per_step} questions x {s.sampling.group_size} "
                                           "multi-turn episodes"))
    if code != 0:
        return code
    wall = time.monotonic() - t0
    before, after = result["heldout"][0], result["heldout"][-1]
    metrics = run / "rl" / "learner" / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    trained = [r for r in rows if "environment_tokens_mean" in r]
    evals = [json.loads(line) for line in (run / "rl" / "eval.jsonl").read_text().splitlines() if line.strip()]
    summary = {
        "heldout_success_after_sft": before["accuracy"], "heldout_success_after_rl": after["accuracy"],
        "heldout_tool_call_rate_after_sft": evals[0].get("tool_call_rate"),
        "heldout_tool_call_rate_after_rl": evals[-1].get("tool_call_rate"),
        "gain_points": round(100 * (after["accuracy"] - before["accuracy"]), 1),
        "weight_version_before": before["weight_version"], "weight_version_after": after["weight_version"],
        "learner_steps": result["steps"], "rl_wall_s": round(rl_wall, 1), "total_wall_s": round(wall, 1),
        "environment_tokens_mean": (sum(r["environment_tokens_mean"] for r in trained) / len(trained)
                                    if trained else 0.0),
        "reward_curve": str(run / "rl" / "learner" / "reward_curve.png"),
        "reward_curve_points": _curve(metrics),
        "samples_after_sft": str(run / "rl" / f"heldout_samples_step{before['step']}.md"),
        "samples_after_rl": str(run / "rl" / f"heldout_samples_step{after['step']}.md"),
        "metrics": str(metrics),
    }
    (run / "summary.json").write_text(json.dumps(summary, indent=2))
    print()
    print("=" * 72)
    print(f"held-out success (greedy episodes with the calculator tool): {before['accuracy']:.1%} (after SFT) -> "
          f"{after['accuracy']:.1%} (after GRPO), {summary['gain_points']:+.1f} points")
    print(f"held-out episodes that call the tool: {summary['heldout_tool_call_rate_after_sft']:.1%} -> "
          f"{summary['heldout_tool_call_rate_after_rl']:.1%}")
    print("training reward (mean of 10 steps): " + "  ".join(f"{s}:{v:.2f}" for s, v in summary["reward_curve_points"]))
    print(f"learner steps: {result['steps']}   weight versions: {before['weight_version']} -> "
          f"{after['weight_version']}   environment tokens per trained episode: "
          f"{summary['environment_tokens_mean']:.1f} (masked)")
    print(f"wall time: {wall:.0f}s total ({rl_wall:.0f}s of RL)   reward curve: {summary['reward_curve']}")
    print(f"sample episodes: {summary['samples_after_sft']}  {summary['samples_after_rl']}")
    print(f"summary: {run / 'summary.json'}   logs: {run / 'rl' / 'logs'}")
    print("=" * 72)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
