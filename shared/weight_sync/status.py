"""The weight sync of one run as an operator sees it (``fleetrl weights status``): the latest version, every
registered replica (alive or not, and how far behind), and the last update round with its reports.

Read-only: unlike :meth:`ReplicaRegistry.alive`, dead entries are shown, not pruned.
"""

from __future__ import annotations

import json
from typing import Any

from shared import keys
from shared.weight_sync import keys as wkeys
from shared.weight_sync.wire import MemberReport, Rendezvous, ReplicaInfo


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


async def weight_sync_status(redis: Any, run: str) -> dict[str, Any]:
    """``{"latest_version", "replicas": [...], "last_round": {...} | None, "delta_choice": {...} | None}`` for
    ``run``."""
    pipe = redis.pipeline(transaction=False)
    pipe.get(keys.weights_version(run))
    pipe.hgetall(wkeys.replicas(run))
    pipe.get(wkeys.rendezvous(run))
    pipe.get(wkeys.delta_choice(run))
    latest_raw, listing, rdv_raw, choice_raw = await pipe.execute()
    latest = int(latest_raw or 0)
    infos = sorted((ReplicaInfo.loads(v) for v in listing.values()), key=lambda i: i.replica_id)
    pipe = redis.pipeline(transaction=False)
    for info in infos:
        pipe.pttl(wkeys.alive(run, info.replica_id))
    ttls = await pipe.execute() if infos else []
    replicas = [{
        "replica_id": info.replica_id, "name": info.name, "engine": info.engine, "transport": info.transport,
        "backend": info.backend, "group": info.group, "weight_version": info.weight_version,
        "wants_version": info.wants_version, "alive": ttl is not None and int(ttl) > 0,
        "behind": max(0, latest - info.weight_version), "delta": info.delta,
    } for info, ttl in zip(infos, ttls)]

    last_round = None
    if rdv_raw is not None:
        rdv = Rendezvous.loads(rdv_raw)
        reports = {_text(k): MemberReport.loads(v) for k, v in
                   (await redis.hgetall(wkeys.reports(run, rdv.round))).items()}
        last_round = {
            "round": rdv.round, "version": rdv.version, "group": rdv.group_name, "backend": rdv.backend,
            "created_at": rdv.created_at,
            "kind": "full" if rdv.delta is None else "delta",
            "delta_base": None if rdv.delta is None else rdv.delta.base_version,
            "patch_bytes": None if rdv.delta is None or rdv.delta.payload is None
            else sum(max(0, n) for n in rdv.delta.payload),
            "whole_buckets": None if rdv.delta is None or rdv.delta.payload is None
            else sum(1 for n in rdv.delta.payload if n < 0),  # pieces sent whole (a bucket is one or more pieces)
            "pieces": None if rdv.delta is None or rdv.delta.payload is None else len(rdv.delta.payload),
            "members": [{"replica_id": m.replica_id, "rank": m.rank,
                         "report": reports[m.replica_id].state if m.replica_id in reports else None,
                         "detail": reports[m.replica_id].detail if m.replica_id in reports else ""}
                        for m in rdv.members],
        }
    # the round kind the learner chose for its last version (delta or full, why, the round times it went by)
    delta_choice = json.loads(_text(choice_raw)) if choice_raw is not None else None
    return {"run": run, "latest_version": latest, "replicas": replicas, "last_round": last_round,
            "delta_choice": delta_choice}
