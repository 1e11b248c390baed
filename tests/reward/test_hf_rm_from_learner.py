"""The learner's reward-model export (algorithm rm) served by a real reward service's hf_rm scorer with no
conversion: /score and /get_reward give each text the reward the trainer computed for it (normalised by the
mean / std the export wrote), so the trained preferences survive the trip (chosen above rejected)."""

from __future__ import annotations

import httpx
import pytest

from deploy.local.sort_prefs import preference_rows
from deploy.local.sort_task import make_splits, write_jsonl
from services.learner.preference_data import read_pairs, rm_text
from tests.learner.helpers import settings
from tests.procs import stop
from tests.reward.conftest import start_reward_service


@pytest.fixture(scope="module")
def trained_rm(tiny_model_dir, tmp_path_factory):
    from services.learner.training.rm_trainer import RMTrainer

    tmp = tmp_path_factory.mktemp("rm")
    train, held = make_splits(0, 16)
    write_jsonl(preference_rows(train[:64], 0), tmp / "prefs.jsonl")
    write_jsonl(preference_rows(held, 1), tmp / "held.jsonl")
    s = settings(tiny_model_dir, tmp, data={"path": str(tmp / "prefs.jsonl"), "input_key": "prompt"},
                 algorithm={"name": "rm", "batch_size": 16, "normalize_reward": True},
                 train={"micro_batch_size": 32, "torch_threads": 1})
    trainer = RMTrainer(s, total_steps=4)
    pairs = read_pairs(str(tmp / "prefs.jsonl"), s.data)
    for step in range(4):
        trainer.train_step(pairs[16 * step: 16 * (step + 1)])
    mean, std = trainer.set_normalization(pairs)
    trainer.export(tmp / "rm-export")
    heldout = read_pairs(str(tmp / "held.jsonl"), s.data)
    chosen, rejected = trainer.pair_rewards(heldout)
    return tmp / "rm-export", trainer.tokenizer, heldout, chosen, rejected, (mean, std)


@pytest.fixture(scope="module")
def rm_served(trained_rm, tmp_path_factory):
    config = {"scorers": [{"name": "rm", "kind": "hf_rm", "model": str(trained_rm[0]), "device": "cpu",
                           "torch_threads": 1}]}
    # a longer start-up allowance than the other reward tests: it loads the model on shared, busy cores
    service = start_reward_service(tmp_path_factory.mktemp("rm-served"), config, name="rm-roundtrip", timeout=240)
    yield service
    stop(service.proc)


@pytest.mark.process
def test_export_scores_the_same_through_score_and_get_reward(trained_rm, rm_served):
    _, tokenizer, heldout, chosen, rejected, (mean, std) = trained_rm
    assert std > 0 and (chosen != rejected).any()
    service = rm_served
    items = [{"prompt": p.prompt, "response": side} for p in heldout for side in (p.chosen, p.rejected)]
    r = httpx.post(f"{service.url}/score", json={"items": items}, timeout=60)
    assert r.status_code == 200, r.text
    served = r.json()["scores"]
    expected = [((c if i % 2 == 0 else j) - mean) / std
                for c, j in zip(chosen.tolist(), rejected.tolist()) for i in range(2)]
    assert served == pytest.approx(expected, abs=1e-4)

    # OpenRLHF's client: whole texts (the eos the trainer appended is stripped and put back by the service)
    queries = [rm_text(tokenizer, p.prompt, p.chosen) for p in heldout]
    g = httpx.post(f"{service.url}/get_reward", json={"query": queries, "prompts": [p.prompt for p in heldout]},
                   timeout=60)
    assert g.status_code == 200, g.text
    assert g.json()["rewards"] == pytest.approx([(c - mean) / std for c in chosen.tolist()], abs=1e-4)


def test_normalization_is_in_the_config(trained_rm):
    import json

    config = json.loads((trained_rm[0] / "config.json").read_text())
    assert config["normalize_reward"] is True
    assert config["mean"] == pytest.approx(trained_rm[5][0])
    assert config["architectures"] == ["LlamaForSequenceClassification"]
