"""GSM8K from a local copy (no hub needed): the recipe's train and held-out prompt files.

    python -m examples.recipes.gsm8k.prepare --train PATH --test PATH [--out DIR] [--max-train N] [--max-test N]

PATH is GSM8K as published (``openai/gsm8k``, config ``main``): JSONL or Parquet rows ``{"question", "answer"}``,
the answer's reasoning ending in ``#### <number>``; a Hugging Face ``save_to_disk`` directory works too (with
``--split``). Writes ``data/train.jsonl`` and ``data/test.jsonl`` (beside this file by default) with rows

    {"input": "<question>\\nLet's think step by step and output the final answer after \\"####\\".",
     "label": "72", "data_source": "openai/gsm8k",
     "extra_info": {"split": "train", "index": 0, "question": ..., "answer": <the reference reasoning>}}

``input`` / ``label`` are what ``gsm8k.yaml`` reads (``data.input_key`` / ``data.label_key``); the label is the
final number (commas removed), scored by the reward service's ``math`` rule (the answer after the response's last
``####``, else its ``\\boxed{}`` or last number, compared as exact fractions). ``data_source`` and
``extra_info`` are verl's keys, kept for reward functions written for verl. A row without ``####`` is an error
naming the file and line. Where a hub is reachable, ``datasets.load_dataset("openai/gsm8k", "main")`` then
``.to_json(...)`` gives the files this reads.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'


class PrepError(ValueError):
    """The input is not GSM8K-shaped; the message names the file and row."""


def read_rows(path: Path, split: str = "train") -> list[dict]:
    """Rows of a local JSONL, Parquet or saved-dataset GSM8K file (``services.learner.data``'s readers)."""
    from services.learner.data import DataError
    from services.learner.data import read_rows as read

    try:
        return read(path, split)
    except DataError as exc:
        raise PrepError(str(exc)) from exc


def final_answer(answer: str, where: str) -> str:
    """The number after GSM8K's ``####``, commas removed ("1,200" -> "1200")."""
    if "####" not in answer:
        raise PrepError(f"{where}: the answer has no '#### <number>' (is this GSM8K's `main` config?)")
    value = answer.rsplit("####", 1)[1].strip().replace(",", "")
    if not value:
        raise PrepError(f"{where}: nothing after '####'")
    return value


def convert(rows: list[dict], split: str, source: Path, limit: int | None = None) -> list[dict]:
    out = []
    for i, row in enumerate(rows[:limit]):
        where = f"{source} row {i}"
        missing = {"question", "answer"} - row.keys()
        if missing:
            raise PrepError(f"{where}: no field(s) {sorted(missing)} (fields: {sorted(row)})")
        out.append({
            "input": f"{row['question'].strip()}\n{INSTRUCTION}",
            "label": final_answer(str(row["answer"]), where),
            "data_source": "openai/gsm8k",
            "extra_info": {"split": split, "index": i, "question": row["question"], "answer": row["answer"]},
        })
    return out


def write_jsonl(rows: list[dict], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m examples.recipes.gsm8k.prepare", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", type=Path, required=True, help="GSM8K train split (JSONL, Parquet or saved dataset)")
    ap.add_argument("--test", type=Path, required=True, help="GSM8K test split (the held-out prompts)")
    ap.add_argument("--out", type=Path, default=HERE, help="where data/ goes (default: beside this script)")
    ap.add_argument("--split", default=None, help="split of a saved DatasetDict (default: train / test)")
    ap.add_argument("--max-train", type=int, default=None)
    ap.add_argument("--max-test", type=int, default=None, help="e.g. 500 for quicker held-out evaluations")
    args = ap.parse_args(argv)
    try:
        train = convert(read_rows(args.train, args.split or "train"), "train", args.train, args.max_train)
        test = convert(read_rows(args.test, args.split or "test"), "test", args.test, args.max_test)
    except PrepError as exc:
        print(f"error: {exc}")
        return 2
    write_jsonl(train, args.out / "data" / "train.jsonl")
    write_jsonl(test, args.out / "data" / "test.jsonl")
    print(f"wrote {len(train)} train and {len(test)} test prompts to {args.out / 'data'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
