"""The LLM-judge recipe's data (``examples/sort-judge/``): the sort task for the policy, and a grading task for a
tiny judge model that a FleetRL rollout service serves as the policy's only reward.

The judge reads one chat turn, ``JUDGE_TEMPLATE`` filled with the reference answer and the policy's answer
(``ref 1237 ans 1273``), and answers ``1`` (the answer is the reference) or ``0``. Its training answers are half
right and half wrong, the wrong ones of the kinds a policy drifts to (found in the grpo-rm runs of the sort-prefs
recipe: sorted digits of the wrong length, one digit repeated, the prompt's digits unsorted, near misses), so a
policy cannot win the judge with an answer it never saw. Judge prompts come from the policy's training prompts
only; the judge's held-out rows come from the held-out prompts.
"""

from __future__ import annotations

import random
from pathlib import Path

from deploy.local.sort_task import prepare_run, write_jsonl

JUDGE_TEMPLATE = "ref {label} ans {response}"
"""The judge's user message; the reward service's ``judge`` scorer (``examples/sort-judge/fleetrl.yaml``) sends the
same template, so the judge is asked exactly what it was taught."""

DIGITS = "0123456789"
JUNK = DIGITS + " =sort.-abc"
MIXES: dict[str, tuple[tuple[int, ...], float, int]] = {
    "basic": ((0, 1, 4), 0.6, 10),
    "hard": ((0, 1, 4, 10, 10, 10), 0.7, 12),
}
"""mix -> (near-miss kinds, their share of the wrong answers, kinds drawn otherwise: ``range(n)``) of
:func:`wrong_answer`. Near misses have the right length, so a judge must read them digit by digit: a judge taught
on fewer of them learned to pass any four digits (81% held-out, every mistake a four-digit wrong answer). The
``basic`` mix teaches a tiny judge to compare digits (1,200 steps: 98% on its held-out rows), but it passed a third
of the SFT policy's wrong answers (0355 for 0336: one or two digits wrong, sorted: kind 10); the ``hard`` mix adds
those and junk, and a judge taught on it from scratch did not learn to compare in 1,600 steps, so the recipe
teaches the basic mix first and the hard one after it (judge-sft.yaml, then judge-sft-hard.yaml)."""


def wrong_answer(label: str, prompt_digits: str, rng: random.Random, mix: str = "hard") -> str:
    """An answer other than ``label``: one of the mistakes a sort policy makes, or drifts to under a judge;
    ``mix`` (:data:`MIXES`) says how often each kind comes."""
    near, share, kinds = MIXES[mix]
    while True:
        kind = rng.choice(near) if rng.random() < share else rng.randrange(kinds)
        d = list(label)
        if kind == 0 and len(d) > 1:  # two neighbours swapped
            i = rng.randrange(len(d) - 1)
            d[i], d[i + 1] = d[i + 1], d[i]
        elif kind == 1:  # one digit changed (the result may still be sorted)
            d[rng.randrange(len(d))] = rng.choice(DIGITS)
        elif kind == 2:  # one digit dropped
            del d[rng.randrange(len(d))]
        elif kind == 3:  # one digit too many
            d.insert(rng.randrange(len(d) + 1), rng.choice(DIGITS))
        elif kind == 4:  # the prompt's digits as they came
            d = list(prompt_digits)
        elif kind == 5:  # sorted digits of another length (the grpo-rm exploit: 8 sorted digits)
            d = sorted(rng.choice(DIGITS) for _ in range(rng.randint(1, 8)))
        elif kind == 6:  # one digit repeated (the other exploit: 1111, 22222222)
            d = [rng.choice(DIGITS)] * rng.randint(1, 8)
        elif kind == 7:  # any digits
            d = [rng.choice(DIGITS) for _ in range(rng.randint(1, 8))]
        elif kind == 8:  # the reference with a tail or cut short
            d = d + [rng.choice(DIGITS) for _ in range(rng.randint(1, 4))] if rng.random() < 0.5 else \
                d[: rng.randint(0, len(d) - 1)]
        elif kind == 9:  # another prompt's sorted answer
            d = sorted(rng.choice(DIGITS) for _ in range(4))
        elif kind == 10:  # the SFT policy's usual mistake: one or two digits wrong, the answer sorted
            for i in rng.sample(range(len(d)), rng.randint(1, 2)):
                d[i] = rng.choice(DIGITS)
            d.sort()
        else:  # not digits at all, or digits with other characters
            d = [rng.choice(JUNK) for _ in range(rng.randint(0, 8))]
        answer = "".join(d)
        if answer != label:
            return answer


def judge_rows(rows: list[dict], rng: random.Random, per_prompt: int = 2, passes: int = 1,
               mix: str = "hard") -> list[dict]:
    """Judge SFT rows from sort rows: per prompt one right answer and ``per_prompt - 1`` wrong ones, ``passes``
    times (new wrong answers each time), shuffled;
    ``input`` is the judge's user message, ``output`` and ``label`` its verdict."""
    out = []
    for row in [r for _ in range(passes) for r in rows]:
        label, digits = row["label"], row["input"][len("sort "):-1]
        answers = [(label, "1")] + [(wrong_answer(label, digits, rng, mix), "0") for _ in range(per_prompt - 1)]
        for answer, verdict in answers:
            text = JUDGE_TEMPLATE.format(label=label, response=answer)
            out.append({"input": text, "output": verdict, "label": verdict})
    rng.shuffle(out)
    return out


def prepare(run_dir: Path, *, seed: int = 0, heldout: int = 200, hidden_size: int = 128, layers: int = 2,
            judge_hidden_size: int = 128, judge_layers: int = 2) -> dict[str, int]:
    """Write the sort task (``data/``, ``base-model/``) and the judge's (``judge-data/``, ``judge-base-model/``)."""
    from deploy.local.tiny_model import build_tiny_causal_lm

    train, held, _ = prepare_run(run_dir, seed=seed, heldout=heldout, hidden_size=hidden_size, layers=layers)
    judge_basic = judge_rows(train, random.Random(seed + 1), passes=2, mix="basic")
    rng = random.Random(seed + 2)
    judge_train = judge_rows(train, rng, passes=2)
    judge_held = judge_rows(held, rng)
    write_jsonl(judge_basic, run_dir / "judge-data" / "basic.jsonl")
    write_jsonl(judge_train, run_dir / "judge-data" / "train.jsonl")
    write_jsonl(judge_held, run_dir / "judge-data" / "heldout.jsonl")
    build_tiny_causal_lm(run_dir / "judge-base-model", hidden_size=judge_hidden_size, layers=judge_layers, heads=4,
                         max_positions=64, seed=seed + 1)
    return {"train": len(train), "heldout": len(held), "judge_train": len(judge_train),
            "judge_heldout": len(judge_held)}


def main(argv: list[str] | None = None) -> int:
    """``python -m deploy.local.sort_judge DIR``: what examples/sort-judge/ expects."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m deploy.local.sort_judge", description=main.__doc__)
    ap.add_argument("dir", type=Path, help="where data/, base-model/, judge-data/ and judge-base-model/ go")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--heldout", type=int, default=200)
    ap.add_argument("--judge-hidden-size", type=int, default=128)
    ap.add_argument("--judge-layers", type=int, default=2)
    args = ap.parse_args(argv)
    n = prepare(args.dir, seed=args.seed, heldout=args.heldout, judge_hidden_size=args.judge_hidden_size,
                judge_layers=args.judge_layers)
    print(f"wrote {n['train']} train and {n['heldout']} held-out sort prompts to {args.dir / 'data'}, "
          f"{n['judge_train']} and {n['judge_heldout']} judge rows to {args.dir / 'judge-data'}, the policy's base "
          f"model to {args.dir / 'base-model'} and the judge's to {args.dir / 'judge-base-model'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
