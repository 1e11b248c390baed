"""What the model writes, where a user looks: the display's headline carries the mean completion length and the
share that hit max_new_tokens, and one sample from the learner's samples.jsonl; ``fleetrl eval --show N`` prints
answers with their reward and length."""

from __future__ import annotations

import io
import json

from deploy.run.cli import show_answer
from deploy.run.display import LineDisplay, headline
from deploy.run.progress import RunView, SampleTail, sample_line

ROW = {"step": 40, "prompt_text": "sort 3102=", "response_text": "0123 0123 0123", "reward": 0.25,
       "finish_reason": "length", "response_tokens": 16}


def test_the_headline_shows_completion_length_and_the_share_at_the_limit():
    view = RunView("r", step=40, total=100, reward=0.25, weight_version=40, lengths=(15.6, 0.75))
    assert "  len 16 (75% at max)" in headline(view)
    view.lengths = (5.0, 0.0)
    assert "  len 5  " in headline(view) + "  " and "at max" not in headline(view)


def test_a_logged_sample_is_one_line_and_the_display_prints_each_new_one_once(tmp_path):
    assert sample_line(ROW) == ("step 40: 'sort 3102=' -> '0123 0123 0123' (reward 0.25, 16 tokens, hit "
                                "max_new_tokens)")
    assert sample_line({**ROW, "response_text": "y" * 200}, width=20).count("...") == 1
    path = tmp_path / "samples.jsonl"
    tail = SampleTail(path)
    assert tail.latest() is None  # no file yet
    path.write_text(json.dumps({**ROW, "step": 10}) + "\n" + json.dumps(ROW) + "\n")
    assert tail.latest().startswith("step 40: ")
    out = io.StringIO()
    display = LineDisplay(stream=out)
    view = RunView("r", sample=tail.latest())
    display.update(view)
    display.update(view)
    assert out.getvalue().count("sample step 40: 'sort 3102='") == 1


def test_eval_show_prints_prompt_completion_reward_and_length():
    text = show_answer({"prompt": "sort 3102=", "completion": "0123", "label": "0123", "reward": 1.0, "tokens": 5,
                        "hit_max_new_tokens": False})
    assert text == "--- reward 1.000, 5 tokens, label '0123'\nprompt:     'sort 3102='\ncompletion: '0123'"
    failed = show_answer({"prompt": "p", "completion": "c" * 9, "reward": None, "tokens": 8,
                          "hit_max_new_tokens": True})
    assert failed.startswith("--- reward failed, 8 tokens (hit max_new_tokens)")
