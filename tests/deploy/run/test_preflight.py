"""Every path of a spec resolves against the spec file's directory (a reward module beside the spec included),
``--model`` against the current directory, and all of it — reward functions imported — is checked before
anything starts, one line per problem naming the setting."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from deploy.local.fleet import FleetError
from deploy.run.load import load_spec
from deploy.run.preflight import import_problems, local_model, path_problems
from deploy.run.progress import fleet_error_line

REWARD = '''def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(solution_str.strip() == str(ground_truth))
'''


def spec_with_reward(tmp_path: Path, model: Path, **scorer) -> Path:
    (tmp_path / "train.jsonl").write_text('{"input": "1+1=", "label": "2"}\n')
    spec = {"run_name": "add", "model": str(model), "data": {"path": "train.jsonl"},
            "reward": {"scorers": [{"name": "add", "kind": "python", "function": "add_reward:compute_score",
                                    "signature": "verl", **scorer}]}}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(spec))
    return tmp_path / "run.yaml"


@pytest.mark.process
def test_a_reward_file_beside_the_spec_imports_with_sys_path_dot_or_none(tmp_path, tiny_model_dir, monkeypatch):
    (tmp_path / "add_reward.py").write_text(REWARD)
    monkeypatch.chdir(tiny_model_dir)  # not the spec's directory: paths are the spec file's, not the shell's
    for scorer in ({"sys_path": ["."]}, {}):
        file = spec_with_reward(tmp_path, tiny_model_dir, **scorer)
        spec = load_spec(file)
        assert spec.reward.scorers[0].sys_path == [str(tmp_path)]
        assert path_problems(spec, file) == [] and import_problems(spec, file) == []


@pytest.mark.process
def test_a_reward_module_that_does_not_import_is_one_line_naming_the_setting(tmp_path, tiny_model_dir):
    file = spec_with_reward(tmp_path, tiny_model_dir)
    spec = load_spec(file)
    (problem,) = import_problems(spec, file)
    assert problem.startswith(f"{file}: reward.scorers[0].function 'add_reward:compute_score': ")
    assert "cannot import module 'add_reward'" in problem
    (tmp_path / "add_reward.py").write_text("def compute_score(x):\n    return 0.0\n")  # the wrong signature
    (problem,) = import_problems(spec, file)
    assert "reward.scorers[0].function" in problem and "\n" not in problem


def test_missing_paths_are_named_with_the_setting_and_where_relative_paths_point(tmp_path, tiny_model_dir):
    file = spec_with_reward(tmp_path, tmp_path / "sft-model", sys_path=["lib"])
    raw = yaml.safe_load(file.read_text())
    raw["model"] = "sft-model"
    raw["eval"] = {"data": "heldout.jsonl"}
    file.write_text(yaml.safe_dump(raw))
    problems = path_problems(load_spec(file), file)
    rel = f"(relative paths in a spec are relative to its directory, {tmp_path})"
    assert problems == [
        f"{file}: model: no model directory at {tmp_path / 'sft-model'} {rel}",
        f"{file}: eval.data: {tmp_path / 'heldout.jsonl'} does not exist {rel}",
        f"{file}: reward.scorers[0].sys_path[0]: no directory at {tmp_path / 'lib'} {rel}",
    ]


def test_command_line_model_is_relative_to_the_current_directory_not_a_hub_id(tmp_path, monkeypatch):
    (tmp_path / "sft-model").mkdir()
    monkeypatch.chdir(tmp_path)
    assert local_model("sft-model", "--model") == str(tmp_path / "sft-model")
    assert local_model("./sft-model", "--model") == str(tmp_path / "sft-model")
    assert local_model("Qwen/Qwen2.5-0.5B", "--model") == "Qwen/Qwen2.5-0.5B"  # only a hub id can be that
    with pytest.raises(ValueError, match=r"^--model out/sft/: no model directory at .*/out/sft \(a relative path"):
        local_model("out/sft/", "--model")


def test_a_service_that_failed_to_start_is_one_line_with_its_reason_and_log(tmp_path):
    tail = ("INFO starting\nTraceback (most recent call last):\n  File \"x.py\", line 1\n"
            "OSError: sft-model is not a local folder and is not a valid model identifier\n")
    line = fleet_error_line(FleetError(f"rollout-0 exited with code 3 while starting:\n{tail}"), tmp_path / "logs")
    assert line == ("rollout-0 exited with code 3 while starting: OSError: sft-model is not a local folder and is "
                    f"not a valid model identifier (its log: {tmp_path / 'logs' / 'rollout-0.log'})")
    empty = fleet_error_line(FleetError("reward-0 exited with code 1 while starting:\n"), tmp_path)
    assert empty == f"reward-0 exited with code 1 while starting: (its log is empty) (its log: {tmp_path / 'reward-0.log'})"


@pytest.mark.process
def test_fleetrl_run_names_the_specs_model_when_it_is_missing_or_not_a_checkpoint(tmp_path, tiny_model_dir):
    """An RL spec's missing model was refused as `rollout settings: model: model '...': no Hugging Face checkpoint
    there`, a setting the user never wrote; an SFT spec with an empty model directory started the learner, which
    died 8 s later. Both are the spec's `model:` now, before anything starts, RL and SFT alike."""
    import subprocess
    import sys

    from tests.deploy.run.conftest import tiny_spec
    from tests.procs import REPO

    (tmp_path / "empty-model").mkdir()
    rel = f"(relative paths in a spec are relative to its directory, {tmp_path})"
    not_hf = f"model: {tmp_path / 'empty-model'} is not a Hugging Face model directory (no config.json in it)"
    rl = tiny_spec(tmp_path, tmp_path / "sft-model")
    sft = tmp_path / "sft.yaml"
    sft.write_text(yaml.safe_dump({"run_name": "sft", "run_dir": "sft-run", "model": "empty-model",
                                   "data": {"path": "train.jsonl", "input_key": "input", "output_key": "label"},
                                   "algorithm": {"name": "sft", "batch_size": 4}}))
    for file, sets, want in ((rl, [], f"model: no model directory at {tmp_path / 'sft-model'} {rel}"),
                             (rl, ["--set", "model=empty-model"], not_hf), (sft, [], not_hf)):
        out = subprocess.run([sys.executable, "-m", "deploy.cli", "run", str(file), "--lines", *sets], cwd=REPO,
                             capture_output=True, text=True, timeout=120, check=False)
        lines = [line.split("] ", 1)[-1] for line in (out.stdout + out.stderr).splitlines() if line.strip()]
        assert (out.returncode, lines) == (1, [f"error: {file}: {want}"]), out.stdout + out.stderr
        for run_dir in ("run", "sft-run"):  # nothing started
            assert not any((tmp_path / run_dir / "logs" / f"{name}.log").exists() for name in ("learner", "rollout-0"))


@pytest.mark.process
def test_an_external_redis_that_does_not_answer_or_refuses_the_password_is_one_line_naming_redis_url(
        tmp_path, tiny_model_dir, redis_server):
    """`redis: {url: ...}` at a Redis that is down (or with a wrong password) was a redis-py traceback out of
    `fleetrl run` (its first read of the run's keys); a URL without redis:// was named as the rollout's
    redis_url. Each is one line naming the spec's redis.url now, before any service starts."""
    import subprocess
    import sys

    from deploy.run.preflight import redis_problem
    from shared.ports import free_port
    from tests.deploy.run.conftest import tiny_spec
    from tests.procs import REPO

    dead = f"redis://127.0.0.1:{free_port()}/0"
    wrong = redis_server.url.replace(f":{redis_server.password}@", ":not-the-password@")
    assert redis_problem(redis_server.url) is None
    assert redis_problem(wrong).startswith(f"redis.url {redis_server.display_url}: Redis refused the credentials (")
    file = tiny_spec(tmp_path, tiny_model_dir)
    for url, code, want in ((dead, 1, (f"error: redis.url {dead}: cannot connect (Connection refused); start that "
                                      "Redis, or leave redis.url unset for an embedded one under run_dir")),
                            ("localhost:6379", 2, ("error: --set redis.url: redis.url: 'localhost:6379' is not a "
                                                  "Redis URL: use redis://[:password@]host:port/db, rediss://... "
                                                  "for TLS, or unix:///path/to/socket"))):
        out = subprocess.run([sys.executable, "-m", "deploy.cli", "run", str(file), "--lines", "--set",
                              f"redis.url={url}"], cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
        lines = [line.split("] ", 1)[-1] for line in (out.stdout + out.stderr).splitlines() if line.strip()]
        assert (out.returncode, lines) == (code, [want]), out.stdout + out.stderr


def test_max_new_tokens_past_the_models_context_is_refused_naming_where_the_context_comes_from(tmp_path,
                                                                                                tiny_model_dir):
    """`sampling.max_new_tokens: 100` on a 64-token model trained (the workers cut each answer to the room left)
    while every held-out pass was refused with a 400, the whole run long; it is one line before anything starts."""
    from deploy.run.preflight import context_problem

    spec = load_spec(tiny_spec_with(tmp_path, tiny_model_dir), ["sampling.max_new_tokens=512"])
    assert context_problem(spec, {}) == (
        "sampling.max_new_tokens 512 leaves no room for a prompt in the model's context of 512 tokens "
        "(max_position_embeddings in the model's config.json): set it below 512, with room for the longest prompt")
    assert context_problem(spec, {"engine": {"context_length": 1024}}) is None  # the rollout's own setting wins
    assert "context of 256 tokens (services.rollout.engine.context_length)" in \
        context_problem(spec, {"engine": {"context_length": 256}})
    assert context_problem(load_spec(tiny_spec_with(tmp_path, tiny_model_dir), ["sampling.max_new_tokens=511"]),
                           {}) is None


def tiny_spec_with(tmp_path, model):
    from tests.deploy.run.conftest import tiny_spec

    return tiny_spec(tmp_path, model)
