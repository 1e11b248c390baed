"""What every service of a run must agree on (the ``run`` section of the learner's and the rollout's settings),
and the run's record of it in Redis.

The learner and each rollout replica read the same streams with the same bounds: a rollout replica that holds back
at another staleness than the learner drops at generates samples the learner throws away (or starves it); replicas
with different prompt claim times take each other's live prompts. Started by ``fleetrl run`` they all get the
spec's values; started by hand (compose, k8s, a shell) nothing made them agree. So the first service of a run to
start writes these values, with its name and the time, to :func:`shared.keys.run_settings` (``SET NX``); every
later one compares its own and refuses to start on a difference, in one line naming the field
(:func:`run_record_problem`). The record goes with the run's other keys (``fleetrl queue clear``, ``--reset``).

The run's signing key is checked the same way, by a fingerprint (HMAC-SHA256 of a fixed label under the key:
the signed records on the streams already are such values, so the fingerprint gives nothing new away).

Not here, on purpose: ``run_name`` (it names the record: a service under another name is another run, and it is
a top-level setting of every service, ``shared.settings.ServiceSettings``); ``torch_threads`` (each process's
own share of its machine); the reward URL / token / timeout (each rollout replica may call its own reward
replica; a wrong token is a 401 naming ``worker.reward_token`` at the first call); the learner's
``queue.claim_idle_ms`` (only learner consumers read the experiences stream: nothing to agree with) and
``queue.max_backlog`` (only the learner writes prompts).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from shared import keys


class RunSettings(BaseModel):
    """Run-wide settings: every service of a run must hold the same values (checked at start against the run's
    record in Redis)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_staleness: int = Field(
        default=1, ge=0, description="Versions a sample's weights may lag the learner's: the learner drops "
        "experiences with weight_version < current - max_staleness (their prompt re-issued), and a rollout worker "
        "takes no prompt while the learner's version is more than this ahead of its own.")
    prompt_claim_idle_ms: int = Field(
        default=30_000, ge=100, description="A prompt pending this long on a rollout worker is reclaimed by another "
        "(a live worker renews its prompts every third of it, so every replica must use the same value).")
    max_experience_backlog: int = Field(
        default=4096, ge=1, description="The experiences stream's backlog bound: rollout workers stop taking "
        "prompts, and session finishes wait, while it holds more than this.")


LEGACY: dict[str, dict[str, str]] = {
    "learner": {"rollout.max_staleness": "max_staleness"},
    "rollout": {"worker.max_staleness": "max_staleness", "worker.claim_idle_ms": "prompt_claim_idle_ms",
                "worker.max_experience_backlog": "max_experience_backlog",
                "sessions.max_experience_backlog": "max_experience_backlog"},
}
"""Per service: the setting's former place -> its field in ``run`` (still read there, with a warning)."""


def move_legacy(service: str, data: Any, warn: Callable[[str], None] | None = None) -> Any:
    """Move the former places of run-wide settings (:data:`LEGACY`) in the raw settings ``data`` into its ``run``
    section; ``warn(line)`` is told each rename. Two places giving one field different values is a ValueError
    naming both."""
    if not isinstance(data, dict):
        return data
    moved: dict[str, tuple[str, Any]] = {}
    out = dict(data)
    for old, field in LEGACY[service].items():
        section, key = old.split(".", 1)
        part = out.get(section)
        if not isinstance(part, dict) or key not in part:
            continue
        part = dict(part)
        value = part.pop(key)
        out[section] = part
        if field in moved and str(moved[field][1]) != str(value):
            raise ValueError(f"{moved[field][0]} ({moved[field][1]}) and {old} ({value}) are one run-wide setting "
                             f"now, run.{field}: give it once")
        moved[field] = (old, value)
    if not moved:
        return data
    given = out.get("run")
    if isinstance(given, BaseModel):  # a RunSettings instance: what it was given
        given = given.model_dump(exclude_unset=True)
    if given is not None and not isinstance(given, dict):
        raise ValueError(f"run: a mapping of run-wide settings, not {type(given).__name__}")
    run = dict(given or {})
    for field, (old, value) in moved.items():
        if field in run and str(run[field]) != str(value):
            raise ValueError(f"{old} ({value}) and run.{field} ({run[field]}) are one setting: give only "
                             f"run.{field}")
        run[field] = value
        if warn is not None:
            warn(f"{old} is now run.{field} (the run-wide section every service of a run shares): rename it")
    out["run"] = run
    return out


_FINGERPRINT_LABEL = b"fleetrl run_key fingerprint v1"


def key_fingerprint(run_key: SecretStr | None) -> str | None:
    """A short fingerprint of the run's signing key (None when unsigned), to compare keys without showing one."""
    if run_key is None:
        return None
    return hmac.new(run_key.get_secret_value().encode(), _FINGERPRINT_LABEL, hashlib.sha256).hexdigest()[:16]


def record_of(run: RunSettings, run_key: SecretStr | None, service: str, now: float | None = None) -> dict[str, Any]:
    """The run's record as ``service`` would write it."""
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if now is None else now))
    return {"settings": run.model_dump(mode="json"), "run_key": key_fingerprint(run_key), "written_by": service,
            "at": at}


def disagreement(run_name: str, record: dict[str, Any], run: RunSettings, run_key: SecretStr | None) -> str | None:
    """Why a service with ``run`` and ``run_key`` must not join the run whose ``record`` this is (one line naming
    each field that differs), or None."""
    given = record.get("settings")
    theirs: dict[str, Any] = given if isinstance(given, dict) else {}
    who = f"written by {record.get('written_by', '?')} at {record.get('at', '?')}"
    diffs = [f"run.{name} is {value} here but {theirs[name]} in the run's record"
             for name, value in run.model_dump(mode="json").items() if name in theirs and theirs[name] != value]
    theirs_key, my_key = record.get("run_key"), key_fingerprint(run_key)
    if theirs_key != my_key:
        diffs.append("run_key is unset here but the run's record was written with one" if my_key is None else
                     "run_key is set here but the run's record was written without one" if theirs_key is None else
                     "run_key here is not the key the run's record was written with")
    if not diffs:
        return None
    return (f"run {run_name!r}: {'; '.join(diffs)} ({who}); start every service of a run with the same values "
            f"(or, with no service of the run up, delete the record: redis-cli DEL {keys.run_settings(run_name)})")


def run_record_problem(client: Any, run_name: str, run: RunSettings, run_key: SecretStr | None,
                       service: str) -> str | None:
    """Write the run's record if it has none (this service is the first); else compare. ``client``: a sync
    ``redis.Redis``. Returns the one-line problem, or None."""
    key = keys.run_settings(run_name)
    mine = record_of(run, run_key, service)
    if client.set(key, json.dumps(mine), nx=True):
        return None
    raw = client.get(key)
    if raw is None:  # deleted in between: write it again
        client.set(key, json.dumps(mine), nx=True)
        return None
    try:
        record = json.loads(raw)
    except ValueError:
        record = None
    if not isinstance(record, dict):
        return (f"run {run_name!r}: the run's record at {key} in Redis is not a FleetRL run record; delete it "
                f"(redis-cli DEL {key}) when no service of the run is up")
    return disagreement(run_name, record, run, run_key)


def check_run_record(redis_url: str, run_name: str, run: RunSettings, run_key: SecretStr | None, service: str,
                     timeout_s: float = 10.0) -> str | None:
    """:func:`run_record_problem` on a fresh client of ``redis_url`` (a service's start check)."""
    import redis

    client = redis.Redis.from_url(redis_url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
    try:
        return run_record_problem(client, run_name, run, run_key, service)
    finally:
        client.close()
