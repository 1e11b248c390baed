"""Weights from a peer: how a replica that joins a running pool reaches the latest version without the learner.

A replica serves the version its engine holds, bucket by bucket, as raw bytes in the layout the learner
published (``GET /weights/peer/{version}/{bucket}``, control token; :func:`bucket_bytes` packs them from the
engine's own tensors, so it costs no memory while nobody asks). A joiner (:class:`PeerCatchUp`, run by the
sidecar before it asks the publisher) picks a live peer that advertises the version (``ReplicaInfo.peer_url``,
``weight_version``), reads the version's manifest and digests from Redis (both written by the learner), fetches
every bucket, checks its size and digest, and only then loads the whole version into its engine. A peer that
fails, answers for another version, or sends a byte that does not match is skipped for the next; if none
serves the version, the sidecar asks the publisher as before. The learner's publish bytes do not grow with
joiners: they never ask it for a catch-up round.

No pickle and no ``torch.load``: bytes are copied into uint8 buffers and viewed with the manifest's dtypes.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any

import httpx

from shared.weight_sync import keys as wkeys
from shared.weight_sync.wire import Bucket, Checksums, Manifest, ReplicaInfo

log = logging.getLogger(__name__)

PEER_ROUTE = "/weights/peer"


class PeerUnavailable(RuntimeError):
    """This peer cannot serve the version (gone, another version, bad bytes): try the next."""


class PeerMovedOn(PeerUnavailable):
    """This peer holds a newer version than the one asked for (409): ask it again for that one."""


def bucket_bytes(targets: dict[str, Any], bucket: Bucket) -> bytes:
    """Bucket ``bucket`` of a version as this module holds it: each tensor's bytes in the wire dtype at its offset
    (what the learner's packing produced, so the learner's digests match)."""
    import torch

    from shared.weight_sync.tensors import torch_dtype

    buf = torch.zeros(bucket.nbytes, dtype=torch.uint8, device="cpu")  # host bytes for the HTTP body
    with torch.no_grad():
        for e in bucket.tensors:
            src = targets[e.name].detach().to("cpu", torch_dtype(e.dtype)).contiguous().reshape(-1)
            buf[e.offset:e.offset + e.nbytes] = src.view(torch.uint8)
    return buf.numpy().tobytes()


async def version_records(redis: Any, run: str, version: int) -> tuple[Manifest, Checksums] | None:
    """The learner's manifest and digests of ``version`` (None if either is gone or there are no digests)."""
    raw_m, raw_c = await redis.mget(wkeys.manifest(run, version), wkeys.checksums(run, version))
    if raw_m is None or raw_c is None:
        return None
    manifest, sums = Manifest.loads(raw_m), Checksums.loads(raw_c)
    if sums.version != version or manifest.version != version or len(sums.values) != len(manifest.buckets):
        return None
    return manifest, sums


class PeerCatchUp:
    """Bring a sidecar's engine to a version from a peer (see the module docstring)."""

    def __init__(self, sidecar: Any, token: str | None) -> None:
        self.sidecar = sidecar
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.last_peer: str | None = None

    async def peers(self, version: int) -> list[ReplicaInfo]:
        """Live peers that serve weights and hold a version newer than ours and at most ``version``, the newest
        first (shuffled within a version, so joiners spread over the peers)."""
        sc = self.sidecar
        found = [i for i in await sc.registry.alive() if i.replica_id != sc.replica_id and i.peer_url
                 and sc.weight_version < i.weight_version <= version]
        random.shuffle(found)
        return sorted(found, key=lambda i: -i.weight_version)

    async def run(self, version: int, attempts: int = 3) -> bool:
        """Load the newest version up to ``version`` that a peer holds (``version`` itself where one does: a peer
        in the middle of a round may still be one behind); True if the engine moved to a newer version. A peer
        that moved on to a newer version while we fetched (409: the learner publishes every step) is asked again,
        for the version it holds now, up to ``attempts`` times in all."""
        sc = self.sidecar
        if version < 1 or not hasattr(sc.sink, "load_buckets"):
            return False
        for _ in range(attempts):
            moved_on = False
            records: dict[int, tuple[Manifest, Checksums] | None] = {}
            for peer in await self.peers(version):
                v = peer.weight_version
                if v <= sc.weight_version:
                    continue
                if v not in records:
                    records[v] = await version_records(sc.redis, sc.run, v)
                record = records[v]
                if record is None:
                    continue
                manifest, sums = record
                t0 = time.perf_counter()
                try:
                    buffers = await self._fetch(peer, manifest, sums)
                    fetched = time.perf_counter() - t0
                    await sc.sink.load_buckets(manifest, buffers)
                except PeerMovedOn as exc:
                    log.info("peer %s moved on from version %d: %s", peer.name, v, exc)
                    moved_on = True
                    continue
                except PeerUnavailable as exc:
                    log.warning("peer %s could not serve version %d: %s", peer.name, v, exc)
                    continue
                self.last_peer = peer.peer_url
                sc.note_peer_update(v, peer.peer_url, time.perf_counter() - t0,
                                    {"fetch": round(fetched, 4), "apply": round(time.perf_counter() - t0 - fetched, 4)})
                log.info("weight version %d loaded from peer %s (%d buckets, %d bytes, %.2fs)", v, peer.name,
                         len(manifest.buckets), manifest.total_bytes, time.perf_counter() - t0)
                return True
            if not moved_on:
                return False
            version = max(version, await sc.latest())  # the peers hold newer versions now: ask for those
        return False

    async def _fetch(self, peer: ReplicaInfo, manifest: Manifest, sums: Checksums) -> list[Any]:
        import torch

        from shared.weight_sync.digest import digest

        out = []
        timeout = httpx.Timeout(self.sidecar.settings.peer_timeout_s, connect=5.0)
        async with httpx.AsyncClient(timeout=timeout, headers=self.headers) as client:
            for b in manifest.buckets:
                url = f"{peer.peer_url}{PEER_ROUTE}/{manifest.version}/{b.index}"
                try:
                    r = await client.get(url)
                except httpx.HTTPError as exc:
                    raise PeerUnavailable(f"{url}: {type(exc).__name__}: {exc}") from exc
                if r.status_code == 409:
                    raise PeerMovedOn(f"{url}: HTTP 409 {r.text[:200]}")
                if r.status_code != 200:
                    raise PeerUnavailable(f"{url}: HTTP {r.status_code} {r.text[:200]}")
                if len(r.content) != b.nbytes:
                    raise PeerUnavailable(f"{url}: {len(r.content)} bytes, the manifest says {b.nbytes}")
                buf = torch.frombuffer(bytearray(r.content), dtype=torch.uint8)
                if digest(buf, sums.algo) != sums.values[b.index]:
                    raise PeerUnavailable(f"{url}: bucket {b.index} does not match the learner's digest")
                out.append(buf)
        return out
