"""Atomic, self-contained checkpoints: ``<root>/step-00000042/`` written as a temp dir, then renamed.

A checkpoint directory holds ``trainer/`` (the actor's and critic's weights and optimizer state as DCP shards
written by every rank, readable on any number of ranks, or DeepSpeed's own files; scheduler state, RNG states,
counters — see ``TrainerBase.save`` and ``training/sharded_state.py``), ``run_state.json`` (dataset position, prompts in
flight, dedupe state, counters — see ``RunState``) and ``COMPLETE`` last. ``<root>/latest`` names the
newest complete one. A crash mid-write leaves only a ``.tmp-*`` directory, removed at the next start.

Every rank writes its shards into the temp dir inside one collective save; rank 0 seals it only after that
returns, so a complete checkpoint holds every rank's part. Everything here is written by the learner's ranks and
read back only from this directory; nothing is loaded from bytes received over the network.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

MARKER = "COMPLETE"
LATEST = "latest"


def _fsync_tree(root: Path) -> None:
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(dirpath))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _complete(root: Path) -> list[Path]:
    return sorted(p for p in Path(root).glob("step-*") if (p / MARKER).is_file())


def latest_in(root: Path) -> Path | None:
    """The newest complete checkpoint under ``root`` (read only: unlike :class:`CheckpointManager`, nothing is
    created or cleaned, so a reader may look while a learner writes)."""
    pointer = Path(root) / LATEST
    if pointer.is_file():
        candidate = Path(root) / pointer.read_text().strip()
        if (candidate / MARKER).is_file():
            return candidate
    done = _complete(root)
    return done[-1] if done else None


class CheckpointManager:
    def __init__(self, root: Path, keep: int = 2) -> None:
        self.root = Path(root)
        self.keep = keep
        self.root.mkdir(parents=True, exist_ok=True)
        for stale in self.root.glob(".tmp-*"):
            log.warning("removing incomplete checkpoint %s", stale)
            shutil.rmtree(stale, ignore_errors=True)

    @staticmethod
    def name(step: int) -> str:
        return f"step-{step:08d}"

    def complete(self) -> list[Path]:
        """Complete checkpoints, oldest first."""
        return _complete(self.root)

    def latest(self) -> Path | None:
        return latest_in(self.root)

    def save(self, step: int, write: Callable[[Path], None]) -> Path:
        """Run ``write(tmp_dir)``, seal it, and atomically make it ``step-<step>`` and the latest."""
        tmp = self.root / f".tmp-{self.name(step)}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir(parents=True)
        try:
            write(tmp)
            (tmp / MARKER).write_text(json.dumps({"step": step, "time": time.time()}))
            _fsync_tree(tmp)
            final = self.root / self.name(step)
            if final.exists():  # the same step again (after a crash replay): replace it
                old = self.root / f".tmp-old-{uuid.uuid4().hex[:8]}"
                final.rename(old)
                shutil.rmtree(old, ignore_errors=True)
            tmp.rename(final)
            pointer_tmp = self.root / f".tmp-latest-{uuid.uuid4().hex[:8]}"
            pointer_tmp.write_text(final.name)
            os.replace(pointer_tmp, self.root / LATEST)
            _fsync_dir(self.root)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self._prune()
        return final

    def _prune(self) -> None:
        done = self.complete()
        for old in done[: max(0, len(done) - self.keep)]:
            shutil.rmtree(old, ignore_errors=True)
