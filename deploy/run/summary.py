"""``run_dir/summary.json``: the whole run, across every launch that resumed it — steps, the held-out accuracy
before and after with every point in between (``eval.jsonl``, which a resumed run appends to and a fresh run
starts over), the wall time of all launches together, and every training-health warning. Pure but for reading
and writing the two files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def heldout_points(eval_log: Path) -> list[dict[str, Any]]:
    """Every held-out point of the run (``eval.jsonl``), oldest first, one per step (a step evaluated again, as
    the last step of a run that was then extended, keeps its latest point)."""
    if not eval_log.exists():
        return []
    by_step: dict[Any, dict[str, Any]] = {}
    for line in eval_log.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        point = {k: row[k] for k in ("step", "accuracy", "mean_reward", "weight_version") if k in row}
        by_step.pop(point.get("step"), None)  # re-inserted: the dict keeps the order of the latest points
        by_step[point.get("step")] = point
    return sorted(by_step.values(), key=lambda p: p.get("step") if isinstance(p.get("step"), int) else -1)


def build_summary(previous: dict[str, Any] | None, *, run_name: str, steps: int, total_steps: int,
                  weight_version: Any, last_reward_mean: float | None, heldout: list[dict[str, Any]],
                  launch_s: float, health: dict[str, str], metrics: str, extra: dict[str, Any] | None = None
                  ) -> dict[str, Any]:
    """The summary after one more launch; ``previous``: the summary the run had (None for a fresh run)."""
    prev = previous or {}
    seen = {**(prev.get("health") or {}), **health}
    return {
        "run_name": run_name, "steps": steps, "total_steps": total_steps, "weight_version": weight_version,
        "last_reward_mean": last_reward_mean,
        "heldout_before": heldout[0]["accuracy"] if heldout and heldout[0].get("step") == 0 else prev.get(
            "heldout_before"),
        "heldout_after": heldout[-1]["accuracy"] if heldout else None,
        "heldout": heldout,
        "wall_time_s": round(float(prev.get("wall_time_s") or 0.0) + launch_s, 1),
        "launches": int(prev.get("launches") or 0) + 1,
        "health": seen,
        "metrics": metrics,
        **(extra or {}),
    }


def read_summary(path: Path) -> dict[str, Any] | None:
    try:
        out = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return out if isinstance(out, dict) else None
