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


def test_an_sft_run_shows_its_loss_not_a_reward_and_warnings_show_on_the_headline():
    v = RunView("sft", phase="running", step=3, total=30, algorithm="sft", loss=1.23456)
    line = headline(v)
    assert "loss 1.2346" in line and "reward" not in line and "held-out" not in line
    v = RunView("rl", phase="running", step=30, total=60, health={"heldout": "held-out accuracy fell 48% -> 1%"})
    assert "health: heldout!" in headline(v)


def test_the_live_panel_prints_an_event_as_it_is_without_a_source_location():
    """Events quote what servers and models wrote: a 404 page with `[/get_reward]` in it raised rich's MarkupError
    out of the launcher (the run died with a traceback), `[bold]` vanished as a style, and every event line ended
    with a link to `display.py:131`."""
    import io

    from deploy.run.display import LiveDisplay

    out = io.StringIO()
    display = LiveDisplay(file=out, force_terminal=True, width=200, color_system=None)
    said = 'error: reward scorer x at http://h/get_reward: answered 404: {"detail": "[bold]no[/bold] [/get_reward]"}'
    display.event(said)
    display.close()
    assert said in out.getvalue() and "display.py" not in out.getvalue()
