"""Run specs of the preference algorithms: ``mode`` names the algorithm; rm / dpo are the learner alone and their
eval.data (held-out pairs) goes to the learner; the online ones start the fleet and need a reward."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from deploy.run.derive import service_config
from deploy.run.spec import RunSpec

BASE = {"run_name": "p", "model": "/m", "data": {"path": "/d.jsonl", "input_key": "prompt"}}
REWARD = {"scorers": [{"name": "exact", "kind": "rule", "check": {"type": "exact"}}]}


def test_mode_names_the_algorithm_and_held_out_pairs_go_to_the_learner():
    spec = RunSpec(**BASE, mode="rm", eval={"data": "/h.jsonl", "every": 5, "max_samples": 50})
    assert spec.algorithm.name == "rm" and not spec.is_rl and spec.heldout_pairs
    learner = service_config(spec, "learner")
    assert learner["data"]["eval_path"] == "/h.jsonl"
    assert learner["algorithm"] == {"name": "rm", "eval_every": 5, "eval_max_pairs": 50}


def test_mode_and_algorithm_must_agree():
    with pytest.raises(ValidationError, match="mode rm and algorithm.name dpo disagree"):
        RunSpec(**BASE, mode="rm", algorithm={"name": "dpo"})
    assert RunSpec(**BASE, mode="dpo", algorithm={"beta": 0.2}).algorithm.beta == 0.2


def test_online_algorithms_run_the_fleet_and_sft_still_refuses_eval_data():
    spec = RunSpec(**BASE, reward=REWARD, algorithm={"name": "online_dpo", "min_gap": 1.0})
    assert spec.is_rl and not spec.heldout_pairs
    assert "eval_path" not in service_config(spec, "learner").get("data", {})
    with pytest.raises(ValidationError, match="needs reward"):
        RunSpec(**BASE, algorithm={"name": "rejection_sampling"})
    with pytest.raises(ValidationError, match="eval.data: held-out evaluation goes through the rollout fleet"):
        RunSpec(**{**BASE, "data": {"path": "/d.jsonl", "output_key": "o"}}, mode="sft", eval={"data": "/h.jsonl"})


def test_dpo_settings_are_checked():
    with pytest.raises(ValidationError, match="cDPO, a variant of loss sigmoid"):
        RunSpec(**BASE, algorithm={"name": "dpo", "loss": "ipo", "label_smoothing": 0.1})
    with pytest.raises(ValidationError, match="set both"):
        RunSpec(**BASE, algorithm={"name": "dpo", "ref_chosen_key": "rc"})
