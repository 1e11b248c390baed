"""Data for the minmax-digits recipe: the smallest and the largest of six digits ("minmax 381729=" -> "19"), as
verl rows.

    python examples/minmax-digits/prepare.py [--out DIR] [--train N] [--heldout N] [--seed S]

Writes ``data/train.jsonl`` and ``data/heldout.jsonl`` (beside this file by default): distinct six-digit strings
drawn from all 10^6, shuffled by ``--seed``, the first ``--heldout`` held out (train and held-out are disjoint), in
verl's row layout:

    {"prompt": "minmax 381729=", "reward_model": {"ground_truth": "19"}, "data_source": "minmax-digits",
     "extra_info": {"split": "train", "index": 0}}

The prompt is text, which the model completes (a list of chat messages in ``prompt`` works as well, rendered with
the model's chat template; with this recipe's 0.5M-parameter model the template's extra tokens slow the warm-up
down). Standard library only; nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = "minmax-digits"
DIGITS = 6


def row(digits: str, split: str, index: int) -> dict:
    return {"prompt": f"minmax {digits}=", "reward_model": {"ground_truth": min(digits) + max(digits)},
            "data_source": SOURCE, "extra_info": {"split": split, "index": index}}


def make_splits(*, train: int = 10_000, heldout: int = 200, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """``heldout`` held-out and ``train`` training rows of distinct six-digit strings."""
    if train < 1 or heldout < 1 or train + heldout > 10**DIGITS:
        raise ValueError(f"--train and --heldout must be >= 1 and together at most {10**DIGITS}")
    picked = random.Random(seed).sample(range(10**DIGITS), train + heldout)
    strings = [f"{n:0{DIGITS}d}" for n in picked]
    return ([row(s, "train", i) for i, s in enumerate(strings[heldout:])],
            [row(s, "heldout", i) for i, s in enumerate(strings[:heldout])])


def write_jsonl(rows: list[dict], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python examples/minmax-digits/prepare.py",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=HERE, help="where data/ goes (default: beside this file)")
    ap.add_argument("--train", type=int, default=10_000, help="training rows (default 10000)")
    ap.add_argument("--heldout", type=int, default=200, help="held-out rows (default 200)")
    ap.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    args = ap.parse_args(argv)
    try:
        train, held = make_splits(train=args.train, heldout=args.heldout, seed=args.seed)
    except ValueError as exc:
        ap.error(str(exc))
    write_jsonl(train, args.out / "data" / "train.jsonl")
    write_jsonl(held, args.out / "data" / "heldout.jsonl")
    print(f"wrote {len(train)} train and {len(held)} held-out prompts to {args.out / 'data'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
