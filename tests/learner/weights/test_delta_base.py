"""Who may get a delta round (services/learner/weights/delta.py): only replicas this publisher saw load the base
version, still serving it, whose sink applies patches, and that did not just refuse one."""

from __future__ import annotations

from services.learner.weights.delta import DeltaBase
from shared.weight_sync import WeightSyncSettings
from shared.weight_sync.wire import ReplicaInfo


def info(rid: str, version: int, delta: bool = True) -> ReplicaInfo:
    return ReplicaInfo(replica_id=rid, name=rid, transport="collective", weight_version=version, delta=delta)


def test_eligible_only_when_every_member_is_level_with_the_base():
    base = DeltaBase(WeightSyncSettings(delta="on"))
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

    assert DeltaBase(WeightSyncSettings(delta="on")).plan(Box()) is None
    assert not DeltaBase(WeightSyncSettings(delta="off")).on


class Manifest:
    version, checksum, layout_id = 7, "xxh3_64", "L"


class Held:
    manifest, pooling, send_in_place = Manifest(), False, False


def test_choose_says_why_a_round_is_full():
    members = [info("a", 6)]
    off = DeltaBase(WeightSyncSettings(delta="off"))
    assert (off.choose(members, Held()).kind, off.choose(members, Held()).reason) == ("full", "setting")
    on = DeltaBase(WeightSyncSettings(delta="on"))
    assert on.choose(members, Held()).reason == "no base"  # nothing confirmed yet
    on.version, on.layout_id, on.last_full = 6, "L", 6
    assert on.choose(members, Held()).reason == "not level"  # a never seen loading the base
    on.confirmed(["a"], 6)
    assert (on.choose(members, Held()).kind, on.choose(members, Held()).reason) == ("delta", "setting")
    assert on.choose([], Held()).reason == "no member applies patches"  # e.g. only SGLang or vLLM replicas
    pooled = Held()
    pooled.pooling = True  # retain none, weights not laid out in place: the version's bytes are not held
    assert on.choose(members, pooled).reason == "retain none"
    auto = DeltaBase(WeightSyncSettings(delta="auto"))
    auto.version, auto.layout_id, auto.last_full = 6, "L", 6
    auto.confirmed(["a"], 6)
    assert (auto.choose(members, Held()).kind, auto.choose(members, Held()).reason) == ("full", "warm-up")
    for kind, seconds in (("full", 0.1), ("full", 0.1), ("delta", 0.5)):
        auto.chooser.record(kind, seconds, 100)
    assert (auto.choose(members, Held()).kind, auto.choose(members, Held()).reason) == ("delta", "warm-up")
    auto.chooser.record("delta", 0.5, 100)
    got = auto.choose(members, Held())
    assert (got.kind, got.reason, got.full_s, got.delta_s) == ("full", "faster", 0.1, 0.5)  # measured: full wins


def test_the_delta_setting_defaults_to_auto_and_reads_yaml_on_and_off():
    import pytest
    import yaml
    from pydantic import ValidationError

    assert WeightSyncSettings().delta == "auto" and WeightSyncSettings().delta_probe_every == 20
    # YAML 1.1 reads unquoted on / off as booleans: taken as the words
    assert WeightSyncSettings(**yaml.safe_load("delta: on")).delta == "on"
    assert WeightSyncSettings(**yaml.safe_load("delta: off")).delta == "off"
    assert WeightSyncSettings(**yaml.safe_load("delta: auto")).delta == "auto"
    with pytest.raises(ValidationError, match="delta"):
        WeightSyncSettings(delta="sometimes")
    with pytest.raises(ValidationError, match="delta_probe_every"):
        WeightSyncSettings(delta_probe_every=1)
