"""Chat-message prompts (verl's and OpenRLHF's chat data) go everywhere a prompt goes, rendered by the model's
chat template into the same token ids: the rollout fleet in training (the learner's prompt task, rendered by the
rollout service), SFT (the learner's prompt ids), and held-out evaluation / ``fleetrl eval`` (``heldout_rows``).

The tokenizer here is the tiny model's with what real ones (Llama 3, Gemma) have: a chat template that writes
the BOS itself and an ``encode`` that adds one too — rendering and then encoding with special tokens gives the
model a doubled BOS it never saw in training."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from deploy.local.tiny_model import CHAT_TEMPLATE, build_tokenizer
from deploy.run.heldout import heldout_rows
from deploy.run.load import load_spec
from services.learner.data import PromptSet
from services.learner.settings import RolloutRequestSettings
from services.rollout.service import RolloutService

ROWS = [
    {"prompt": [{"role": "system", "content": "Answer with the number."}, {"role": "user", "content": f"{a}+{b}="}],
     "reward_model": {"ground_truth": str(a + b)}, "data_source": "add", "answer": str(a + b)}
    for a, b in ((2, 3), (10, 7), (41, 1))
]


@pytest.fixture(scope="module")
def bos_model(tmp_path_factory) -> Path:
    """A model directory whose tokenizer adds a BOS on encode and whose chat template starts with one."""
    from tokenizers.processors import TemplateProcessing

    tok = build_tokenizer()
    tok._tokenizer.post_processor = TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", tok.bos_token_id)])
    tok.chat_template = "{{ bos_token }}" + CHAT_TEMPLATE
    out = tmp_path_factory.mktemp("bos-model")
    tok.save_pretrained(out)
    return out


def _spec(tmp: Path, model: Path, rows: list[dict], **data):
    (tmp / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = {"run_name": "chat", "model": str(model),
            "data": {"path": "data.jsonl", "input_key": "prompt", "label_key": "reward_model.ground_truth",
                     "output_key": "answer", "shuffle": False, **data},
            "reward": {"scorers": [{"name": "exact", "kind": "rule", "check": {"type": "exact"}}]},
            "eval": {"data": "data.jsonl"}}
    (tmp / "run.yaml").write_text(yaml.safe_dump(spec))
    return load_spec(tmp / "run.yaml")


def _three_renderings(spec, tok) -> tuple[list, list, list]:
    """(held-out ids, SFT prompt ids, the rollout service's ids of the learner's prompt task) per row."""
    heldout = [row["input_ids"] for row in heldout_rows(spec)]
    prompts = PromptSet.load(spec.data, 0, tok, need_output=True)
    sft = [prompts.sft_pair(0, i)[0] for i in range(len(prompts))]
    rollout_side = SimpleNamespace(tokenizer=tok, settings=SimpleNamespace(model_name="bos-model"),
                                   check_template_kwargs=lambda extra: False)  # no request kwargs here
    training = []
    for i in range(len(prompts)):
        task = prompts.task(0, i, 0, RolloutRequestSettings())
        assert isinstance(task.prompt, list)  # the rollout fleet renders it with the model it serves
        training.append(RolloutService.apply_chat_template(rollout_side, [m.model_dump() for m in task.prompt]))
    return heldout, sft, training


def test_verl_chat_prompts_are_the_same_ids_in_training_sft_and_heldout(tmp_path, bos_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(bos_model)
    heldout, sft, training = _three_renderings(_spec(tmp_path, bos_model, ROWS), tok)
    assert heldout == sft == training
    bos = tok.bos_token_id
    assert all(ids[0] == bos and ids[1] != bos for ids in heldout)  # one BOS: the template's
    assert tok.decode(heldout[0]) == ("<s><|im_start|>system\nAnswer with the number.<|im_end|>\n"
                                      "<|im_start|>user\n2+3=<|im_end|>\n<|im_start|>assistant\n")


def test_text_prompts_with_apply_chat_template_are_the_same_ids_everywhere(tmp_path, bos_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(bos_model)
    rows = [{**r, "prompt": r["prompt"][1]["content"]} for r in ROWS]
    heldout, sft, training = _three_renderings(_spec(tmp_path, bos_model, rows, apply_chat_template=True), tok)
    assert heldout == sft == training
    assert tok.decode(heldout[1]) == "<s><|im_start|>user\n10+7=<|im_end|>\n<|im_start|>assistant\n"


def test_heldout_chat_rows_give_the_reward_the_messages_and_text_rows_stay_text(tmp_path, bos_model):
    rows = heldout_rows(_spec(tmp_path, bos_model, ROWS[:1] + [{**ROWS[1], "prompt": "10+7="}]))
    assert rows[0]["prompt"] == ROWS[0]["prompt"] and rows[0]["label"] == "5"
    assert rows[0]["metadata"] == {"data_source": "add"}
    assert rows[1]["input"] == "10+7=" and "input_ids" not in rows[1] and "prompt" not in rows[1]


def test_a_model_without_a_chat_template_is_one_line_naming_the_row(tmp_path, bos_model):
    plain = tmp_path / "plain"
    tok = build_tokenizer()
    tok.chat_template = None
    tok.save_pretrained(plain)
    (tmp_path / "d").mkdir()
    with pytest.raises(ValueError, match=r"^eval.data row 0: the model's tokenizer has no chat template"):
        heldout_rows(_spec(tmp_path / "d", plain, ROWS))
