"""A snapshot record and a manifest come from Redis: whoever can write there must not be able to make a replica
read other files, fetch from another server, or skip the digests."""

from __future__ import annotations

import pytest

from services.rollout.weights.receiver import Received, UpdateRefused
from services.rollout.weights.snapshot import SnapshotError, check_info, fetch_file, trusted
from shared.weight_sync.wire import Manifest, SnapshotInfo


def info(**kw) -> SnapshotInfo:
    base = {"path": "/srv/snapshots/v0000000003", "url": None, "files": ("bucket-00000.safetensors",), "checksums": (1,)}
    return SnapshotInfo(**{**base, **kw})


@pytest.mark.parametrize(("record", "kwargs", "says"), [
    (info(files=("../../etc/passwd",)), {}, "is not bucket-NNNNN.safetensors"),
    (info(files=("bucket-00000.safetensors/../../x",)), {}, "is not bucket-NNNNN.safetensors"),
    (info(checksums=()), {}, "one checksum per file"),
    (info(path="/etc"), {"root": "/srv/snapshots"}, "outside weights.snapshot_root"),
    (info(path="/srv/snapshots/../../etc"), {"root": "/srv/snapshots"}, "outside weights.snapshot_root"),
])
def test_records_that_reach_outside_are_refused(record, kwargs, says):
    with pytest.raises(SnapshotError, match=says):
        check_info(record, **kwargs)


def test_records_inside_pass():
    check_info(info())
    check_info(info(), root="/srv/snapshots")


def test_urls_are_fetched_only_under_a_trusted_prefix():
    assert trusted("http://snap.example/v3", ["http://snap.example/"])
    assert not trusted("http://snap.example.evil/v3", ["http://snap.example"])
    assert not trusted("http://evil.example/v3", [])
    with pytest.raises(SnapshotError, match="not under weights.snapshot_trusted_urls"):
        fetch_file(info(url="http://evil.example/v3"), 0, 1.0, prefer_url=True)  # refused before any request


def test_a_version_without_digests_is_refused_unless_allowed():
    m = Manifest(version=4, bucket_bytes=1, total_bytes=0, buckets=(), checksum=None)
    got = Received(m, [], [])
    with pytest.raises(UpdateRefused, match="carries no checksums"):
        got.verify(None, required=True)
    got.verify(None, required=False)
