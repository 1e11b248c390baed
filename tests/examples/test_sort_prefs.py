"""deploy/local/sort_prefs.py: synthetic pairs, and on-policy pairs built from a policy's own samples (the
``sampled.jsonl`` of ``fleetrl eval --samples``), paired by the sort task's exact rule."""

from __future__ import annotations

import json

import pytest

from deploy.local.sort_prefs import closeness, is_correct, main, policy_pairs, read_samples, same_digits


def _samples(prompt: str, label: str, completions: list[str]) -> list[dict]:
    return [{"prompt": prompt, "completion": c, "label": label, "reward": float(c.strip() == label), "sample": j}
            for j, c in enumerate(completions)]


def test_exact_rule_strips_whitespace_only():
    assert is_correct(" 1237\n", "1237") and not is_correct("1273", "1237") and not is_correct("12377", "1237")


def test_wrong_samples_are_rejected_against_the_policys_right_answer():
    rows = _samples("sort 3721=", "1237", ["1237", "1273", " 1237", "1273", "22222222", "123"])
    pairs = policy_pairs(rows, seed=0, max_per_prompt=8)
    assert sorted(p["rejected"] for p in pairs) == ["123", "1273", "22222222"]  # distinct wrong answers, once each
    assert {p["chosen"] for p in pairs} <= {"1237", " 1237"}  # as the policy wrote them
    assert all(p["chosen_from"] == "policy" and p["label"] == "1237" and p["prompt"] == "sort 3721=" for p in pairs)


def test_the_label_is_chosen_when_the_policy_wrote_no_right_answer_and_all_right_gives_no_pair():
    rows = _samples("sort 3721=", "1237", ["1273", "1111"]) + _samples("sort 0001=", "0001", ["0001", "0001"])
    pairs = policy_pairs(rows, seed=0)
    assert [(p["chosen"], p["chosen_from"]) for p in pairs] == [("1237", "label")] * 2
    assert {p["rejected"] for p in pairs} == {"1273", "1111"}


def test_pairs_per_prompt_are_capped_and_seeded():
    rows = _samples("sort 9876=", "6789", [f"{i:04d}" for i in range(10)])
    assert len(policy_pairs(rows, seed=0, max_per_prompt=3)) == 3
    assert policy_pairs(rows, seed=1, max_per_prompt=3) == policy_pairs(rows, seed=1, max_per_prompt=3)


def test_same_digits_checks_the_digits_not_their_order():
    assert same_digits("", "7321 ", "1237") == 1.0 == same_digits("", "1237", "1237")
    assert same_digits("", "1227", "1237") == 0.0 == same_digits("", "123", "1237") == same_digits("", "12377", "1237")


def test_closeness_counts_digits_in_place_less_the_length_error():
    assert closeness("1236", "1237") == 3 and closeness("7321", "1237") == 0 and closeness(" 123\n", "1237") == 2
    assert closeness("22222222", "1237") == 1 - 4 and closeness("", "1237") == -4


def test_graded_pairs_rank_two_wrong_answers_by_closeness():
    rows = _samples("sort 3721=", "1237", ["1236", "1273", "9999", "1263"])  # closeness 3, 2, 0, 2
    plain = policy_pairs(rows, seed=0, max_per_prompt=8)
    assert all(p["chosen_from"] == "label" for p in plain) and len(plain) == 4
    graded = [p for p in policy_pairs(rows, seed=0, max_per_prompt=8, graded=True) if p["chosen_from"] == "graded"]
    # every strictly ordered pair of distinct wrong answers, nearer one chosen; ties (1273 / 1263) give none
    assert sorted((p["chosen"], p["rejected"]) for p in graded) == [
        ("1236", "1263"), ("1236", "1273"), ("1236", "9999"), ("1263", "9999"), ("1273", "9999")]
    assert len([p for p in policy_pairs(rows, 0, max_per_prompt=2, graded=True) if p["chosen_from"] == "graded"]) == 2


def test_a_prompt_with_two_labels_is_refused():
    rows = _samples("sort 12=", "12", ["21"]) + _samples("sort 12=", "21", ["12"])
    with pytest.raises(ValueError, match="different labels"):
        policy_pairs(rows, seed=0)


def test_samples_of_heldout_prompts_are_refused_for_training(tmp_path):
    path = tmp_path / "sampled.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _samples("sort 3721=", "1237", ["1273"])))
    assert len(read_samples(path, {"sort 0000="})) == 1
    with pytest.raises(ValueError, match="held-out prompt"):
        read_samples(path, {"sort 3721="})
    path.write_text(json.dumps({"prompt": "sort 3721=", "label": "1237"}) + "\n")
    with pytest.raises(ValueError, match="completion"):
        read_samples(path)


def test_main_writes_on_policy_pairs_mixed_with_synthetic(tmp_path):
    from deploy.local.sort_task import make_splits

    (tmp_path / "base-model").mkdir()
    (tmp_path / "base-model" / "config.json").write_text("{}")  # no model built: only the pairs are under test
    train, held = make_splits(0, 200)
    samples = tmp_path / "train-samples.jsonl"
    samples.write_text("".join(json.dumps(r) + "\n" for t in train[:5]
                               for r in _samples(t["input"], t["label"], [t["label"], t["label"][::-1] + "9"])))
    held_samples = tmp_path / "held-samples.jsonl"
    held_samples.write_text("".join(json.dumps(r) + "\n" for r in _samples(held[0]["input"], held[0]["label"], ["x"])))
    assert main([str(tmp_path), "--train-pairs", "10", "--policy-samples", str(samples),
                 "--policy-heldout", str(held_samples), "--synthetic", "7"]) == 0
    rows = [json.loads(line) for line in (tmp_path / "data" / "prefs-policy-train.jsonl").read_text().splitlines()]
    assert len(rows) == 5 + 7 and sum(r.get("chosen_from") == "policy" for r in rows) == 5
    # the samples of a second policy (repeated --policy-samples) add their own pairs
    assert main([str(tmp_path), "--policy-samples", str(samples), "--policy-samples", str(samples)]) == 0
    rows = (tmp_path / "data" / "prefs-policy-train.jsonl").read_text().splitlines()
    assert len(rows) == 2 * 5
    rows = [json.loads(line) for line in (tmp_path / "data" / "prefs-policy-train.jsonl").read_text().splitlines()]
    assert all(r["chosen"] == r["label"] != r["rejected"] for r in rows)
    held_rows = (tmp_path / "data" / "prefs-policy-heldout.jsonl").read_text().splitlines()
    assert [json.loads(x)["rejected"] for x in held_rows] == ["x"]



def test_main_refuses_heldout_samples_in_one_line_before_writing(tmp_path, capsys):
    from deploy.local.sort_task import make_splits

    _, held = make_splits(0, 200)
    held_samples = tmp_path / "held-samples.jsonl"
    held_samples.write_text("".join(json.dumps(r) + "\n" for r in _samples(held[0]["input"], held[0]["label"], ["x"])))
    assert main([str(tmp_path), "--policy-samples", str(held_samples)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "held-out prompt" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "data").exists()
