"""Publisher-side settings of the weight-sync protocol (receivers take their timeouts from the rendezvous)."""

from __future__ import annotations

import ipaddress
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from shared.weight_sync.net import is_loopback, is_wildcard

MiB = 1024 * 1024


def _is_ip(addr: str) -> bool:
    try:
        ipaddress.ip_address(addr.strip("[]"))
        return True
    except ValueError:
        return False


class WeightSyncSettings(BaseModel):
    """How the learner publishes weights. Every wait the protocol does is bounded by one of these."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: Literal["gloo", "nccl"] = Field(
        default="gloo", description="torch.distributed backend: nccl between GPUs, gloo on CPUs (same code)."
    )
    bucket_bytes: int = Field(
        default=256 * MiB, ge=1, description="Target size of one flat bucket; a bucket closes once it passes this."
    )
    master_addr: str = Field(
        default="127.0.0.1", min_length=1,
        description="Address replicas dial to reach the publisher (rank 0) of the group.",
    )
    bind_addr: str | None = Field(
        default=None,
        description="Address the publisher's rendezvous store and gloo sockets listen on. Unset: master_addr, "
                    "so they listen only where replicas dial (127.0.0.1 by default). Set it when master_addr is "
                    "not an address of this host (NAT, a load balancer): this host's address on the replicas' "
                    "network, or 0.0.0.0 for every interface (gloo then takes the address this host's name "
                    "resolves to, or GLOO_SOCKET_IFNAME). Nothing on these sockets authenticates a peer: keep "
                    "them on a private network (README.md, Trust boundary).",
    )
    rendezvous_port: int = Field(
        default=0, ge=0, le=65535,
        description="TCP port of a group's rendezvous store (hosted by the publisher). 0: a free port per group "
                    "(one machine). Fixed (firewalls, Kubernetes): each group takes the first free port of "
                    "rendezvous_port .. rendezvous_port + rendezvous_ports - 1.",
    )
    rendezvous_ports: int = Field(
        default=4, ge=1, le=1024,
        description="With a fixed rendezvous_port, how many ports groups may occupy at once: the group kept "
                    "per group kind (torch, pynccl) and a late joiner's catch-up group, so 3 at most.",
    )
    init_timeout_s: float = Field(default=60.0, gt=0, description="Bound on forming a process group.")
    collective_timeout_s: float = Field(
        default=120.0, gt=0, description="Bound on each bucket's broadcast (size it for one bucket on a slow link)."
    )
    regroup_timeout_s: float = Field(
        default=10.0, gt=0,
        description="After a failed round, how long (beyond collective_timeout_s) to wait for members to say they "
                    "are alive before dropping them.",
    )
    load_timeout_s: float = Field(
        default=60.0, gt=0, description="After the broadcast, how long members have to report the version loaded."
    )
    max_attempts: int = Field(default=3, ge=1, description="Rounds per publish before giving up on the stragglers.")
    checksum: bool = Field(default=True, description="A digest per bucket; receivers verify it before loading.")
    checksum_algo: Literal["auto", "xxh3_64", "wsum64", "crc32"] = Field(
        default="auto",
        description="Digest algorithm (shared.weight_sync.digest). auto: xxh3_64 with gloo (memory speed on a "
                    "CPU), wsum64 with nccl (computed on the GPU, no copy to the host).",
    )
    inflight_buckets: int = Field(
        default=2, ge=1,
        description="Broadcasts outstanding at once; the next bucket is packed while these are on the wire.",
    )
    retain: Literal["auto", "copy", "none"] = Field(
        default="auto",
        description="What the publisher keeps of a version for replicas that join late (weights laid out by "
                    "flatten() are sent in place whatever this says). copy: a host copy of every bucket, served "
                    "at any time (memory: one flat copy of the weights). none: buckets are packed into "
                    "inflight_buckets + 1 reused buffers on the weights' device (GPU weights are packed on the "
                    "GPU for nccl, with no trip through host memory) and nothing is kept: a late joiner gets the "
                    "next version. auto: none with nccl, copy with gloo. A snapshot_dir implies copy.",
    )
    delta: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="Delta rounds: when every member of a round holds the version all of them last confirmed (the "
                    "base), each bucket may go as a patch of its changed elements against it (or whole, when that is "
                    "not smaller); members check the result against the new version's digests. A delta round "
                    "carries ~0.03x the bytes at lr 1e-6 but puts the learner's compare on the round's critical "
                    "path: measured 0.16x a full round's time on a 1 Gb/s link, 0.37x at 2.5 Gb/s, 1.15x at 5 Gb/s, "
                    "0.8-1.3x on loopback (docs/benchmarks.md, Weight delta). auto: the publisher chooses per "
                    "round from the time its recent delta and full rounds took (the faster kind; the other one "
                    "every delta_probe_every rounds; the second round is a delta round, to measure one). on: a "
                    "delta round whenever every member is level with the base. off: every bucket whole, every "
                    "round. auto and on cost one copy of the wire bytes on the learner (the base), on the device "
                    "the buckets are packed on, and need the version's bytes held through the publish (weights "
                    "laid out in place, or retain copy: the default with gloo); otherwise every round is full.",
    )
    delta_probe_every: int = Field(
        default=20, ge=2,
        description="With delta: auto, every this many rounds the kind that has been slower (delta or full) runs "
                    "once, so a change of learning rate, link or replica count is noticed; a probe of a kind r "
                    "times slower costs (r - 1) / delta_probe_every of a round on average.",
    )
    full_every: int = Field(
        default=50, ge=1,
        description="With delta auto or on: every this many versions a round sends every bucket whole anyway (bounds what "
                    "any undetected damage could cost).",
    )
    snapshot_dir: str | None = Field(
        default=None,
        description="Write a safetensors snapshot per version here (the fallback transport); unset = no snapshots.",
    )
    snapshot_url: str | None = Field(
        default=None, description="Base URL under which snapshot_dir is served over HTTP (advertised in the manifest)."
    )
    snapshot_keep: int = Field(default=2, ge=1, description="Snapshot versions kept on disk.")
    catch_up_poll_s: float = Field(
        default=0.25, gt=0, description="How often the publisher looks for replicas that joined late."
    )
    key_ttl_s: int = Field(default=24 * 3600, ge=60, description="Expiry of per-version and per-round Redis keys.")

    @property
    def listen_addr(self) -> str:
        """Where the rendezvous store listens (``bind_addr``, defaulting to ``master_addr``)."""
        return self.bind_addr if self.bind_addr is not None else self.master_addr

    @property
    def gloo_addr(self) -> str | None:
        """Where the publisher's gloo sockets listen: ``listen_addr``, or None (gloo's default) for a wildcard."""
        return None if is_wildcard(self.listen_addr) else self.listen_addr

    @property
    def digest_algo(self) -> str:
        """The digest algorithm in use (``checksum_algo`` with ``auto`` resolved for the backend)."""
        if self.checksum_algo != "auto":
            return self.checksum_algo
        return "wsum64" if self.backend == "nccl" else "xxh3_64"

    @field_validator("delta", mode="before")
    @classmethod
    def _yaml_on_off(cls, value: object) -> object:
        """YAML 1.1 (PyYAML) reads an unquoted ``delta: on`` / ``off`` as a boolean: take it as the word."""
        if isinstance(value, bool):
            return "on" if value else "off"
        return value

    @model_validator(mode="after")
    def _check(self) -> WeightSyncSettings:
        if self.snapshot_url is not None and self.snapshot_dir is None:
            raise ValueError("snapshot_url needs snapshot_dir (the directory that URL serves)")
        if self.rendezvous_port and self.rendezvous_port + self.rendezvous_ports - 1 > 65535:
            raise ValueError(f"rendezvous ports {self.rendezvous_port}..{self.rendezvous_port + self.rendezvous_ports - 1}"
                             " run past 65535: lower rendezvous_port or rendezvous_ports")
        if is_loopback(self.listen_addr) and not is_loopback(self.master_addr) and _is_ip(self.master_addr):
            raise ValueError(f"replicas dial master_addr {self.master_addr}, but bind_addr {self.listen_addr} listens "
                             "on loopback only: set bind_addr to this host's address on the replicas' network "
                             "(or leave it unset to listen on master_addr)")
        return self
