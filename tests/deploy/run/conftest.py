"""A tiny run spec on disk: a tiny model, a few sort-digits prompts, held-out prompts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def tiny_spec(tmp: Path, model: Path, **extra) -> Path:
    """``tmp/run.yaml``: GRPO on 40 sort-digits prompts, 2 groups x 2 samples per step, 4 new tokens."""
    rows = [{"input": f"sort {i:04d}=", "label": "".join(sorted(f"{i:04d}"))} for i in range(0, 10_000, 97)]
    write_rows(tmp / "train.jsonl", rows[:40])
    write_rows(tmp / "heldout.jsonl", rows[40:48])
    spec = {
        "run_name": "tiny", "run_dir": "run", "model": str(model),
        "data": {"path": "train.jsonl", "input_key": "input", "label_key": "label"},
        "reward": {"scorers": [{"name": "exact", "kind": "rule", "check": {"type": "exact"}}]},
        "algorithm": {"name": "grpo"},
        "optim": {"actor_lr": 1e-3, "schedule": "constant", "warmup_ratio": 0.0},
        "train": {"groups_per_step": 2, "micro_batch_size": 8, "max_steps": 2, "torch_threads": 1},
        "sampling": {"group_size": 2, "max_new_tokens": 4},
        "checkpoint_every": 2,
        "eval": {"data": "heldout.jsonl"},
        "services": {"rollout": {"engine": {"kind": "hf", "device": "cpu", "torch_threads": 1}},
                     "learner": {"model": {"device": "cpu"}, "observability": {"plot": False}}},
        **extra,
    }
    path = tmp / "run.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def with_remote_scorer(spec_file: Path, url: str, **settings) -> Path:
    """``spec_file`` with its reward one ``http`` scorer ``myrm`` in OpenRLHF's protocol at ``url``."""
    raw = yaml.safe_load(spec_file.read_text())
    raw["reward"] = {"scorers": [{"name": "myrm", "kind": "http", "protocol": "openrlhf", "url": url, **settings}]}
    spec_file.write_text(yaml.safe_dump(raw, sort_keys=False))
    return spec_file


@pytest.fixture()
def spec_file(tmp_path, tiny_model_dir) -> Path:
    return tiny_spec(tmp_path, tiny_model_dir)
