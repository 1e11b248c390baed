"""``fleetrl eval``: held-out accuracy of a model directory through a rollout replica and the spec's reward —
chat-message held-out rows included, ``--model`` relative to the current directory, and a replica that fails to
start said in one line with its reason and its log."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.deploy.run.conftest import write_rows
from tests.deploy.run.test_fleetrl_run import ENV
from tests.procs import REPO

pytestmark = pytest.mark.process  # runs `fleetrl eval` as a process


def fleetrl_eval(spec_file, *args: str, cwd=REPO, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "deploy.cli", "eval", str(spec_file), *args], cwd=cwd,
                          env={**ENV, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=timeout,
                          check=False)


def test_fleetrl_eval_prints_the_accuracy_of_a_model(spec_file, tiny_model_dir):
    rows = [json.loads(line) for line in (spec_file.parent / "heldout.jsonl").read_text().splitlines()]
    write_rows(spec_file.parent / "chat.jsonl", [{**r, "input": [{"role": "user", "content": r["input"]}]}
                                                 for r in rows])  # verl / OpenRLHF chat prompts
    out = fleetrl_eval(spec_file, "--model", tiny_model_dir.name, "--set", "eval.data=chat.jsonl", "--show", "2",
                       cwd=tiny_model_dir.parent)  # a relative --model: a directory under the current one
    assert out.returncode == 0, out.stderr[-3000:]
    shown, _, body = out.stdout.partition("\n{")
    result = json.loads("{" + body)
    assert result["n"] == 8 and 0.0 <= result["accuracy"] <= 1.0 and result["weight_version"] == "0"
    # what is measured (issue 41): accuracy = share of rewards >= eval.success_threshold, the mean reward beside it;
    # --show 2 prints two answers with their reward and length, and every answer is kept in samples.jsonl
    assert result["success_threshold"] == 1.0 and 0.0 <= result["mean_reward"] <= 1.0
    assert result["measured"] == "one greedy answer per held-out prompt" and "tool_call_rate" not in result
    assert shown.count("--- reward ") == 2 and shown.count("\ncompletion: ") == 2 and " tokens" in shown
    (answers,) = (spec_file.parent / "run" / "evals").glob("*/samples.jsonl")
    assert len(answers.read_text().splitlines()) == 8
    assert result["model"] == str(tiny_model_dir)
    run_dir = spec_file.parent / "run"
    (kept,) = (run_dir / "evals").glob("*/result.json")  # each evaluation in its own folder under evals/
    assert json.loads(kept.read_text()) == result
    assert sorted(p.name for p in run_dir.iterdir()) == ["evals"]

    none = fleetrl_eval(spec_file, "--set", "eval.data=null", timeout=60)
    assert none.returncode == 1 and none.stderr.strip().startswith("error: eval.data is not set")
    missing = fleetrl_eval(spec_file, "--model", "sft-model", cwd=spec_file.parent, timeout=60)
    assert missing.returncode == 1
    assert missing.stderr.strip() == f"error: --model sft-model: no model directory at {spec_file.parent / 'sft-model'}" \
        " (a relative path is relative to the current directory)"


def test_a_replica_that_fails_to_start_is_one_line_with_its_reason_and_log(spec_file, tmp_path):
    not_a_model = tmp_path / "not-a-model"
    not_a_model.mkdir()
    (not_a_model / "config.json").write_text('{"model_type": "llama"}')  # a checkpoint with no weights, no tokenizer
    out = fleetrl_eval(spec_file, "--model", str(not_a_model))
    assert out.returncode == 1
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("error: rollout-0 exited with code "), line
    _, _, rest = line.partition("while starting: ")
    assert rest and not rest.startswith("(its log"), line  # the reason from its log, then where the log is
    log = rest.rsplit("(its log: ", 1)[1].rstrip(")")
    assert log.startswith(str(spec_file.parent / "run" / "evals")) and log.endswith("rollout-0.log")


def test_a_rollout_url_that_is_no_rollout_service_is_one_line_naming_the_option(spec_file):
    """`fleetrl eval --rollout-url` printed `error: [Errno 111] Connection refused` (no URL, no option), `Client
    error '404 Not Found' for url '.../v1/generate'` for a base URL with /v1, and httpx's own words for a URL with no
    scheme; each is now one line naming --rollout-url, the URL and what to fix, before anything starts."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from shared.ports import free_port

    class NotFound(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_error(404)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), NotFound)  # another service: every route it lacks is a 404
    threading.Thread(target=server.serve_forever, daemon=True).start()
    dead, other = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{server.server_port}/v1"
    try:
        for url, want in ((dead, f"--rollout-url {dead}: cannot connect (Connection refused)"),
                          (other, (f"--rollout-url {other}: answered 404 to /get_model_info (is it a FleetRL rollout "
                                  "service's base URL? no path such as /v1 after the port)")),
                          ("localhost:8001", ("--rollout-url localhost:8001: not an http:// or https:// URL (write "
                                             "http://localhost:8001)"))):
            out = fleetrl_eval(spec_file, "--rollout-url", url, timeout=60)
            assert (out.returncode, out.stderr.strip()) == (1, f"error: {want}"), out.stderr
    finally:
        server.shutdown()
    assert not (spec_file.parent / "run" / "evals").exists()  # nothing started


def test_a_rollout_refusal_says_the_services_own_words_and_the_spec_setting(spec_file, tiny_model_dir):
    """A held-out pass the rollout service refused (max_new_tokens past the model's context) was said as httpx's
    `Client error '400 Bad Request' for url 'http://127.0.0.1:37963/generate'`, in `fleetrl eval` and in the run's
    display alike: the reason was in the reply's body, never shown."""
    import re

    out = fleetrl_eval(spec_file, "--model", str(tiny_model_dir), "--set", "sampling.max_new_tokens=510")
    assert out.returncode == 1
    assert re.fullmatch(r"error: the rollout service answered 400: prompt 0 \(\d+ tokens\) \+ max_new_tokens \(510\) "
                        r"exceeds the context length 512; ask for at most \d+ new tokens \(sampling.max_new_tokens in "
                        r"the spec\)", out.stderr.strip()), out.stderr
    past = fleetrl_eval(spec_file, "--model", str(tiny_model_dir), "--set", "sampling.max_new_tokens=600")
    assert (past.returncode, past.stderr.strip()) == (1, (
        "error: sampling.max_new_tokens 600 leaves no room for a prompt in the model's context of 512 tokens "
        "(max_position_embeddings in the model's config.json): set it below 512, with room for the longest prompt"))
