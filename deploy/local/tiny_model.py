"""Build tiny Hugging Face checkpoints locally (no model hub is reachable here).

``build_tiny_causal_lm(dir)`` writes a Llama-architecture causal LM — ``config.json``,
``model.safetensors``, ``generation_config.json``, ``tokenizer.json``, ``tokenizer_config.json`` with
a chat template — that loads through the same ``AutoModelForCausalLM`` / ``AutoTokenizer`` calls a
real checkpoint uses. ``build_tiny_reward_model(dir)`` writes a sequence-classification model with
one output (an OpenRLHF-style RM shape).

The tokenizer is byte-level BPE with no merges: every byte is a token, so any text round-trips and
nothing is unknown; a few special tokens mark chat turns.
"""

from __future__ import annotations

from pathlib import Path

SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
PAD, BOS, EOS = "<pad>", "<s>", "</s>"

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def build_tokenizer():
    """A byte-level tokenizer (256 byte tokens + specials) as a PreTrainedTokenizerFast."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in sorted(byte_alphabet):
        vocab[ch] = len(vocab)
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(SPECIAL_TOKENS)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        model_max_length=2048,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def save_tokenizer(tok, out: Path) -> None:
    """Save the tokenizer; the chat template also goes into tokenizer_config.json for older loaders."""
    import json

    tok.save_pretrained(out)
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = CHAT_TEMPLATE
    cfg_path.write_text(json.dumps(cfg, indent=2))


def _llama_config(tok, *, hidden_size: int, layers: int, heads: int, max_positions: int, **extra):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 4,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        max_position_embeddings=max_positions,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        **extra,
    )


def build_tiny_causal_lm(
    out_dir: str | Path,
    *,
    hidden_size: int = 64,
    layers: int = 2,
    heads: int = 4,
    max_positions: int = 512,
    seed: int = 0,
    tokenizer=None,
) -> Path:
    """Write a randomly initialised tiny causal LM and its tokenizer (default: the byte-level one of
    :func:`build_tokenizer`) to ``out_dir``."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = tokenizer if tokenizer is not None else build_tokenizer()
    config = _llama_config(tok, hidden_size=hidden_size, layers=layers, heads=heads, max_positions=max_positions)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
    )
    model.save_pretrained(out, safe_serialization=True)
    save_tokenizer(tok, out)
    return out


def build_tiny_reward_model(
    out_dir: str | Path, *, hidden_size: int = 64, layers: int = 2, heads: int = 4, seed: int = 0
) -> Path:
    """Write a tiny sequence-classification reward model (one score head) and its tokenizer."""
    import torch
    from transformers import AutoModelForSequenceClassification

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer()
    config = _llama_config(tok, hidden_size=hidden_size, layers=layers, heads=heads, max_positions=512, num_labels=1)
    torch.manual_seed(seed)
    model = AutoModelForSequenceClassification.from_config(config, dtype=torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    save_tokenizer(tok, out)
    return out
