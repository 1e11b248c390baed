"""The frames a python scorer's worker process and the service exchange on its stdin / stdout: a 4-byte
big-endian length, then that many bytes of JSON (no pickle: what crosses is items and floats)."""

from __future__ import annotations

import json
import struct
from typing import Any, BinaryIO

HEADER = struct.Struct(">I")
MAX_FRAME = 1 << 30


def read_frame(stream: BinaryIO) -> Any | None:
    """The next frame's JSON value, or None at end of input."""
    head = stream.read(HEADER.size)
    if len(head) < HEADER.size:
        return None
    (size,) = HEADER.unpack(head)
    if size > MAX_FRAME:
        raise ValueError(f"frame of {size} bytes")
    return json.loads(stream.read(size))


def encode_frame(value: Any) -> bytes:
    data = json.dumps(value, separators=(",", ":")).encode()
    return HEADER.pack(len(data)) + data
