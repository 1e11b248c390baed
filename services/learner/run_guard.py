"""Refuse a fresh learner on a run name that Redis already holds a trained run under.

A learner that starts with no checkpoint to resume issues prompt ids ``e0-0``, ``e0-1``, ... again. If Redis
still holds an earlier run of the same ``run_name``, its set of processed sample ids names exactly those
samples, so every new experience is dropped as a duplicate and the run trains nothing, without a word. This
check runs in the learner's entry point before anything starts (and in ``fleetrl run``): the message says what
to do instead.
"""

from __future__ import annotations

from pathlib import Path

from services.learner.checkpoint import MARKER
from shared import keys
from shared.redact import redact_url


def has_checkpoint(checkpoint_dir: Path) -> bool:
    """Whether ``checkpoint_dir`` holds a complete checkpoint to resume from (read-only, unlike the manager)."""
    return any((p / MARKER).is_file() for p in Path(checkpoint_dir).glob("step-*"))


def processed_samples(redis_url: str, run_name: str, timeout_s: float = 10.0) -> int:
    """How many sample ids the run's learner has marked processed in Redis (0 for a name never used)."""
    import redis

    client = redis.Redis.from_url(redis_url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
    try:
        return int(client.scard(keys.processed_ids(run_name, "learner")))
    finally:
        client.close()


def stale_run_problem(redis_url: str, run_name: str, checkpoint_dir: Path, resume: bool,
                      reset_hint: str = "fleetrl queue clear --run-name {run} --redis-url {url}") -> str | None:
    """Why this learner must not start (one paragraph), or None. A learner that will resume a checkpoint is
    fine: its run state matches the processed ids."""
    if resume and has_checkpoint(checkpoint_dir):
        return None
    done = processed_samples(redis_url, run_name)
    if not done:
        return None
    why = "checkpoint.resume is off" if resume is False else f"no checkpoint in {checkpoint_dir}"
    shown = redact_url(redis_url)  # a password in the URL is never shown
    return (f"run_name {run_name!r} was used before: Redis at {shown} holds {done} sample ids that run "
            f"trained on, and this learner starts fresh ({why}), so every new experience would be dropped as "
            f"already trained. Resume that run (point checkpoint.dir / run_dir at its checkpoints), pick a new "
            f"run_name, or clear the old run's keys first: {reset_hint.format(run=run_name, url=shown)}")


def clear_run(redis_url: str, run_name: str, timeout_s: float = 10.0) -> int:
    """Delete every Redis key of ``run_name`` (streams, processed ids, weight-sync keys); returns how many."""
    import redis

    client = redis.Redis.from_url(redis_url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
    try:
        names = list(client.scan_iter(match=keys.run_pattern(run_name), count=1000))
        for i in range(0, len(names), 500):
            client.delete(*names[i:i + 500])
        return len(names)
    finally:
        client.close()
