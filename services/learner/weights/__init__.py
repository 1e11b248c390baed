"""The learner's side of weight sync: publishing versions to the rollout fleet.

    from services.learner.weights import WeightPublisher
    pub = WeightPublisher(redis, run, settings.publish.sync)      # a shared.weight_sync.WeightSyncSettings
    version = await pub.publish(model)                             # -> the new version
    pub.last_report                                                # PublishReport: loaded / dropped / refused

``publisher.py`` runs a publish; ``outbox.py`` holds a version's buckets on their way out, ``packing.py``
and ``walk.py`` turn a model into them; ``snapshot.py`` writes the snapshot transport's files. The
protocol they speak is ``shared/weight_sync/``.
"""

from services.learner.weights.publisher import PublishReport, WeightPublisher

__all__ = ["PublishReport", "WeightPublisher"]
