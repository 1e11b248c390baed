"""Preference pairs derived from the sort-digits task (:mod:`deploy.local.sort_task`): for each prompt
``sort 3721=`` the chosen answer is the correct ordering (``1237``), the rejected one a wrong answer: for half the
pairs a wrong ordering of the same digits (half of those one adjacent swap away from correct, half a random
shuffle; a prompt of one repeated digit, which has no wrong ordering, gets one digit changed), for the other half
(``--rejected mixed``, the default; ``orderings`` leaves them out) a sorted answer with one digit changed, dropped
or added. OpenRLHF's columns: ``prompt``, ``chosen``, ``rejected``.
Train and held-out pairs come from the task's disjoint train and held-out prompts.

``python -m deploy.local.sort_prefs DIR`` writes ``DIR/data/prefs-train.jsonl`` and ``DIR/data/prefs-heldout.jsonl``
(and the task's data and tiny base model, as ``deploy.local.sort_task`` does, when DIR has none).

On-policy pairs (``--policy-samples FILE``, repeatable, as OpenRLHF's and TRL's RM pipelines build them from the policy they
will tune): FILE holds the policy's own sampled answers (``sampled.jsonl`` of ``fleetrl eval --samples N`` on the
train prompts, e.g. of ``sft.yaml``'s export); each prompt's wrong answers (by the exact rule) are rejected against
one of its right answers, or the right ordering when the policy sampled none (:func:`policy_pairs`). They go to
``DIR/data/prefs-policy-train.jsonl``, mixed with ``--synthetic N`` of the synthetic pairs above; with
``--policy-heldout FILE`` (samples on the held-out prompts), held-out on-policy pairs to
``DIR/data/prefs-policy-heldout.jsonl``.
"""

from __future__ import annotations

import json
import random
import sys
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


def is_correct(completion: str, label: str) -> bool:
    """The sort task's exact rule (the reward service's ``exact`` check with ``strip``): the answer is the label."""
    return completion.strip() == label.strip()


def same_digits(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None) -> float:
    """A cheap rule to put beside a reward model (the reward service's ``python`` scorer, verl signature): 1.0 when
    the answer holds exactly the label's digits in any order (the prompt's digits, nothing dropped or added), else
    0.0. Half of the sort task's exact rule: the order is left to the reward model."""
    return float(sorted(solution_str.strip()) == sorted(str(ground_truth).strip()))


def closeness(answer: str, label: str) -> int:
    """How near a wrong answer is to the label, as a grader ranking two wrong answers would see it: the digits in
    the right place, less one per digit too many or too few (``1236`` for ``1237``: 3; ``22222222``: -3)."""
    a, b = answer.strip(), label.strip()
    return sum(x == y for x, y in zip(a, b, strict=False)) - abs(len(a) - len(b))


def policy_pairs(samples: list[dict], seed: int, max_per_prompt: int = 4, graded: bool = False) -> list[dict]:
    """Preference pairs from a policy's own samples (rows ``{"prompt", "completion", "label"}``, several per
    prompt): per prompt, each distinct wrong answer (by :func:`is_correct`; at most ``max_per_prompt`` of them)
    is the rejected side of one pair whose chosen side is one of the prompt's right answers as the policy wrote
    them, or the label when the policy wrote none. A prompt whose samples are all right gives no pair. Rows:
    ``{"prompt", "chosen", "rejected", "label", "chosen_from": "policy" | "label" | "graded"}``, prompts in
    first-seen order. ``graded``: also up to ``max_per_prompt`` pairs of two wrong answers, the one nearer the
    label (:func:`closeness`, strictly) chosen: the ranking among wrong answers that a group of samples none of
    which is right needs from the reward model (an RM that only saw right-vs-wrong ranks them at random)."""
    rng = random.Random(seed)
    by_prompt: dict[str, list[dict]] = {}
    for row in samples:
        by_prompt.setdefault(row["prompt"], []).append(row)
    out = []
    for prompt, rows in by_prompt.items():
        labels = {r["label"] for r in rows}
        if len(labels) != 1:
            raise ValueError(f"prompt {prompt!r} has samples with different labels: {sorted(map(str, labels))}")
        label = str(labels.pop())
        right = sorted({r["completion"] for r in rows if is_correct(r["completion"], label)})
        wrong = sorted({r["completion"] for r in rows if not is_correct(r["completion"], label)})
        rng.shuffle(wrong)
        for rejected in wrong[:max_per_prompt]:
            chosen = rng.choice(right) if right else label
            out.append({"prompt": prompt, "chosen": chosen, "rejected": rejected, "label": label,
                        "chosen_from": "policy" if right else "label"})
        if graded:
            ranked = [(a, b) for a in wrong for b in wrong if closeness(a, label) > closeness(b, label)]
            rng.shuffle(ranked)
            out.extend({"prompt": prompt, "chosen": a, "rejected": b, "label": label, "chosen_from": "graded"}
                       for a, b in ranked[:max_per_prompt])
    return out


def read_samples(path: Path, heldout_prompts: set[str] | None = None) -> list[dict]:
    """The rows of a ``sampled.jsonl`` (``fleetrl eval --samples``); ValueError, naming the file, when a row
    lacks a field or (``heldout_prompts`` given) a prompt is a held-out one (training pairs would leak)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for n, row in enumerate(rows):
        missing = {"prompt", "completion", "label"} - set(row)
        if missing:
            raise ValueError(f"{path} row {n}: no {sorted(missing)} (is it fleetrl eval --samples' sampled.jsonl?)")
        if heldout_prompts is not None and row["prompt"] in heldout_prompts:
            raise ValueError(f"{path} row {n}: prompt {row['prompt']!r} is a held-out prompt: sample the train "
                             "prompts (--set eval.data=data/train.jsonl)")
    return rows


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
    ap.add_argument("--policy-samples", type=Path, action="append", default=None,
                    help="the policy's sampled answers on train prompts (fleetrl eval --samples' sampled.jsonl): "
                         "on-policy pairs to data/prefs-policy-train.jsonl; repeat it for the samples of several "
                         "policies (e.g. the SFT start, then a policy tuned against the previous RM: iterated RLHF)")
    ap.add_argument("--policy-heldout", type=Path, default=None,
                    help="the policy's sampled answers on the held-out prompts: data/prefs-policy-heldout.jsonl")
    ap.add_argument("--synthetic", type=int, default=0,
                    help="synthetic pairs (of --rejected's kinds) mixed into the on-policy training pairs")
    ap.add_argument("--per-prompt", type=int, default=4, help="on-policy pairs per prompt at most")
    ap.add_argument("--graded", action="store_true",
                    help="also pair two wrong samples of a prompt, the one nearer the label chosen (closeness())")
    args = ap.parse_args(argv)
    train, held = make_splits(args.seed, args.heldout)
    try:  # the samples are checked before anything is written
        policy = None if args.policy_samples is None else [
            read_samples(path, {r["input"] for r in held}) for path in args.policy_samples]
        policy_held = None if args.policy_heldout is None else read_samples(args.policy_heldout)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not (args.dir / "base-model" / "config.json").is_file():
        prepare_run(args.dir, seed=args.seed, heldout=args.heldout, hidden_size=128, layers=2)
    tr = write_jsonl(preference_rows(train[: args.train_pairs], args.seed, args.rejected), args.dir / "data" / "prefs-train.jsonl")
    ho = write_jsonl(preference_rows(held, args.seed + 1, args.rejected), args.dir / "data" / "prefs-heldout.jsonl")
    print(f"wrote {min(len(train), args.train_pairs)} training pairs to {tr} and {len(held)} held-out pairs to {ho}")
    if policy is not None:
        pairs = [p for n, rows in enumerate(policy) for p in policy_pairs(rows, args.seed + n, args.per_prompt,
                                                                           args.graded)]
        synthetic = preference_rows(train[-args.synthetic:], args.seed + 2, args.rejected) if args.synthetic else []
        mixed = pairs + synthetic
        random.Random(args.seed).shuffle(mixed)
        out = write_jsonl(mixed, args.dir / "data" / "prefs-policy-train.jsonl")
        gold, graded = (sum(p["chosen_from"] == k for p in pairs) for k in ("label", "graded"))
        print(f"wrote {len(pairs)} on-policy pairs ({gold} with the label as chosen, {graded} of two wrong answers) "
              f"and {len(synthetic)} synthetic pairs to {out}")
    if policy_held is not None:
        held_pairs = policy_pairs(policy_held, args.seed + 1, args.per_prompt, args.graded)
        out = write_jsonl(held_pairs, args.dir / "data" / "prefs-policy-heldout.jsonl")
        print(f"wrote {len(held_pairs)} held-out on-policy pairs to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
