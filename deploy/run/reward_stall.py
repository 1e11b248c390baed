"""What a run says about its reward while it goes: a scorer that keeps failing (``reward.stall_after_s``: the
display says the run is stalled on it, naming the scorer, its URL and the last error; ``reward.give_up_after_s``:
the run stops), and the line a run ends with (held-out accuracy and mean reward before -> after)."""

from __future__ import annotations

from .progress import EvalPoint


class RewardStall:
    """Reads the reward services' ``failing`` scorers (``RunView.reward_failing``: where -> (seconds, last
    error)) against the spec's ``reward.stall_after_s`` and ``reward.give_up_after_s`` (0: never)."""

    def __init__(self, reward) -> None:
        self.stall_after_s = reward.stall_after_s if reward is not None else None
        self.give_up_after_s = reward.give_up_after_s if reward is not None else 0.0
        #: while the run is stalled: the scorer it waits on and for how long it had failed at the last check
        self.stalled_on: tuple[str, float] | None = None

    def check(self, failing: dict[str, tuple[float, str]]) -> tuple[str | None, bool]:
        """(the stalled line, or None; whether to give up): the scorer failing longest decides."""
        self.stalled_on = None
        if not failing or self.stall_after_s is None:
            return None, False
        where, (for_s, error) = max(failing.items(), key=lambda kv: kv[1][0])
        if for_s < self.stall_after_s:
            return None, False
        self.stalled_on = (where, for_s)
        line = f"stalled: {where} failing for {for_s:.0f} s (last error: {error})"  # refused, or answering garbage
        return line, bool(self.give_up_after_s) and for_s >= self.give_up_after_s

    def came_back(self, failing: dict[str, tuple[float, str]]) -> str | None:
        """The line for a run that was stalled on a scorer that no longer fails (once), else None."""
        if self.stalled_on is None or self.stalled_on[0] in failing:
            return None
        where, for_s = self.stalled_on
        self.stalled_on = None
        return f"back: {where} answers again after {for_s:.0f} s or more of failing; the run goes on"


def before_after(evals: list[EvalPoint], seconds: float) -> str:
    """``held-out accuracy: A% -> B% (mean reward x -> y), N steps, T s``: the first and last evaluation."""
    first, last = evals[0], evals[-1]
    mean = "" if first.mean_reward is None or last.mean_reward is None else \
        f" (mean reward {first.mean_reward:.3f} -> {last.mean_reward:.3f})"
    return (f"held-out accuracy: {first.accuracy:.1%} -> {last.accuracy:.1%}{mean}, "
            f"{last.step - first.step} steps, {seconds:.0f} s")
