"""Settings of the per-replica weight sidecar: the ``weights`` section of the rollout settings
(``weights: {backend: nccl}`` in the settings file, ``FLEETRL_ROLLOUT_WEIGHTS__BACKEND=nccl`` in the
environment). The timeouts of each update come from the publisher's rendezvous, so both sides always agree
on them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

from shared.plugins import PluginPoint
from shared.weight_sync.net import is_wildcard

LEGACY_ENV_PREFIX = "FLEETRL_WEIGHTS_"


#: weight transports on the replica's side, by name: a ``ReplicaTransport`` subclass (configured by this
#: ``weights`` section: no settings of their own). The learner's publisher registers the same names on its side
#: (``services.learner.weights.transport.PUBLISHER_TRANSPORTS``); register your own on both (docs/plugins.md).
REPLICA_TRANSPORTS: PluginPoint[Any] = PluginPoint(
    "weight transport (replica)", where="rollout: weights.transport", tag=None,
    doc="How versions reach a replica (services/rollout/weights/transport.py).",
    base="services.rollout.weights.transport:ReplicaTransport")
REPLICA_TRANSPORTS.register("collective", None, "services.rollout.weights.transport:CollectiveJoin")
REPLICA_TRANSPORTS.register("snapshot", None, "services.rollout.weights.transport:SnapshotPull")
REPLICA_TRANSPORTS.register("ipc", None, "services.rollout.weights.transport:IpcJoin")


class SidecarSettings(BaseModel):
    """The weight sidecar of one rollout replica (``RolloutSettings.weights``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(default=True, description="Run the sidecar (join weight updates) in this replica.")
    transport: str = Field(
        default="collective",
        description="collective: join the publisher's broadcast group; ipc: on the learner's own GPU, copy each "
                    "version device to device from the learner's buckets by CUDA IPC handle (hf engine); snapshot: "
                    "pull safetensors snapshots (for replicas that cannot join a collective); or a transport you "
                    "registered (docs/plugins.md). fleetrl run chooses it from where the learner and the replica "
                    "are placed.",
    )
    backend: Literal["gloo", "nccl"] = Field(default="gloo", description="Collective backend this replica can join.")
    group: Literal["auto", "torch", "pynccl"] = Field(
        default="auto",
        description="Kind of update group the engine joins: auto = the engine's own (vllm: pynccl, vLLM's "
                    "communicator; hf and sglang: torch). Set it for an engine build whose weight transfer joins "
                    "the other kind.",
    )
    ranks: int = Field(default=1, ge=1, description="Ranks the engine occupies in the group (its TP size).")
    bind_addr: str | None = Field(
        default=None,
        description="hf engine with gloo: the address this replica's gloo sockets listen on (ephemeral ports) "
                    "and that the publisher dials. Unset: this host's address on the route to the publisher's "
                    "master_addr (127.0.0.1 when the learner runs on this host). A specific address, not "
                    "0.0.0.0: peers dial what it advertises. SGLang and vLLM servers open their own sockets.",
    )
    pause_mode: Literal["wait", "abort", "partial"] = Field(
        default="wait",
        description="Around the switch: wait = in-flight requests finish on the old weights; abort = they end "
                    "with finish_reason abort (the rollout worker regenerates their group); partial = they are "
                    "interrupted at a token boundary and continue from their exact tokens under the new weights "
                    "(partial rollouts: each token records the version that produced it, version_spans).",
    )
    pause_timeout_s: float = Field(
        default=120.0, gt=0, description="Longest wait for in-flight requests before aborting them."
    )
    keep_staging: bool = Field(
        default=True,
        description="hf: keep the receive buffers (one flat copy of the weights, in host memory for gloo or on "
                    "the device for nccl) between updates, so updates fault in no fresh pages; off frees them "
                    "after each update (less memory, slower updates).",
    )
    apply_mode: Literal["swap", "copy"] = Field(
        default="swap",
        description="hf: how a verified version enters the model: swap = its tensors are re-pointed at the "
                    "received buffers (no copy; for engines that read weights through the module, as the hf "
                    "engine does); copy = copied into the model's own storage (for code that holds raw "
                    "pointers to the weights, e.g. captured CUDA graphs).",
    )
    adapters: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="LoRA adapter rounds (a LoRA learner sends only the adapter; docs/weight-sync.md): on = this "
                    "replica loads them; off = it asks for merged full rounds; auto = on for the hf engine, off for "
                    "engine servers (vLLM needs --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True, SGLang "
                    "--enable-lora: turn it on where the server was started so).",
    )
    adapter_apply: Literal["merge", "unmerged"] = Field(
        default="merge",
        description="hf: how an adapter round enters the model: merge = each adapted weight becomes base + "
                    "scaling * B @ A (from a copy of the base weights; faster generation; the version is served "
                    "hooked at once and merged in the background, then swapped in between two decode steps), "
                    "unmerged = the base stays and hooks add the adapter's output at every forward (no copy).",
    )
    adapters_resident: int = Field(
        default=0, ge=0, le=64,
        description="Engine servers: adapter versions kept loaded (older ones are unloaded); 0 = "
                    "run.max_staleness + 1 (requests still running on an older version keep their adapter).",
    )
    adapter_dir: str | None = Field(
        default=None,
        description="Engine servers: where adapter versions are written for the server to load (a path the server "
                    "reads too); unset: a temporary directory of this process.",
    )
    heartbeat_s: float = Field(default=1.0, gt=0, description="Registry heartbeat period.")
    heartbeat_ttl_s: float = Field(default=5.0, gt=0, description="A replica silent this long is considered dead.")
    poll_s: float = Field(
        default=1.0, gt=0,
        description="Longest wait for a round announcement before the rendezvous is read anyway (rounds are "
                    "announced on a Redis stream, so a replica joins one as soon as it is published).",
    )
    join_timeout_s: float = Field(
        default=60.0, ge=0,
        description="At startup, how long to wait to be brought to the latest version before serving anyway "
                    "(its responses then report the older weight_version).",
    )
    snapshot_timeout_s: float = Field(default=300.0, gt=0, description="Bound on fetching one snapshot file.")
    peer: bool = Field(default=True, description="Elastic pool: serve this replica's verified weights to joining "
                       "peers (GET /weights/peer/*, control token) and, when joining behind, load the latest version "
                       "from a peer before asking the publisher (docs/elastic.md).")
    peer_timeout_s: float = Field(default=60.0, gt=0, le=3600, description="Bound on fetching one bucket from a peer.")
    snapshot_prefer_url: bool = Field(default=False, description="Fetch snapshots over HTTP even if the path is visible.")
    snapshot_trusted_urls: list[str] = Field(
        default_factory=list,
        description="URL prefixes this replica fetches snapshot files from (the learner's snapshot_url): a manifest "
                    "in Redis naming any other URL is refused, so whoever can write to Redis cannot point replicas "
                    "at a server of theirs. Empty: snapshots are read from the shared path only.",
    )
    snapshot_root: str | None = Field(
        default=None,
        description="The directory snapshot paths must lie under (the learner's snapshot_dir as this host sees it); "
                    "unset: any path the manifest names (file names are always bucket-NNNNN.safetensors).",
    )
    require_checksums: bool = Field(
        default=True,
        description="Refuse a version that carries no per-bucket digests (a manifest with checksum null, as a "
                    "publisher with checksum: false writes; or one forged in Redis to skip verification).",
    )

    @field_validator("transport")
    @classmethod
    def _known_transport(cls, v: str) -> str:
        if v not in REPLICA_TRANSPORTS:
            raise ValueError(REPLICA_TRANSPORTS.unknown(v))
        return v

    @field_validator("bind_addr")
    @classmethod
    def _specific_address(cls, value: str | None) -> str | None:
        if value is not None and is_wildcard(value):
            raise ValueError(f"bind_addr {value!r} is every interface, but gloo advertises this address to the "
                             "publisher, which must be able to dial it: name this host's address on the learner's "
                             "network, or leave it unset")
        return value


def refuse_legacy_env(environ: Mapping[str, str]) -> None:
    """Refuse (a ``ValueError``: one line that names the new setting) an ``environ`` that sets a
    ``FLEETRL_WEIGHTS_*`` variable: the sidecar used to read those, and ignoring one silently would run the
    sidecar with other settings than its operator asked for. The rollout settings call it with the
    environment they read."""
    old = sorted(v for v in environ if v.upper().startswith(LEGACY_ENV_PREFIX))
    if old:
        key = old[0][len(LEGACY_ENV_PREFIX):].lower()
        # PydanticCustomError is a ValueError that pydantic reports as it is (no "Value error, " prefix)
        raise PydanticCustomError(
            "legacy_setting",
            f"{old[0]} is no longer read: the weight sidecar's settings are the rollout settings' weights section "
            f"(FLEETRL_ROLLOUT_WEIGHTS__{key.upper()}, or weights: {{{key}: ...}} in the settings file)")
