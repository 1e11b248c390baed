"""examples/recipes/: every recipe file validates as a run spec and derives valid settings for each service it
starts (a recipe that stops validating fails here), the data-prep scripts work on fixtures, the reasoning-gym
reward scores through a real reward service, and the stand-in RM speaks the protocol the `http` scorer calls."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import pytest

from deploy.run.derive import service_config, validate
from deploy.run.load import load_spec
from tests.procs import spawn, stop, wait_http_ok
from tests.reward.conftest import CHILD_ENV, start_reward_service

REPO = Path(__file__).resolve().parents[2]
RECIPES = REPO / "examples" / "recipes"
FIXTURES = Path(__file__).resolve().parent / "fixtures"
RECIPE_FILES = sorted(RECIPES.glob("*.yaml"))


def settings_class(service: str) -> type:
    if service == "learner":
        from services.learner.settings import LearnerSettings

        return LearnerSettings
    if service == "rollout":
        from services.rollout.settings import RolloutSettings

        return RolloutSettings
    from services.reward.settings import RewardSettings

    return RewardSettings


def test_the_recipes_are_there():
    names = {p.stem for p in RECIPE_FILES}
    assert {"reasoning-gym", "gsm8k", "ppo-critic", "remote-rm"} <= names
    for recipe in ("reasoning_gym_tasks", "gsm8k", "ppo_critic", "remote_rm"):
        assert (RECIPES / recipe / "README.md").is_file(), f"{recipe}: a README saying what it needs and reached"


@pytest.mark.parametrize("path", RECIPE_FILES, ids=lambda p: p.name)
def test_recipe_validates_and_derives_every_service(path, tiny_model_dir):
    load_spec(path)  # as written
    # the services check that the model is a checkpoint: the recipes' own (prepared or downloaded) are not here
    spec = load_spec(path, [f"model={tiny_model_dir}"])
    services = ["learner"] + (["rollout"] + (["reward"] if spec.reward.scorers is not None else [])
                              if spec.is_rl else [])
    for service in services:
        validate(settings_class(service), service, service_config(spec, service, path))
    header = path.read_text().splitlines()[0]
    assert header.startswith("# "), "a recipe says what it is (and needs) at the top"


def test_recipes_use_the_algorithms_they_are_named_for():
    assert load_spec(RECIPES / "ppo-critic.yaml").algorithm.name == "ppo"
    scorers = load_spec(RECIPES / "remote-rm.yaml").reward.scorers
    assert [(s.kind, s.protocol) for s in scorers] == [("http", "openrlhf")]
    (rg,) = load_spec(RECIPES / "reasoning-gym.yaml").reward.scorers
    assert rg.kind == "python" and rg.function.endswith("reward:compute_score")


# ---- reasoning-gym ------------------------------------------------------------------------------------------
def _prepared(out: Path, *args: str) -> tuple[list[dict], list[dict]]:
    from examples.recipes.reasoning_gym_tasks import prepare

    assert prepare.main(["--out", str(out), "--train", "60", "--heldout", "10", "--prompt", "short", *args]) == 0
    return _read(out / "data/train.jsonl"), _read(out / "data/heldout.jsonl")


def test_reasoning_gym_prepare_writes_disjoint_splits_scored_by_the_dataset(tmp_path):
    """The recipe's default task: number_sorting, four whole numbers 0-9, the bare `sort <direction> ... =`
    prompt, the dataset's own answer as the warm-up target and its own score_answer as the reward."""
    pytest.importorskip("reasoning_gym")
    from examples.recipes.reasoning_gym_tasks import reward

    train, held = _prepared(tmp_path)
    assert len(train) == 60 and len(held) == 10
    assert not {r["input"] for r in train} & {r["input"] for r in held}, "held-out prompts are not train prompts"
    for row in train + held:
        meta = row["label"]["entry"]["metadata"]
        assert row["label"]["dataset"] == "number_sorting" and meta["numbers"] == 4
        assert row["input"] == f"sort {meta['direction']} {', '.join(meta['original_numbers'])} ="
        assert all(0 <= float(n) <= 9 and n.endswith(".0") for n in meta["original_numbers"])
        assert row["output"] == row["label"]["entry"]["answer"]
        assert reward.compute_score("", row["output"], row["label"], binary=True) == 1.0
    row = next(r for r in held if len(set(r["label"]["entry"]["metadata"]["original_numbers"])) > 1)
    numbers = row["label"]["entry"]["metadata"]["sorted_numbers"]
    assert reward.compute_score("", f"thinking...\n<answer>{row['output']}</answer>", row["label"]) == 1.0
    assert reward.compute_score("", str(numbers[::-1]), row["label"]) == 0.0  # the other direction
    assert reward.compute_score("", ", ".join(numbers), row["label"]) == 0.0  # not the list it asks for
    with pytest.raises(ValueError, match="label must be"):
        reward.compute_score("", row["output"], row["output"])


def test_reasoning_gym_prepare_other_datasets_and_the_tiny_model(tmp_path):
    """--dataset takes its own default sizes (chain_sum: three one-digit terms), --config overrides them, and
    --tiny-model's positions hold the longest prompt with its answer."""
    pytest.importorskip("reasoning_gym")
    import transformers

    from examples.recipes.reasoning_gym_tasks import reward

    train, held = _prepared(tmp_path / "cs", "--dataset", "chain_sum")
    row = held[0]
    assert row["input"].endswith(" =") and row["label"]["dataset"] == "chain_sum"
    assert all(r["label"]["entry"]["metadata"]["num_terms"] == 3 for r in train + held)
    answer = row["output"]
    assert reward.compute_score("", answer, row["label"]) == 1.0
    assert reward.compute_score("", f"{int(answer) + 1}", row["label"]) == 0.0

    train, _ = _prepared(tmp_path / "two", "--dataset", "chain_sum", "--config",
                         '{"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}')
    assert all(r["label"]["entry"]["metadata"]["num_terms"] == 2 for r in train)

    train, held = _prepared(tmp_path / "ns", "--tiny-model", "--hidden-size", "32", "--layers", "1")
    config = transformers.AutoConfig.from_pretrained(tmp_path / "ns/base-model")
    assert (config.hidden_size, config.num_hidden_layers) == (32, 1)
    assert config.max_position_embeddings >= max(len(r["input"]) + len(r["output"]) for r in train + held) + 2


def test_reasoning_gym_binary_reward_takes_away_substring_credit():
    """chain_sum gives 0.5 to "15" when the answer is 5; the recipe's `binary: true` gives it 0."""
    pytest.importorskip("reasoning_gym")
    from examples.recipes.reasoning_gym_tasks import reward

    label = {"dataset": "chain_sum", "entry": {"question": "2 + 3 =", "answer": "5", "metadata": {}}}
    assert reward.compute_score("", "15", label) == 0.5
    assert reward.compute_score("", "15", label, binary=True) == 0.0
    assert reward.compute_score("", "+05", label, binary=True) == 1.0  # the dataset's own equivalence stays
    (scorer,) = load_spec(RECIPES / "reasoning-gym.yaml").reward.scorers
    assert scorer.kwargs == {"binary": True}


@pytest.mark.process
def test_reasoning_gym_reward_through_the_reward_service(tmp_path):
    """The recipe's own reward config, started as the run starts it: the dataset's score_answer decides."""
    pytest.importorskip("reasoning_gym")
    from examples.recipes.reasoning_gym_tasks import prepare

    spec = load_spec(RECIPES / "reasoning-gym.yaml")
    config = service_config(spec, "reward", RECIPES / "reasoning-gym.yaml")
    rows = prepare.rows("chain_sum", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}, 3, 7,
                        "question")
    # the reward service runs from the repository root, as fleetrl run starts it
    server = start_reward_service(tmp_path, {**config, "scorers": [
        {**s, "sys_path": [str(REPO)]} for s in config["scorers"]]})
    try:
        items = [{"prompt": r["input"], "response": r["output"], "label": r["label"]} for r in rows]
        items += [{"prompt": rows[0]["input"], "response": "no idea", "label": rows[0]["label"]},
                  {"prompt": rows[0]["input"], "response": f"1{rows[0]['output']}", "label": rows[0]["label"]}]
        r = httpx.post(f"{server.url}/score", json={"items": items}, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["scores"] == [1.0, 1.0, 1.0, 0.0, 0.0]  # no substring credit (binary: true)
    finally:
        stop(server.proc)


# ---- GSM8K ---------------------------------------------------------------------------------------------------
def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_gsm8k_prepare_on_a_fixture(tmp_path, fmt):
    from examples.recipes.gsm8k import prepare

    source = FIXTURES / "gsm8k_5.jsonl"
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(_read(source)), tmp_path / "gsm8k.parquet")
        source = tmp_path / "gsm8k.parquet"
    assert prepare.main(["--train", str(source), "--test", str(source), "--out", str(tmp_path / "out"),
                         "--max-test", "2"]) == 0
    train, test = _read(tmp_path / "out/data/train.jsonl"), _read(tmp_path / "out/data/test.jsonl")
    assert [r["label"] for r in train] == ["29", "1200", "45", "2.5", "-5"]  # commas gone
    assert len(test) == 2 and test[0]["extra_info"]["split"] == "test"
    first = train[0]
    assert first["input"].startswith("Mia has 3 boxes") and first["input"].endswith(prepare.INSTRUCTION)
    assert first["data_source"] == "openai/gsm8k" and first["extra_info"]["index"] == 0
    assert first["extra_info"]["answer"].endswith("#### 29")


def test_gsm8k_prepare_names_the_row_that_is_not_gsm8k(tmp_path, capsys):
    from examples.recipes.gsm8k import prepare

    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "q", "answer": "42"}) + "\n")
    assert prepare.main(["--train", str(bad), "--test", str(bad), "--out", str(tmp_path)]) == 2
    assert "bad.jsonl row 0" in capsys.readouterr().out and not (tmp_path / "data").exists()


@pytest.mark.process
def test_gsm8k_recipe_reads_what_prepare_writes(tmp_path):
    """The recipe's data keys name fields of the prepared rows, and its math rule scores a worked answer."""
    from examples.recipes.gsm8k import prepare
    from services.learner.data import check_fields

    spec = load_spec(RECIPES / "gsm8k.yaml")
    prepare.main(["--train", str(FIXTURES / "gsm8k_5.jsonl"), "--test", str(FIXTURES / "gsm8k_5.jsonl"),
                  "--out", str(tmp_path)])
    check_fields(_read(tmp_path / "data/train.jsonl"), spec.data)
    server = start_reward_service(tmp_path, service_config(spec, "reward", RECIPES / "gsm8k.yaml"))
    try:
        row = _read(tmp_path / "data/train.jsonl")[1]
        items = [{"prompt": row["input"], "response": "150 * 8 = 1200 rolls.\n#### 1200", "label": row["label"]},
                 {"prompt": row["input"], "response": "#### 1100", "label": row["label"]}]
        assert httpx.post(f"{server.url}/score", json={"items": items}, timeout=30).json()["scores"] == [1.0, 0.0]
    finally:
        stop(server.proc)


# ---- remote reward model --------------------------------------------------------------------------------------
@pytest.mark.process
def test_the_http_scorer_of_the_remote_rm_recipe_scores_through_the_standin_rm(tmp_path):
    from shared.ports import free_port

    port = free_port()
    log = tmp_path / "standin-rm.log"
    rm = spawn(["-m", "examples.recipes.remote_rm.standin_rm", "--port", str(port)], log, CHILD_ENV)
    reward = None
    try:
        rm_url = f"http://127.0.0.1:{port}"
        wait_http_ok(f"{rm_url}/health", rm, timeout=60, log=log)
        bad = httpx.post(f"{rm_url}/get_reward", json={"query": "sort 12=12"}, timeout=10)
        assert bad.status_code == 400 and "query" in bad.json()["error"]

        spec = load_spec(RECIPES / "remote-rm.yaml")
        config = service_config(spec, "reward", RECIPES / "remote-rm.yaml")
        (scorer,) = config["scorers"]
        assert scorer["url"].endswith("/get_reward")
        reward = start_reward_service(tmp_path, {**config, "scorers": [{**scorer, "url": f"{rm_url}/get_reward"}]})
        items = [{"prompt": "sort 3721=", "response": "1237", "label": "1237"},
                 {"prompt": "sort 3721=", "response": "1273", "label": "1237"},
                 {"prompt": "sort 0090=", "response": "0009", "label": None}]
        r = httpx.post(f"{reward.url}/score", json={"items": items}, timeout=30)
        assert r.status_code == 200, r.text
        assert r.json()["scores"] == [1.0, 0.0, 1.0]
        assert r.json()["components"][0] == {"remote_rm": 1.0}
    finally:
        if reward is not None:
            stop(reward.proc)
        stop(rm)


def test_recipe_modules_import_without_side_effects():
    for module in ("examples.recipes.reasoning_gym_tasks.prepare", "examples.recipes.gsm8k.prepare",
                   "examples.recipes.remote_rm.standin_rm"):
        __import__(module)
        assert module in sys.modules
