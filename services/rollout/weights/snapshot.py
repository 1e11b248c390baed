"""Reading the snapshot transport's files (written by the learner's ``services/learner/weights/snapshot.py``):
one safetensors file per bucket per version, from a shared path or over HTTP, each checked against the CRC32
the manifest's :class:`~shared.weight_sync.wire.SnapshotInfo` gives, then read with the ``safetensors``
library (no pickle)."""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from shared.weight_sync.wire import SnapshotInfo


class SnapshotError(RuntimeError):
    """A snapshot file is missing, unreadable or does not match its checksum."""


FILE_NAME = re.compile(r"bucket-\d{5}\.safetensors")


def check_info(info: SnapshotInfo, root: str | None = None) -> None:
    """Refuse (:class:`SnapshotError`) a snapshot record that names files outside its directory or a directory
    outside ``root`` (the record comes from Redis: whoever can write there must not be able to point a replica
    at other files; its URL is checked where it would be fetched, :func:`fetch_file`)."""
    bad = [f for f in info.files if not FILE_NAME.fullmatch(f)]
    if bad:
        raise SnapshotError(f"snapshot file name {bad[0]!r} is not bucket-NNNNN.safetensors")
    if len(info.checksums) != len(info.files):
        raise SnapshotError("the snapshot record has not one checksum per file")
    if root is not None:
        base, path = Path(root).resolve(), Path(info.path).resolve()
        if path != base and base not in path.parents:
            raise SnapshotError(f"snapshot path {info.path} is outside weights.snapshot_root {root}")


def trusted(url: str, trusted_urls: Sequence[str]) -> bool:
    """Is ``url`` under one of the ``trusted_urls`` prefixes (whole path segments: ``http://a`` is not a
    prefix of ``http://a.evil``)?"""
    url = url.rstrip("/") + "/"
    return any(url.startswith(t.rstrip("/") + "/") for t in trusted_urls)


def fetch_file(info: SnapshotInfo, i: int, timeout_s: float, prefer_url: bool = False,
               trusted_urls: Sequence[str] = ()) -> bytes:
    """Bytes of file ``i``: from the shared path when it is visible here, else over HTTP from a trusted URL
    (check the record first: :func:`check_info`)."""
    local = Path(info.path) / info.files[i]
    if not prefer_url and local.is_file():
        data = local.read_bytes()
    elif info.url:
        import httpx

        if not trusted(info.url, trusted_urls):
            raise SnapshotError(f"snapshot URL {info.url} is not under weights.snapshot_trusted_urls "
                                f"({list(trusted_urls) or 'none'}): add the learner's snapshot_url there")

        try:
            r = httpx.get(f"{info.url}/{info.files[i]}", timeout=timeout_s)
            r.raise_for_status()
        except httpx.HTTPError as exc:
            raise SnapshotError(f"fetching {info.files[i]} from {info.url} failed: {exc}") from exc
        data = r.content
    else:
        raise SnapshotError(f"{local} is not visible here and the snapshot has no URL")
    if zlib.crc32(data) != info.checksums[i]:
        raise SnapshotError(f"{info.files[i]}: checksum mismatch (file corrupt or replaced)")
    return data


def read_snapshot(info: SnapshotInfo, timeout_s: float = 120.0, prefer_url: bool = False,
                  trusted_urls: Sequence[str] = (), root: str | None = None) -> Iterator[dict[str, Any]]:
    """Each file's tensors (a dict name -> CPU tensor), verified, one file at a time."""
    from safetensors.torch import load

    check_info(info, root=root)
    for i in range(len(info.files)):
        yield load(fetch_file(info, i, timeout_s, prefer_url, trusted_urls))
