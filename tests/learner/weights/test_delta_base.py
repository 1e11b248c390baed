"""Who may get a delta round (services/learner/weights/delta.py): only replicas this publisher saw load the base
version, still serving it, whose sink applies patches, and that did not just refuse one."""

from __future__ import annotations

from services.learner.weights.delta import DeltaBase
from shared.weight_sync import WeightSyncSettings
from shared.weight_sync.wire import ReplicaInfo


def info(rid: str, version: int, delta: bool = True) -> ReplicaInfo:
    return ReplicaInfo(replica_id=rid, name=rid, transport="collective", weight_version=version, delta=delta)


def test_eligible_only_when_every_member_is_level_with_the_base():
    base = DeltaBase(WeightSyncSettings(delta="auto"))
    base.version = 5
    base.confirmed(["a", "b"], 5)
    assert base.eligible([info("a", 5), info("b", 5)])
    assert not base.eligible([])
    assert not base.eligible([info("a", 5), info("c", 5)])  # c: never seen loading it (a peer joiner, a restart)
    # b's registry still says 4 although this publisher saw it load 5: the advertisement lags the round (written
    # after it; a publish right after read the old value and went whole: a flaky full round in a full-suite run).
    # A replica really behind refuses the patch itself and gets the version whole in the same publish.
    assert base.eligible([info("a", 5), info("b", 4)])
    assert not base.eligible([info("a", 5), info("b", 5, delta=False)])  # an engine that cannot patch
    base.refused(["b"])
    assert not base.eligible([info("a", 5), info("b", 5)])  # refused a patch: whole until it confirms again
    base.confirmed(["b"], 5)
    assert base.eligible([info("a", 5), info("b", 5)])
    base.confirmed(["a"], 6)  # a moved on without the base (b missed 6): no delta for a against 5
    assert not base.eligible([info("a", 6), info("b", 5)])


def test_off_and_no_base_make_no_plan():
    class Box:
        manifest = None
        pooling = False
        send_in_place = False

    assert DeltaBase(WeightSyncSettings(delta="auto")).plan(Box()) is None
    assert not DeltaBase(WeightSyncSettings(delta="off")).on
