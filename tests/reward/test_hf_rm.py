"""The hf_rm scorer on a tiny sequence-classification model built locally: concurrent requests share
batches (batch-size metric > 1) and every score equals an unbatched forward pass."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.reward.conftest import metric_value

PROMPTS = ["Hi", "What is 2+2? ", "Tell me a story about a cat who", "x", "A much longer prompt " * 6]
RESPONSES = ["there", "4", "sat on a mat and then slept for a very long while.", "y" * 40, "ok"]


@pytest.fixture(scope="module")
def rm_service(reward_service, tiny_reward_model_dir):
    return reward_service({
        "scorers": [
            {"name": "rm", "kind": "hf_rm", "model": str(tiny_reward_model_dir), "device": "cpu",
             "max_batch_size": 16, "max_wait_ms": 50, "torch_threads": 1, "weight": 2.0},
            {"name": "math", "kind": "rule", "check": {"type": "math"}, "weight": 1.0},
        ]
    }, name="hf-rm")


def unbatched_scores(model_dir, texts):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=1).eval()
    out = []
    with torch.inference_mode():
        for text in texts:
            ids = tok(text, return_tensors="pt", add_special_tokens=False)
            out.append(model(**ids).logits[0, 0].item())  # HF pools at the last (non-pad) token
    return out


def test_concurrent_requests_are_batched_and_match_unbatched(rm_service, tiny_reward_model_dir):
    items = [{"prompt": PROMPTS[i % 5], "response": RESPONSES[(i * 3) % 5] + f" #{i}", "label": str(i)}
             for i in range(32)]

    async def fire():
        async with httpx.AsyncClient(timeout=60) as client:
            return await asyncio.gather(*(client.post(f"{rm_service.url}/score", json={"items": [it]}) for it in items))

    replies = asyncio.run(fire())
    assert all(r.status_code == 200 for r in replies), [r.text for r in replies if r.status_code != 200][:2]
    got = [r.json()["components"][0]["rm"] for r in replies]
    finals = [r.json()["scores"][0] for r in replies]

    text = httpx.get(f"{rm_service.url}/metrics", timeout=10).text
    batches = metric_value(text, "fleetrl_reward_batch_size_count", scorer="rm")
    sequences = metric_value(text, "fleetrl_reward_batch_size_sum", scorer="rm")
    assert sequences / batches > 1.0, f"{sequences} sequences in {batches} batches: no batching happened"

    # OpenRLHF-style text: prompt + response + eos
    expected = unbatched_scores(tiny_reward_model_dir, [it["prompt"] + it["response"] + "</s>" for it in items])
    assert got == pytest.approx(expected, abs=1e-4)
    # the final reward: 2 * rm + math (the label is the item number, which is the last number)
    assert finals == pytest.approx([2 * e + 1.0 for e in expected], abs=2e-4)


def test_chat_prompts_use_the_chat_template_and_get_reward_works(rm_service, tiny_reward_model_dir):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    r = httpx.post(f"{rm_service.url}/score", json={"items": [{"prompt": messages, "response": "4", "label": 4}]},
                   timeout=60)
    assert r.status_code == 200, r.text
    templated = ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
                 "<|im_start|>assistant\n4<|im_end|>\n</s>")
    (expected,) = unbatched_scores(tiny_reward_model_dir, [templated])
    assert r.json()["components"][0]["rm"] == pytest.approx(expected, abs=1e-4)

    # OpenRLHF client, query with trailing pad/eos: stripped, then one eos appended (as serve_rm does)
    g = httpx.post(f"{rm_service.url}/get_reward",
                   json={"query": ["Hi there 7</s><pad><pad>"], "prompts": ["Hi"], "labels": ["7"]}, timeout=60)
    assert g.status_code == 200, g.text
    (expected,) = unbatched_scores(tiny_reward_model_dir, ["Hi there 7</s>"])
    assert g.json()["extra_logs"]["rm"][0] == pytest.approx(expected, abs=1e-4)
    assert g.json()["rewards"][0] == pytest.approx(2 * expected + 1.0, abs=2e-4)


def test_openrlhf_style_checkpoint_loads_and_normalizes(tmp_path, tiny_reward_model_dir):
    """OpenRLHF saves its RM as the base config (num_labels unset) + `score` head, with normalize_reward,
    mean and std in config.json; the scorer applies (r - mean) / std."""
    import json
    import shutil

    from services.reward.scorer_config import HfRmScorerConfig
    from services.reward.scorers.hf_rm import RewardModel

    ckpt = tmp_path / "openrlhf-rm"
    shutil.copytree(tiny_reward_model_dir, ckpt)
    cfg = json.loads((ckpt / "config.json").read_text())
    for key in ("id2label", "label2id", "num_labels"):
        cfg.pop(key, None)
    cfg.update(architectures=["LlamaForCausalLM"], normalize_reward=True, mean=0.5, std=2.0)
    (ckpt / "config.json").write_text(json.dumps(cfg))

    texts = ["Hi there</s>", "a longer text to score, with padding in the batch</s>"]
    raw = unbatched_scores(tiny_reward_model_dir, texts)
    rm = RewardModel(HfRmScorerConfig(name="rm", model=str(ckpt), device="cpu"))
    assert rm.forward(texts) == pytest.approx([(r - 0.5) / 2.0 for r in raw], abs=1e-4)
    plain = RewardModel(HfRmScorerConfig(name="rm", model=str(ckpt), device="cpu", normalize=False))
    assert plain.forward(texts) == pytest.approx(raw, abs=1e-4)
