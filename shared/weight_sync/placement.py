"""Where the weights live decides how they travel: pure functions, no torch, table-tested on CPU.

- :func:`choose_route`: the transport (and collective backend) between the publisher's device and one replica's
  device: replicas on the publisher's own GPU get the buckets device to device by CUDA IPC handle (``ipc``);
  replicas on another GPU join an NCCL group (``collective`` / ``nccl``); anything on a CPU uses gloo, the
  GPU side staging through pinned host memory. :func:`check_route` refuses, in one line, a route that cannot
  work (NCCL never pairs two ranks on one GPU; IPC handles open only on the GPU that made them), by the
  :class:`TransportPlacement` its transport declares (``placement`` on the replica's transport class).
- :func:`wire_staging`: for one bucket on one device, what a consumer (a gloo or NCCL collective, an IPC
  handle, a file) needs done before it reads the bytes: nothing, a copy to (pinned) host memory, or an upload
  to the GPU. A CUDA tensor never reaches gloo, numpy or a file without this step.

Devices are strings as torch prints them: ``cpu``, ``cuda``, ``cuda:1``. ``cuda`` means the current device,
index 0 unless the process says otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

RouteTransport = Literal["collective", "ipc", "snapshot"]
Backend = Literal["gloo", "nccl"]
Consumer = Literal["gloo", "nccl", "ipc", "file"]


class PlacementError(ValueError):
    """A placement whose weights cannot travel the way asked (the message is one line that says why and what to do)."""


@dataclass(frozen=True)
class Route:
    """How a version travels from the publisher to one replica."""

    transport: RouteTransport
    backend: Backend = "gloo"  # the collective's backend (also what an ipc replica advertises; unused by it)


@dataclass(frozen=True)
class TransportPlacement:
    """The placement rules a weight transport declares (``ReplicaTransport.placement``); the default, no rules,
    is what a third-party transport gets unless it declares its own."""

    #: the replica reads the learner's GPU buffers in place (CUDA IPC handles): both on GPUs, the same GPU, one host
    shares_device_memory: bool = False
    #: the bytes travel over the route's collective backend, whose rules apply (nccl: two GPUs, never one)
    uses_backend: bool = False


@dataclass(frozen=True)
class Staging:
    """What happens to a bucket's bytes before its consumer reads them."""

    device: Literal["cpu", "cuda"]  # where the consumer reads them
    copy: bool                      # a copy is made (to the host, or up to the GPU)
    pinned: bool                    # the host side of that copy is page-locked (fast, asynchronous DMA)


def parse_device(device: str) -> tuple[str, int | None]:
    """``('cpu', None)``, ``('cuda', 0)`` for ``cuda`` / ``cuda:0``, ``('cuda', 1)`` for ``cuda:1``."""
    text = device.strip().lower()
    if text == "cpu":
        return "cpu", None
    if text == "cuda":
        return "cuda", 0
    if text.startswith("cuda:") and text[5:].isdigit():
        return "cuda", int(text[5:])
    raise PlacementError(f"device {device!r}: use 'cpu', 'cuda' or 'cuda:<index>'")


def choose_route(publisher: str, replica: str, same_host: bool = True) -> Route:
    """The transport between a publisher on ``publisher`` and a replica on ``replica`` (see the module docstring)."""
    p_kind, p_index = parse_device(publisher)
    r_kind, r_index = parse_device(replica)
    if p_kind == "cpu" or r_kind == "cpu":
        return Route("collective", "gloo")
    if same_host and p_index == r_index:
        return Route("ipc", "nccl")
    return Route("collective", "nccl")


def check_route(route: Route, publisher: str, replica: str, same_host: bool = True,
                placement: TransportPlacement = TransportPlacement()) -> None:
    """Raise :class:`PlacementError` when ``route`` cannot carry weights between these two devices, by the rules
    its transport declares (``placement``)."""
    p_kind, p_index = parse_device(publisher)
    r_kind, r_index = parse_device(replica)
    same_gpu = same_host and p_kind == r_kind == "cuda" and p_index == r_index
    if placement.shares_device_memory:
        if p_kind != "cuda" or r_kind != "cuda":
            raise PlacementError(f"weights transport {route.transport} needs the learner and the replica on GPUs "
                                 f"(learner on {publisher}, replica on {replica}): use collective (gloo) for a CPU "
                                 "side")
        if not same_gpu:
            where = "" if same_host else ", another host"
            raise PlacementError(f"weights transport {route.transport} shares GPU memory, so the replica must be on "
                                 f"the learner's GPU (learner on {publisher}, replica on {replica}{where}): use "
                                 "collective with backend nccl")
    elif placement.uses_backend and route.backend == "nccl":
        if p_kind != "cuda" or r_kind != "cuda":
            raise PlacementError(f"weights backend nccl needs GPUs on both sides (learner on {publisher}, replica on "
                                 f"{replica}): use backend gloo")
        if same_gpu:
            raise PlacementError(f"weights backend nccl cannot pair two ranks on one GPU (learner and replica both on "
                                 f"{publisher}; NCCL refuses it): use transport ipc, or put the replica on another GPU")


def wire_staging(consumer: Consumer, device: str) -> Staging:
    """What a bucket on ``device`` needs before ``consumer`` reads it (see the module docstring)."""
    kind, _ = parse_device(device)
    if consumer in ("gloo", "file"):
        # gloo and files read host memory: a GPU bucket is copied down through a pinned buffer
        return Staging("cpu", copy=kind == "cuda", pinned=kind == "cuda")
    if consumer == "nccl":
        # NCCL reads GPU memory: a host bucket is uploaded from a pinned buffer
        return Staging("cuda", copy=kind == "cpu", pinned=kind == "cpu")
    if kind != "cuda":
        raise PlacementError(f"weights transport ipc shares GPU memory, but the weights are on {device}")
    return Staging("cuda", copy=False, pinned=False)
