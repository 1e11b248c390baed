"""examples/minmax-digits/: the second CPU recipe (issue 27). Its specs validate and derive every service's settings,
its data prep writes disjoint, correctly labelled verl rows, its reward beside the spec scores them, and the
preparation commands in the spec's header are the README's. What it reached is in its README (a run, not a test)."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from deploy.run.derive import service_config, validate
from deploy.run.load import load_spec
from tests.examples.test_recipes import settings_class

RECIPE = Path(__file__).resolve().parents[2] / "examples" / "minmax-digits"


def module(name: str):
    spec = importlib.util.spec_from_file_location(f"minmax_{name}", RECIPE / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_prepare_writes_disjoint_labelled_verl_rows(tmp_path):
    assert module("prepare").main(["--out", str(tmp_path), "--train", "300", "--heldout", "40", "--seed", "3"]) == 0
    train, held = rows(tmp_path / "data/train.jsonl"), rows(tmp_path / "data/heldout.jsonl")
    assert len(train) == 300 and len(held) == 40
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in held}
    for r in train + held:
        digits = re.fullmatch(r"minmax (\d{6})=", r["prompt"]).group(1)
        assert r["reward_model"]["ground_truth"] == min(digits) + max(digits)
        assert r["data_source"] == "minmax-digits" and r["extra_info"]["split"] in ("train", "heldout")
    again = tmp_path / "again"
    module("prepare").main(["--out", str(again), "--train", "300", "--heldout", "40", "--seed", "3"])
    assert (again / "data/train.jsonl").read_text() == (tmp_path / "data/train.jsonl").read_text()  # reproducible


def test_prepare_refuses_more_rows_than_there_are(tmp_path, capsys):
    with pytest.raises(SystemExit):
        module("prepare").main(["--out", str(tmp_path), "--train", "1000000", "--heldout", "1"])
    assert "--train and --heldout" in capsys.readouterr().err


def test_the_reward_beside_the_spec_scores_exact_answers():
    score = module("reward").compute_score
    assert score("minmax-digits", "19", "19") == 1.0 and score("minmax-digits", " 19\n", "19") == 1.0
    assert score("minmax-digits", "91", "19") == 0.0 and score("minmax-digits", "1", "19") == 0.0


@pytest.mark.parametrize("name", ["sft.yaml", "fleetrl.yaml"])
def test_the_specs_validate_and_derive_every_service(name, tmp_path, tiny_model_dir):
    module("prepare").main(["--out", str(tmp_path), "--train", "50", "--heldout", "10"])
    path = RECIPE / name
    load_spec(path)  # as written
    sets = [f"model={tiny_model_dir}", f"data.path={tmp_path / 'data/train.jsonl'}"]
    if name == "fleetrl.yaml":
        sets.append(f"eval.data={tmp_path / 'data/heldout.jsonl'}")
    spec = load_spec(path, sets)
    services = ["learner", "rollout", "reward"] if spec.is_rl else ["learner"]
    for service in services:
        validate(settings_class(service), service, service_config(spec, service, path))
    if spec.is_rl:
        (scorer,) = spec.reward.scorers
        assert scorer.kind == "python" and scorer.sys_path == [str(RECIPE)]  # the module beside the spec


def test_the_header_and_the_readme_give_the_same_commands():
    readme = (RECIPE / "README.md").read_text()
    header = [line for line in (RECIPE / "fleetrl.yaml").read_text().splitlines() if line.startswith("#   ")]
    commands = [line[4:].split("  #")[0].strip() for line in header]
    assert len(commands) == 4
    for command in commands:
        assert command in readme, command
