"""Smaller things a new user hit (issue 41): the held-out history lists each step once after a run is extended;
a service that finished shows "finished", not its log's last line; the display knows the step budget before the
learner answers."""

from __future__ import annotations

import json
from types import SimpleNamespace

import httpx

from deploy.run.display import headline
from deploy.run.progress import Poller
from deploy.run.summary import heldout_points


def test_a_step_evaluated_again_after_an_extension_is_listed_once_with_its_latest_point(tmp_path):
    log = tmp_path / "eval.jsonl"
    rows = [{"step": 0, "accuracy": 0.1}, {"step": 63, "accuracy": 0.3, "mean_reward": 0.5},
            {"step": 63, "accuracy": 0.31, "mean_reward": 0.52}, {"step": 75, "accuracy": 0.4}]
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert heldout_points(log) == [{"step": 0, "accuracy": 0.1}, {"step": 63, "accuracy": 0.31, "mean_reward": 0.52},
                                   {"step": 75, "accuracy": 0.4}]


def test_a_learner_that_finished_shows_finished_not_uvicorns_goodbye():
    done = SimpleNamespace(alive=False, proc=SimpleNamespace(returncode=0), url="http://x", log_path="l",
                           log_tail=lambda n: "INFO:     Finished server process [123]\n")
    poller = Poller(SimpleNamespace(services={"learner": done}), "r")  # type: ignore[arg-type]
    (view,) = poller.poll().services
    assert (view.state, view.doing) == ("exited 0", "finished") and poller.view.error is None


def test_a_learner_still_loading_does_not_turn_the_budget_into_step_0_of_0():
    def status(request: httpx.Request) -> httpx.Response:  # a learner loading: no total yet
        return httpx.Response(200, json={"phase": "loading", "step": 0, "total_steps": 0})

    poller = Poller(SimpleNamespace(services={}), "r")  # type: ignore[arg-type]
    poller.view.total = 200  # what fleetrl run knows from the spec (train.max_steps) before the learner answers
    poller._client = httpx.Client(transport=httpx.MockTransport(status))
    poller._learner("learner", "http://learner")
    assert headline(poller.view).startswith("step 0/200 ")
