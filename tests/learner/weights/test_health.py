"""Why a replica is behind: the sentence the learner's /status and the fleetrl run display show."""

from __future__ import annotations

from services.learner.weights.health import RoundHistory, lag_problem, problem_of
from services.learner.weights.transport import PublishReport


def failing(n: int, error: str = "broadcast failed: No backend type associated with device type cuda") -> RoundHistory:
    h = RoundHistory()
    for v in range(n):
        h.record(PublishReport(version=v + 1, dropped=["r0"], errors=[error]))
    return h


def test_replica_left_behind_by_failing_rounds_names_the_real_reason():
    msg = lag_problem([("rollout-0", 0)], 12, failing(5))
    assert msg == ("rollout-0 on weights v0, learner on v12: the last 5 weight rounds failed: broadcast failed: "
                   "No backend type associated with device type cuda")


def test_one_step_behind_is_normal_two_is_reported_without_a_failure():
    assert lag_problem([("rollout-0", 11)], 12, RoundHistory()) is None  # async: one version back
    assert lag_problem([("rollout-0", 10)], 12, RoundHistory()) == "rollout-0 on weights v10, learner on v12"
    assert lag_problem([], 0, RoundHistory()) is None
    assert lag_problem([], 0, failing(3)).startswith("the last 3 weight rounds failed")  # none ever published


def test_failures_without_a_lagging_replica_are_still_said_and_success_clears_them():
    h = failing(2, "publishing version 2 failed: OSError: disk full")
    assert lag_problem([], 2, h) == "the last 2 weight rounds failed: publishing version 2 failed: OSError: disk full"
    assert "rollout-0 on weights v1" in lag_problem([("rollout-0", 1)], 2, h)  # one back, but rounds fail
    h.record(PublishReport(version=3, loaded=["r0"]))
    assert h.failed_in_a_row == 0 and lag_problem([("rollout-0", 3)], 3, h) is None


def test_problem_of_a_report():
    assert problem_of(PublishReport(version=1, loaded=["a"])) == ""
    assert "refused the version" in problem_of(PublishReport(version=1, refused=["a"]))
    assert "never reported" in problem_of(PublishReport(version=1, dropped=["a"]))
    many = lag_problem([(f"r{i}", 0) for i in range(6)], 9, RoundHistory())
    assert many.endswith("(and 2 more), learner on v9")
