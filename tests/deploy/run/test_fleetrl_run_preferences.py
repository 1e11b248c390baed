"""``fleetrl run`` of each preference algorithm, 2 steps each: rm and dpo (the learner alone, held-out pairs
measured before and after), online_dpo and rejection_sampling (the whole fleet, groups from the queue as GRPO)."""

from __future__ import annotations

import json

import pytest
import yaml

from deploy.local.sort_prefs import preference_rows
from tests.deploy.run.conftest import tiny_spec, write_rows
from tests.deploy.run.test_fleetrl_run import fleetrl_run, metrics

pytestmark = [pytest.mark.slow, pytest.mark.process, pytest.mark.timeout(600)]  # whole `fleetrl run`s (~20-60 s
# each on a quiet machine; minutes when 2 cores are shared: a module import took 144 s under load 20)


def _offline_spec(tmp, model, algorithm: dict):
    rows = [{"input": f"sort {i:04d}=", "output": "".join(sorted(f"{i:04d}")), "label": ""}
            for i in range(0, 10_000, 97)]
    write_rows(tmp / "prefs.jsonl", preference_rows(rows[:32], 0))
    write_rows(tmp / "held.jsonl", preference_rows(rows[32:48], 1))
    spec = {"run_name": f"tiny-{algorithm['name']}", "run_dir": "run", "model": str(model),
            "data": {"path": "prefs.jsonl", "input_key": "prompt"}, "algorithm": algorithm,
            "optim": {"actor_lr": 1e-3, "schedule": "constant", "warmup_ratio": 0.0},
            "train": {"micro_batch_size": 16, "max_steps": 2, "torch_threads": 1},
            "eval": {"data": "held.jsonl"}, "export": "out",
            "services": {"learner": {"model": {"device": "cpu"}, "observability": {"plot": False}}}}
    path = tmp / "run.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


@pytest.mark.parametrize("algorithm", [{"name": "rm", "batch_size": 8, "normalize_reward": True},
                                       {"name": "dpo", "batch_size": 8, "beta": 0.1}], ids=["rm", "dpo"])
def test_offline_preference_run(tmp_path, tiny_model_dir, algorithm):
    spec = _offline_spec(tmp_path, tiny_model_dir, algorithm)
    out = fleetrl_run(spec, timeout=560)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "learner finished: step 2/2" in out.stdout
    assert "starting reward" not in out.stdout and "starting rollout" not in out.stdout  # the learner alone
    (line,) = [x for x in out.stdout.splitlines() if "held-out pairwise accuracy:" in x]
    assert "(start) ->" in line and "(end)" in line and "16 pairs, steps 0 -> 2" in line
    rows = metrics(tmp_path / "run")
    assert [m["step"] for m in rows] == [1, 2]
    assert all(k in rows[-1] for k in ("rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins"))
    assert "heldout/accuracy" in rows[-1]
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    if algorithm["name"] == "rm":  # what the hf_rm scorer loads, normalised as asked
        assert config["architectures"] == ["LlamaForSequenceClassification"] and config["normalize_reward"]
    else:  # a policy again
        assert config["architectures"] == ["LlamaForCausalLM"]


@pytest.mark.parametrize("algorithm", [{"name": "online_dpo", "min_gap": 0.5},
                                       {"name": "rejection_sampling", "threshold": 1.0}], ids=["online_dpo", "rs"])
def test_online_preference_run(tmp_path, tiny_model_dir, algorithm):
    spec = tiny_spec(tmp_path, tiny_model_dir, algorithm=algorithm, eval={"data": None},
                     sampling={"group_size": 4, "max_new_tokens": 4})
    out = fleetrl_run(spec, timeout=560)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "learner finished: step 2/2" in out.stdout
    rows = metrics(tmp_path / "run")
    assert [m["step"] for m in rows] == [1, 2]
    last = rows[-1]
    assert last["groups_trained"] == 4 and last["experiences_unissued"] == 0 and last["weight_version"] == 2
    assert "reward_mean" in last and ("pairs" in last if algorithm["name"] == "online_dpo" else "kept" in last)
