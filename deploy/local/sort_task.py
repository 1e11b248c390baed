"""The demo's verifiable task: sort four digits ("sort 3721=" -> "1237"), exact-answer reward.

Small enough for a ~1M-parameter model on two CPU cores, structured enough that a short supervised
warm-up leaves room that RL with an exact-match reward visibly closes. Train and held-out prompts
are disjoint.
"""

from __future__ import annotations

import json
import random
from pathlib import Path


def problem(digits: list[int]) -> dict[str, str]:
    prompt = "sort " + "".join(map(str, digits)) + "="
    return {"input": prompt, "output": "".join(map(str, sorted(digits))), "label": "".join(map(str, sorted(digits)))}


def make_splits(seed: int = 0, heldout: int = 200) -> tuple[list[dict], list[dict]]:
    """All 10^4 four-digit strings, shuffled; the first ``heldout`` are the held-out set."""
    every = [[int(c) for c in f"{i:04d}"] for i in range(10_000)]
    random.Random(seed).shuffle(every)
    rows = [problem(d) for d in every]
    return rows[heldout:], rows[:heldout]


def write_jsonl(rows: list[dict], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def prepare_run(run_dir: Path, *, seed: int, heldout: int, hidden_size: int, layers: int) -> tuple[list, list, Path]:
    """Write ``data/train.jsonl``, ``data/heldout.jsonl`` and a fresh tiny model ``base-model`` under ``run_dir``."""
    from deploy.local.tiny_model import build_tiny_causal_lm

    train, held = make_splits(seed, heldout)
    write_jsonl(train, run_dir / "data" / "train.jsonl")
    write_jsonl(held, run_dir / "data" / "heldout.jsonl")
    base = build_tiny_causal_lm(run_dir / "base-model", hidden_size=hidden_size, layers=layers, heads=4,
                                max_positions=64, seed=seed)
    return train, held, base


def main(argv: list[str] | None = None) -> int:
    """``python -m deploy.local.sort_task DIR``: the data and base model examples/sort-digits/ expects."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m deploy.local.sort_task", description=main.__doc__)
    ap.add_argument("dir", type=Path, help="where data/ and base-model/ go (e.g. examples/sort-digits)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--heldout", type=int, default=200)
    ap.add_argument("--hidden-size", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    args = ap.parse_args(argv)
    train, held, base = prepare_run(args.dir, seed=args.seed, heldout=args.heldout, hidden_size=args.hidden_size,
                                    layers=args.layers)
    print(f"wrote {len(train)} train and {len(held)} held-out prompts to {args.dir / 'data'}, the model to {base}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
