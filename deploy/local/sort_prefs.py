"""Preference pairs derived from the sort-digits task (:mod:`deploy.local.sort_task`): for each prompt
``sort 3721=`` the chosen answer is the correct ordering (``1237``), the rejected one a wrong answer: for half the
pairs a wrong ordering of the same digits (half of those one adjacent swap away from correct, half a random
shuffle; a prompt of one repeated digit, which has no wrong ordering, gets one digit changed), for the other half
(``--rejected mixed``, the default; ``orderings`` leaves them out) a sorted answer with one digit changed, dropped
or added. OpenRLHF's columns: ``prompt``, ``chosen``, ``rejected``.
Train and held-out pairs come from the task's disjoint train and held-out prompts.

``python -m deploy.local.sort_prefs DIR`` writes ``DIR/data/prefs-train.jsonl`` and ``DIR/data/prefs-heldout.jsonl``
(and the task's data and tiny base model, as ``deploy.local.sort_task`` does, when DIR has none).
"""

from __future__ import annotations

import random
from pathlib import Path

from deploy.local.sort_task import make_splits, write_jsonl


def wrong_answer(answer: str, rng: random.Random, kinds: str = "mixed") -> str:
    """A wrong answer: with ``kinds`` ``orderings``, a wrong ordering of the same digits; ``mixed`` (the default),
    also sorted answers with one digit changed or one digit too few / too many, so that a reward model trained on
    them checks the digits and the length, not only the order (a GRPO run against an RM trained on orderings
    alone learned to write 8 sorted digits whatever the prompt: docs/recipes.md)."""
    r = rng.random()
    if kinds == "orderings" or r < 0.5:
        return wrong_ordering(answer, rng)
    digits = list(answer)
    if r < 0.75:  # one digit changed, still sorted
        i = rng.randrange(len(digits))
        digits[i] = str((int(digits[i]) + rng.randrange(1, 10)) % 10)
    elif r < 0.875:  # one digit dropped
        digits.pop(rng.randrange(len(digits)))
    else:  # one digit added
        digits.append(str(rng.randrange(10)))
    out = "".join(sorted(digits))
    return out if out != answer else wrong_ordering(answer, rng)


def wrong_ordering(answer: str, rng: random.Random) -> str:
    """A wrong answer to a sort prompt whose right answer is ``answer`` (sorted digits)."""
    if len(set(answer)) == 1:  # no wrong ordering: one digit changed
        i = rng.randrange(len(answer))
        return answer[:i] + str((int(answer[i]) + rng.randrange(1, 10)) % 10) + answer[i + 1:]
    digits = list(answer)
    if rng.random() < 0.5:  # a near miss: two different adjacent digits swapped
        spots = [i for i in range(len(digits) - 1) if digits[i] != digits[i + 1]]
        i = rng.choice(spots)
        digits[i], digits[i + 1] = digits[i + 1], digits[i]
        return "".join(digits)
    while "".join(digits) == answer:
        rng.shuffle(digits)
    return "".join(digits)


def preference_rows(rows: list[dict], seed: int, kinds: str = "mixed") -> list[dict]:
    rng = random.Random(seed)
    return [{"prompt": r["input"], "chosen": r["output"], "rejected": wrong_answer(r["output"], rng, kinds),
             "label": r["label"]} for r in rows]


def main(argv: list[str] | None = None) -> int:
    """``python -m deploy.local.sort_prefs DIR``: sort-task preference pairs under DIR/data."""
    import argparse

    from deploy.local.sort_task import prepare_run

    ap = argparse.ArgumentParser(prog="python -m deploy.local.sort_prefs", description=main.__doc__)
    ap.add_argument("dir", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--heldout", type=int, default=200)
    ap.add_argument("--train-pairs", type=int, default=4000, help="training pairs (the first N train prompts)")
    ap.add_argument("--rejected", choices=["mixed", "orderings"], default="mixed",
                    help="rejected answers: wrong orderings only, or also wrong digits / lengths (default)")
    args = ap.parse_args(argv)
    if not (args.dir / "base-model" / "config.json").is_file():
        prepare_run(args.dir, seed=args.seed, heldout=args.heldout, hidden_size=128, layers=2)
    train, held = make_splits(args.seed, args.heldout)
    tr = write_jsonl(preference_rows(train[: args.train_pairs], args.seed, args.rejected), args.dir / "data" / "prefs-train.jsonl")
    ho = write_jsonl(preference_rows(held, args.seed + 1, args.rejected), args.dir / "data" / "prefs-heldout.jsonl")
    print(f"wrote {min(len(train), args.train_pairs)} training pairs to {tr} and {len(held)} held-out pairs to {ho}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
