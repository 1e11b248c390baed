"""A FleetRL rollout service as the judge: the judge scorer talks to our own ``/v1/chat/completions`` (hf engine, tiny
model) as it would to vLLM or a hosted API. The tiny model is taught in-process, in a few SFT steps, to answer any
chat with "Score: 7" (a judge of no judgement, but a real model behind the real endpoint): its replies are read,
its ``usage`` is counted against the budget, and a reply the parser cannot read fails clearly."""

from __future__ import annotations

import random
import shutil

import httpx
import pytest

from services.reward.errors import RewardRequestError
from services.reward.service import RewardService
from services.reward.settings import RewardSettings
from shared.reward_api import ScoreItem
from tests.procs import stop
from tests.rollout.conftest import start_rollout

REPLY = "Score: 7"


def teach_fixed_reply(model_dir, steps: int = 80) -> None:
    """SFT the tiny chat model to answer every chat with ``REPLY`` (loss on the reply and EOS only)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    rng = random.Random(0)
    target = tok.encode(REPLY, add_special_tokens=False) + [tok.eos_token_id]
    for _ in range(steps):
        seqs, masks = [], []
        for _ in range(8):
            words = " ".join(rng.choice(["sort", "1237", "good", "bad", "rate", "<response>", "Task:"])
                             for _ in range(rng.randrange(3, 30)))
            messages = [{"role": "system", "content": "You grade."}] if rng.random() < 0.5 else []
            text = tok.apply_chat_template([*messages, {"role": "user", "content": words}],
                                           add_generation_prompt=True, tokenize=False)
            prompt = tok.encode(text, add_special_tokens=False)
            seqs.append(prompt + target)
            masks.append([0] * len(prompt) + [1] * len(target))
        width = max(map(len, seqs))
        ids = torch.tensor([s + [tok.pad_token_id] * (width - len(s)) for s in seqs])
        labels = torch.tensor([[t if m else -100 for t, m in zip(s, mk)] + [-100] * (width - len(s))
                               for s, mk in zip(seqs, masks)])
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.save_pretrained(model_dir, safe_serialization=True)


@pytest.mark.slow
@pytest.mark.process
async def test_a_fleetrl_rollout_service_is_the_judge(tiny_model_dir, tmp_path):
    judge_dir = tmp_path / "judge-model"
    shutil.copytree(tiny_model_dir, judge_dir)
    teach_fixed_reply(judge_dir)
    proc, url, _log = start_rollout(tmp_path, "judge", {
        "model": str(judge_dir), "served_model_name": "tiny-judge",
        "engine": {"kind": "hf", "device": "cpu", "max_batch_size": 16, "max_wait_ms": 5, "torch_threads": 1}})
    try:
        async with httpx.AsyncClient(timeout=10) as client:
            assert (await client.get(f"{url}/v1/models")).json()["data"][0]["id"] == "tiny-judge"
        base = {"name": "judge", "kind": "judge", "url": f"{url}/v1/chat/completions", "model": "tiny-judge",
                "system": "You grade.", "template": "Task: {prompt}\n<response>{response}</response>",
                "sampling": {"max_tokens": 8}, "timeout_s": 60, "retry": {"attempts": 1}}
        svc = RewardService(RewardSettings(scorers=[{
            **base, "parser": {"type": "number", "pattern": r"Score:\s*(\d+)", "max": 10, "normalize": True},
            "budget": {"max_calls": 3}}]))
        await svc.start()
        try:
            group = [ScoreItem(prompt="sort 3721=", response=r, label="1237") for r in ("1237", "1273", "1237")]
            assert (await svc.score(group)).scores == [0.7, 0.7, 0.7]  # two distinct responses: two calls
            tokens = svc.metrics.registry.get_sample_value("fleetrl_reward_judge_tokens_total", {"scorer": "judge"})
            assert tokens and tokens > 20  # the rollout service's `usage`: the rendered chat plus the reply
            await svc.score([ScoreItem(prompt="sort 11=", response="11")])
            with pytest.raises(RewardRequestError, match="budget.max_calls is 3"):
                await svc.score([ScoreItem(prompt="sort 12=", response="12")])
        finally:
            await svc.stop()
        strict = RewardService(RewardSettings(scorers=[{
            **base, "name": "judge", "parser": {"type": "labels", "map": {"correct": 1, "incorrect": 0}},
            "max_retries": 1}]))
        await strict.start()
        try:
            with pytest.raises(RewardRequestError, match=r"could not be read in 2 call\(s\).*'Score: 7'"):
                await strict.score([ScoreItem(prompt="sort 21=", response="12")])
        finally:
            await strict.stop()
    finally:
        stop(proc)
