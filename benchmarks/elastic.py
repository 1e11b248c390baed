"""An elastic rollout pool against fixed pools, on a load that changes mid-run (issue 30).

The same GRPO run three ways through ``fleetrl run``: a fixed pool of 1 rollout replica, a fixed pool of 4, and
an elastic pool of 1 to 4 (``replicas.rollout: {min: 1, max: 4}``) driven by the learner's demand signal. The
load changes half-way: the first half of the prompts ask for short answers (``count 2``: 2 digits), the second
half for answers ``--factor`` (12) times longer. Replicas run ``deploy/local/sleep_engine.py``: the hf engine (tiny
model, real weight sync and joins from a peer) whose generation is a sleep per token (``--token-s``), so a
replica's throughput does not come from this machine's CPU cores. The learner is the real one (GRPO on the tiny
model, weights published every step, ``weights.pause_mode: partial`` so a publish does not wait out the answers
in flight); every prompt carries ``--prompt-pad`` characters of padding, work for the learner the sleep engine
does not pay for, so that one replica keeps up with the learner on the short answers and not on the long ones.
A replica takes a whole step's groups at a time (``--concurrency 8`` = ``--groups``): the per-group cost of a
replica on this busy machine (reward call, push, weight load; ~0.2 s at load 11) is then paid once per step.

Printed per way: wall time (the ``fleetrl run`` command, launch until the learner finished), s/step in each half
(from the learner's metrics.jsonl), the replica-seconds (every rollout replica process's lifetime until the
learner finished: a replica started by the controller counts from its start, a drained one until it left) and
the pool changes; then the two ratios of the elastic pool against the fixed 4, with the issue's targets (wall
time within 1.15x, replica-seconds at most 60 %).

    .venv/bin/python benchmarks/elastic.py [--steps 100] [--token-s 0.08] [--short 2] [--factor 12] [--pool K=V] [--signal K=V]
    .venv/bin/python benchmarks/elastic.py --quick      # a short smoke run (tests/benchmarks/test_elastic.py)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from deploy.local.sleep_engine import TOKEN_S_ENV

WAYS = ("fixed-1", "fixed-4", "elastic-1-4")
WALL_TARGET = 1.15
REPLICA_S_TARGET = 0.60


@dataclass
class Result:
    way: str
    wall_s: float
    steps: int
    s_per_step: tuple[float, float]  # first half, second half
    replica_s: float
    changes: list[str] = field(default_factory=list)
    max_replicas: int = 0


def write_inputs(root: Path, steps: int, groups: int, short: int, factor: float, pad: int) -> tuple[Path, Path]:
    """The prompts (first half short answers, second half ``factor`` x longer) and the tiny model."""
    from deploy.local.tiny_model import build_tiny_causal_lm

    long = round(short * factor)
    prompts = steps * groups
    rows = []
    for i in range(prompts):
        n = short if i < prompts // 2 else long
        rows.append({"input": f"count {n} " + "." * pad, "label": "".join(str(d % 10) for d in range(n))})
    data = root / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    model = root / "model"
    if not (model / "config.json").is_file():
        build_tiny_causal_lm(model, hidden_size=128, layers=2, heads=4, max_positions=max(64, long + pad + 48), seed=0)
    return data, model


def spec(way: str, root: Path, data: Path, model: Path, args, pool: dict) -> dict:
    long = round(args.short * args.factor)
    rollout: int | dict = {"fixed-1": 1, "fixed-4": 4}.get(way) or {"min": 1, "max": 4, **pool}
    return {
        "run_name": f"elastic-bench-{way}", "run_dir": str(root / way), "model": str(model),
        "data": {"path": str(data), "input_key": "input", "label_key": "label", "shuffle": False, "epochs": 1},
        "reward": {"scorers": [{"name": "exact", "kind": "rule", "check": {"type": "exact"}}]},
        "algorithm": {"name": "grpo"},
        "optim": {"actor_lr": 1e-4, "schedule": "constant", "warmup_ratio": 0.0},
        "train": {"groups_per_step": args.groups, "micro_batch_size": 64, "max_steps": args.steps, "seed": 0,
                  "torch_threads": 1},
        "sampling": {"group_size": args.group_size, "max_new_tokens": long + 2, "temperature": 1.0},
        "staleness": 1,
        "checkpoint_every": 10_000,
        "replicas": {"rollout": rollout, "reward": 1},
        "services": {
            "rollout": {"engine": {"kind": "hf", "device": "cpu", "torch_threads": 1},
                        "extensions": ["deploy.local.sleep_engine:install"],
                        "worker": {"concurrency": args.concurrency},
                        # a publish interrupts sequences at a token boundary (they continue on the new weights):
                        # with "wait" every publish would wait out the longest answer in flight on every replica,
                        # a stall more replicas do not shorten
                        "weights": {"pause_mode": "partial"}},
            "learner": {"observability": {"progress_bar": False, "plot": False},
                        **({"pool": args.learner_pool} if args.learner_pool else {})},
        },
    }


START = re.compile(r"(?:starting|pool: start|pool: replace) (rollout-\d+)")
LEFT = re.compile(r"pool: (?:left|give up) (rollout-\d+)")


def run_way(way: str, root: Path, args, data: Path, model: Path, pool: dict) -> Result:
    path = root / f"{way}.yaml"
    path.write_text(yaml.safe_dump(spec(way, root, data, model, args, pool)))
    env = {**os.environ, TOKEN_S_ENV: str(args.token_s), "PYTHONPATH": str(REPO)}
    t0 = time.monotonic()
    alive: dict[str, float] = {}
    replica_s = 0.0
    changes: list[str] = []
    end = None
    peak = 0
    log = (root / f"{way}.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "deploy.cli", "run", str(path), "--lines", "--reset"],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        now = time.monotonic() - t0
        log.write(f"{now:8.2f} {line}")
        if m := START.search(line):
            alive.setdefault(m.group(1), now)
            peak = max(peak, len(alive))
        elif (m := LEFT.search(line)) and m.group(1) in alive:
            replica_s += now - alive.pop(m.group(1))
        if "pool: " in line:
            changes.append(f"{now:.0f}s {line.split('pool: ', 1)[1].strip()[:110]}")
        if end is None and "learner finished" in line:
            end = now
    rc = proc.wait()
    log.close()
    if rc != 0 or end is None:
        raise SystemExit(f"{way}: fleetrl run exited {rc}; its output: {root / f'{way}.log'}")
    replica_s += sum(end - since for since in alive.values())
    metrics = [json.loads(x) for x in (root / way / "learner" / "metrics.jsonl").read_text().splitlines()]
    times = {int(m["step"]): float(m["time"]) for m in metrics if "step" in m and "time" in m}
    steps = max(times)
    half = steps // 2

    def per_step(a: int, b: int) -> float:
        return (times[b] - times[a]) / (b - a) if b > a and a in times and b in times else float("nan")

    return Result(way, end, steps, (per_step(1, half), per_step(half, steps)), replica_s, changes, peak)


def report(results: dict[str, Result], args, load: str) -> str:
    lines = [(f"elastic pool benchmark: {args.steps} steps x {args.groups} groups x {args.group_size}; answers "
             f"{args.short} tokens then {round(args.short * args.factor)}; {args.token_s * 1000:g} ms per token; "
             f"load before: {load}"), "",
             "| way | wall s | steps | s/step 1st half | s/step 2nd half | replica-s | most replicas |",
             "|---|---|---|---|---|---|---|"]
    for r in results.values():
        lines.append(f"| {r.way} | {r.wall_s:.1f} | {r.steps} | {r.s_per_step[0]:.2f} | {r.s_per_step[1]:.2f} | "
                     f"{r.replica_s:.0f} | {r.max_replicas} |")
    e, f4 = results.get("elastic-1-4"), results.get("fixed-4")
    if e and f4:
        wall, rs = e.wall_s / f4.wall_s, e.replica_s / f4.replica_s
        lines += ["", (f"elastic / fixed-4 wall time: {wall:.2f}x (target <= {WALL_TARGET}x: "
                      f"{'met' if wall <= WALL_TARGET else 'NOT met'})"),
                  (f"elastic / fixed-4 replica-seconds: {rs:.0%} (target <= {REPLICA_S_TARGET:.0%}: "
                  f"{'met' if rs <= REPLICA_S_TARGET else 'NOT met'})")]
    if e:
        lines += ["", "elastic pool changes:"] + [f"  {c}" for c in e.changes]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100, help="learner steps (prompts = steps x groups)")
    ap.add_argument("--groups", type=int, default=8, help="groups per learner step")
    ap.add_argument("--group-size", type=int, default=8, help="answers per prompt")
    ap.add_argument("--concurrency", type=int, default=8, help="groups a replica generates at a time")
    ap.add_argument("--token-s", type=float, default=0.08, help="the sleep engine's seconds per token")
    ap.add_argument("--short", type=int, default=2, help="answer tokens in the first half")
    ap.add_argument("--factor", type=float, default=12.0, help="second-half answers are this many times longer")
    ap.add_argument("--prompt-pad", type=int, default=30,
                    help="characters added to every prompt: learner work the sleep engine does not pay for")
    ap.add_argument("--ways", default=",".join(WAYS), help=f"comma-separated subset of {','.join(WAYS)}")
    ap.add_argument("--pool", action="append", default=[], metavar="KEY=VALUE",
                    help="elastic pool setting (replicas.rollout), e.g. cooldown_up_s=10")
    ap.add_argument("--signal", action="append", default=[], metavar="KEY=VALUE",
                    help="the learner's demand-signal setting (its pool section), e.g. wait_high=0.4")
    ap.add_argument("--dir", type=Path, default=None, help="where runs go (default: a temporary directory)")
    ap.add_argument("--quick", action="store_true", help="a short smoke run: 12 steps, 5 ms per token")
    args = ap.parse_args(argv)
    if args.quick:
        args.steps, args.token_s = 12, 0.005
    pool = {k: yaml.safe_load(v) for k, v in (p.split("=", 1) for p in args.pool)}
    args.learner_pool = {k: yaml.safe_load(v) for k, v in (p.split("=", 1) for p in args.signal)}
    ways = [w for w in args.ways.split(",") if w]
    unknown = set(ways) - set(WAYS)
    if unknown:
        ap.error(f"--ways: unknown {sorted(unknown)}; choose from {', '.join(WAYS)}")
    load = os.getloadavg()
    load_s = f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} (1/5/15 min, {os.cpu_count()} cores)"
    root = args.dir or Path(tempfile.mkdtemp(prefix="fleetrl-elastic-"))
    root.mkdir(parents=True, exist_ok=True)
    data, model = write_inputs(root, args.steps, args.groups, args.short, args.factor,
                               args.prompt_pad)
    results = {}
    for way in ways:
        print(f"[elastic] {way} ...", flush=True)
        results[way] = run_way(way, root, args, data, model, pool)
        r = results[way]
        print(f"[elastic] {way}: {r.wall_s:.1f} s, {r.s_per_step[0]:.2f} / {r.s_per_step[1]:.2f} s/step, "
              f"{r.replica_s:.0f} replica-s", flush=True)
    text = report(results, args, load_s)
    print(text)
    (root / "elastic.md").write_text(text + "\n")
    print(f"\nruns and logs under {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
