"""Why a replica is behind: the publisher's record of its recent weight rounds, and the one sentence the learner's
``/status``, its log and the ``fleetrl run`` display show when replicas serve old weights.

    history = RoundHistory()
    history.record(report)                  # after every publish (or history.failed(reason) when it raised)
    lag_problem([("rollout-0", 0)], 12, history)
    # 'rollout-0 on weights v0, learner on v12: the last 5 weight rounds failed: <error>'
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from services.learner.weights.transport import PublishReport


@dataclass
class RoundHistory:
    """Consecutive publishes that went wrong, and the last reason."""

    failed_in_a_row: int = 0
    last_error: str = ""

    def record(self, report: PublishReport) -> None:
        """One publish's outcome: an error, a dropped or a refused replica counts as a failed round."""
        problem = problem_of(report)
        if problem:
            self.failed(problem)
        else:
            self.failed_in_a_row, self.last_error = 0, ""

    def failed(self, reason: str) -> None:
        self.failed_in_a_row += 1
        self.last_error = reason


def problem_of(report: PublishReport) -> str:
    """What went wrong with one publish ('' when every replica loaded it)."""
    if report.errors:
        return report.errors[-1]
    if report.refused:
        return f"{', '.join(report.refused)} refused the version (checksum, names or shapes: see its log)"
    if report.dropped:
        return f"{', '.join(report.dropped)} never reported the version loaded (crashed, or its load timed out)"
    return ""


def lag_problem(replicas: Sequence[tuple[str, int]], version: int, history: RoundHistory,
                behind_after: int = 2) -> str | None:
    """The sentence saying which replicas serve old weights and why, or None when none is behind.

    ``replicas``: (name, weight version) of each live replica; ``version``: the learner's latest published
    version. A replica counts as behind when it is ``behind_after`` versions back (one step back is normal
    in an asynchronous run), or at all once rounds have failed twice in a row."""
    failing = history.failed_in_a_row >= 2
    if version <= 0:  # nothing published yet: only failures can be said
        return f"the last {history.failed_in_a_row} weight rounds failed: {history.last_error}" if failing else None
    behind = [(n, v) for n, v in replicas if version - v >= behind_after or (failing and v < version)]
    why = (f": the last {history.failed_in_a_row} weight round{'s' if history.failed_in_a_row > 1 else ''} failed: "
           f"{history.last_error}") if history.failed_in_a_row else ""
    if not behind:
        return f"the last {history.failed_in_a_row} weight rounds failed: {history.last_error}" if failing else None
    shown = ", ".join(f"{n} on weights v{v}" for n, v in behind[:4])
    more = f" (and {len(behind) - 4} more)" if len(behind) > 4 else ""
    return f"{shown}{more}, learner on v{version}{why}"
