"""Preference pairs in the layouts users have: OpenRLHF / TRL columns (text), chat-message lists per side, JSONL
and Parquet; bad rows are one error naming the row and the setting; the RM text is the hf_rm scorer's."""

from __future__ import annotations

import json

import pytest

from services.learner.data import DataError
from services.learner.preference_data import PairSet, read_pairs, render_text_prompt, rm_text
from services.learner.settings import DataSettings
from shared.schemas import ChatMessage


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_columns_with_a_prompt_jsonl_and_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"prompt": "sort 31=", "chosen": "13", "rejected": "31", "m": 0.5}]
    s = DataSettings(path="x", input_key="prompt")
    (pair,) = read_pairs(_jsonl(tmp_path / "p.jsonl", rows), s, margin_key="m")
    assert (pair.prompt, pair.chosen, pair.rejected, pair.margin) == ("sort 31=", "13", "31", 0.5)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "p.parquet")
    assert read_pairs(str(tmp_path / "p.parquet"), s, margin_key="m") == [pair]


def test_chat_lists_per_side_take_the_prompt_from_the_shared_turns(tmp_path):
    turns = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    rows = [{"chosen": turns + [{"role": "assistant", "content": "4"}],
             "rejected": turns + [{"role": "assistant", "content": "5"}]}]
    (pair,) = read_pairs(_jsonl(tmp_path / "c.jsonl", rows), DataSettings(path="x"))
    assert pair.prompt == [ChatMessage(**t) for t in turns] and (pair.chosen, pair.rejected) == ("4", "5")


def test_answer_only_chat_sides_and_whole_texts(tmp_path):
    rows = [{"q": "hi", "good": [{"role": "assistant", "content": "hello"}],
             "bad": [{"role": "assistant", "content": "go"}]}]
    s = DataSettings(path="x", input_key="q", chosen_key="good", rejected_key="bad")
    (pair,) = read_pairs(_jsonl(tmp_path / "a.jsonl", rows), s)
    assert (pair.prompt, pair.chosen, pair.rejected) == ("hi", "hello", "go")
    (whole,) = read_pairs(_jsonl(tmp_path / "w.jsonl", [{"chosen": "a b", "rejected": "b a"}]), DataSettings(path="x"))
    assert whole.prompt == ""  # no prompt field: whole texts


@pytest.mark.parametrize("row, message", [
    ({"prompt": "p", "chosen": "a"}, "'rejected' names no field of row 0"),
    ({"chosen": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "rejected": "b"},
     "one side is chat messages and the other is not"),
    ({"chosen": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
      "rejected": [{"role": "user", "content": "other"}, {"role": "assistant", "content": "b"}]},
     "the messages before the answers differ"),
    ({"chosen": [{"role": "user", "content": "q"}], "rejected": [{"role": "user", "content": "q"}]},
     "last message must be the assistant's answer"),
])
def test_bad_rows_name_the_row_and_what_to_fix(tmp_path, row, message):
    with pytest.raises(DataError, match=message):
        read_pairs(_jsonl(tmp_path / "bad.jsonl", [row]), DataSettings(path="x"))


def test_pair_set_order_is_seeded_and_stable(tmp_path):
    rows = [{"prompt": str(i), "chosen": "a", "rejected": "b"} for i in range(10)]
    s = DataSettings(path=_jsonl(tmp_path / "p.jsonl", rows), input_key="prompt")
    a, b = PairSet.load_pairs(s, seed=3), PairSet.load_pairs(s, seed=3)
    assert [a.pair(1, i).prompt for i in range(10)] == [b.pair(1, i).prompt for i in range(10)]
    assert sorted(a.pair(0, i).prompt for i in range(10)) == [str(i) for i in range(10)]


class _Tok:
    chat_template = None
    eos_token, pad_token = "</s>", "<pad>"


def test_rm_text_is_the_scorers_rule():
    assert rm_text(_Tok(), "sort 31=", "13") == "sort 31=13</s>"
    assert rm_text(_Tok(), "p", "a</s><pad>") == "pa</s>"  # trailing specials stripped, one eos
    msgs = [ChatMessage(role="user", content="q")]
    assert rm_text(_Tok(), msgs, "a", append_eos=False) == render_text_prompt(msgs) + "a"
    assert render_text_prompt(msgs) == "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n"
