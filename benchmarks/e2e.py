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

**Time to accuracy** (``--time-to-accuracy``): the sort-digits recipe of ``make demo`` (examples/sort-digits/,
through ``fleetrl run``), per seed (``--seeds 0,1,2``: the seed's own task split and SFT warm-up, shared by
its modes), in three modes, with held-out greedy accuracy every
``--eval-every`` steps: ``sync`` (staleness 0, window = groups_per_step), ``async`` (staleness 1, window 2x) and
``async-partial`` (async, and the rollout fleet continues in-flight sequences across weight switches:
``weights.pause_mode: partial``). Printed per mode: wall seconds from the first held-out evaluation (the
starting policy) until accuracy first reaches ``--threshold``, the learner step and the samples trained by
then, and the final accuracy (the mean of the last ``--final-evals`` evaluations); then per mode the mean
final accuracy over seeds and its difference to sync, and each async mode's speed-up over sync (the median of
the per-seed ratios).

Two views of the final accuracy, both printed: at **equal steps** (the last ``--final-evals`` evaluations up to
``--rl-steps``) and at **equal wall time** (the last ``--final-evals`` evaluations of a mode within the
wall seconds sync took for its ``--rl-steps``: where async steps are faster, it runs more steps in that time). For the
second view the async modes run ``--async-steps-factor`` x ``--rl-steps`` steps; ``--lr`` sets every mode's learning
rate, ``--async-lr`` the async modes'. At the recipe's constant learning rate the extra steps do not change the first
``--rl-steps``; ``--schedule cosine`` (or ``linear``, down to ``--min-lr-ratio`` x the peak) makes each mode's LR decay
over its own steps, so an async mode's first ``--rl-steps`` then run at a higher LR than sync's (its equal-steps view
is mid-schedule; the equal-wall-time view compares each mode at the end of its own schedule). ``--set KEY=VALUE``
(repeatable) passes any other run-spec override to every mode's RL run.

    .venv/bin/python benchmarks/e2e.py --time-to-accuracy [--threshold 0.6] [--also-thresholds 0.7,0.8]
        [--rl-steps 300] [--eval-every 20] [--seeds 0,1,2] [--heldout 200] [--async-steps-factor 1.5] [--async-lr 2.5e-4] [--schedule cosine]
        [--set services.learner.observability.log_samples=true]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from deploy.local.demo import RECIPE
from deploy.local.sort_task import make_splits, write_jsonl
from deploy.run.display import make_display
from deploy.run.launch import run_spec
from deploy.run.load import load_spec

MODES = {
    "sync": lambda g: ["staleness=0", f"window={g}"],
    "async": lambda g: ["staleness=1", f"window={2 * g}"],
}


def run_mode(run: Path, mode: str, actor: Path, args) -> dict:
    """The sort-digits recipe through ``fleetrl run`` (one mode, no held-out evaluation), timed from its metrics."""
    g = args.groups_per_step
    sets = [f"model={actor}", f"data.path={run / 'train.jsonl'}", f"run_name={run.name}-{mode}",
            f"run_dir={run / mode}", f"train.max_steps={args.steps}", f"train.groups_per_step={g}",
            f"sampling.group_size={args.group_size}", "checkpoint_every=10000", "export=null", "eval.data=null",
            *MODES[mode](g)]
    if args.redis_url:
        sets.append(f"redis.url={args.redis_url}")
    if run_spec(load_spec(RECIPE / "fleetrl.yaml", sets), RECIPE / "fleetrl.yaml", make_display(False)) != 0:
        raise SystemExit(f"{mode}: fleetrl run failed; logs under {run / mode / 'logs'}")
    rows = [json.loads(x) for x in (run / mode / "learner" / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "step" in r]
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


TTA_MODES = {
    **MODES,
    "async-partial": lambda g: ["staleness=1", f"window={2 * g}", "services.rollout.weights.pause_mode=partial"],
}


def tta_seed(run: Path, seed: int, args) -> list[dict] | None:
    """One seed: its own task split and SFT warm-up, then every mode from that warm-up; per mode the wall seconds,
    step and samples until held-out accuracy first reaches the threshold, and the final accuracy (the mean of the
    last ``--final-evals`` evaluations: one held-out pass swings by several points)."""
    import shutil

    from deploy.local.demo import parse_args as demo_args
    from deploy.local.sort_task import prepare_run
    from deploy.local.two_stage import overrides as demo_overrides

    run.mkdir(parents=True, exist_ok=True)
    prepare_run(run, seed=seed, heldout=args.heldout, hidden_size=128, layers=2)
    for name in ("sft.yaml", "fleetrl.yaml"):
        shutil.copy(RECIPE / name, run / name)
    knobs = demo_args(["--sft-steps", str(args.sft_steps), "--rl-steps", str(args.rl_steps), "--seed", str(seed),
                       "--groups-per-step", str(args.groups_per_step), "--group-size", str(args.group_size)]
                      + (["--redis-url", args.redis_url] if args.redis_url else [])
                      + (["--lr", str(args.lr)] if args.lr is not None else []))
    sft_sets, rl_sets = demo_overrides(run, knobs)
    print(f"[tta] seed {seed}: SFT warm-up: {args.sft_steps} steps", flush=True)
    if run_spec(load_spec(run / "sft.yaml", sft_sets), run / "sft.yaml", make_display(False)) != 0:
        return None
    g = args.groups_per_step
    results = []
    for mode in args.modes.split(","):
        steps = args.rl_steps if mode == "sync" else math.ceil(args.rl_steps * args.async_steps_factor)
        sets = [*rl_sets, f"run_name={run.parent.name}-{run.name}-{mode}", f"run_dir={run / mode}",
                f"eval.every={args.eval_every}", f"train.max_steps={steps}", *TTA_MODES[mode](g)]
        if mode != "sync" and args.async_lr is not None:
            sets.append(f"optim.actor_lr={args.async_lr}")
        if args.schedule is not None:  # spans this mode's own train.max_steps (the learner derives it)
            sets += [f"optim.schedule={args.schedule}", f"optim.min_lr_ratio={args.min_lr_ratio}"]
        sets += args.set
        print(f"[tta] seed {seed} {mode}: up to {steps} steps, held-out every {args.eval_every}", flush=True)
        if run_spec(load_spec(run / "fleetrl.yaml", sets), run / "fleetrl.yaml", make_display(False)) != 0:
            return None
        evals = [json.loads(x) for x in (run / mode / "eval.jsonl").read_text().splitlines()]
        metrics = {r["step"]: r for r in map(json.loads, (run / mode / "learner" / "metrics.jsonl").read_text().splitlines())
                   if "step" in r}
        hit = next((e for e in evals if e["accuracy"] >= args.threshold), None)
        samples = int(sum(m.get("samples", 0) for step, m in metrics.items() if hit and step <= hit["step"]))
        # equal steps: evaluations up to --rl-steps (an evaluation is labelled with the step the launcher saw when
        # it started one, which can be a step or two past the due step: half an interval of slack)
        upto = [e for e in evals if e["step"] < args.rl_steps + args.eval_every / 2]
        last = upto[1:][-args.final_evals:] or upto
        results.append({"seed": seed, "mode": mode, "start_acc": evals[0]["accuracy"],
                        "final_acc": sum(e["accuracy"] for e in last) / len(last),
                        "final_steps": [e["step"] for e in last],
                        "evals": [{"step": e["step"], "s": round(e["time"] - evals[0]["time"], 1),
                                   "accuracy": e["accuracy"]} for e in evals],
                        "reached_s": round(hit["time"] - evals[0]["time"], 1) if hit else None,
                        "reached_step": hit["step"] if hit else None, "samples": samples if hit else None,
                        "steps_run": max(metrics) if metrics else 0, "wall_s": round(evals[-1]["time"] - evals[0]["time"], 1),
                        "rl_steps_s": round(upto[-1]["time"] - evals[0]["time"], 1)})
    return results


def at_wall(r: dict, budget_s: float, n: int) -> tuple[float, list[int], bool]:
    """A run's accuracy at a wall budget: the mean of its last ``n`` evaluations (step 0 excluded) finished within
    ``budget_s`` seconds of its step-0 evaluation; their steps; whether the run ended before the budget."""
    within = [e for e in r["evals"] if e["s"] <= budget_s]
    last = within[1:][-n:] or within
    return sum(e["accuracy"] for e in last) / len(last), [e["step"] for e in last], r["evals"][-1]["s"] < budget_s


def time_to_accuracy(args) -> int:
    """Every seed, every mode; the per-run table, then per mode the mean final accuracy over seeds and each async
    mode's speed-up over sync (median over seeds of the per-seed ratio)."""
    import statistics

    run = (args.run_dir or REPO / "runs" / time.strftime("bench-tta-%Y%m%d-%H%M%S")).resolve()
    results: list[dict] = []
    for seed in (int(x) for x in args.seeds.split(",")):
        one = tta_seed(run / f"seed-{seed}", seed, args)
        if one is None:
            return 1
        results += one
        (run / "tta.json").write_text(json.dumps(results, indent=2))
    print()
    print(f"threshold: held-out greedy accuracy >= {args.threshold:.0%} ({args.heldout} held-out prompts); final: mean "
          f"of the last {args.final_evals} evaluations")
    print(f"{'seed':>5} {'mode':>14} {'start':>7} {'reached s':>10} {'at step':>8} {'samples':>8} {'final':>7} "
          f"{'steps':>6} {'wall s':>7} {'s to rl-steps':>13}")
    for r in results:
        reached = "-" if r["reached_s"] is None else f"{r['reached_s']:.1f}"
        step = "-" if r["reached_step"] is None else r["reached_step"]
        samples = "-" if r["samples"] is None else r["samples"]
        print(f"{r['seed']:>5} {r['mode']:>14} {r['start_acc']:>7.1%} {reached:>10} {step!s:>8} {samples!s:>8} "
              f"{r['final_acc']:>7.1%} {r['steps_run']:>6} {r['wall_s']:>7.1f} {r['rl_steps_s']:>13.1f}")
    print()
    modes = args.modes.split(",")
    by = {(r["seed"], r["mode"]): r for r in results}
    seeds = sorted({r["seed"] for r in results})
    for mode in modes:
        finals = [by[s, mode]["final_acc"] for s in seeds]
        line = f"{mode:>14}: equal steps: final accuracy mean {statistics.mean(finals):.1%} over {len(seeds)} seed(s) " \
               f"({', '.join(f'{f:.1%}' for f in finals)})"
        if mode != "sync" and "sync" in modes:
            diffs = [100 * (by[s, mode]["final_acc"] - by[s, "sync"]["final_acc"]) for s in seeds]
            ratios = [by[s, "sync"]["reached_s"] / by[s, mode]["reached_s"] for s in seeds
                      if by[s, mode]["reached_s"] and by[s, "sync"]["reached_s"]]
            line += f"; vs sync {statistics.mean(diffs):+.1f} points"
            line += (f"; reaches the threshold {statistics.median(ratios):.2f}x sooner (median of "
                     f"{', '.join(f'{x:.2f}' for x in ratios)}; target >= 1.3)") if ratios else "; threshold not reached"
        print(line)
    if "sync" in modes:
        print()
        print("equal wall time: each mode's last evaluations within the wall seconds sync took for its steps")
        for mode in modes:
            views = [at_wall(by[s, mode], by[s, "sync"]["rl_steps_s"], args.final_evals) for s in seeds]
            line = (f"{mode:>14}: accuracy mean {statistics.mean(v[0] for v in views):.1%} ("
                    + ", ".join(f"seed {s}: {v[0]:.1%} at steps {v[1]} within {by[s, 'sync']['rl_steps_s']:.0f} s"
                                + (" (run ended sooner)" if v[2] else "") for s, v in zip(seeds, views)) + ")")
            if mode != "sync":
                diffs = [100 * (v[0] - by[s, "sync"]["final_acc"]) for s, v in zip(seeds, views)]
                line += f"; vs sync {statistics.mean(diffs):+.1f} points"
            print(line)
    if args.also_thresholds and "sync" in modes:
        print()
        print("other thresholds, from the same evaluations (seconds from the step-0 evaluation; '-' not reached, "
              "'start' already at step 0)")
        for th in (float(x) for x in args.also_thresholds.split(",")):
            for mode in modes:
                cells = [first_reach(by[s, mode]["evals"], th) for s in seeds]
                line = f"{th:>5.0%} {mode:>14}: " + ", ".join(
                    f"seed {s}: " + ("-" if c is None else "start" if c[1] == 0 else f"{c[0]:.1f} s (step {c[1]})")
                    for s, c in zip(seeds, cells))
                if mode != "sync":
                    ratios = [sy[0] / c[0] for s, c in zip(seeds, cells)
                              if c and c[1] and (sy := first_reach(by[s, "sync"]["evals"], th)) and sy[1]]
                    line += (f"; {statistics.median(ratios):.2f}x sooner (median of "
                             f"{', '.join(f'{x:.2f}' for x in ratios)})") if ratios else "; no ratio"
                print(line)
    print(f"results: {run / 'tta.json'}")
    return 0


def first_reach(evals: list[dict], threshold: float) -> tuple[float, int] | None:
    """The first evaluation (``{"step", "s", "accuracy"}``, in order) at or above ``threshold``: its seconds from
    the step-0 evaluation and its step; None if none is."""
    hit = next((e for e in evals if e["accuracy"] >= threshold), None)
    return None if hit is None else (hit["s"], hit["step"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-to-accuracy", action="store_true", help="the time-to-accuracy comparison (above)")
    ap.add_argument("--threshold", type=float, default=0.6)
    ap.add_argument("--also-thresholds", default="",
                    help="time to accuracy: more comma-separated thresholds, read from the same evaluations")
    ap.add_argument("--rl-steps", type=int, default=300)
    ap.add_argument("--sft-steps", type=int, default=40)
    ap.add_argument("--eval-every", type=int, default=20)
    ap.add_argument("--heldout", type=int, default=100)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--groups-per-step", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--modes", default="sync,async")
    ap.add_argument("--seeds", default="0", help="time to accuracy: comma-separated seeds (task split, warm-up, RL)")
    ap.add_argument("--final-evals", type=int, default=3, help="time to accuracy: final accuracy = mean of the last N")
    ap.add_argument("--async-steps-factor", type=float, default=1.5,
                    help="time to accuracy: async modes run this x --rl-steps (for the equal-wall-time view)")
    ap.add_argument("--lr", type=float, default=None,
                    help="time to accuracy: every mode's learning rate (default: the recipe's)")
    ap.add_argument("--async-lr", type=float, default=None,
                    help="time to accuracy: the async modes' learning rate (default: the recipe's)")
    ap.add_argument("--schedule", choices=["constant", "cosine", "linear"], default=None,
                    help="time to accuracy: every mode's LR schedule, spanning that mode's own steps (default: the "
                         "recipe's, constant)")
    ap.add_argument("--min-lr-ratio", type=float, default=0.1,
                    help="time to accuracy: where --schedule cosine / linear ends, as a fraction of the peak LR")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="time to accuracy: a run-spec override for every mode's RL run (repeatable)")
    ap.add_argument("--run-dir", type=Path, default=None)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--redis-url", default=os.environ.get("REDIS_URL") or None,
                    help="an external Redis (default: $REDIS_URL; unset: an embedded server per mode)")
    args = ap.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.time_to_accuracy:
        if args.modes == "sync,async":
            args.modes = ",".join(TTA_MODES)
        args.groups_per_step = 16 if args.groups_per_step == 8 else args.groups_per_step
        return time_to_accuracy(args)
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
