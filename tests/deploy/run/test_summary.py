"""summary.json is the whole run across resumes: before/after, every held-out point, wall time of all launches,
every health warning; a fresh run starts it over. Exports are per run ({run_name} / {run_dir} in export)."""

from __future__ import annotations

import json

import yaml

from deploy.run.load import load_spec
from deploy.run.summary import build_summary, heldout_points


def test_a_resumed_run_keeps_every_heldout_point_and_adds_its_wall_time(tmp_path):
    log = tmp_path / "eval.jsonl"
    log.write_text("".join(json.dumps({"step": s, "accuracy": a, "weight_version": str(s), "time": 1.0}) + "\n"
                           for s, a in ((0, 0.1), (10, 0.3))))
    common = {"run_name": "r", "total_steps": 20, "weight_version": 10, "last_reward_mean": 0.4, "metrics": "m"}
    first = build_summary(None, steps=10, heldout=heldout_points(log), launch_s=60.04,
                          health={"reward": "reward fell"}, **common)
    with log.open("a") as f:  # the resumed launch appends its points
        f.write(json.dumps({"step": 20, "accuracy": 0.5, "weight_version": "20"}) + "\n")
    second = build_summary(first, steps=20, heldout=heldout_points(log), launch_s=30.0, health={}, **common)
    assert [p["step"] for p in second["heldout"]] == [0, 10, 20]
    assert (second["heldout_before"], second["heldout_after"]) == (0.1, 0.5)
    assert second["wall_time_s"] == 90.0 and second["launches"] == 2
    assert second["health"] == {"reward": "reward fell"}  # said in the first launch, still on record
    fresh = build_summary(None, steps=1, heldout=[], launch_s=5.0, health={}, **common)
    assert fresh["launches"] == 1 and fresh["heldout_before"] is None and fresh["wall_time_s"] == 5.0


def test_export_placeholders_give_each_run_of_a_spec_its_own_export(tmp_path):
    (tmp_path / "m").mkdir()
    spec = {"run_name": "a", "model": "m", "data": {"path": "d.jsonl"}, "algorithm": {"name": "sft"},
            "export": "exports/{run_name}"}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(spec))
    assert load_spec(tmp_path / "run.yaml").export == str(tmp_path / "exports" / "a")
    assert load_spec(tmp_path / "run.yaml", ["run_name=b"]).export == str(tmp_path / "exports" / "b")
    spec.update(export="{run_dir}/export", run_dir="runs/x")
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(spec))
    assert load_spec(tmp_path / "run.yaml").export == str(tmp_path / "runs" / "x" / "export")


def test_an_sft_spec_that_sets_an_rl_step_setting_is_refused_naming_it(tmp_path):
    import pytest

    from deploy.run.load import SpecError

    (tmp_path / "m").mkdir()
    spec = {"run_name": "a", "model": "m", "data": {"path": "d.jsonl"}, "algorithm": {"name": "sft"},
            "train": {"groups_per_step": 4}}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(spec))
    with pytest.raises(SpecError, match=r"train.groups_per_step: an sft run takes algorithm.batch_size pairs"):
        load_spec(tmp_path / "run.yaml")
