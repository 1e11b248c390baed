"""Weight sync, the protocol: the learner publishes versioned weights; a sidecar beside each rollout replica
loads them. What both sides speak lives here, torch-free at import:

- :mod:`~shared.weight_sync.wire` — the records in Redis (manifest, checksums, rendezvous, reports, replica
  info; JSON, no pickle) and the bucket layout plan; :mod:`~shared.weight_sync.keys` — their Redis keys;
- :mod:`~shared.weight_sync.settings` — :class:`WeightSyncSettings`, the publisher's settings (the learner's
  ``publish.sync``), whose timeouts every round carries to the replicas;
- :mod:`~shared.weight_sync.registry` — replica membership; :mod:`~shared.weight_sync.status` — what
  ``fleetrl weights status`` shows; :mod:`~shared.weight_sync.phases` — where an update spends its time;
- :mod:`~shared.weight_sync.digest` — the bucket digests both sides compute;
  :mod:`~shared.weight_sync.tensors` — wire dtype names and staging buffers;
- :mod:`~shared.weight_sync.net` and :mod:`~shared.weight_sync.group` — sockets and the collective groups
  (kinds, forming, timeouts).

The publisher is the learner's (``services/learner/weights/``: ``from services.learner.weights import
WeightPublisher``); the receiving side is the rollout service's (``services/rollout/weights/``).
"""

from shared.weight_sync.settings import WeightSyncSettings

__all__ = ["WeightSyncSettings"]
