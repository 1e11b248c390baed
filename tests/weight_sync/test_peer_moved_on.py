"""A joiner whose peer moves on to a newer version while it fetches (HTTP 409: the learner publishes every step)
asks again for the version the peer holds now, instead of giving up on peers (the elastic drill saw a joiner fall
back to the publisher after one 409). Pure: the registry, the records and the fetch are stand-ins."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from services.rollout.weights import peer as peer_mod
from services.rollout.weights.peer import PeerCatchUp, PeerMovedOn, PeerUnavailable


class Sidecar:
    def __init__(self, peer_versions: list[int], latest: list[int]) -> None:
        self.replica_id, self.weight_version, self.run, self.redis = "me", 0, "r", None
        self.peer_versions, self.latests = peer_versions, latest
        self.sink = SimpleNamespace(load_buckets=self._load)
        self.registry = SimpleNamespace(alive=self._alive)
        self.noted: list[int] = []

    async def _alive(self):
        return [SimpleNamespace(replica_id="p", name="p", peer_url="http://p", weight_version=self.peer_versions[0])]

    async def latest(self) -> int:
        return self.latests.pop(0)

    async def _load(self, manifest, buffers) -> None:
        self.weight_version = manifest.version

    def note_peer_update(self, version, peer_url, seconds, phases) -> None:
        self.noted.append(version)


def _records(monkeypatch):
    async def records(redis, run, v):
        return SimpleNamespace(version=v, buckets=[1], total_bytes=8), None

    monkeypatch.setattr(peer_mod, "version_records", records)


def test_a_peer_that_moved_on_is_asked_again_for_its_new_version(monkeypatch):
    _records(monkeypatch)
    sc = Sidecar(peer_versions=[47], latest=[48])
    asked: list[int] = []

    async def fetch(self, peer, manifest, sums):
        asked.append(manifest.version)
        if manifest.version == 47:
            sc.peer_versions[0] = 48  # it loaded 48 meanwhile
            raise PeerMovedOn("HTTP 409 this replica holds version 48, not 47")
        return [b"x"]

    monkeypatch.setattr(PeerCatchUp, "_fetch", fetch)
    assert asyncio.run(PeerCatchUp(sc, "t").run(47)) is True
    assert asked == [47, 48] and sc.weight_version == 48 and sc.noted == [48]


def test_a_peer_that_fails_otherwise_is_not_asked_again_and_attempts_are_bounded(monkeypatch):
    _records(monkeypatch)
    sc = Sidecar(peer_versions=[5], latest=[5, 5, 5])
    asked: list[int] = []

    async def broken(self, peer, manifest, sums):
        asked.append(manifest.version)
        raise PeerUnavailable("bucket 0 does not match the learner's digest")

    monkeypatch.setattr(PeerCatchUp, "_fetch", broken)
    assert asyncio.run(PeerCatchUp(sc, "t").run(5)) is False and asked == [5]

    async def always_moving(self, peer, manifest, sums):
        asked.append(manifest.version)
        raise PeerMovedOn("HTTP 409")

    asked.clear()
    monkeypatch.setattr(PeerCatchUp, "_fetch", always_moving)
    assert asyncio.run(PeerCatchUp(sc, "t").run(5)) is False and asked == [5, 5, 5]
