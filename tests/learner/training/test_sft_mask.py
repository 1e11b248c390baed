"""SFT on multi-turn transcripts: the environment's tokens (a tool's result) are context, not loss — the
answer's loss mask from the data (segments ``{"text", "train"}``) reaches the trainer."""

import json

import pytest

from deploy.local.tiny_model import build_tokenizer
from services.learner.data import DataError, PromptSet
from services.learner.settings import DataSettings
from services.learner.training.sft_trainer import SFTTrainer
from tests.learner.helpers import GOOD, response_logprob, settings


def test_sft_loss_excludes_masked_tokens(tiny_model_dir, tmp_path):
    s = settings(tiny_model_dir, tmp_path, algorithm={"name": "sft", "batch_size": 4}, optim={"actor_lr": 3e-3})
    trainer = SFTTrainer(s, total_steps=8)
    prompt, answer, mask = [1, 50, 51, 52], [GOOD, 77, 78, GOOD, 2], [1, 0, 0, 1, 1]
    kept = [response_logprob(trainer, answer[:i + 1], prompt=prompt) - response_logprob(trainer, answer[:i], prompt=prompt)
            if i else response_logprob(trainer, answer[:1], prompt=prompt) for i in range(len(answer))]
    expected = -sum(lp for lp, m in zip(kept, mask) if m) / sum(mask)
    first = trainer.train_step([(prompt, answer, mask)] * 4)["sft_loss"]
    assert first == pytest.approx(expected, abs=1e-4)
    plain = SFTTrainer(s, total_steps=8)  # the same start, every answer token trained
    plain.train_step([(prompt, answer)] * 4)

    def env_logprob(t):
        return response_logprob(t, answer[:3], prompt=prompt) - response_logprob(t, answer[:1], prompt=prompt)

    before = env_logprob(SFTTrainer(s, total_steps=8))
    for _ in range(5):
        trainer.train_step([(prompt, answer, mask)] * 4)
        plain.train_step([(prompt, answer)] * 4)
    assert env_logprob(plain) - before > env_logprob(trainer) - before + 2.0  # here 4.7 vs 1.6 nats
    with pytest.raises(ValueError, match="loss mask"):
        trainer.train_step([(prompt, answer, mask[:-1])])


def test_sft_pair_of_segments_tokenises_each_and_masks_untrained(tmp_path):
    tok = build_tokenizer()
    path = tmp_path / "t.jsonl"
    row = {"input": "Q?", "output": [{"text": "call", "train": True}, {"text": "42", "train": False},
                                     {"text": "ok"}]}
    path.write_text(json.dumps(row) + "\n" + json.dumps({"input": "Q?", "output": "plain"}) + "\n")
    ps = PromptSet.load(DataSettings(path=str(path), label_key=None, shuffle=False), 0, tok, need_output=True)
    prompt, answer, mask = ps.sft_pair(0, 0)
    assert tok.decode(prompt) == "Q?" and tok.decode(answer[:-1]) == "call42ok" and answer[-1] == tok.eos_token_id
    assert mask == [1] * 4 + [0] * 2 + [1] * 2 + [1]
    assert len(ps.sft_pair(0, 1)) == 2  # a plain answer: every token trained, as before
    path.write_text(json.dumps({"input": "Q?", "output": [{"train": True}]}) + "\n")
    bad = PromptSet.load(DataSettings(path=str(path), label_key=None, shuffle=False), 0, tok, need_output=True)
    with pytest.raises(DataError, match="segment 0"):
        bad.sft_pair(0, 0)
