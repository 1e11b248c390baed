"""Which learner rank failed, and why, in one line, when a collective breaks.

A collective that loses a rank fails on the others at once (gloo: "Connection closed by peer"; nccl: within
``distributed.timeout_s``), without saying which rank. So every follower keeps a beat in the group's own
rendezvous store (hosted by rank 0): ``fleetrl/who/<rank>`` (host and pid, once), ``fleetrl/beat/<rank>`` (a
counter, every ``BEAT_S``), and, when it fails by an exception, ``fleetrl/failed/<rank>`` (the reason) before it
exits. Rank 0, on a failed collective, reads them: a rank that said why is named with its reason; one whose
beat stopped is named as gone (killed, or its machine lost). Store calls are bounded by the group's timeout.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time

log = logging.getLogger(__name__)

BEAT_S = 0.5
PREFIX = "fleetrl/"


class RankFailed(RuntimeError):
    """A learner rank failed; the message is one line naming it and the reason."""


def _store():
    import torch.distributed.distributed_c10d as c10d

    return c10d._get_default_store()  # the rendezvous store every rank of the default group reaches


class FollowerBeat:
    """A follower's beat (a daemon thread) and its last word."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.store = _store()
        self.store.set(f"{PREFIX}who/{rank}", f"{socket.gethostname()} pid {os.getpid()}")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"rank{rank}-beat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(BEAT_S):
            try:
                self.store.add(f"{PREFIX}beat/{self.rank}", 1)
            except Exception:  # noqa: BLE001 - rank 0 (the store's host) is gone: the main loop fails on its own
                return

    def failed(self, exc: BaseException) -> None:
        """Leave the reason where rank 0 reads it (best effort: rank 0 may be the one that is gone)."""
        reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        try:
            self.store.set(f"{PREFIX}failed/{self.rank}", reason)
        except Exception as exc2:  # noqa: BLE001
            log.debug("rank %d could not leave its reason in the store: %s", self.rank, exc2)

    def stop(self) -> None:
        self._stop.set()


def diagnose(world: int, exc: BaseException, wait_s: float = 3 * BEAT_S) -> str | None:
    """One line for rank 0 after a collective failed with ``exc``: which rank(s) failed and why; None when every
    follower still beats and none said it failed (the failure is rank 0's own)."""
    try:
        store = _store()
        before = {r: _count(store, r) for r in range(1, world)}
        time.sleep(wait_s)  # a live rank beats meanwhile
        said, gone = [], []
        for r in range(1, world):
            who = _get(store, f"who/{r}") or "not started"
            reason = _get(store, f"failed/{r}")
            if reason:
                said.append(f"learner rank {r} ({who}) failed: {reason}")
            elif _count(store, r) == before[r]:
                gone.append(f"learner rank {r} ({who}) is gone (no beat for {wait_s:.1f}s: killed, or its machine "
                            "lost)")
    except Exception:  # noqa: BLE001 - the store itself failed: say what the collective said
        said, gone = [], []
    found = said + gone
    detail = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
    if not found:
        return None
    return "; ".join(found) + f" (the collective on rank 0: {detail}); the learner stops: start it again to resume " \
                               "from its last checkpoint"


def _get(store, key: str) -> str | None:
    full = PREFIX + key
    if not store.check([full]):
        return None
    return store.get(full).decode(errors="replace")


def _count(store, rank: int) -> int:
    return int(store.add(f"{PREFIX}beat/{rank}", 0))


def guarded(world: int, fn, *args, **kwargs):
    """``fn(...)`` on rank 0; a failure that a follower caused becomes :class:`RankFailed` naming it."""
    try:
        return fn(*args, **kwargs)
    except RankFailed:
        raise
    except Exception as exc:
        line = diagnose(world, exc)
        if line is None:
            raise
        raise RankFailed(line) from exc
