import json
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer


def test_tiny_causal_lm_loads_through_auto_classes_and_generates(tiny_model_dir):
    files = {p.name for p in tiny_model_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= files
    assert "chat_template" in json.loads((tiny_model_dir / "tokenizer_config.json").read_text())
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    text = "12+30=éß"
    ids = tok(text, return_tensors="pt")
    assert tok.decode(ids.input_ids[0]) == text, "byte-level tokenizer round-trips any text"
    out = model.generate(**ids, max_new_tokens=6, do_sample=False, pad_token_id=tok.pad_token_id)
    assert out.shape == (1, ids.input_ids.shape[1] + 6)
    with torch.no_grad():  # greedy generate agrees with a forward pass
        logits = model(out[:, :-1]).logits
    assert torch.equal(logits[0, ids.input_ids.shape[1] - 1:].argmax(-1), out[0, ids.input_ids.shape[1]:])


def test_chat_template_renders_generation_prompt(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    text = tok.apply_chat_template([{"role": "user", "content": "2+2?"}], tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
    ids = tok.apply_chat_template([{"role": "user", "content": "x"}], tokenize=True, add_generation_prompt=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    assert tok.convert_tokens_to_ids("<|im_start|>") in ids


def test_tiny_reward_model_scores(tiny_reward_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_reward_model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_reward_model_dir)
    batch = tok(["a", "longer text"], return_tensors="pt", padding=True)
    assert model(**batch).logits.shape == (2, 1)


@pytest.mark.process
def test_cli_tiny_model_writes_a_loadable_checkpoint(tmp_path):
    out = tmp_path / "m"
    r = subprocess.run([sys.executable, "-m", "deploy.cli", "tiny-model", str(out), "--hidden-size", "32",
                        "--layers", "1", "--heads", "2"], capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config.hidden_size == 32 and model.config.num_hidden_layers == 1


@pytest.mark.process
def test_cli_tiny_model_into_a_place_it_cannot_write_is_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")  # a file where the directory's parent should be
    r = subprocess.run([sys.executable, "-m", "deploy.cli", "tiny-model", str(blocker / "m")], capture_output=True,
                       text=True, timeout=120, check=False)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and f"cannot write the model to {blocker / 'm'}" in r.stderr, r.stderr
