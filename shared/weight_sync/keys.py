"""Redis key names of the weight-sync protocol; all live under ``shared.keys.weights_prefix(run)``.

The latest published version itself is ``shared.keys.weights_version(run)`` (an integer string).
"""

from __future__ import annotations

from shared import keys


def rendezvous(run: str) -> str:
    """JSON :class:`~shared.weight_sync.wire.Rendezvous`: the update round replicas must join now."""
    return f"{keys.weights_prefix(run)}:rendezvous"


def delta_choice(run: str) -> str:
    """JSON of the last publish's round kind choice (``PublishReport.delta_choice`` and its version): delta or full,
    why, and the estimates of a round's seconds it was made from (``publish.sync.delta: auto``)."""
    return f"{keys.weights_prefix(run)}:delta_choice"


def ipc_round(run: str) -> str:
    """The latest IPC round (:class:`~shared.weight_sync.wire.IpcRound`): replicas on the publisher's GPU."""
    return f"{keys.weights_prefix(run)}:ipc_round"


def copied(run: str, round_id: int) -> str:
    """List of the members of an ipc round that have copied its buckets (the publisher may touch them again)."""
    return f"{keys.weights_prefix(run)}:round:{round_id}:copied"


def announcements(run: str) -> str:
    """Stream with one entry per new rendezvous (capped): replicas block on it instead of polling the key."""
    return f"{keys.weights_prefix(run)}:announcements"


def manifest(run: str, version: int) -> str:
    """JSON :class:`~shared.weight_sync.wire.Manifest` of ``version`` (buckets, tensors, checksums)."""
    return f"{keys.weights_prefix(run)}:manifest:{version}"


def checksums(run: str, version: int) -> str:
    """JSON :class:`~shared.weight_sync.wire.Checksums` of ``version`` (written once its buckets are packed)."""
    return f"{keys.weights_prefix(run)}:checksums:{version}"


def reports(run: str, round_id: int) -> str:
    """Hash replica id -> JSON :class:`~shared.weight_sync.wire.MemberReport` for one update round."""
    return f"{keys.weights_prefix(run)}:reports:{round_id}"


def reported(run: str, round_id: int) -> str:
    """List a replica pushes a token onto after writing its report for ``round_id``, so the publisher blocks
    on it (BLPOP) instead of polling the reports hash."""
    return f"{keys.weights_prefix(run)}:reported:{round_id}"


def abandoned(run: str, round_id: int) -> str:
    """Set by the publisher when it gives up on ``round_id`` (a member died or hung, its own side failed): the
    members still in the round's collectives leave them at once and report, instead of each waiting out its
    collective timeout (the publisher's connections closing is not enough: a hung member keeps its own open)."""
    return f"{keys.weights_prefix(run)}:round:{round_id}:abandoned"


def round_counter(run: str) -> str:
    """INCR counter that numbers update rounds (every attempt and catch-up is a round)."""
    return f"{keys.weights_prefix(run)}:rounds"


def replicas(run: str) -> str:
    """Hash replica id -> JSON :class:`~shared.weight_sync.wire.ReplicaInfo` (the registry)."""
    return f"{keys.weights_prefix(run)}:replicas"


def alive(run: str, replica_id: str) -> str:
    """Heartbeat key of one replica (expires when the replica stops refreshing it)."""
    return f"{keys.weights_prefix(run)}:alive:{replica_id}"
