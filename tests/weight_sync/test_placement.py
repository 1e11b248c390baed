"""Which transport carries weights between two devices, which placements are refused, and what a bucket needs
before each consumer reads it: pure functions, every case in a table."""

from __future__ import annotations

import pytest

from services.rollout.weights.settings import REPLICA_TRANSPORTS
from shared.weight_sync.placement import (
    PlacementError,
    Route,
    Staging,
    TransportPlacement,
    check_route,
    choose_route,
    wire_staging,
)


def declared(route: Route) -> TransportPlacement:
    """The placement rules the route's (built-in) transport declares."""
    return REPLICA_TRANSPORTS.load(route.transport).placement


@pytest.mark.parametrize(("learner", "replica", "same_host", "route"), [
    ("cpu", "cpu", True, Route("collective", "gloo")),
    ("cuda", "cpu", True, Route("collective", "gloo")),      # the GPU side stages through pinned host memory
    ("cpu", "cuda:0", True, Route("collective", "gloo")),
    ("cuda", "cuda", True, Route("ipc", "nccl")),             # same GPU: device to device by IPC handle
    ("cuda:0", "cuda", True, Route("ipc", "nccl")),
    ("cuda:1", "cuda:1", True, Route("ipc", "nccl")),
    ("cuda:0", "cuda:1", True, Route("collective", "nccl")),  # another GPU: NCCL
    ("cuda:0", "cuda:0", False, Route("collective", "nccl")),  # same index on another host is another GPU
])
def test_route_follows_placement(learner, replica, same_host, route):
    assert choose_route(learner, replica, same_host) == route
    check_route(route, learner, replica, same_host, declared(route))  # what it chooses always works


@pytest.mark.parametrize(("route", "learner", "replica", "same_host", "says"), [
    (Route("collective", "nccl"), "cuda:0", "cuda", True, "cannot pair two ranks on one GPU"),
    (Route("collective", "nccl"), "cuda:0", "cpu", True, "needs GPUs on both sides"),
    (Route("ipc"), "cuda:0", "cuda:1", True, "must be on the learner's GPU"),
    (Route("ipc"), "cuda:0", "cuda:0", False, "another host"),
    (Route("ipc"), "cpu", "cpu", True, "needs the learner and the replica on GPUs"),
])
def test_impossible_placements_are_refused_in_one_line(route, learner, replica, same_host, says):
    with pytest.raises(PlacementError, match=says) as err:
        check_route(route, learner, replica, same_host, declared(route))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(("route", "learner", "replica"), [
    (Route("collective", "gloo"), "cuda:0", "cuda:0"),  # works (staged through the host), just slow
    (Route("snapshot"), "cuda:0", "cuda:1"),
    (Route("collective", "nccl"), "cuda:0", "cuda:1"),
])
def test_workable_explicit_routes_pass(route, learner, replica):
    check_route(route, learner, replica, placement=declared(route))


@pytest.mark.parametrize(("consumer", "device", "staging"), [
    ("gloo", "cpu", Staging("cpu", copy=False, pinned=False)),
    ("gloo", "cuda:0", Staging("cpu", copy=True, pinned=True)),   # a CUDA tensor never reaches gloo
    ("file", "cpu", Staging("cpu", copy=False, pinned=False)),
    ("file", "cuda", Staging("cpu", copy=True, pinned=True)),     # ... nor numpy or a file
    ("nccl", "cuda:1", Staging("cuda", copy=False, pinned=False)),
    ("nccl", "cpu", Staging("cuda", copy=True, pinned=True)),     # host weights upload from pinned buffers
    ("ipc", "cuda:0", Staging("cuda", copy=False, pinned=False)),
])
def test_staging_per_consumer_and_device(consumer, device, staging):
    assert wire_staging(consumer, device) == staging


def test_ipc_of_host_memory_and_unknown_devices_are_refused():
    with pytest.raises(PlacementError, match="ipc shares GPU memory"):
        wire_staging("ipc", "cpu")
    with pytest.raises(PlacementError, match="use 'cpu', 'cuda' or 'cuda:<index>'"):
        choose_route("gpu0", "cpu")
