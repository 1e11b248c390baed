"""FleetRL against TRL's ``GRPOTrainer`` on the same task, model, start checkpoint and hyper-parameters, from launch.

Per task (``sort``: "sort 3721=" -> "1237", :mod:`deploy.local.sort_task`; ``add``: "add 37+45=" -> "82",
:mod:`deploy.local.add_task`) and model shape (``--shapes``: Llama-shaped, 2 layers, 4 heads, hidden 128 (~0.5 M
parameters) and 64; byte-level tokenizer with a chat template; the smaller model makes the fleet's fixed per-step
cost a larger share): a fresh tiny chat model and a short supervised warm-up through ``fleetrl run`` (the recipe's
``sft.yaml``), not timed. From that one checkpoint, per seed, each mode is launched as its own process, the order
alternating from seed to seed. Each system runs as its users run it; a handicap or a tuning is a labelled variant,
printed beside the defaults, never the headline:

- ``trl``: TRL's ``GRPOTrainer`` in one process (``benchmarks/trl_grpo_run.py``, ``use_cpu``), generation with
  ``model.generate`` between optimizer steps, torch's default thread count (no ``OMP_NUM_THREADS``: here, one
  thread per core);
- ``fleet-s1`` / ``fleet-s0``: ``fleetrl run`` of the sort-digits recipe with its defaults (embedded Redis, reward,
  rollout + worker + weight sidecar, learner as separate processes, forked from one zygote that imported torch and
  the services once) with staleness 1 (window 2 steps) / staleness 0;
- variants: ``trl-1t`` (TRL held to one torch thread, this benchmark's default before issue 43), ``fleet-s1-spawn``
  (``FLEETRL_ZYGOTE=0``: every service spawned, importing everything itself; an A/B of the start-up),
  ``fleet-s1-1t`` (the learner held to one torch thread), ``fleet-s1-lc`` (the learner on every core),
  ``fleet-s1-ac`` (the learner and the rollout engine on every core).

Each side's thread configuration (processes, torch threads of each, the cores they share) is printed per shape.

Same for all: 8 prompts x 8 samples x 4 new tokens per step, temperature 1, exact-answer reward, lr 1e-4 decaying
linearly to 0, no warm-up, AdamW (0.9, 0.999), weight decay 0, grad clip 1.0, clip eps 0.2 both sides, KL 0,
group-normalised advantages, token-mean loss, one optimizer step per batch, new weights to the generator after
every step. FleetRL keeps its truncated-IS correction (cap 2), which staleness 1 needs.

Both save the policy every ``--save-every`` steps; held-out greedy accuracy is computed **afterwards**, offline, from
those checkpoints (and the start checkpoint at step 0), never on the training clock. Printed per run: s/step (from
step 1 to the last), launch -> first step, launch -> last step, wall time to exit, accuracy at the end, and the time
from launch to each ``--thresholds`` accuracy (the first checkpoint at or above it); then per task the medians over
seeds, the fleet's time to TRL's final accuracy against TRL's own, and the trace of a fleet step and its start-up
(from the services' own metrics and logs: :mod:`benchmarks.vs_trl_trace`).

    .venv/bin/python benchmarks/vs_trl.py [--tasks sort,add] [--shapes 128,64] [--seeds 0,1,2] [--steps 300]
        [--save-every 25] [--modes trl,fleet-s1,fleet-s0]
    .venv/bin/python benchmarks/vs_trl.py --quick     # a smoke run: sort, hidden 64, 1 seed, 6 steps, trl and fleet-s1
    .venv/bin/python benchmarks/vs_trl.py --startup   # start-up only: 3 seeds x 4 steps, trl, fleet-s1, fleet-s1-spawn

The machine's load average is printed next to every run (the figures are only comparable within one run). The
benchmark passes no thread count on: ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` of its own environment are dropped
from every launch (and said so), so each system picks its own.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PROMPTS, SAMPLES, NEW_TOKENS, LR = 8, 8, 4, 1e-4
RECIPE = REPO / "examples" / "sort-digits"
TASKS = {"sort": "deploy.local.sort_task", "add": "deploy.local.add_task"}
SFT_STEPS = {"sort": 40, "add": 200}  # warm-ups that leave each task room (sort ~30 %, add ~20 % held-out)
SHAPES = {128: {"hidden_size": 128, "layers": 2, "heads": 4}, 64: {"hidden_size": 64, "layers": 2, "heads": 4}}
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")  # unset for every launch: each system picks its own
CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@dataclass(frozen=True)
class Mode:
    """One way of running one side: TRL (``staleness`` None) or ``fleetrl run``; ``variant`` names a handicap or a
    tuning (never a headline)."""

    staleness: int | None = None
    env: dict[str, str] = field(default_factory=dict)
    sets: tuple[str, ...] = ()
    variant: str = ""

    @property
    def trl(self) -> bool:
        return self.staleness is None


MODES = {
    "trl": Mode(),
    "trl-1t": Mode(env={"OMP_NUM_THREADS": "1"}, variant="TRL held to one torch thread"),
    "fleet-s1": Mode(1),
    "fleet-s0": Mode(0),
    "fleet-s1-spawn": Mode(1, env={"FLEETRL_ZYGOTE": "0"}, variant="every service spawned (no zygote)"),
    "fleet-s1-1t": Mode(1, sets=("train.torch_threads=1",), variant="the learner held to one torch thread"),
    "fleet-s1-lc": Mode(1, sets=(f"train.torch_threads={CORES}",), variant="the learner on every core"),
    "fleet-s1-ac": Mode(1, sets=(f"train.torch_threads={CORES}", f"services.rollout.engine.torch_threads={CORES}"),
                        variant="the learner and the rollout engine on every core"),
}


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def prepare(task: str, shape: int, root: Path, sft_steps: int, heldout: int) -> tuple[Path, Path, list[dict]]:
    """The task's data, a fresh tiny model and its SFT warm-up: (train.jsonl, the start checkpoint, held-out rows)."""
    import importlib

    from deploy.local.sort_task import write_jsonl
    from deploy.local.tiny_model import build_tiny_causal_lm
    from deploy.run.display import make_display
    from deploy.run.launch import run_spec
    from deploy.run.load import load_spec

    train, held = importlib.import_module(TASKS[task]).make_splits(0, heldout)
    made = {"task": task, "shape": SHAPES[shape], "sft_steps": sft_steps}
    marker = root / "prepared.json"
    if marker.exists() and json.loads(marker.read_text()) == made:  # a kept --run-dir: the same start, made before
        print(f"[vs-trl] {task}/h{shape}: reusing the start checkpoint in {root}", flush=True)
        return root / "data" / "train.jsonl", root / ("sft-model" if sft_steps else "base-model"), held
    data = write_jsonl(train, root / "data" / "train.jsonl")
    base = build_tiny_causal_lm(root / "base-model", **SHAPES[shape], max_positions=64, seed=0)
    if sft_steps == 0:  # --quick: RL from the random model (the timings, not the learning, are what it checks)
        marker.write_text(json.dumps(made))
        return data, base, held
    shutil.copy(RECIPE / "sft.yaml", root / "sft.yaml")
    sets = [f"run_name=vs-trl-{task}-sft", f"run_dir={root / 'sft'}", f"model={base}", f"data.path={data}",
            f"algorithm.max_steps={sft_steps}", f"export={root / 'sft-model'}"]
    if run_spec(load_spec(root / "sft.yaml", sets), root / "sft.yaml", make_display(False)) != 0:
        raise SystemExit(f"{task}: the SFT warm-up failed; logs under {root / 'sft' / 'logs'}")
    marker.write_text(json.dumps(made))
    return data, root / "sft-model", held


def env(extra: dict[str, str]) -> dict[str, str]:
    """A launch's environment: ours without any thread count (each system picks its own), plus the mode's."""
    base = {k: v for k, v in os.environ.items() if k not in THREAD_VARS}
    return {**base, "PYTHONPATH": str(REPO), "TOKENIZERS_PARALLELISM": "false", **extra}


def run_trl(mode: str, out: Path, data: Path, model: Path, seed: int, args) -> dict:
    cmd = [sys.executable, str(REPO / "benchmarks" / "trl_grpo_run.py"), "--model", str(model), "--data", str(data),
           "--out", str(out), "--steps", str(args.steps), "--save-every", str(args.save_every), "--seed", str(seed),
           "--prompts", str(PROMPTS), "--samples", str(SAMPLES), "--new-tokens", str(NEW_TOKENS), "--lr", str(LR)]
    out.mkdir(parents=True, exist_ok=True)
    launch = time.time()
    with (out.parent / f"{out.name}.log").open("w") as log:
        code = subprocess.run(cmd, check=False, env=env(MODES[mode].env), stdout=log,
                              stderr=subprocess.STDOUT).returncode
    end = time.time()
    if code != 0:
        raise SystemExit(f"trl run failed (exit {code}); log: {out.parent / f'{out.name}.log'}")
    steps = {r["step"]: r["time"] for r in map(json.loads, (out / "steps.jsonl").read_text().splitlines())}
    ckpts = {int(p.name.split("-")[1]): p for p in out.glob("checkpoint-*")}
    t = json.loads((out / "threads.json").read_text())
    threads = f"1 process, {t['torch_threads']} torch threads ({t['interop_threads']} inter-op) on {t['cores']} cores"
    return {"launch": launch, "end": end, "steps": steps, "checkpoints": ckpts, "threads": threads}


def fleet_sets(mode: str, run_dir: Path, data: Path, model: Path, seed: int, args) -> list[str]:
    staleness = MODES[mode].staleness
    window = 2 * PROMPTS if staleness else PROMPTS
    return [f"run_name={run_dir.parent.name}-{run_dir.name}", f"run_dir={run_dir}", f"model={model}",
            f"data.path={data}", f"train.seed={seed}", f"train.max_steps={args.steps}",
            f"train.groups_per_step={PROMPTS}", f"sampling.group_size={SAMPLES}",
            f"sampling.max_new_tokens={NEW_TOKENS}", f"optim.actor_lr={LR}", "optim.schedule=linear",
            "optim.min_lr_ratio=0.0", "optim.warmup_ratio=0.0", "optim.betas=[0.9,0.999]", "optim.weight_decay=0.0",
            "optim.max_grad_norm=1.0", "algorithm.policy_loss.eps_low=0.2", "algorithm.policy_loss.eps_high=0.2",
            "algorithm.kl.coef=0.0", "algorithm.loss_agg=token-mean", f"staleness={staleness}", f"window={window}",
            f"checkpoint_every={args.save_every}", f"services.learner.checkpoint.keep={args.steps}", "export=null",
            "eval.data=null", "services.learner.observability.plot=false",
            "services.learner.observability.log_samples=true", *MODES[mode].sets]


THREADS_LINE = "torch threads: "


def fleet_threads(run_dir: Path) -> str:
    """The fleet's processes and the torch threads of those that compute (from their logs' ``torch threads`` line)."""
    logs = sorted(p for p in (run_dir / "logs").glob("*.log") if p.stem != "zygote")
    parts = []
    for p in logs:
        line = next((x for x in p.read_text(errors="replace").splitlines() if THREADS_LINE in x), None)
        if line is not None:
            parts.append(f"{p.stem} {line.split(THREADS_LINE, 1)[1]}")
    redis = ["redis"] if (run_dir / "redis").exists() else []
    idle = ["fleetrl run"] + (["zygote"] if (run_dir / "logs" / "zygote.log").exists() else [])
    return (f"{len(idle) + len(redis) + len(logs)} processes: {', '.join(idle)} (idle while it trains), "
            f"{', '.join(redis + [p.stem for p in logs])}; torch: {'; '.join(parts) or 'no threads line'}")


def run_fleet(mode: str, run_dir: Path, data: Path, model: Path, seed: int, args, **extra_env: str) -> dict:
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(RECIPE / "fleetrl.yaml", run_dir.parent / "fleetrl.yaml")
    cmd = [sys.executable, "-m", "deploy.cli", "run", str(run_dir.parent / "fleetrl.yaml"), "--lines"]
    for s in fleet_sets(mode, run_dir, data, model, seed, args):
        cmd += ["--set", s]
    launch = time.time()
    with (run_dir.parent / f"{run_dir.name}.log").open("w") as log:
        code = subprocess.run(cmd, check=False, env=env({**MODES[mode].env, **extra_env}), cwd=REPO, stdout=log,
                              stderr=subprocess.STDOUT).returncode
    end = time.time()
    if code != 0:
        raise SystemExit(f"{mode} run failed (exit {code}); log: {run_dir.parent / f'{run_dir.name}.log'}")
    rows = [json.loads(x) for x in (run_dir / "learner" / "metrics.jsonl").read_text().splitlines()]
    steps = {r["step"]: r["time"] for r in rows if "step" in r and "time" in r}
    ckpts = {int(p.name.split("-")[1]): p / "trainer"
             for p in (run_dir / "learner" / "checkpoints").glob("step-*") if (p / "COMPLETE").exists()}
    return {"launch": launch, "end": end, "steps": steps, "checkpoints": ckpts, "threads": fleet_threads(run_dir)}


def hf_dir(checkpoint: Path) -> Path:
    """A checkpoint as a Hugging Face directory: TRL's are one; a FleetRL learner's (``step-N/trainer``, sharded
    with torch.distributed.checkpoint) is exported beside it once, as ``fleetrl export`` does."""
    if (checkpoint / "config.json").is_file():
        return checkpoint
    from services.learner.training.export_checkpoint import export_checkpoint

    out = checkpoint.parent / "hf-export"
    if not (out / "config.json").is_file():
        export_checkpoint(checkpoint, out)
    return out


def accuracy(model_dir: Path, rows: list[dict]) -> float:
    """Greedy held-out accuracy of one checkpoint, in this process (after the runs, off their clocks)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = hf_dir(model_dir)
    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    enc = tok([r["input"] for r in rows], return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=tok.pad_token_id,
                             eos_token_id=tok.eos_token_id)
    texts = tok.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    return sum(t.strip() == r["label"] for t, r in zip(texts, rows)) / len(rows)


def summarise(run: dict, start_acc: float, held: list[dict], thresholds: list[float]) -> dict:
    steps = run["steps"]
    first, last = min(steps), max(steps)
    evals = {0: start_acc, **{s: accuracy(p, held) for s, p in sorted(run["checkpoints"].items())}}
    reach = {}
    for thr in thresholds:
        hit = next((s for s in sorted(evals) if s > 0 and evals[s] >= thr), None)
        reach[thr] = None if hit is None else steps[hit] - run["launch"]
    return {"s_per_step": (steps[last] - steps[first]) / max(last - first, 1),
            "first_step_s": steps[first] - run["launch"], "last_step_s": steps[last] - run["launch"],
            "wall_s": run["end"] - run["launch"], "final_acc": evals[max(evals)], "evals": evals, "reach": reach,
            "step_times": {s: t - run["launch"] for s, t in steps.items()}, "steps": last}


def time_to(result: dict, acc: float) -> float | None:
    """Seconds from launch to the first checkpoint at or above ``acc``."""
    hit = next((s for s in sorted(result["evals"]) if s > 0 and result["evals"][s] >= acc), None)
    return None if hit is None else result["step_times"][hit]


def bench_task(task: str, shape: int, root: Path, args) -> list[dict]:
    sft_steps = SFT_STEPS[task] if args.sft_steps is None else args.sft_steps
    name = f"{task}/h{shape}"
    print(f"[vs-trl] {name}: data, tiny model (hidden {shape}) and a {sft_steps}-step SFT warm-up (not timed)",
          flush=True)
    data, model, held = prepare(task, shape, root, sft_steps, args.heldout)
    start_acc = accuracy(model, held)
    print(f"[vs-trl] {name}: start checkpoint held-out accuracy {start_acc:.1%} ({len(held)} prompts)", flush=True)
    modes = args.modes.split(",")
    runs = []
    for k, seed in enumerate(int(x) for x in args.seeds.split(",")):
        order = modes if k % 2 == 0 else modes[::-1]
        for mode in order:
            out = root / f"seed{seed}" / mode
            shutil.rmtree(out, ignore_errors=True)  # a kept --run-dir's earlier run: never resumed, never mixed in
            before = load()
            print(f"[vs-trl] {name} seed {seed}: {mode}, {args.steps} steps (load {before})", flush=True)
            raw = run_trl(mode, out, data, model, seed, args) if MODES[mode].trl else \
                run_fleet(mode, out, data, model, seed, args)
            runs.append({"task": task, "shape": shape, "seed": seed, "mode": mode, "load": f"{before} -> {load()}",
                         "dir": out, **raw})
    results = []
    for r in runs:
        s = summarise(r, start_acc, held, args.thresholds)
        results.append({**{k: r[k] for k in ("task", "shape", "seed", "mode", "load", "dir", "launch", "threads")},
                        **s})
    print_table(name, results, args.thresholds, start_acc)
    from benchmarks.vs_trl_trace import print_traces

    print_traces([(r["mode"], r["seed"], r["dir"], r["launch"]) for r in results if not MODES[r["mode"]].trl])
    if args.startup_profile:
        profile_startup(root / "startup-profile", data, model, args)
    (root / "runs.json").write_text(json.dumps([{k: v for k, v in r.items() if k != "dir"} | {"dir": str(r["dir"])}
                                                for r in results], indent=2, default=str))
    return results


def profile_startup(run_dir: Path, data: Path, model: Path, args) -> None:
    """One more short fleet-s1 run with every process's imports profiled: its start-up and imports."""
    from benchmarks.vs_trl_trace import print_imports, print_traces

    short = argparse.Namespace(**{**vars(args), "steps": 4, "save_every": 4})
    print(f"\n[vs-trl] start-up profile: a 4-step fleet-s1 run under PYTHONPROFILEIMPORTTIME (load {load()})",
          flush=True)
    raw = run_fleet("fleet-s1", run_dir / "run", data, model, 0, short, PYTHONPROFILEIMPORTTIME="1")
    print_traces([("profiled", 0, run_dir / "run", raw["launch"])])
    print_imports(run_dir / "run", run_dir / "run.log")


def fmt(x: float | None, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def print_table(task: str, results: list[dict], thresholds: list[float], start_acc: float) -> None:
    print()
    print(f"task {task}: {PROMPTS} prompts x {SAMPLES} samples x {NEW_TOKENS} new tokens per step; start checkpoint "
          f"{start_acc:.1%} held-out; times in s from launch")
    print(f"what each side ran on (machine: {os.cpu_count()} cores):")
    for mode in dict.fromkeys(r["mode"] for r in results):
        label = MODES[mode].variant
        print(f"  {mode:<14} {next(r['threads'] for r in results if r['mode'] == mode)}"
              + (f"  [variant: {label}]" if label else ""))
    head = f"{'mode':<14} {'seed':>4} {'s/step':>7} {'->step1':>8} {'->last':>7} {'wall':>6} {'final':>6} " + \
        " ".join(f"{'->' + format(t, '.0%'):>6}" for t in thresholds) + "  load (1/5/15 min, before -> after)"
    print(head)
    for r in results:
        print(f"{r['mode']:<14} {r['seed']:>4} {r['s_per_step']:>7.3f} {r['first_step_s']:>8.2f} {r['last_step_s']:>7.1f} "
              f"{r['wall_s']:>6.1f} {r['final_acc']:>6.1%} " + " ".join(f"{fmt(r['reach'][t]):>6}" for t in thresholds)
              + f"  {r['load']}")
    med = statistics.median
    trl = {r["seed"]: r for r in results if r["mode"] == "trl"}
    learned = {seed: r for seed, r in trl.items() if r["final_acc"] > start_acc}  # TRL's final accuracy is a target
    print("medians over seeds (variants marked; the ratios are to trl, TRL as its users run it):")
    for mode in dict.fromkeys(r["mode"] for r in results):
        xs = [r for r in results if r["mode"] == mode]
        line = (f"  {mode + ('*' if MODES[mode].variant else ''):<15} s/step {med(r['s_per_step'] for r in xs):.3f}, launch -> step 1 "
                f"{med(r['first_step_s'] for r in xs):.2f} s, launch -> last step {med(r['last_step_s'] for r in xs):.1f} s, "
                f"final {med(r['final_acc'] for r in xs):.1%}")
        if mode != "trl" and trl:
            ratios = [r["s_per_step"] / trl[r["seed"]]["s_per_step"] for r in xs if r["seed"] in trl]
            sooner = [time_to(learned[r["seed"]], learned[r["seed"]]["final_acc"]) / t for r in xs
                      if r["seed"] in learned and (t := time_to(r, learned[r["seed"]]["final_acc"]))]
            line += f"; s/step {med(ratios):.2f}x TRL's ({', '.join(f'{x:.2f}' for x in ratios)}); TRL's final " \
                "accuracy reached " + (f"{med(sooner):.2f}x sooner than TRL (median of {len(sooner)} of the "
                                       f"{len(learned)} seeds where TRL ended above the start)" if sooner else
                                       f"in none of the {len(learned)} seeds where TRL ended above the start")
        print(line)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", default="sort,add", help=f"comma-separated, of {', '.join(TASKS)}")
    ap.add_argument("--shapes", default="128,64", help=f"model widths (hidden size), comma-separated, of "
                    f"{', '.join(map(str, SHAPES))}")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--modes", default="trl,fleet-s1,fleet-s0",
                    help=f"comma-separated, of {', '.join(MODES)} (run order alternates)")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--save-every", type=int, default=25, help="checkpoint (and so held-out point) every N steps")
    ap.add_argument("--sft-steps", type=int, default=None, help=f"SFT warm-up steps (default per task: {SFT_STEPS})")
    ap.add_argument("--heldout", type=int, default=200)
    ap.add_argument("--thresholds", default="0.5,0.6", help="held-out accuracies to time, comma-separated")
    ap.add_argument("--startup-profile", action="store_true",
                    help="after each task, one short fleet run with its processes' imports profiled")
    ap.add_argument("--run-dir", type=Path, default=None, help="keep everything here (default: a temp dir, removed)")
    ap.add_argument("--quick", action="store_true", help="smoke run: sort, seed 0, 6 steps, trl and fleet-s1")
    ap.add_argument("--startup", action="store_true",
                    help="start-up A/B: sort, seeds 0,1,2, 4 steps, trl, fleet-s1 and fleet-s1-spawn (no SFT)")
    args = ap.parse_args(argv)
    if args.quick:
        args.tasks, args.seeds, args.modes, args.steps, args.save_every = "sort", "0", "trl,fleet-s1", 6, 3
        args.shapes = "64"
        args.sft_steps, args.heldout = 0, 50
    if args.startup:
        args.tasks, args.seeds, args.modes, args.steps, args.save_every = "sort", "0,1,2", \
            "trl,fleet-s1,fleet-s1-spawn", 4, 4
        args.shapes = "128"
        args.sft_steps, args.heldout = 0, 20
    args.thresholds = [float(x) for x in args.thresholds.split(",")]
    for t in args.tasks.split(","):
        if t not in TASKS:
            ap.error(f"--tasks: unknown task {t!r}; choose from {', '.join(TASKS)}")
    for m in args.modes.split(","):
        if m not in MODES:
            ap.error(f"--modes: unknown mode {m!r}; choose from {', '.join(MODES)}")
    modes = args.modes.split(",")
    if "trl" not in modes and any(MODES[m].trl for m in modes):
        ap.error("--modes: a TRL variant needs trl (TRL as its users run it) beside it: every ratio is to trl")
    try:
        args.shapes = [int(x) for x in args.shapes.split(",")]
    except ValueError:
        ap.error(f"--shapes: comma-separated hidden sizes, of {', '.join(map(str, SHAPES))}")
    for w in args.shapes:
        if w not in SHAPES:
            ap.error(f"--shapes: unknown width {w}; choose from {', '.join(map(str, SHAPES))}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    print(f"[vs-trl] load average {load()} on {os.cpu_count()} cores; trl {_version('trl')}, torch {torch.__version__} "
          f"(its default here: {torch.get_num_threads()} threads, {torch.get_num_interop_threads()} inter-op"
          + "".join(f"; our {k}={os.environ[k]}, not passed on" for k in THREAD_VARS if k in os.environ) + ")",
          flush=True)
    torch.set_num_threads(1)  # this process only scores checkpoints, after the runs
    tmp = None
    root = args.run_dir
    if root is None:
        tmp = tempfile.TemporaryDirectory(prefix="fleetrl-vs-trl-")
        root = Path(tmp.name)
    try:
        results = []
        for task in args.tasks.split(","):
            for shape in args.shapes:
                results += bench_task(task, shape, root.resolve() / task / f"h{shape}", args)
        (root / "vs_trl.json").write_text(json.dumps(
            [{k: v for k, v in r.items() if k not in ("dir",)} for r in results], indent=2, default=str))
    finally:
        if tmp is not None:
            tmp.cleanup()
    return 0


def _version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


if __name__ == "__main__":
    raise SystemExit(main())
