"""Every Redis key FleetRL uses, in one place. All keys of a run share the prefix ``fleetrl:<run>:``."""

from __future__ import annotations


def _prefix(run: str) -> str:
    return f"fleetrl:{run}"


def run_pattern(run: str) -> str:
    """A SCAN pattern matching every key of ``run`` (what clearing a run deletes)."""
    return f"{_prefix(run)}:*"


def prompts_stream(run: str) -> str:
    """Stream of PromptTask records: produced by the learner, consumed by rollout workers (group "rollout")."""
    return f"{_prefix(run)}:prompts"


def experiences_stream(run: str) -> str:
    """Stream of Experience records: produced by rollout workers, consumed by the learner (group "learner")."""
    return f"{_prefix(run)}:experiences"


def dead_letter_stream(stream: str) -> str:
    """Where entries of ``stream`` that cannot be processed go, with the error text."""
    return f"{stream}:dead"


def processed_ids(run: str, consumer_group: str) -> str:
    """Set of record ids a consumer group has durably processed (idempotency)."""
    return f"{_prefix(run)}:processed:{consumer_group}"


def learner_start_gate(run: str) -> str:
    """Set by ``fleetrl run`` to the learner's ``train.start_gate`` value once the step-0 held-out evaluation is
    done: the learner loads meanwhile and holds its first step (and first publish) until then."""
    return f"{_prefix(run)}:learner:start_gate"


def weights_version(run: str) -> str:
    """The latest weight version the learner has published (an integer string)."""
    return f"{_prefix(run)}:weights:version"


def pool_signal(run: str) -> str:
    """The learner's demand signal for the rollout pool, rewritten every step (JSON: desired_replicas, replicas,
    prompts_waiting, groups_in_flight, wait_share, tokens_per_s_per_replica, reason, step, at; docs/elastic.md)."""
    return f"{_prefix(run)}:pool:signal"


def weights_prefix(run: str) -> str:
    """Prefix for the weight-sync protocol's own keys (rendezvous, manifests, replica registry)."""
    return f"{_prefix(run)}:weights"


def session_owner(run: str, session_id: str) -> str:
    """The rollout replica holding an open session (its advertised URL), or how it ended ("finished",
    "deleted", "expired"); expires with the session (services/rollout/sessions/registry.py)."""
    return f"{_prefix(run)}:sessions:{session_id}"


def rollout_replica(run: str, url: str) -> str:
    """A live rollout replica in session mode, by its advertised URL (a heartbeat with a short TTL)."""
    return f"{_prefix(run)}:rollout:replica:{url}"


def run_settings(run: str) -> str:
    """The run's record of its run-wide settings (JSON: settings, run_key fingerprint, written_by, at), written
    by the first service of the run to start and compared by every later one (shared/run_settings.py)."""
    return f"{_prefix(run)}:run:settings"
