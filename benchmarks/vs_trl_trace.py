"""Where a ``fleetrl run`` spends its start-up and its steps, from what the services already record (for
``benchmarks/vs_trl.py``; runs on its own over a kept run dir: ``python benchmarks/vs_trl_trace.py RUN_DIR``).

Start-up, seconds from launch (the benchmark's clock before it spawned ``fleetrl run``): the millisecond-stamped
lines of each service's log (the zygote started, its imports done, each service forked from it, Redis started and
ready, reward's scorer up, the learner's prompts loaded and its
trainer built, the rollout engine's model loaded, the rollout worker started, the first weight publish), the first
prompts issued and the first samples generated
(``samples.jsonl``: ``created_at`` / ``generated_at``), and step 1 trained (``metrics.jsonl``).

A step, medians over steps 3..N (``metrics.jsonl`` and ``samples.jsonl`` of the learner): the learner's training
(``step_time_s``), its wait for experiences (``wait_time_s``), the weight publish (``publish_s``) with its phases
from the publisher's log line (plan, announce, send, settle, ...), and the rest (bookkeeping, Redis commits), broken
down by the learner's own account of its loop (``loop_s`` of each metrics line: the samples and metrics lines
written, the pool signal, the prompts fed, the commits settled, ...); and the
rollout side of the samples the step trained: prompts issued -> last sample generated and scored (the worker's
Redis read, scheduling, generation, the reward call) -> training starts (the push to Redis, the learner's read and
admission).
"""

from __future__ import annotations

import itertools
import json
import re
import statistics
import sys
from datetime import datetime
from pathlib import Path

STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
STARTUP_LINES = [  # (log, text in the line, what it marks): the first such line of each
    ("zygote", "zygote: started", "zygote: started (the services' imports begin, once: deploy/local/zygote.py)"),
    ("zygote", "zygote: imported", "zygote: imports done"),
    ("zygote", "forked services.reward", "reward: forked from the zygote"),
    ("zygote", "forked services.rollout", "rollout: forked from the zygote"),
    ("zygote", "forked services.learner", "learner: forked from the zygote"),
    ("reward-0", "starting scorer", "reward: scorer up"),
    ("learner", "train: a step of", "learner: tokenizer and prompts loaded (the trainer loads next)"),
    ("learner", "actor weights laid out", "learner: trainer built (model, optimizer, publish buckets)"),
    ("rollout-0", "hf engine:", "rollout: engine's model loaded"),
    ("rollout-0", "rollout worker", "rollout: worker started"),
    ("learner", "published version 1 ", "learner: first weights published (after step 1)"),
]
REDIS_STAMP = re.compile(r"^\d+:\w (\d+ \w+ \d{4} \d\d:\d\d:\d\d\.\d{3}) ")
REDIS_LINES = [("Redis is starting", "redis: starting (the launcher's imports and checks done)"),
               ("Ready to accept connections", "redis: ready")]
IMPORT = re.compile(r"^import time:\s+\d+ \|\s+(\d+) \| (\S.*)$")
PUBLISH = re.compile(r"published version (\d+) .* in ([\d.]+)s \(([^)]*)\)")


def _stamp(line: str) -> float | None:
    m = STAMP.match(line)
    return datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp() if m else None


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def startup(run_dir: Path, launch: float) -> list[tuple[float, str]]:
    """(seconds from launch, event) in time order."""
    events: list[tuple[float, str]] = []
    logs = run_dir / "logs"
    for name, text, label in STARTUP_LINES:
        path = logs / f"{name}.log"
        lines = path.read_text(errors="replace").splitlines() if path.exists() else []
        at = next((t for x in lines if text in x and (t := _stamp(x)) is not None), None)
        if at is not None:
            events.append((at - launch, label))
    redis_log = run_dir / "redis" / "redis.log"
    for text, label in REDIS_LINES:
        for line in (redis_log.read_text(errors="replace").splitlines() if redis_log.exists() else []):
            m = REDIS_STAMP.match(line)
            if m and text in line:
                events.append((datetime.strptime(m.group(1), "%d %b %Y %H:%M:%S.%f").timestamp() - launch, label))
                break
    samples = [s for s in _rows(run_dir / "learner" / "samples.jsonl") if s.get("step") == 1]
    if samples:
        events.append((min(s["created_at"] for s in samples) - launch, "learner: first prompts issued"))
        events.append((min(s["generated_at"] for s in samples) - launch, "rollout: first sample generated + scored"))
        events.append((max(s["generated_at"] for s in samples) - launch, "rollout: step 1's last sample"))
    metrics = [r for r in _rows(run_dir / "learner" / "metrics.jsonl") if "step" in r]
    if metrics:
        events.append((metrics[0]["time"] - launch, "learner: step 1 trained"))
    return sorted(events)


def import_profile(log: Path, top: int = 4) -> tuple[float, list[tuple[str, float]]]:
    """From a process's stderr under ``PYTHONPROFILEIMPORTTIME=1``: its seconds of imports (the sum of the top-level
    ones, inflated by the profiling itself) and the ``top`` biggest top-level imports."""
    total, big = 0.0, {}
    for line in (log.read_text(errors="replace").splitlines() if log.exists() else []):
        m = IMPORT.match(line)
        if m:  # a top-level import: its cumulative time counts its children
            total += int(m.group(1)) / 1e6
            big[m.group(2)] = big.get(m.group(2), 0.0) + int(m.group(1)) / 1e6
    return total, sorted(big.items(), key=lambda kv: -kv[1])[:top]


def print_imports(run_dir: Path, launcher_log: Path) -> None:
    """Per process of a run made with ``PYTHONPROFILEIMPORTTIME=1``: its import seconds and the biggest imports."""
    print("imports per process (PYTHONPROFILEIMPORTTIME, which inflates them; CPU-bound, so load inflates them too):")
    logs = [("launcher", launcher_log)] + [(p.stem, p) for p in sorted((run_dir / "logs").glob("*.log"))]
    for name, path in logs:
        total, big = import_profile(path)
        print(f"  {name:<10} {total:5.2f} s: " + ", ".join(f"{n} {s:.2f}" for n, s in big))


def step_trace(run_dir: Path, skip: int = 2) -> dict[str, float]:
    """Medians (seconds) of a step's parts over steps after the first ``skip``."""
    med = statistics.median
    metrics = [r for r in _rows(run_dir / "learner" / "metrics.jsonl") if "step" in r and "time" in r]
    timed = metrics[skip:]
    if len(timed) < 2:
        return {}
    gaps = [b["time"] - a["time"] for a, b in itertools.pairwise(timed)]
    out = {"step": med(gaps), "train": med(r["step_time_s"] for r in timed[1:]),
           "wait": med(r["wait_time_s"] for r in timed[1:]), "publish": med(r.get("publish_s", 0.0) for r in timed[1:])}
    out["rest"] = med(g - r["step_time_s"] - r["wait_time_s"] - r.get("publish_s", 0.0)  # per step, then the median
                      for g, r in zip(gaps, timed[1:]))
    loops = [(r, r["loop_s"]) for r in timed[1:] if isinstance(r.get("loop_s"), dict)]
    if loops:  # the learner's own account of the loop between two steps' lines (services/learner/rl_runner.py)
        parts = sorted({k for _, x in loops for k in x})
        for k in parts:
            out[f"loop.{k}"] = med(x.get(k, 0.0) for _, x in loops)
        out["loop.train_handoff"] = med(max(x.get("train", 0.0) - r["step_time_s"], 0.0) for r, x in loops)
        out["loop.admission"] = med(max(x.get("receive", 0.0) - r["wait_time_s"], 0.0) for r, x in loops)
        gaps_by_step = {b["step"]: b["time"] - a["time"] for a, b in itertools.pairwise(timed)}
        out["loop.unaccounted"] = med(max(gaps_by_step.get(r["step"], 0.0) - sum(x.values()), 0.0)
                                      for r, x in loops if r["step"] in gaps_by_step)
    by_step: dict[int, list[dict]] = {}
    for s in _rows(run_dir / "learner" / "samples.jsonl"):
        by_step.setdefault(s["step"], []).append(s)
    issued_scored, scored_train = [], []
    for r in timed[1:]:
        xs = by_step.get(r["step"])
        if not xs:
            continue
        generated = max(x["generated_at"] for x in xs)
        issued_scored.append(generated - min(x["created_at"] for x in xs))
        scored_train.append(r["time"] - r["step_time_s"] - r.get("publish_s", 0.0) - generated)
    if issued_scored:
        out["issued_to_scored"] = med(issued_scored)
        out["scored_to_train"] = med(scored_train)
    phases: dict[str, list[float]] = {}
    log = run_dir / "logs" / "learner.log"
    for line in (log.read_text(errors="replace").splitlines() if log.exists() else []):
        m = PUBLISH.search(line)
        if m and int(m.group(1)) > skip:
            for name, ms in re.findall(r"(\w+) (\d+)ms", m.group(3)):
                phases.setdefault(name, []).append(float(ms) / 1000)
    for name, xs in phases.items():
        out[f"publish.{name}"] = med(xs)
    return out


def print_traces(runs: list[tuple[str, int, Path, float]]) -> None:
    """Per fleet run: its start-up events and its step trace."""
    for mode, seed, run_dir, launch in runs:
        run_dir = Path(run_dir)
        print(f"\n{mode} seed {seed}: start-up, s from launch")
        for at, what in startup(run_dir, launch):
            print(f"  {at:7.2f}  {what}")
        t = step_trace(run_dir)
        if not t:
            continue
        ms = {k: v * 1000 for k, v in t.items()}
        print(f"{mode} seed {seed}: a step (medians, ms): {ms['step']:.0f} = train {ms['train']:.0f} + wait for "
              f"experiences {ms['wait']:.0f} + weight publish {ms['publish']:.0f} + rest {ms['rest']:.0f}")
        if "issued_to_scored" in ms:
            print(f"  its samples: prompts issued -> last sample generated and scored {ms['issued_to_scored']:.0f} ms "
                  f"(worker's Redis read, scheduling, generation, /score); -> training starts "
                  f"{ms['scored_to_train']:.0f} ms (push to Redis, the learner's read and admission)")
        pub = {k.split(".", 1)[1]: v for k, v in ms.items() if k.startswith("publish.")}
        if pub:
            print("  publish phases: " + ", ".join(f"{k} {v:.0f}" for k, v in pub.items()) + " ms")
        loop = {k.split(".", 1)[1]: v for k, v in ms.items() if k.startswith("loop.")}
        if loop:
            rest = ["train_handoff", "admission", "log_samples", "pool_signal", "log_step", "feed", "settle",
                    "dead_letters", "take", "checkpoint", "unaccounted"]
            print("  the rest, by the learner's loop (medians, ms): " + ", ".join(
                f"{k} {loop[k]:.1f}" for k in rest if k in loop) + " (train_handoff: the train call beyond "
                "train_step, mostly the event loop getting a core back after the training thread; admission: the "
                "experiences' read beyond the wait; log_step: the step before's line)")


def main(argv: list[str] | None = None) -> int:
    """``python benchmarks/vs_trl_trace.py RUN_DIR``: the traces of the fleet runs a kept vs_trl run dir holds."""
    root = Path((argv or sys.argv[1:])[0])
    for runs_json in sorted(root.glob("*/runs.json")):
        runs = [r for r in json.loads(runs_json.read_text()) if r["mode"] != "trl"]
        print(f"== {runs_json.parent.name}")
        print_traces([(r["mode"], r["seed"], Path(r["dir"]), r["launch"]) for r in runs])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
