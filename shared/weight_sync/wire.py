"""Wire records of the weight-sync protocol (JSON in Redis; no torch, no pickle).

- :class:`Manifest` — one version: its buckets, each a list of tensors (name, dtype, shape, byte offset)
  packed back to back as raw bytes, the checksum algorithm, and where its snapshot lives. Written before
  any bucket is packed, so replicas join the round while the publisher packs.
- :class:`Checksums` — one digest per bucket, written by the publisher once every bucket is packed and
  before the last bucket is broadcast (a replica holding every bucket can always read it).
- :class:`Rendezvous` — one update round: which group to join (address, port, world size, group name,
  backend), who is in it at which rank, the version it carries and the timeouts everyone uses.
- :class:`MemberReport` — what a replica says about a round (loaded / failed / refused).
- :class:`ReplicaInfo` — a replica in the registry (with its transport and current version).

Bucket layout is the one SGLang's ``flattened_bucket`` and vLLM's packed broadcast use: tensors' bytes
concatenated in manifest order with no padding, a bucket closing once it passes ``bucket_bytes``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

# dtypes a bucket may carry, by their torch attribute name (what SGLang / vLLM put on the wire too)
DTYPES: dict[str, int] = {
    "float32": 4, "float16": 2, "bfloat16": 2, "float64": 8,
    "float8_e4m3fn": 1, "float8_e5m2": 1,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
}


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    def dumps(self) -> str:
        return self.model_dump_json()

    @classmethod
    def loads(cls, raw: str | bytes):
        return cls.model_validate_json(raw)


GroupKind = Literal["torch", "pynccl"]


class TensorEntry(_Record):
    """One tensor inside a bucket: ``bucket[offset:offset + nbytes]`` holds its raw bytes."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int = Field(ge=0)
    nbytes: int = Field(ge=0)


class Bucket(_Record):
    """One flat buffer of the broadcast."""

    index: int = Field(ge=0)
    nbytes: int = Field(ge=0)
    tensors: tuple[TensorEntry, ...]


class SnapshotInfo(_Record):
    """Where the fallback transport finds this version: one safetensors file per bucket."""

    path: str = Field(description="Directory on a shared filesystem holding bucket-NNNNN.safetensors files.")
    url: str | None = Field(default=None, description="The same directory over HTTP, if it is served.")
    files: tuple[str, ...]
    checksums: tuple[int, ...] = Field(description="CRC32 of each file's bytes.")


class AdapterModule(_Record):
    """One adapted module of a LoRA adapter round: its tensors are ``{name}.lora_A`` ([rank, in]) and
    ``{name}.lora_B`` ([out, rank]); the module's weight is ``base + scaling * B @ A`` (transposed when
    ``fan_in_fan_out``: GPT-2's Conv1D keeps its weight as [in, out])."""

    name: str = Field(min_length=1, max_length=512)
    scaling: float
    fan_in_fan_out: bool = False


class AdapterInfo(_Record):
    """What makes a version an **adapter round**: its buckets hold only a LoRA adapter's tensors, which each
    replica applies to its own copy of the base model (the base it loaded at start, kept pristine: every version
    is base + that version's adapter, never a merge on top of the previous one)."""

    rank: int = Field(ge=1)
    alpha: float
    use_rslora: bool = False
    modules: tuple[AdapterModule, ...] = Field(min_length=1)

    def tensor_names(self) -> list[str]:
        return [f"{m.name}.{ab}" for m in self.modules for ab in ("lora_A", "lora_B")]


class Manifest(_Record):
    version: int = Field(ge=1)
    bucket_bytes: int
    total_bytes: int
    buckets: tuple[Bucket, ...]
    checksum: str | None = Field(
        default=None, description="Digest algorithm of the version's Checksums record (None: no checksums)."
    )
    snapshot: SnapshotInfo | None = None
    layout_id: str = Field(
        default="", description="Digest of the bucket layout (see layout_id()); equal ids mean equal buckets."
    )
    adapter: AdapterInfo | None = Field(
        default=None, description="Set for an adapter round: the buckets hold a LoRA adapter (its tensors named in "
                                  "AdapterInfo), not the model's weights.")
    merged_adapter: AdapterInfo | None = Field(
        default=None, description="Set for a LoRA learner's merged full round (a live replica cannot load adapters): "
                                  "the learner's base with this adapter merged in (the modules it names are base + "
                                  "scaling * B @ A, every other tensor the base), so a replica that keeps its base "
                                  "weights of those modules can take adapter rounds again afterwards.")
    created_at: float = Field(default_factory=time.time)

    def dumps(self) -> str:
        # the bucket list (thousands of entries) is serialised once per layout, not once per version
        head = self.model_dump(mode="json", exclude={"buckets"})
        return json.dumps(head)[:-1] + ', "buckets": ' + buckets_json(self.buckets) + "}"

    @property
    def num_tensors(self) -> int:
        return sum(len(b.tensors) for b in self.buckets)

    def tensor_names(self) -> list[str]:
        return [t.name for b in self.buckets for t in b.tensors]


_BUCKETS_JSON: tuple[tuple[Bucket, ...], str] | None = None


def buckets_json(buckets: tuple[Bucket, ...]) -> str:
    """JSON of a bucket list, cached for the last list serialised (publishers reuse one plan per layout)."""
    global _BUCKETS_JSON
    cached = _BUCKETS_JSON
    if cached is not None and len(cached[0]) == len(buckets) and all(a is b for a, b in zip(cached[0], buckets)):
        return cached[1]
    text = "[" + ", ".join(b.model_dump_json() for b in buckets) + "]"
    _BUCKETS_JSON = (tuple(buckets), text)
    return text


def layout_id(buckets: tuple[Bucket, ...], bucket_bytes: int) -> str:
    """A short digest naming a bucket layout, so replicas that already hold it need not fetch it again."""
    import hashlib

    return hashlib.sha1(f"{bucket_bytes}:".encode() + buckets_json(buckets).encode()).hexdigest()[:20]


class Checksums(_Record):
    """Digest of each bucket's bytes, in bucket order (see :mod:`shared.weight_sync.digest`)."""

    version: int = Field(ge=1)
    algo: str
    values: tuple[int, ...]


class Member(_Record):
    replica_id: str
    rank: int = Field(ge=1, description="First rank of the replica (the publisher is rank 0).")
    ranks: int = Field(default=1, ge=1, description="Ranks the replica occupies (its engine's TP size).")


class DeltaRound(_Record):
    """A delta round: each bucket goes as a patch against ``base_version`` (the version every member confirmed),
    unchanged, or whole. Members apply the patches to the bytes they hold and check every bucket against the
    version's digests (:class:`Checksums`); a member not at ``base_version`` refuses, and gets a full round."""

    base_version: int = Field(ge=1)
    piece_bytes: int = Field(
        default=0, ge=0, multiple_of=8,
        description="Buckets are patched in pieces of this many bytes (shared.weight_sync.delta.pieces), so a "
                    "member patches piece k while the publisher compares piece k+1 even within one bucket; 0: "
                    "whole buckets.")
    payload: tuple[int, ...] | None = Field(
        default=None,
        description="Per piece, what was broadcast: -1 the whole piece, 0 nothing (unchanged), n > 0 a patch "
                    "of n bytes (shared.weight_sync.delta). Members read it in band: before each piece the "
                    "publisher broadcasts that number (one int64), since a piece's patch is built while the one "
                    "before it is on the wire; the rendezvous gets it once the round's broadcasts are done (for "
                    "fleetrl weights status), None until then.")


class Rendezvous(_Record):
    round: int = Field(ge=1, description="Unique id of this update round (INCR).")
    version: int = Field(ge=1)
    manifest_key: str
    group_name: str
    fresh_group: bool = Field(description="True when this round forms a new group; False reuses the members' group.")
    backend: Literal["gloo", "nccl"]
    group: GroupKind = Field(default="torch", description="Kind of group to form (shared.weight_sync.group).")
    master_addr: str
    master_port: int
    world_size: int = Field(ge=2)
    members: tuple[Member, ...]
    init_timeout_s: float
    collective_timeout_s: float
    load_timeout_s: float
    layout_id: str = Field(default="", description="The version manifest's layout_id (receivers that hold that "
                                                    "layout start receiving without fetching the manifest).")
    checksum: str | None = Field(default=None, description="The manifest's checksum algorithm.")
    delta: DeltaRound | None = Field(default=None, description="Set for a delta round (None: every bucket whole).")
    merged_adapter: bool = Field(default=False, description="The version is a LoRA learner's merged full round (its "
                                                            "manifest's merged_adapter: members fetch the manifest).")
    created_at: float = Field(default_factory=time.time)

    def member(self, replica_id: str) -> Member | None:
        return next((m for m in self.members if m.replica_id == replica_id), None)


class IpcHandle(_Record):
    """One bucket shared by CUDA IPC: the fields of torch's ``UntypedStorage._share_cuda_()`` for the storage
    that holds it (bytes fields as base64), and where the bucket sits in that storage. Plain data, validated
    on the way in: nothing here is unpickled or executed; a replica opens the handle only on the GPU named
    by ``device_uuid``."""

    device_uuid: str = Field(min_length=1, max_length=64, description="UUID of the GPU that holds the memory.")
    handle: str = Field(min_length=1, max_length=512, description="cudaIpcMemHandle of the allocation (base64).")
    storage_nbytes: int = Field(ge=1)
    storage_offset: int = Field(ge=0, description="Byte offset of the storage in the shared allocation.")
    ref_counter_handle: str = Field(max_length=512, description="torch's IPC reference-counter file (base64).")
    ref_counter_offset: int = Field(ge=0)
    event_handle: str = Field(default="", max_length=512, description="cudaIpcEventHandle (base64; '' for none).")
    event_sync_required: bool = False
    offset: int = Field(ge=0, description="Byte offset of the bucket in the storage.")
    nbytes: int = Field(ge=0)


class IpcRound(_Record):
    """One update round for replicas on the publisher's own GPU: each bucket's handle; members copy the bytes
    device to device, digest them, and report (the publisher does not touch the buckets until they did)."""

    round: int = Field(ge=1)
    version: int = Field(ge=1)
    manifest_key: str
    members: tuple[str, ...]
    handles: tuple[IpcHandle, ...]
    init_timeout_s: float
    collective_timeout_s: float
    load_timeout_s: float
    layout_id: str = ""
    checksum: str | None = None
    created_at: float = Field(default_factory=time.time)

    def member(self, replica_id: str) -> str | None:
        return replica_id if replica_id in self.members else None


ReportState = Literal["loaded", "failed", "refused"]


class MemberReport(_Record):
    replica_id: str
    round: int
    version: int
    state: ReportState = Field(description="loaded: serving it; failed: alive, round broke; refused: bad data.")
    detail: str = ""


#: how a version reaches a replica: a weight transport's name, the same on both sides (the replica's
#: ``weights.transport`` and the learner's publisher; built in: collective, snapshot, ipc; each side's plug-in
#: point registers its own, docs/plugins.md)
Transport = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][\w.-]*$", max_length=64)]


class ReplicaInfo(_Record):
    replica_id: str
    name: str = Field(description="Human label (host:port of the rollout service).")
    transport: Transport
    backend: Literal["gloo", "nccl"] = "gloo"
    group: GroupKind = Field(
        default="torch", description="Kind of update group the replica can join: torch (torch.distributed: FleetRL's "
                                     "hf sidecar, SGLang) or pynccl (vLLM's native weight transfer).")
    ranks: int = 1
    engine: str = ""
    weight_version: int = 0
    wants_version: int = Field(default=0, description="Version the replica asks to be brought to (catch-up).")
    delta: bool = Field(default=False, description="The replica applies delta rounds (its sink holds the bytes "
                                                   "it receives: the hf engine); engines that receive into their "
                                                   "own buffers get every bucket whole.")
    adapters: bool = Field(default=False, description="The replica loads LoRA adapter rounds (applies a version's "
                                                      "adapter to its own base copy); one that cannot gets merged "
                                                      "full rounds.")
    peer_url: str = Field(default="", description="Where joining replicas fetch this replica's verified weights "
                                                  "(GET {peer_url}/weights/peer/...); '' when it serves none.")
    updated_at: float = Field(default_factory=time.time)


def plan_buckets(specs: Iterable[tuple[str, str, Sequence[int]]], bucket_bytes: int) -> list[Bucket]:
    """Group ``(name, dtype, shape)`` into buckets, in order: a bucket closes once it passes ``bucket_bytes``
    (vLLM's packing rule, so buckets line up with its packed consumer)."""
    buckets: list[Bucket] = []
    current: list[TensorEntry] = []
    offset = 0

    def close() -> None:
        nonlocal current, offset
        buckets.append(Bucket(index=len(buckets), nbytes=offset, tensors=tuple(current)))
        current, offset = [], 0

    for name, dtype, shape in specs:
        if dtype not in DTYPES:
            raise ValueError(f"tensor {name!r}: dtype {dtype!r} cannot be synced (known: {sorted(DTYPES)})")
        numel = 1
        for d in shape:
            numel *= int(d)
        nbytes = numel * DTYPES[dtype]
        current.append(TensorEntry(name=name, dtype=dtype, shape=tuple(int(d) for d in shape), offset=offset,
                                   nbytes=nbytes))
        offset += nbytes
        if offset > bucket_bytes:
            close()
    if current:
        close()
    return buckets
