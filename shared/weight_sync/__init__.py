"""Weight sync: the learner publishes versioned weights; a sidecar beside each rollout replica loads them.

Learner API (``shared.weight_sync.publisher``)::

    from shared.weight_sync import WeightPublisher, WeightSyncSettings
    pub = WeightPublisher(redis, run, WeightSyncSettings(backend="gloo", bucket_bytes=256 << 20))
    version: int = await pub.publish(model_or_named_tensors, version=None)   # -> the new version
    pub.last_report        # PublishReport(version, loaded, dropped, refused, rounds, total_bytes, seconds, phases)
    await pub.close()

``redis`` is a ``redis.asyncio`` client. ``publish`` returns once every live collective replica has
loaded the version, refused it, or been dropped (each wait bounded by the settings), and after
``shared.keys.weights_version(run)`` holds the version.

Replica side: :mod:`shared.weight_sync.receiver` (``RoundWatcher``, ``BucketReceiver``) and
:mod:`shared.weight_sync.snapshot` (the fallback transport); the rollout service's sidecar uses them.
Wire records: :mod:`shared.weight_sync.wire` (JSON in Redis, keys in :mod:`shared.weight_sync.keys`).

This package imports torch only where tensors are handled (``tensors``, ``group``, and lazily inside
``publish`` / ``BucketReceiver.receive`` / ``read_snapshot``).
"""

from shared.weight_sync.publisher import PublishReport, WeightPublisher
from shared.weight_sync.settings import WeightSyncSettings

__all__ = ["PublishReport", "WeightPublisher", "WeightSyncSettings"]
