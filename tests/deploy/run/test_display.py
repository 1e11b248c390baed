"""The progress headline: what a person watching a run reads, off-policy figures included (issue 14)."""

from deploy.run.display import headline
from deploy.run.progress import Poller, RunView


class _Fleet:
    def __init__(self) -> None:
        self.services: dict = {}


def test_the_headline_shows_staleness_mismatch_and_rejections_once_the_learner_reports_them():
    v = RunView("r", phase="running", step=3, total=10, weight_version=3, reward=0.5)
    assert "stale" not in headline(v)  # nothing reported yet: nothing made up
    poller = Poller(_Fleet(), "r")
    poller.view = v
    poller._get = lambda url: (200, {"phase": "running", "step": 4, "total_steps": 10, "weight_version": 4,
                                     "last_metrics": {"reward_mean": 0.6, "staleness_mean": 0.75, "staleness_max": 1,
                                                      "mismatch_k3": 0.00042, "is_rejected_frac": 0.03}})
    poller._learner("learner", "http://x")
    line = headline(poller.view)
    assert "stale 0.8/1" in line and "mismatch 4.2e-04" in line and "rejected 3%" in line, line
    poller.close()
