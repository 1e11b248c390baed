"""Update groups: one handle per member, formed and torn down without touching the default process group,
with a timeout on forming it and on every collective. Two kinds, registered in :data:`GROUP_KINDS` by the
name replicas advertise (``ReplicaInfo.group``) and rounds carry (``Rendezvous.group``):

- ``torch`` (:class:`CollectiveGroup`): a torch.distributed group (gloo or nccl), built the way SGLang's
  ``init_weights_update_group`` builds its side (a ``tcp://`` rendezvous, a ``PrefixStore`` named after
  the group, ``_new_process_group_helper``), so a FleetRL publisher, FleetRL's hf sidecar and an SGLang
  server land in the same group.
- ``pynccl`` (:class:`PyNcclGroup`): vLLM's own communicator (``StatelessProcessGroup`` +
  ``PyNcclCommunicator``), which is what a vLLM server's native weight transfer
  (``/init_weight_transfer_engine``) joins: the publisher takes rank 0 of it the way vLLM's
  ``NCCLWeightTransferEngine.trainer_init`` does. Needs vLLM installed on the learner (``fleetrl[vllm]``).

A failed group is aborted and dropped (neither kind can shrink a group), and the next round forms a
fresh one. Both sides use these (the learner's publisher as rank 0, the rollout sidecar as a member, the
learner's own data-parallel group for its store); torch is imported inside the functions, so that importing
``shared`` does not import it.

Sockets (README.md, "Trust boundary"): rank 0 hosts the group's TCP store on a socket the publisher bound
beforehand (``listener``: the address and port its settings name, never ``*`` unless they say so); other
ranks only dial it. Gloo's own sockets listen on ``gloo_addr`` (ephemeral ports), which is also the address
gloo tells its peers to dial; NCCL picks its interfaces itself (``NCCL_SOCKET_IFNAME``).
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import logging
import socket
import threading
import time
from typing import TYPE_CHECKING, Any, Protocol, cast

from shared.weight_sync import net

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import GroupName

log = logging.getLogger(__name__)


class CollectiveError(RuntimeError):
    """Forming the group or a collective failed or timed out; the group is unusable."""


#: how often a wait that can be cancelled (:meth:`CollectiveGroup.wait` with ``cancel``) looks at its flag
CANCEL_POLL_S = 0.05


def _finish(work: Any, timeout_s: float, cancel: threading.Event | None) -> str | None:
    """Wait for a torch work handle up to ``timeout_s``; None when it succeeded, else what went wrong. With
    ``cancel``, waits in slices of :data:`CANCEL_POLL_S` (a slice that ends unfinished leaves the work as it was;
    a finished work wakes the wait at once, so slices cost nothing on the way through)."""
    deadline = time.monotonic() + timeout_s
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return f"did not finish within {timeout_s:g}s"
        if cancel is not None and cancel.is_set():
            return "the round was abandoned by its publisher"
        step = remaining if cancel is None else min(remaining, CANCEL_POLL_S)
        try:
            work.wait(timeout=datetime.timedelta(seconds=step))
            return None
        except Exception as exc:  # noqa: BLE001 - the message is the result; the caller raises CollectiveError
            if cancel is None:
                return str(exc)
            if not work.is_completed():
                continue  # this slice ran out; the broadcast goes on
            break  # it ended just as the slice did: its own outcome, below
    try:
        work.wait(timeout=datetime.timedelta(seconds=1))
        return None
    except Exception as exc:  # noqa: BLE001 - as above
        return str(exc)


class CollectiveGroup:
    """One member's handle on an update group (rank 0 is the publisher).

    :meth:`broadcast` hands out a ticket, not torch's work handle: the group keeps the handles itself, because a
    gloo work handle holds the group's connections open (its context) for as long as anything references it,
    aborted group or not. A caller's frame or a traceback still holding one after :meth:`close` kept a broken
    round's sockets open, so the other ranks, instead of failing at once, sat out their whole collective
    timeout (tests/weight_sync/test_group_teardown.py). :meth:`close` drops every handle."""

    def __init__(self, pg: Any, name: str, rank: int, world_size: int, backend: str, timeout_s: float) -> None:
        self.pg, self.name, self.rank, self.world_size = pg, name, rank, world_size
        self.backend, self.timeout_s = backend, timeout_s
        self.broken = False
        self._works: dict[int, Any] = {}  # ticket -> torch work handle, until waited for or closed
        self._tickets = itertools.count()

    @classmethod
    def open(cls, *, backend: str, master_addr: str, master_port: int, rank: int, world_size: int,
             group_name: str, init_timeout_s: float, collective_timeout_s: float,
             listener: socket.socket | None = None, gloo_addr: str | None = None) -> CollectiveGroup:
        """Form (join) the group; blocks until every rank joined or ``init_timeout_s`` passed.

        Rank 0 hosts the TCP store on ``listener`` (taken over; default: a socket bound to ``master_addr:
        master_port``). ``gloo_addr``: the address this rank's gloo sockets listen on and advertise (None:
        ``GLOO_SOCKET_IFNAME``, else torch's default, the address this host's name resolves to)."""
        from torch.distributed import distributed_c10d as c10d

        init = datetime.timedelta(seconds=init_timeout_s)
        timeout = datetime.timedelta(seconds=collective_timeout_s)
        try:
            if rank == 0:
                store = host_store(listener or net.listen(master_addr, master_port), world_size, init)
            else:
                store = dial_store(master_addr, master_port, world_size, init_timeout_s)
            store.set_timeout(init)
            prefixed = c10d.PrefixStore(group_name, store)
            if backend == "gloo":
                pg = _gloo_group(prefixed, rank, world_size, group_name, timeout, gloo_addr)
            else:
                pg, _ = c10d._new_process_group_helper(world_size, rank, [], c10d.Backend(backend), prefixed,
                                                       group_name=cast("GroupName", group_name), timeout=timeout)
                c10d._world.pg_group_ranks[pg] = {i: i for i in range(world_size)}
        except Exception as exc:
            raise CollectiveError(f"forming group {group_name} (rank {rank}/{world_size}) failed: {exc}") from exc
        return cls(pg, group_name, rank, world_size, backend, collective_timeout_s)

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> int:
        """Post a broadcast; returns the ticket to pass to :meth:`wait`."""
        import torch.distributed as dist

        if self.pg is None:
            raise CollectiveError(f"group {self.name} is closed")
        try:
            opts = dist.BroadcastOptions()
            opts.rootRank, opts.rootTensor, opts.asyncOp = src, 0, True
            work = self.pg.broadcast([tensor], opts)
        except Exception as exc:
            self.broken = True
            raise CollectiveError(f"broadcast in {self.name} failed: {exc}") from exc
        ticket = next(self._tickets)
        self._works[ticket] = work
        return ticket

    def wait(self, ticket: int, timeout_s: float | None = None, cancel: threading.Event | None = None) -> None:
        """Wait for a posted broadcast, at most ``timeout_s`` (default: the collective timeout). ``cancel`` (set from
        another thread: the round was abandoned) ends the wait within :data:`CANCEL_POLL_S`. Raises
        :class:`CollectiveError` (the group is then broken) without holding on to the work handle."""
        work = self._works.get(ticket)
        error = _finish(work, timeout_s or self.timeout_s, cancel) if work is not None else "its group was closed"
        del work  # the error raised below must not keep the handle (and the connections) alive
        self._works.pop(ticket, None)
        if error is not None:
            self.broken = True
            raise CollectiveError(f"broadcast in {self.name} failed: {error}")

    def close(self) -> None:
        """Abort (if broken) and destroy the group; never raises, never blocks on a dead peer. Every work handle
        is dropped first, so the connections close now and the other ranks' collectives fail at once."""
        self._works.clear()
        pg, self.pg = self.pg, None
        if pg is None:
            return
        import torch.distributed as dist
        from torch.distributed import distributed_c10d as c10d

        if self.broken:
            for method in ("abort", "shutdown"):
                try:
                    getattr(pg, method)()
                    break
                except (AttributeError, RuntimeError) as exc:
                    log.debug("group %s: %s failed: %s", self.name, method, exc)
        try:
            if pg in c10d._world.pg_map:  # nccl: formed through torch's helper
                dist.destroy_process_group(pg)
            elif not self.broken:
                pg.shutdown()
        except (RuntimeError, ValueError) as exc:
            log.debug("destroying group %s: %s", self.name, exc)
        # that was the last reference: the backend's threads and sockets and (rank 0) the TCP store go with it


def host_store(listener: socket.socket, world_size: int, timeout: datetime.timedelta) -> dist.TCPStore:
    """The group's TCP store, served on ``listener`` (a bound, listening socket, taken over: the store closes
    it) and only there; blocks until ``world_size`` ranks (this one included) have connected."""
    import torch.distributed as dist

    port, host = listener.getsockname()[1], net.connect_addr(listener)
    fd = listener.detach()
    # no os.close(fd) if this raises: the store closes it also when it fails (e.g. a rank never connected),
    # and closing it again could close whatever file took that number since
    return dist.TCPStore(host, port, world_size, is_master=True, timeout=timeout, master_listen_fd=fd)


_DIAL_ATTEMPT_S = 3.0


def dial_store(addr: str, port: int, world_size: int, init_timeout_s: float) -> dist.TCPStore:
    """A client of the group's TCP store at ``addr:port`` (counted among its ``world_size`` ranks), connected
    within ``init_timeout_s``.

    The publisher binds its store's socket before it announces a round, so a refused connection means the
    round's publisher is gone (e.g. a learner killed mid-publish): that fails at once instead of retrying
    for the whole init timeout (torch's own client retries a refused port until it passes, twice over).
    Each connection attempt is bounded by a few seconds, so an address that does not answer at all costs
    at most ``init_timeout_s``."""
    import torch.distributed as dist

    deadline = time.monotonic() + init_timeout_s
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise CollectiveError(f"no answer from the group's store at {addr}:{port} within {init_timeout_s:.0f}s")
        try:
            with socket.create_connection((addr, port), timeout=min(_DIAL_ATTEMPT_S, remaining)):
                pass
        except ConnectionRefusedError as exc:
            raise CollectiveError(f"nothing listens on {addr}:{port} any more: the publisher that announced this "
                                  "round is gone") from exc
        except OSError:
            continue  # no answer yet (a slow or filtered network): try again until the deadline
        try:
            store = dist.TCPStore(addr, port, world_size, False,
                                  timeout=datetime.timedelta(seconds=max(0.1, min(_DIAL_ATTEMPT_S, remaining))))
        except (RuntimeError, TimeoutError) as exc:  # it went away between the probe and the connect
            log.debug("connecting to the store at %s:%d: %s", addr, port, exc)
            continue
        store.set_timeout(datetime.timedelta(seconds=init_timeout_s))
        return store


def _gloo_device(addr: str | None) -> Any:
    from torch.distributed import ProcessGroupGloo

    if addr and not net.is_wildcard(addr):
        return ProcessGroupGloo.create_device(hostname=addr)
    interface = net.gloo_interface()
    if interface:
        return ProcessGroupGloo.create_device(interface=interface)
    return ProcessGroupGloo.create_default_device()


def _gloo_group(store: Any, rank: int, world_size: int, group_name: str, timeout: datetime.timedelta,
                gloo_addr: str | None) -> Any:
    """A gloo group whose sockets listen on ``gloo_addr``. ``_new_process_group_helper`` cannot take a gloo
    device, so the group is put together here, with the store layout the helper gives it (``<name>/cpu/``):
    a peer that formed its side with the helper (an SGLang server) meets this one."""
    import torch
    from torch.distributed import ProcessGroup, ProcessGroupGloo
    from torch.distributed import distributed_c10d as c10d

    prefix_store = c10d.PrefixStore(f"{group_name}/", store)
    opts = ProcessGroupGloo._Options()  # type: ignore[attr-defined]  # torch's private gloo options (no stub)
    opts._timeout = timeout
    opts._devices = [_gloo_device(gloo_addr)]
    opts._threads = 2
    opts.group_name = group_name
    backend = ProcessGroupGloo(c10d.PrefixStore("cpu/", prefix_store), rank, world_size, opts)
    backend._set_sequence_number_for_group()
    pg = ProcessGroup(prefix_store, rank, world_size)
    pg._set_default_backend(ProcessGroup.BackendType.GLOO)
    pg._register_backend(torch.device("cpu"), ProcessGroup.BackendType.GLOO, backend)
    pg._set_group_name(cast("GroupName", group_name))
    return pg


class PyNcclGroup:
    """The publisher's (rank 0) or a member's handle on a vLLM ``PyNcclCommunicator`` group.

    Broadcasts are enqueued on the current CUDA stream; :meth:`wait` polls a CUDA event recorded after the
    broadcast, so a peer that never joins the collective costs ``collective_timeout_s`` and marks the
    group broken instead of blocking the caller forever (PyNccl has no abort: a broken communicator is
    dropped, not reused)."""

    def __init__(self, comm: Any, name: str, rank: int, world_size: int, timeout_s: float) -> None:
        self.comm, self.name, self.rank, self.world_size = comm, name, rank, world_size
        self.backend, self.timeout_s = "nccl", timeout_s
        self.broken = False

    @classmethod
    def open(cls, *, backend: str, master_addr: str, master_port: int, rank: int, world_size: int,
             group_name: str, init_timeout_s: float, collective_timeout_s: float,
             listener: socket.socket | None = None, gloo_addr: str | None = None) -> PyNcclGroup:
        """As :meth:`CollectiveGroup.open` (``gloo_addr`` unused: NCCL picks its interfaces itself)."""
        if backend != "nccl":
            raise CollectiveError(f"group {group_name}: the pynccl kind runs on nccl only, not {backend!r}")
        import torch

        try:
            from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
            from vllm.distributed.utils import StatelessProcessGroup
        except ImportError as exc:
            raise CollectiveError(
                f"group {group_name}: a vLLM replica's weight transfer needs vLLM on the publisher too "
                f"(pip install 'fleetrl[vllm]'): {exc}") from exc
        try:
            if rank == 0:  # vLLM's create() would bind the store itself (older releases: on every interface)
                store = host_store(listener or net.listen(master_addr, master_port), world_size,
                                   datetime.timedelta(seconds=max(1, int(init_timeout_s))))
                given = {"rank": rank, "world_size": world_size, "store": store}
                # the fields a release adds without a default (the listening socket, which our store owns)
                given |= {f.name: None for f in dataclasses.fields(StatelessProcessGroup)
                          if f.init and f.name not in given and f.default is dataclasses.MISSING
                          and f.default_factory is dataclasses.MISSING}
                pg = StatelessProcessGroup(**given)
            else:
                pg = StatelessProcessGroup.create(host=master_addr, port=master_port, rank=rank,
                                                  world_size=world_size, store_timeout=max(1, int(init_timeout_s)))
            comm = PyNcclCommunicator(pg, device=torch.cuda.current_device())
        except Exception as exc:
            raise CollectiveError(f"forming group {group_name} (rank {rank}/{world_size}) failed: {exc}") from exc
        return cls(comm, group_name, rank, world_size, collective_timeout_s)

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> Any:
        import torch

        try:
            stream = torch.cuda.current_stream()
            self.comm.broadcast(tensor, src=src, stream=stream)
            done = torch.cuda.Event()
            done.record(stream)
        except Exception as exc:
            self.broken = True
            raise CollectiveError(f"broadcast in {self.name} failed: {exc}") from exc
        return done, tensor  # the tensor stays referenced until the broadcast is done

    def wait(self, work: Any, timeout_s: float | None = None, cancel: threading.Event | None = None) -> None:
        done, _ = work
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        pause = 0.0002
        while not done.query():
            if cancel is not None and cancel.is_set():
                self.broken = True
                raise CollectiveError(f"broadcast in {self.name} failed: the round was abandoned by its publisher")
            if time.monotonic() >= deadline:
                self.broken = True
                raise CollectiveError(f"broadcast in {self.name} did not finish within {timeout_s or self.timeout_s}s")
            time.sleep(pause)
            pause = min(pause * 2, 0.01)

    def close(self) -> None:
        self.comm = None


class UpdateGroup(Protocol):
    """What the publisher and receivers use of a group, whatever its kind."""

    name: str
    broken: bool

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> Any: ...
    def wait(self, work: Any, timeout_s: float | None = None, cancel: threading.Event | None = None) -> None: ...
    def close(self) -> None: ...


GROUP_KINDS: dict[str, Any] = {"torch": CollectiveGroup, "pynccl": PyNcclGroup}


def open_group(kind: str, **kwargs: Any) -> UpdateGroup:
    """Form (join) an update group of ``kind`` (see :data:`GROUP_KINDS`); ``kwargs`` as ``CollectiveGroup.open``."""
    cls = GROUP_KINDS.get(kind)
    if cls is None:
        raise CollectiveError(f"unknown group kind {kind!r}; known: {sorted(GROUP_KINDS)}")
    return cls.open(**kwargs)
