"""Iterated reward model on the sort task (recipe (a), OpenRLHF's iterative recipe), one command.

Round 0 samples the start policy on the train prompts, pairs its answers by the exact rule (each wrong answer
rejected against a right one, or the label: ``deploy.local.sort_prefs --policy-samples``) and trains the reward
model on them (``rm-policy.yaml``). Each round then runs a short GRPO against the current RM from the last policy
(``grpo-rm.yaml``), measures the new policy's held-out greedy accuracy by the exact rule (``fleetrl eval
online-dpo.yaml --model ...``, as README.md does), samples it on the train prompts, adds its answers (labelled by
the exact rule) to the RM's pairs and retrains the RM on all of them for the next round. Every step runs the
project's own CLIs (``fleetrl run`` / ``fleetrl eval`` / ``python -m deploy.local.sort_prefs``) as subprocesses,
so each is the command README.md documents; a step whose output exists is skipped, so the same command resumes.

    cd examples/sort-prefs
    python -m deploy.local.sort_prefs . && fleetrl run sft.yaml --set algorithm.max_steps=80 --set export=sft80-model \\
        --set run_name=sort-prefs-sft80
    python iterate.py --start sft80-model --rounds 4 --grpo-steps 30

Per round it prints and writes to ``runs/<tag>-summary.json``: the policy's held-out accuracy by the exact rule,
the RM's held-out pairwise accuracy (pairs from every policy so far on the held-out prompts), steps and seconds.
``--rm-model DIR`` trains the RM from another trunk (e.g. a larger model than the policy); ``--grpo-set`` /
``--rm-set`` pass ``--set`` overrides through.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
RM_LINE = re.compile(r"held-out pairwise accuracy: ([0-9.]+)% \(start\) -> ([0-9.]+)% \(end\)")


def rm_accuracy(output: str) -> tuple[float, float]:
    """The learner's ``held-out pairwise accuracy: A% (start) -> B% (end)`` line of a ``mode: rm`` run, as
    fractions; ValueError when the output has none (the run failed or had no ``eval.data``)."""
    found = RM_LINE.findall(output)
    if not found:
        raise ValueError("no 'held-out pairwise accuracy' line in the RM run's output")
    start, end = found[-1]
    return round(float(start) / 100, 4), round(float(end) / 100, 4)


def concat_jsonl(paths: list[Path], out: Path) -> Path:
    """The rows of ``paths`` in order, one file (the held-out samples of every policy so far)."""
    out.write_text("".join(p.read_text() for p in paths))
    return out


def grpo_sets(policy: str, rm: str, steps: int, export: str, run_name: str, extra: list[str]) -> list[str]:
    """``grpo-rm.yaml``'s overrides for one round: from ``policy`` (also its KL reference), scored by ``rm`` (+ the
    spec's format rule), ``steps`` steps, exported to ``export``; no in-run held-out eval (it would be judged by
    the RM: the round is judged by the exact rule afterwards)."""
    return [f"model={policy}", f"reward.scorers.0.model={rm}", f"train.max_steps={steps}", f"export={export}",
            f"run_name={run_name}", "eval.data=null", *extra]


def rm_sets(init: str, steps: int, export: str, run_name: str, extra: list[str]) -> list[str]:
    """``rm-policy.yaml``'s overrides: the RM from ``init``, ``steps`` steps on the pairs so far, to ``export``."""
    return [f"model={init}", f"export={export}", f"run_name={run_name}", f"algorithm.max_steps={steps}", *extra]


def fleetrl() -> list[str]:
    exe = shutil.which("fleetrl") or str(Path(sys.executable).with_name("fleetrl"))
    return [exe]


def run(cmd: list[str], log: Path) -> str:
    """Run ``cmd`` in this directory, its output (stdout and stderr) to ``log``; returns its stdout, stops the
    script when it fails."""
    print("$ " + " ".join(cmd), flush=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run(cmd, check=False, cwd=HERE, env=env, capture_output=True, text=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise SystemExit(f"failed (exit {proc.returncode}); its output is in {log}:\n{(proc.stdout + proc.stderr)[-2000:]}")
    return proc.stdout


def evaluate(model: str, logs: Path, name: str, *extra: str) -> dict:
    """``fleetrl eval online-dpo.yaml --model MODEL``: the exact rule (the spec's reward), its JSON summary."""
    out = logs / f"{name}.json"
    if not out.is_file():
        text = run([*fleetrl(), "eval", "online-dpo.yaml", "--model", model, "--set", f"model={model}", *extra],
                   logs / f"{name}.log")
        out.write_text(json.dumps(json.JSONDecoder().raw_decode(text[text.index("{"):])[0], indent=2) + "\n")
    return json.loads(out.read_text())


def sample(model: str, split: str, seed: int, n_prompts: int, k: int, dest: Path, logs: Path) -> Path:
    """``fleetrl eval --samples K`` of ``model`` on the train (``split`` train, the first ``n_prompts``) or the
    held-out prompts, its ``sampled.jsonl`` copied to ``dest``."""
    if dest.is_file():
        return dest
    data = ["--set", "eval.data=data/train.jsonl", "--set", f"eval.max_samples={n_prompts}"] if split == "train" else []
    summary = evaluate(model, logs, dest.stem, *data, "--samples", str(k), "--seed", str(seed))
    shutil.copyfile(summary["sampled_file"], dest)
    return dest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--start", default="sft80-model", help="the policy to start from (a model directory here)")
    ap.add_argument("--rm-model", default=None, help="the RM's initial trunk (default: --start, as RLHF does)")
    ap.add_argument("--rounds", type=int, default=4, help="GRPO rounds (each followed by an RM retrain)")
    ap.add_argument("--grpo-steps", type=int, default=30, help="GRPO steps a round")
    ap.add_argument("--rm-steps", type=int, default=300, help="RM steps a (re)training")
    ap.add_argument("--samples", type=int, default=8, help="samples per prompt for the RM's pairs")
    ap.add_argument("--train-prompts", type=int, default=2000, help="train prompts sampled each round")
    ap.add_argument("--synthetic", type=int, default=2000, help="synthetic pairs mixed into the RM's")
    ap.add_argument("--graded", action="store_true", help="also graded pairs of two wrong answers (sort_prefs)")
    ap.add_argument("--tag", default="iter", help="names of this run's files: data/<tag>-*, <tag>-*-model, ...")
    ap.add_argument("--grpo-set", action="append", default=[], help="a --set for grpo-rm.yaml (repeatable)")
    ap.add_argument("--rm-set", action="append", default=[], help="a --set for rm-policy.yaml (repeatable)")
    args = ap.parse_args(argv)
    tag, logs = args.tag, HERE / "runs" / f"{args.tag}-logs"
    missing = [str(need) for need in (HERE / "data" / "train.jsonl", HERE / args.start / "config.json")
               if not need.is_file()]
    if missing:  # every one named at once: a first run lacks both
        print(f"error: no {' and no '.join(missing)}: prepare first (this file's docstring)", file=sys.stderr)
        return 2
    rm_init = args.rm_model or args.start
    summary_path = HERE / "runs" / f"{tag}-summary.json"
    rows: list[dict] = []
    train_samples: list[Path] = []
    held_samples: list[Path] = []
    policy = args.start
    for rnd in range(args.rounds + 1):
        t0 = time.monotonic()
        row: dict = {"round": rnd, "policy": policy}
        if rnd > 0:  # GRPO against the last round's RM, from the last policy
            rm = f"{tag}-rm-r{rnd - 1}-model"
            new = f"{tag}-grpo-r{rnd}-model"
            if not (HERE / new / "config.json").is_file():
                sets = grpo_sets(policy, rm, args.grpo_steps, new, f"sort-prefs-{tag}-grpo-r{rnd}", args.grpo_set)
                run([*fleetrl(), "run", "grpo-rm.yaml", "--lines", *[x for s in sets for x in ("--set", s)]],
                    logs / f"grpo-r{rnd}.log")
            policy = row["policy"] = new
            row["grpo_steps"] = args.grpo_steps
            row["grpo_s"] = round(time.monotonic() - t0, 1)
        row["heldout_accuracy"] = evaluate(policy, logs, f"heldout-r{rnd}")["accuracy"]
        print(f"round {rnd}: {policy} held-out accuracy (exact rule) {row['heldout_accuracy']:.1%}", flush=True)
        if rnd == args.rounds:  # the last policy needs no RM after it
            row["seconds"] = round(time.monotonic() - t0, 1)
            rows.append(row)
            break
        train_samples.append(sample(policy, "train", 1000 * rnd, args.train_prompts, args.samples,
                                    HERE / "data" / f"{tag}-r{rnd}-samples-train.jsonl", logs))
        held_samples.append(sample(policy, "heldout", 1000 * rnd + 100, 0, args.samples,
                                   HERE / "data" / f"{tag}-r{rnd}-samples-heldout.jsonl", logs))
        held = concat_jsonl(held_samples, HERE / "data" / f"{tag}-r{rnd}-samples-heldout-all.jsonl")
        rm = f"{tag}-rm-r{rnd}-model"
        rm_log = logs / f"rm-r{rnd}.log"
        if not (HERE / rm / "config.json").is_file():
            pairs = run([sys.executable, "-m", "deploy.local.sort_prefs", ".", "--synthetic", str(args.synthetic),
                         *[x for p in train_samples for x in ("--policy-samples", str(p.relative_to(HERE)))],
                         "--policy-heldout", str(held.relative_to(HERE)), *(["--graded"] if args.graded else [])],
                        logs / f"pairs-r{rnd}.log")
            row["pairs"] = pairs.strip().splitlines()[-2:]
            sets = rm_sets(rm_init, args.rm_steps, rm, f"sort-prefs-{tag}-rm-r{rnd}", args.rm_set)
            run([*fleetrl(), "run", "rm-policy.yaml", "--lines", *[x for s in sets for x in ("--set", s)]], rm_log)
        row["rm_pairwise_start"], row["rm_pairwise_end"] = rm_accuracy(rm_log.read_text())
        row["rm_steps"] = args.rm_steps
        row["seconds"] = round(time.monotonic() - t0, 1)
        print(f"round {rnd}: RM {rm} held-out pairwise accuracy {row['rm_pairwise_start']:.1%} -> "
              f"{row['rm_pairwise_end']:.1%} ({row['seconds']} s this round)", flush=True)
        rows.append(row)
        summary_path.write_text(json.dumps(rows, indent=2) + "\n")
    summary_path.write_text(json.dumps(rows, indent=2) + "\n")
    start, end = rows[0]["heldout_accuracy"], rows[-1]["heldout_accuracy"]
    print(f"held-out accuracy by the exact rule: {start:.1%} -> {end:.1%} ({100 * (end - start):+.1f} points) "
          f"over {args.rounds} rounds of {args.grpo_steps} GRPO steps; summary {summary_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
