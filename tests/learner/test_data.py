"""The prompt set: JSONL / Parquet / saved HF dataset, templates, positions and ids."""

import json

import pytest

from deploy.local.tiny_model import build_tokenizer
from services.learner.data import DataError, PromptSet, item_id, parse_item_id, prompt_ids_of, read_rows
from services.learner.settings import DataSettings, RolloutRequestSettings
from shared.schemas import ChatMessage

ROWS = [{"question": f"what is {i}+{i}?", "answer": str(2 * i), "sol": f"{2 * i}"} for i in range(5)]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_jsonl_and_parquet_read_the_same(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "p.parquet")
    assert read_rows(write_jsonl(tmp_path / "p.jsonl", ROWS)) == read_rows(tmp_path / "p.parquet") == ROWS


def test_saved_hf_dataset_is_optional(tmp_path):
    datasets = pytest.importorskip("datasets")
    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS)}).save_to_disk(str(tmp_path / "ds"))
    assert read_rows(tmp_path / "ds", "train") == ROWS


def test_bad_inputs_name_the_problem(tmp_path):
    (tmp_path / "bad.jsonl").write_text('{"question": "a"}\nnot json\n')
    with pytest.raises(DataError, match="bad.jsonl:2"):
        read_rows(tmp_path / "bad.jsonl")
    with pytest.raises(DataError, match="does not exist"):
        read_rows(tmp_path / "nope.jsonl")
    with pytest.raises(DataError, match="use .jsonl"):
        (tmp_path / "x.csv").write_text("a,b\n")
        read_rows(tmp_path / "x.csv")
    path = write_jsonl(tmp_path / "p.jsonl", ROWS)
    with pytest.raises(DataError, match="data.input_key 'prompt' names no field"):
        PromptSet.load(DataSettings(path=str(path), input_key="prompt", label_key="answer"), seed=0)


def test_a_label_key_naming_no_field_is_an_error_at_start(tmp_path):
    """Not a run whose every label is null: the reward would score every sample against nothing."""
    path = write_jsonl(tmp_path / "p.jsonl", ROWS)
    with pytest.raises(DataError, match=r"data.label_key 'label' names no field of row 0 .*'answer'"):
        PromptSet.load(DataSettings(path=str(path), input_key="question"), seed=0)
    assert PromptSet.load(DataSettings(path=str(path), input_key="question", label_key=None), seed=0).label(ROWS[0]) is None
    sft = PromptSet.load(DataSettings(path=str(path), input_key="question", output_key="answer"), seed=0,
                         need_output=True)  # SFT reads the answer, not the label
    assert len(sft) == 5
    with pytest.raises(DataError, match="data.output_key 'output' names no field"):
        PromptSet.load(DataSettings(path=str(path), input_key="question"), seed=0, need_output=True)


def test_positions_are_stable_permutations(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", ROWS)
    ps = PromptSet.load(DataSettings(path=str(path), input_key="question", label_key="answer"), seed=3)
    again = PromptSet.load(DataSettings(path=str(path), input_key="question", label_key="answer"), seed=3)
    assert sorted(ps.order(0).tolist()) == list(range(5))
    assert ps.order(0).tolist() == again.order(0).tolist() and ps.order(0).tolist() != ps.order(1).tolist()
    unshuffled = PromptSet.load(DataSettings(path=str(path), input_key="question", label_key="answer", shuffle=False),
                                seed=3)
    assert unshuffled.order(4).tolist() == [0, 1, 2, 3, 4]


def test_task_fields_template_and_ids(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", ROWS)
    ps = PromptSet.load(DataSettings(path=str(path), input_key="question", label_key="sol", shuffle=False,
                                     input_template="Q: {}\nA:"), seed=0)
    task = ps.task(1, 2, 0, RolloutRequestSettings(group_size=3, sampling={"temperature": 0.7}))
    assert task.id == "e1-2" and task.prompt == "Q: what is 2+2?\nA:" and task.label == "4" and task.n == 3
    assert task.sampling.temperature == 0.7 and task.metadata == {"epoch": 1, "index": 2, "attempt": 0}
    assert ps.task(1, 2, 3, RolloutRequestSettings()).id == "e1-2-r3"
    assert item_id(0, 7) == "e0-7" and parse_item_id("e0-7") == ("e0-7", 0)
    assert parse_item_id("e12-7-r2") == ("e12-7", 2)
    for foreign in ("prompt-1", "e1", "e1-x", "ex-1", "e1-2-3", "e1-2-rx"):
        assert parse_item_id(foreign) is None


def test_chat_template_and_chat_messages(tmp_path):
    tok = build_tokenizer()
    path = write_jsonl(tmp_path / "p.jsonl", [{"input": "hi"}, {"input": [{"role": "user", "content": "yo"}]}])
    templ = PromptSet.load(DataSettings(path=str(path), label_key=None, apply_chat_template=True, shuffle=False), 0,
                           tok)
    # a text prompt becomes one user turn; the rollout fleet renders it with the model's template
    assert templ.render_prompt(templ.rows[0]) == [ChatMessage(role="user", content="hi")]
    assert templ.render_prompt(templ.rows[1]) == [ChatMessage(role="user", content="yo")]
    assert tok.decode(prompt_ids_of(tok, templ.render_prompt(templ.rows[0]))) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    plain = PromptSet.load(DataSettings(path=str(path), label_key=None, shuffle=False), 0, tok)
    assert plain.render_prompt(plain.rows[1]) == [ChatMessage(role="user", content="yo")]


def test_sft_pair_tokenises_answer_with_eos(tmp_path):
    tok = build_tokenizer()
    path = write_jsonl(tmp_path / "p.jsonl", ROWS)
    ps = PromptSet.load(DataSettings(path=str(path), input_key="question", output_key="answer", shuffle=False),
                        0, tok, need_output=True)
    prompt, answer = ps.sft_pair(0, 3)
    assert tok.decode(prompt) == "what is 3+3?" and tok.decode(answer[:-1]) == "6" and answer[-1] == tok.eos_token_id
