"""The tail of a ``fleetrl run`` after its last step: from the learner's ``run finished`` log line to the launcher's
exit (the launcher waits for every process of the run, the zygote and the embedded Redis included), on a tiny spec
(a fresh tiny Llama-shaped model, 40 sort-digits prompts, 2 steps of 2 groups x 2 samples x 4 new tokens, held-out
accuracy before and after). Each run is a fresh ``python -m deploy.cli run SPEC --lines --reset`` from ``--tree``
(a checkout: give two and the runs alternate between them, an A/B on one machine).

    .venv/bin/python benchmarks/exit_tail.py [--runs 3] [--tree DIR ...]

Prints per run: the tree, launch -> exit, ``run finished`` -> exit, and the load average then.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
FINISHED = re.compile(r"(\d+-\d+-\d+ \d+:\d+:\d+),(\d+) INFO learner \S+: run finished")


def tiny_spec(root: Path) -> Path:
    from deploy.local.tiny_model import build_tiny_causal_lm

    model = build_tiny_causal_lm(root / "model")
    rows = [{"input": f"sort {i:04d}=", "label": "".join(sorted(f"{i:04d}"))} for i in range(0, 10_000, 97)]
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:40]))
    (root / "heldout.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[40:48]))
    spec = {
        "run_name": "tail", "run_dir": "run", "model": str(model),
        "data": {"path": "train.jsonl", "input_key": "input", "label_key": "label"},
        "reward": {"scorers": [{"name": "exact", "kind": "rule", "check": {"type": "exact"}}]},
        "algorithm": {"name": "grpo"}, "optim": {"actor_lr": 1e-3, "schedule": "constant", "warmup_ratio": 0.0},
        "train": {"groups_per_step": 2, "micro_batch_size": 8, "max_steps": 2, "torch_threads": 1},
        "sampling": {"group_size": 2, "max_new_tokens": 4}, "checkpoint_every": 2, "eval": {"data": "heldout.jsonl"},
        "services": {"rollout": {"engine": {"kind": "hf", "device": "cpu", "torch_threads": 1}},
                     "learner": {"model": {"device": "cpu"}, "observability": {"plot": False}}},
    }
    path = root / "run.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def one_run(tree: Path, spec: Path) -> tuple[float, float]:
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    t0 = time.time()
    done = subprocess.run([sys.executable, "-m", "deploy.cli", "run", str(spec), "--lines", "--reset"], cwd=tree,
                          env=env, capture_output=True, text=True, timeout=600, check=False)
    t1 = time.time()
    if done.returncode != 0:
        raise SystemExit(f"fleetrl run failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    found = FINISHED.findall((spec.parent / "run" / "logs" / "learner.log").read_text())  # appended to: the last
    if not found:
        raise SystemExit("no 'run finished' line in the learner's log")
    stamp, ms = found[-1]
    finished = datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S").timestamp() + int(ms) / 1000
    return t1 - t0, t1 - finished


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3, help="runs per tree")
    ap.add_argument("--tree", type=Path, action="append", help="a checkout to run (default: this one); repeat to A/B")
    args = ap.parse_args()
    trees = args.tree or [REPO]
    with tempfile.TemporaryDirectory() as tmp:
        spec = tiny_spec(Path(tmp))
        for i in range(args.runs):
            for tree in trees:
                wall, tail = one_run(tree, spec)
                load = Path("/proc/loadavg").read_text().split()[0]
                print(f"{tree}  run {i}: launch -> exit {wall:6.2f}s   run finished -> exit {tail:5.2f}s   load {load}",
                      flush=True)


if __name__ == "__main__":
    main()
