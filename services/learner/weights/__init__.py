"""The learner's side of weight sync: publishing versions to the rollout fleet.

    from services.learner.weights import WeightPublisher
    pub = WeightPublisher(redis, run, settings.publish.sync)      # a shared.weight_sync.WeightSyncSettings
    version = await pub.publish(model)                             # -> the new version
    pub.last_report                                                # PublishReport: loaded / dropped / refused

``publisher.py`` runs a publish; ``outbox.py`` holds a version's buckets on their way out, ``packing.py``
and ``walk.py`` turn a model into them; ``collective.py``, ``ipc.py`` and ``snapshot.py`` are the transports (a broadcast group, CUDA IPC handles
for replicas on the learner's GPU, snapshot files); ``health.py`` says why a replica is behind. The
protocol they speak is ``shared/weight_sync/``.
"""

from services.learner.weights.publisher import PublishFailed, PublishReport, WeightPublisher

__all__ = ["PublishFailed", "PublishReport", "WeightPublisher"]
