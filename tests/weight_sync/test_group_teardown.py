"""A group given up on releases its other ranks at once: closing it mid-broadcast makes their collectives fail now,
not after their collective timeout, whatever the closer still holds of what it posted; a wait told that the round
was abandoned ends within a slice. Two gloo ranks in two threads of this process (no services)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from shared.weight_sync import net
from shared.weight_sync.group import CANCEL_POLL_S, CollectiveError, CollectiveGroup

TIMEOUT_S = 30.0  # each collective's bound: far past what the test allows, so only a prompt release passes


def _pair() -> tuple[CollectiveGroup, CollectiveGroup]:
    """Rank 0 (the publisher) and rank 1 of one fresh gloo group on this host."""
    listener = net.listen("127.0.0.1", 0)
    port = listener.getsockname()[1]
    common = {"backend": "gloo", "master_addr": "127.0.0.1", "master_port": port, "world_size": 2,
              "group_name": f"teardown-{port}", "init_timeout_s": 30.0, "collective_timeout_s": TIMEOUT_S,
              "gloo_addr": "127.0.0.1"}
    with ThreadPoolExecutor(2) as pool:
        root = pool.submit(CollectiveGroup.open, rank=0, listener=listener, **common)
        member = pool.submit(CollectiveGroup.open, rank=1, **common)
        return root.result(timeout=60), member.result(timeout=60)


def _receive_two(member: CollectiveGroup, cancel: threading.Event | None = None) -> tuple[str, float]:
    """Rank 1 posts two broadcasts and waits for both: what ended the wait, and when."""
    bufs = [torch.zeros(1 << 16, dtype=torch.uint8) for _ in range(2)]
    tickets = [member.broadcast(b, src=0) for b in bufs]
    try:
        for t in tickets:
            member.wait(t, cancel=cancel)
    except CollectiveError as exc:
        return str(exc), time.monotonic()
    return "received", time.monotonic()


def test_closing_a_group_mid_broadcast_releases_the_other_ranks_at_once():
    """The publisher sent bucket 0 and gives up on the round before bucket 1, still holding what broadcast returned
    (as the send loop's queue, kept by the failure's traceback, did): rank 1, waiting for bucket 1, must fail now.
    Before, torch's work handle kept the group's connections open and rank 1 waited out its 30 s."""
    root, member = _pair()
    try:
        with ThreadPoolExecutor(1) as pool:
            receiving = pool.submit(_receive_two, member)
            posted = root.broadcast(torch.ones(1 << 16, dtype=torch.uint8), src=0)
            root.wait(posted)
            time.sleep(0.2)  # rank 1 is in its wait for bucket 1
            closed_at = time.monotonic()
            root.broken = True
            root.close()
            what, ended_at = receiving.result(timeout=2 * TIMEOUT_S)
        assert posted is not None  # still held here
        assert what != "received"
        assert ended_at - closed_at < 5.0, f"rank 1 left {ended_at - closed_at:.1f}s after the close: {what}"
    finally:
        root.close()
        member.close()


def test_an_abandoned_round_ends_a_wait_for_a_silent_publisher():
    """The publisher is alive and silent (its connections open: it hung, or a relay before this rank did): the
    round's abandonment, set from another thread, ends rank 1's wait within a slice, not its 30 s."""
    root, member = _pair()
    abandoned = threading.Event()
    try:
        with ThreadPoolExecutor(1) as pool:
            receiving = pool.submit(_receive_two, member, abandoned)
            time.sleep(0.3)
            set_at = time.monotonic()
            abandoned.set()
            what, ended_at = receiving.result(timeout=2 * TIMEOUT_S)
        assert "abandoned" in what, what
        assert ended_at - set_at < CANCEL_POLL_S + 1.0, ended_at - set_at
        assert member.broken
    finally:
        root.close()
        member.close()


def test_a_cancellable_wait_still_receives_what_is_sent():
    """Waiting in slices loses nothing: a broadcast that takes longer than a slice arrives whole."""
    root, member = _pair()
    try:
        with ThreadPoolExecutor(1) as pool:
            got = torch.zeros(1 << 20, dtype=torch.uint8)
            done = pool.submit(lambda: member.wait(member.broadcast(got, src=0), cancel=threading.Event()))
            time.sleep(3 * CANCEL_POLL_S)  # a few slices run out before anything is sent
            root.wait(root.broadcast(torch.full((1 << 20,), 7, dtype=torch.uint8), src=0))
            done.result(timeout=TIMEOUT_S)
        assert bool((got == 7).all())
    finally:
        root.close()
        member.close()


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
