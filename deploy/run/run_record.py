"""What a run was started with, and who runs it now: the spec's record in ``run_dir`` (``spec.json``, with its
fingerprint), compared with the spec of a later ``fleetrl run`` before anything starts, and a lock on the run
dir held while ``fleetrl run`` lives.

Re-running with a changed spec continues the run only when nothing but budgets grew (``train.max_steps``,
``algorithm.max_steps``, ``data.epochs``, ``algorithm.epochs``) or settings that do not change what is trained
changed (held-out evaluation, the number of replicas, checkpoint cadence, the export path); anything else (the
model, the data, the algorithm, the learning rate, ...) is refused in one line naming what changed and the two
ways out. :func:`compare` is pure.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from deploy.run.derive import leaves

RECORD = "spec.json"
"""The spec the run was started (or last continued) with, under run_dir."""
LOCK = ".fleetrl-run.lock"

BUDGETS = ("train.max_steps", "algorithm.max_steps", "data.epochs", "algorithm.epochs")
"""Settings a run may continue under when they grew: it trains further."""
FREE = ("eval.", "replicas.", "placement.", "checkpoint_every", "export", "run_dir", "reward.stall_after_s",
        "reward.give_up_after_s")
"""Settings (or prefixes) that change how a run is watched or where it is written, not what it trains."""


def fingerprint(spec_json: dict[str, Any]) -> str:
    """sha256 of the spec (as ``model_dump(mode="json")``), key order ignored."""
    return hashlib.sha256(json.dumps(spec_json, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class Verdict:
    """``ok``: the run may continue; ``notes``: what to say at start; ``problem``: the one-line refusal."""

    ok: bool
    notes: tuple[str, ...] = ()
    problem: str | None = None


_UNSET = "(not set)"  # a setting one side has and the other lacks (a list item added or removed)


def _show(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else value
    return text if len(text) <= 60 else text[:57] + "..."


def _side_by_side(old: dict[str, Any], new: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Dotted path -> value of every setting of both specs, a list of sections item by item as ``--set`` names
    them (``reward.scorers.0.url``) where an item has the same fields on both sides (the same kind), else the item
    whole: a whole list cut to 60 characters hid what changed in it (a scorer's URL read ``[{"name": "myrm",
    "weight": 1.0, ...`` on both sides)."""
    a, b = leaves(old), leaves(new)
    out_a, out_b = {}, {}
    for key in {**a, **b}:
        va, vb = a.get(key, _UNSET), b.get(key, _UNSET)
        if not (_sections(va) and _sections(vb)):
            out_a[key], out_b[key] = va, vb
            continue
        for i in range(max(len(va), len(vb))):
            ia, ib = va[i] if i < len(va) else _UNSET, vb[i] if i < len(vb) else _UNSET
            if isinstance(ia, dict) and isinstance(ib, dict) and set(ia) == set(ib):
                inner_a, inner_b = _side_by_side(ia, ib)
                out_a.update({f"{key}.{i}.{k}": v for k, v in inner_a.items()})
                out_b.update({f"{key}.{i}.{k}": v for k, v in inner_b.items()})
            else:
                out_a[f"{key}.{i}"], out_b[f"{key}.{i}"] = ia, ib
    return out_a, out_b


def _sections(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(item, dict) for item in value)


def _is_free(path: str) -> bool:
    return any(path == f or (f.endswith(".") and path.startswith(f)) for f in FREE)


def _budget(value: Any) -> float:
    return float("inf") if value is None or value == _UNSET else float(value)


def compare(old: dict[str, Any], new: dict[str, Any], spec_file: str, command: str | None = None) -> Verdict:
    """May a run started with spec ``old`` continue under spec ``new`` (both ``model_dump(mode="json")``)?
    ``command``: the command the user ran (``--set`` included), which the refusal's hint repeats with
    ``--reset``; default ``fleetrl run SPEC_FILE``."""
    a, b = _side_by_side(old, new)
    changed = sorted(k for k in set(a) | set(b) if a.get(k, _UNSET) != b.get(k, _UNSET))
    notes, refused = [], []
    for key in changed:
        before, after = a.get(key, _UNSET), b.get(key, _UNSET)
        if _is_free(key):
            notes.append(f"{key}: {_show(before)} -> {_show(after)}")
        elif key in BUDGETS and _budget(after) > _budget(before):
            notes.append(f"{key} grew {_show(before)} -> {_show(after)}: the run continues to the new budget")
        elif key in BUDGETS:
            refused.append(f"{key} {_show(before)} -> {_show(after)} (a budget may only grow)")
        else:
            refused.append(f"{key} {_show(before)} -> {_show(after)}")
    if refused:
        more = f" and {len(refused) - 3} more" if len(refused) > 3 else ""
        return Verdict(False, problem=(
            f"{spec_file} changed since this run was started: {'; '.join(refused[:3])}{more}. A run continues only "
            f"when budgets such as train.max_steps grew; start it over with {command or f'fleetrl run {spec_file}'} --reset, or give "
            "the changed spec a new run_name"))
    return Verdict(True, notes=tuple(f"spec changed since the last start: {n}" for n in notes))


def read_record(run_dir: Path) -> dict[str, Any] | None:
    """The spec the run in ``run_dir`` was last started with, or None (none recorded, or unreadable)."""
    try:
        return json.loads((run_dir / RECORD).read_text())["spec"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_record(run_dir: Path, spec_json: dict[str, Any]) -> None:
    tmp = run_dir / f".{RECORD}.tmp"
    tmp.write_text(json.dumps({"fingerprint": fingerprint(spec_json), "spec": spec_json}, indent=2))
    tmp.replace(run_dir / RECORD)


class RunLocked(RuntimeError):
    """Another ``fleetrl run`` holds the run dir; the message names its PID."""


class RunLock:
    """An exclusive ``flock`` on ``run_dir/.fleetrl-run.lock`` with the holder's PID in it; released when this
    process exits, however it exits."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / LOCK
        self._file: TextIO | None = None

    def acquire(self, what: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        f = self.path.open("a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.seek(0)
            pid = f.read().strip() or "unknown"
            f.close()
            raise RunLocked(f"{self.path.parent} is in use by another fleetrl run (PID {pid}); wait for it to end "
                            f"or stop it (kill -INT {pid}), or start {what} under another run_name") from None
        f.seek(0)
        f.truncate()
        f.write(str(os.getpid()))
        f.flush()
        self._file = f

    def release(self) -> None:
        if self._file is not None:
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None


def latest_step(checkpoint_dir: Path) -> int | None:
    """The step of the newest complete checkpoint in ``checkpoint_dir`` (``step-00000042``), or None."""
    from services.learner.checkpoint import MARKER

    steps = [int(p.name.removeprefix("step-")) for p in Path(checkpoint_dir).glob("step-*")
             if p.name.removeprefix("step-").isdigit() and (p / MARKER).is_file()]
    return max(steps, default=None)
