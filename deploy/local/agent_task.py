"""The agent demo's task: arithmetic too large for a tiny model, solved by calling a ``calculator`` tool.

A question ``What is 482*739?`` (sums and products of 2- and 3-digit numbers). The model may call the
calculator environment's tool (``services/rollout/agents/envs/calculator.py``) in the hermes format, read the
``tool`` message that carries the result, and answer ``The answer is <result>``; the reward service checks the last
number of the answer against the label. A tiny model cannot multiply 3-digit numbers, so success without the
tool is ~0: what it can learn is the call format, to copy the operands into it, to copy the result, and to call
the tool at all.

The SFT data mixes two kinds of transcripts (``direct``, default :data:`DIRECT`): tool use (:func:`transcript`)
and answers without the tool (:func:`direct_transcript`, the label's digits not trained). The warm-up thus
teaches both the skill and the habit of not using it; greedy, the warmed-up model answers directly and is
wrong, and what RL has to learn is the decision to call the tool.

The SFT transcripts are written in exactly the token format the ``multi_turn`` rollout produces: the prompt
the chat template renders (with the tool declared), the model's turn ``<tool_call>{...}</tool_call><|im_end|>``,
the template's turn glue and its delta for the ``tool`` message (ending with the next assistant header),
then the answer and ``<|im_end|>`` (:func:`transcript`, checked against ``ChatTokens`` in the tests).
Train, SFT and held-out questions are disjoint.

The model's tokenizer is byte-level BPE trained on the task's transcripts (:func:`build_task_tokenizer`), as a
real model's tokenizer is trained on text like it: the tool-call boilerplate becomes a few tokens instead of
~70 bytes, while digits stay one token each (split before BPE), so numbers are read and copied digit by digit.
Merges never cross a special token nor the start of a model turn, so the transcripts tokenise exactly as the
rollout's ids grow (the test checks it).
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

from services.rollout.agents.envs.calculator import CALCULATOR, calculator
from services.rollout.agents.tool_calls import ToolCall, render_hermes

OPS = ("+", "*")
END = "<|im_end|>"
ANSWER = "The answer is "
"""How every answer turn starts, after the tool's result or without one."""
DIRECT = 0.6
"""The demo's share of SFT transcripts that answer without the tool (:func:`direct_transcript`)."""


def question(a: int, op: str, b: int) -> dict[str, str]:
    expression = f"{a}{op}{b}"
    return {"input": f"What is {expression}?", "expression": expression, "label": calculator(expression)}


def make_questions(n: int, seed: int, digits: tuple[int, int] = (2, 3)) -> list[dict[str, str]]:
    """``n`` distinct questions (operands of ``digits[0]`` to ``digits[1]`` digits, ``+`` or ``*``)."""
    rng = random.Random(seed)
    lo, hi = 10 ** (digits[0] - 1), 10 ** digits[1] - 1
    seen: set[str] = set()
    out = []
    while len(out) < n:
        q = question(rng.randint(lo, hi), rng.choice(OPS), rng.randint(lo, hi))
        if q["expression"] not in seen:
            seen.add(q["expression"])
            out.append(q)
    return out


def transcript(tokenizer, row: dict[str, str]) -> dict:
    """One SFT pair: ``input`` the rendered first prompt (tool declared), ``output`` everything after it up to the
    answer's end of turn as segments ``{"text", "train"}``, in the exact tokens a ``multi_turn`` rollout of the
    calculator environment produces: the model's call turn, the template's turn glue and its delta for the
    ``tool`` message (``train: false``: context, as RL masks it — the result is not the model's to predict, and
    training on it drowns the copying the model has to learn), the answer turn. The learner tokenises each
    segment on its own, as the rollout's ids grow."""
    from services.rollout.chat_tokens import ChatTokens

    chat = ChatTokens(tokenizer, tools=[CALCULATOR.schema()])
    prompt = tokenizer.decode(chat.prompt([{"role": "user", "content": row["input"]}]), skip_special_tokens=False)
    call = render_hermes([ToolCall("calculator", {"expression": row["expression"]})])
    glue = tokenizer.decode(chat.glue, skip_special_tokens=False)
    tool = tokenizer.decode(chat.delta([{"role": "tool", "name": "calculator", "content": row["label"]}]),
                            skip_special_tokens=False)
    return {"input": prompt, "output": [{"text": f"{call}{END}", "train": True},
                                        {"text": f"{glue}{tool}", "train": False},
                                        {"text": f"{ANSWER}{row['label']}{END}", "train": True}]}


def direct_transcript(tokenizer, row: dict[str, str]) -> dict:
    """One SFT pair that answers without the tool: the rendered first prompt (tool declared), then
    ``The answer is <label>`` and ``<|im_end|>`` as the model's only turn. A tiny model cannot compute the label
    itself, so what these teach is the *choice* to answer directly (its first token, against the call's
    ``<tool_call>``) and to end the turn; the label's digits are not trained (``train: false``): noise to a
    model that cannot compute them, they slowed the copying the tool transcripts teach. Mixed with
    :func:`transcript` they leave RL the decision to call the tool."""
    from services.rollout.chat_tokens import ChatTokens

    chat = ChatTokens(tokenizer, tools=[CALCULATOR.schema()])
    prompt = tokenizer.decode(chat.prompt([{"role": "user", "content": row["input"]}]), skip_special_tokens=False)
    return {"input": prompt, "output": [{"text": ANSWER, "train": True},
                                        {"text": row["label"], "train": False},
                                        {"text": END, "train": True}]}


def transcript_text(row: dict) -> str:
    """The whole text of a transcript's output segments."""
    return "".join(seg["text"] for seg in row["output"])


def build_task_tokenizer(texts: list[str], merges: int = 128):
    """A byte-level BPE tokenizer (the tiny model's special tokens and chat template) with ``merges`` merges
    learned from ``texts``; digits are split one per token before BPE."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from deploy.local.tiny_model import BOS, CHAT_TEMPLATE, EOS, PAD, SPECIAL_TOKENS

    split = re.compile("|".join(re.escape(t) for t in SPECIAL_TOKENS))
    pieces = [p for text in texts for p in split.split(text) if p]
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                  pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    core.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    core.train_from_iterator(pieces, trainers.BpeTrainer(
        vocab_size=len(SPECIAL_TOKENS) + len(alphabet) + merges, special_tokens=SPECIAL_TOKENS,
        initial_alphabet=alphabet, min_frequency=max(2, len(texts) // 20), show_progress=False))
    tok = PreTrainedTokenizerFast(tokenizer_object=core, bos_token=BOS, eos_token=EOS, pad_token=PAD,
                                  model_max_length=2048, padding_side="left", clean_up_tokenization_spaces=False)
    tok.chat_template = CHAT_TEMPLATE
    return tok


def write_jsonl(rows: list[dict], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def prepare_run(run_dir: Path, *, seed: int = 0, train: int = 4000, sft: int = 1000, heldout: int = 200,
                hidden_size: int = 128, layers: int = 2, digits: tuple[int, int] = (2, 3),
                direct: float = DIRECT) -> dict[str, Path]:
    """Under ``run_dir``: ``data/train.jsonl`` (RL prompts and labels), ``data/sft.jsonl`` (tool-use transcripts,
    a ``direct`` fraction of them answering without the tool), ``data/heldout.jsonl`` and a fresh tiny model
    ``base-model``."""
    from deploy.local.tiny_model import build_tiny_causal_lm, build_tokenizer

    rows = make_questions(train + sft + heldout, seed, digits)
    held, sft_rows, rl_rows = rows[:heldout], rows[heldout:heldout + sft], rows[heldout + sft:]
    base_tok = build_tokenizer()  # the text does not depend on the tokenizer
    n_direct = round(direct * len(sft_rows))
    mix = set(random.Random(seed + 1).sample(range(len(sft_rows)), n_direct))
    transcripts = [direct_transcript(base_tok, r) if i in mix else transcript(base_tok, r)
                   for i, r in enumerate(sft_rows)]
    tok = build_task_tokenizer([text for t in transcripts for text in (t["input"], transcript_text(t))])
    out = {
        "train": write_jsonl([{"input": r["input"], "label": r["label"]} for r in rl_rows],
                             run_dir / "data" / "train.jsonl"),
        "sft": write_jsonl(transcripts, run_dir / "data" / "sft.jsonl"),
        "heldout": write_jsonl([{"input": r["input"], "label": r["label"]} for r in held],
                               run_dir / "data" / "heldout.jsonl"),
    }
    out["model"] = build_tiny_causal_lm(run_dir / "base-model", hidden_size=hidden_size, layers=layers, heads=4,
                                        max_positions=512, seed=seed, tokenizer=tok)
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m deploy.local.agent_task DIR``: the data and base model examples/agent-calculator/ expects."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m deploy.local.agent_task", description=main.__doc__)
    ap.add_argument("dir", type=Path, help="where data/ and base-model/ go (e.g. examples/agent-calculator)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sft", type=int, default=1000, help="SFT transcripts")
    ap.add_argument("--heldout", type=int, default=200)
    ap.add_argument("--direct", type=float, default=DIRECT, help="share of SFT transcripts answering without the tool")
    args = ap.parse_args(argv)
    if not 0.0 <= args.direct < 1.0:
        ap.error(f"--direct must be in [0, 1), got {args.direct}")
    out = prepare_run(args.dir, seed=args.seed, sft=args.sft, heldout=args.heldout, direct=args.direct)
    print(f"wrote {out['train']}, {out['sft']}, {out['heldout']} and the model {out['model']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
