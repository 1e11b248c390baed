"""verl's data format end to end: a verl row (chat ``prompt``, ``data_source``, nested
``reward_model.ground_truth``, ``extra_info``) read from JSONL and Parquet becomes a PromptTask whose label and
metadata cross the queue codec and the reward service's /score unchanged, and the python scorer calls verl's
``compute_score(data_source, solution_str, ground_truth, extra_info)`` with the row's values, as verl does.
OpenRLHF's keys keep working the same way."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from services.learner.data import DataError, PromptSet
from services.learner.settings import DataSettings, RolloutRequestSettings
from services.reward.app import create_app
from services.reward.settings import RewardSettings
from shared.codec import decode, encode
from shared.reward_api import ScoreItem
from shared.schemas import PromptTask
from tests.learner import verl_reward

VERL_ROWS = [
    {"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": "What is 2+3?"}], "ability": "math",
     "reward_model": {"style": "rule", "ground_truth": "5"}, "extra_info": {"split": "train", "index": 0}},
    {"data_source": "lighteval/MATH", "prompt": [{"role": "user", "content": "What is 4*4?"}], "ability": "math",
     "reward_model": {"style": "rule", "ground_truth": "16"}, "extra_info": {"split": "train", "index": 1}},
]
VERL_KEYS = {"input_key": "prompt", "label_key": "reward_model.ground_truth"}


def write(tmp_path, rows, fmt):
    if fmt == "jsonl":
        path = tmp_path / "data.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return path
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "data.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def score_through_the_reward_service(tasks: list[PromptTask], responses: list[str]) -> list[float]:
    """What a rollout worker does with a task taken from the queue: one ScoreItem per sample with the task's
    label and metadata, POST /score to a reward service with a verl python scorer."""
    settings = RewardSettings(scorers=[{"name": "verl", "kind": "python", "signature": "verl",
                                        "function": "tests.learner.verl_reward:compute_score",
                                        "isolation": "thread"}])  # in this process: the test reads its CALLS
    items = []
    for task, response in zip(tasks, responses):
        task = decode(encode(task), PromptTask)  # as it crosses Redis
        items.append(ScoreItem(prompt=task.prompt, response=response, label=task.label, metadata=task.metadata))
    with TestClient(create_app(settings)) as client:
        r = client.post("/score", json={"items": [i.model_dump(mode="json") for i in items]})
    assert r.status_code == 200, r.text
    return r.json()["scores"]


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_a_verl_row_reaches_compute_score_as_verl_passes_it(tmp_path, fmt):
    data = PromptSet.load(DataSettings(path=str(write(tmp_path, VERL_ROWS, fmt)), shuffle=False, **VERL_KEYS), 0)
    tasks = [data.task(0, i, 0, RolloutRequestSettings(group_size=2)) for i in range(2)]
    assert [t.label for t in tasks] == ["5", "16"]
    assert [m.content for m in tasks[0].prompt] == ["What is 2+3?"]
    verl_reward.CALLS.clear()
    assert score_through_the_reward_service(tasks, ["5", "15"]) == [1.0, 0.0]
    assert verl_reward.CALLS == [
        {"data_source": "openai/gsm8k", "solution_str": "5", "ground_truth": "5",
         "extra_info": {"split": "train", "index": 0}},
        {"data_source": "lighteval/MATH", "solution_str": "15", "ground_truth": "16",
         "extra_info": {"split": "train", "index": 1}},
    ]


def test_openrlhf_keys_keep_working_and_a_row_without_verl_fields_gets_an_empty_extra_info(tmp_path):
    rows = [{"input": "1+1=", "label": "2"}]
    data = PromptSet.load(DataSettings(path=str(write(tmp_path, rows, "jsonl"))), 0)
    task = data.task(0, 0, 0, RolloutRequestSettings(group_size=2))
    assert (task.prompt, task.label) == ("1+1=", "2")
    verl_reward.CALLS.clear()
    assert score_through_the_reward_service([task], ["2"]) == [1.0]
    assert verl_reward.CALLS == [{"data_source": "", "solution_str": "2", "ground_truth": "2", "extra_info": {}}]


def test_a_nested_label_key_naming_no_field_is_an_error_at_start(tmp_path):
    path = write(tmp_path, VERL_ROWS, "jsonl")
    with pytest.raises(DataError, match="data.label_key 'reward_model.answer' names no field of row 0"):
        PromptSet.load(DataSettings(path=str(path), input_key="prompt", label_key="reward_model.answer"), 0)
    with pytest.raises(ValueError, match="learner's own prompt metadata"):
        DataSettings(path=str(path), metadata_keys=["index"])
