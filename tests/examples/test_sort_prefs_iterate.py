"""examples/sort-prefs/iterate.py (issue 39, iterated RM): the overrides it passes to grpo-rm.yaml and
rm-policy.yaml validate and land where the round needs them, it reads the RM run's held-out pairwise accuracy from
the learner's line, and it refuses to start without its inputs. What it reached is in docs/recipes.md (a run)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from deploy.run.load import load_spec

RECIPE = Path(__file__).resolve().parents[2] / "examples" / "sort-prefs"


def iterate():
    spec = importlib.util.spec_from_file_location("sort_prefs_iterate", RECIPE / "iterate.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_grpo_round_starts_from_the_last_policy_scored_by_the_rounds_rm(tiny_model_dir):
    mod = iterate()
    sets = mod.grpo_sets(str(tiny_model_dir), str(tiny_model_dir), 25, "iter-grpo-r2-model", "sort-prefs-iter-grpo-r2",
                         ["algorithm.kl.coef=0.3"])
    spec = load_spec(RECIPE / "grpo-rm.yaml", sets)
    assert spec.train.max_steps == 25 and spec.export.endswith("iter-grpo-r2-model")
    assert spec.run_name == "sort-prefs-iter-grpo-r2" and spec.eval.data is None
    assert spec.algorithm.kl.coef == 0.3  # the user's --grpo-set comes last and wins
    rm, fmt = spec.reward.scorers
    assert rm.kind == "hf_rm" and str(rm.model).endswith(str(tiny_model_dir)) and fmt.name == "format"


def test_the_rm_retrains_from_its_trunk(tiny_model_dir):
    mod = iterate()
    spec = load_spec(RECIPE / "rm-policy.yaml", mod.rm_sets(str(tiny_model_dir), 400, "iter-rm-r1-model",
                                                           "sort-prefs-iter-rm-r1", []))
    assert spec.algorithm.name == "rm" and spec.algorithm.max_steps == 400
    assert spec.export.endswith("iter-rm-r1-model") and spec.run_name == "sort-prefs-iter-rm-r1"


def test_rm_accuracy_is_read_from_the_learners_line_and_missing_is_an_error():
    mod = iterate()
    out = ("[fleetrl 00:45:44] step 300/300 ...\n[fleetrl 00:45:44] held-out pairwise accuracy: 47.8% (start) -> "
           "96.5% (end)   mean margin 0.005 -> 9.507   (452 pairs, steps 0 -> 300)\n")
    assert mod.rm_accuracy(out) == pytest.approx((0.478, 0.965))
    with pytest.raises(ValueError, match="held-out pairwise accuracy"):
        mod.rm_accuracy("[fleetrl] learner failed\n")


def test_held_out_samples_of_every_policy_are_kept_in_order(tmp_path):
    mod = iterate()
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text('{"x": 1}\n')
    b.write_text('{"x": 2}\n{"x": 3}\n')
    assert mod.concat_jsonl([a, b], tmp_path / "all.jsonl").read_text() == '{"x": 1}\n{"x": 2}\n{"x": 3}\n'


def test_it_refuses_to_start_without_the_start_policy(capsys):
    assert iterate().main(["--start", "no-such-model", "--rounds", "1"]) == 2
    assert "no-such-model" in capsys.readouterr().err
