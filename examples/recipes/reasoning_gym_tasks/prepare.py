"""Data (and a tiny base model) for the reasoning-gym recipe: procedural tasks with their own scoring, no hub.

    python -m examples.recipes.reasoning_gym_tasks.prepare [--dataset number_sorting] [--config JSON]
        [--prompt short] [--tiny-model [--hidden-size 128 --layers 2]]

writes ``data/train.jsonl`` and ``data/heldout.jsonl`` beside this file (``--out`` elsewhere), rows
``{"input": prompt, "output": the dataset's answer (for the SFT warm-up), "label": {"dataset": name, "entry":
the generator's entry}}``; the reward (``reward.py``) scores a response with the dataset's own ``score_answer``
on that entry. Held-out rows are generated from seeds far from train's, and any whose question also occurs in
train is dropped, so the two are disjoint. Without ``--config`` a dataset gets its size in ``DEFAULT_CONFIGS``
(number_sorting: four whole numbers 0-9). ``--prompt question`` (the default) uses reasoning-gym's question
text; ``--prompt short`` a bare form for the tiny CPU model (see ``SHORT``). ``--tiny-model`` also builds a
byte-level tiny Llama in ``base-model/`` (``deploy/local/tiny_model.py``), with positions for the longest
prompt and answer.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
HELDOUT_SEED_OFFSET = 1_000_003
"""reasoning-gym seeds entry i with seed + i: the held-out set starts far from train's seeds."""


DEFAULT_CONFIGS = {
    "number_sorting": {"min_numbers": 4, "max_numbers": 4, "min_decimals": 0, "max_decimals": 0,
                       "min_value": 0, "max_value": 9},
    "chain_sum": {"min_terms": 3, "max_terms": 3, "min_digits": 1, "max_digits": 1},
}
"""The recipe's task sizes for the tiny CPU model: four whole numbers 0-9 to sort (either direction), and three
one-digit terms to add or subtract; any other dataset starts from its own defaults."""


def _jsonable(value: Any) -> Any:
    """The entry as plain JSON (reasoning-gym metadata holds tuples)."""
    return json.loads(json.dumps(value, default=str))


SHORT = [
    (("expression",), lambda m: f"{m['expression']} ="),
    (("word",), lambda m: f"backward {m['word']} ="),
    (("direction", "original_numbers"), lambda m: f"sort {m['direction']} {', '.join(m['original_numbers'])} ="),
]
"""``--prompt short``: the metadata fields an entry needs and the bare prompt made of them (arithmetic datasets'
``expression``: ``3 - 7 + 5 =``; spell_backward's ``word``: ``backward harry =``; number_sorting's numbers:
``sort ascending 5.0, 2.0, 7.0 =``); the question text says the same at greater length."""


def prompt_of(entry: dict, style: str) -> str:
    if style == "question":
        return entry["question"]
    meta = entry.get("metadata", {})
    for fields, template in SHORT:
        if all(f in meta for f in fields):
            return template(meta)
    raise ValueError(f"--prompt short: dataset {meta.get('source_dataset')!r} has none of the metadata fields "
                     f"{[list(f) for f, _ in SHORT]}; use --prompt question")


def rows(name: str, config: dict, size: int, seed: int, style: str) -> list[dict]:
    import reasoning_gym

    ds = reasoning_gym.create_dataset(name, size=size, seed=seed, **config)
    return [{"input": prompt_of(entry, style), "output": entry["answer"],
             "label": {"dataset": name, "entry": _jsonable(entry)}} for entry in ds]


def make_splits(name: str, config: dict, *, train: int, heldout: int, seed: int,
                style: str) -> tuple[list[dict], list[dict]]:
    train_rows = rows(name, config, train, seed, style)
    seen = {r["input"] for r in train_rows}
    held = [r for r in rows(name, config, heldout * 4, seed + HELDOUT_SEED_OFFSET, style) if r["input"] not in seen]
    unique = list({r["input"]: r for r in held}.values())[:heldout]
    if len(unique) < heldout:
        raise SystemExit(f"only {len(unique)} held-out prompts are not in train; lower --heldout or widen the "
                         "task (--config)")
    return train_rows, unique


def write_jsonl(data: list[dict], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in data))
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m examples.recipes.reasoning_gym_tasks.prepare",
                                 description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=HERE, help="where data/ (and base-model/) go")
    ap.add_argument("--dataset", default="number_sorting", help="a reasoning-gym dataset name")
    ap.add_argument("--config", default=None,
                    help="the dataset's config as JSON (default: the dataset's entry in DEFAULT_CONFIGS, else {})")
    ap.add_argument("--train", type=int, default=4000)
    ap.add_argument("--heldout", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prompt", choices=("question", "short"), default="question")
    ap.add_argument("--tiny-model", action="store_true", help="also build a tiny base-model/ (CPU recipe)")
    ap.add_argument("--hidden-size", type=int, default=128, help="--tiny-model's width")
    ap.add_argument("--layers", type=int, default=2, help="--tiny-model's depth")
    args = ap.parse_args(argv)
    try:
        config = DEFAULT_CONFIGS.get(args.dataset, {}) if args.config is None else json.loads(args.config)
    except json.JSONDecodeError as exc:
        ap.error(f"--config is not JSON: {exc}")
    train, held = make_splits(args.dataset, config, train=args.train, heldout=args.heldout, seed=args.seed,
                              style=args.prompt)
    write_jsonl(train, args.out / "data" / "train.jsonl")
    write_jsonl(held, args.out / "data" / "heldout.jsonl")
    print(f"wrote {len(train)} train and {len(held)} held-out {args.dataset} prompts to {args.out / 'data'}")
    if args.tiny_model:
        from deploy.local.tiny_model import build_tiny_causal_lm

        longest = max(len(r["input"].encode()) + len(str(r["output"]).encode()) for r in train + held)
        base = build_tiny_causal_lm(args.out / "base-model", hidden_size=args.hidden_size, layers=args.layers,
                                    heads=4, max_positions=max(64, longest + 16), seed=args.seed)
        print(f"built a tiny byte-level model in {base}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
