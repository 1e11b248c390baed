"""The ack rule on a real Redis: a commit writes the checkpoint first and then marks processed and acks exactly
what it covers (the ids handed to ``settle_later`` before it, none after); a commit whose settle did not happen is
carried into the next checkpoint; a resumed checkpoint's recorded commit is settled; /checkpoint futures resolve
with the step and path, or fail."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from services.learner.checkpoint import CheckpointManager
from services.learner.rl.commits import Commits
from services.learner.rl.group_buffer import GroupBuffer
from services.learner.run_state import CommitIds, RunState
from shared.experience_queue import Lease, ProcessedIds, StreamQueue
from shared.schemas import Experience
from tests.learner.helpers import group


@pytest.fixture()
async def parts(tmp_path, redis_client):
    queue = StreamQueue(redis_client, "fleetrl:commit-test:experiences", "learner", Experience)
    await queue.ensure_group()
    await queue.produce(group("p0", [[5]] * 4, [1, 0, 1, 0]))
    entries = [d.id for d in await queue.consume("learner-0", count=10, block_ms=100)]
    processed = ProcessedIds(redis_client, "fleetrl:commit-test:processed:learner")
    commits = Commits(CheckpointManager(tmp_path / "ckpt"), processed, queue, Lease(queue, "learner-0"), GroupBuffer())
    return commits, queue, processed, entries


def saved_state(path: str) -> dict:
    return json.loads((Path(path) / "run_state.json").read_text())


async def test_a_commit_writes_then_marks_and_acks_exactly_what_it_covers(parts):
    commits, queue, processed, entries = parts
    commits.settle_later(entries[:2], ["p0-0", "p0-1"])
    waiter = commits.request()
    commits.steps_since = 3
    await commits.commit(RunState(), 7, lambda out: (out.mkdir(), (out / "weights").write_text("w")))
    assert waiter.result() == {"step": 7, "path": commits.last_checkpoint} and not commits.waiters
    assert saved_state(commits.last_checkpoint)["commit_entry_ids"] == entries[:2]  # on disk before the acks
    assert (commits.pending, commits.unsettled, commits.steps_since) == (CommitIds(), None, 0)
    assert sorted(await processed.filter_new(["p0-0", "p0-1", "p0-2"])) == ["p0-2"]
    assert (await queue.stats()).pending == 2  # the two entries the checkpoint does not cover stay pending


async def test_an_unsettled_commit_is_carried_into_the_next_checkpoint(parts):
    commits, queue, processed, entries = parts
    state = RunState()
    commits.settle_later(entries[:1], ["p0-0"])
    await commits.commit(state, 1, lambda out: out.mkdir(), settle=False)  # e.g. Redis went down before the acks
    assert commits.unsettled == CommitIds(("p0-0",), tuple(entries[:1])) and (await queue.stats()).pending == 4
    commits.settle_later(entries[1:2], ["p0-1"])
    await commits.commit(state, 2, lambda out: out.mkdir(), settle=False)
    assert saved_state(commits.last_checkpoint)["commit_entry_ids"] == entries[:2]  # both commits' entries
    await commits.settle()
    assert commits.unsettled is None and (await queue.stats()).pending == 2
    assert await processed.filter_new(["p0-0", "p0-1", "p0-2"]) == ["p0-2"]


async def test_a_resumed_checkpoints_commit_is_settled_and_waiters_fail_when_the_run_ends(parts):
    commits, queue, processed, entries = parts
    commits.carry_recorded(CommitIds(("p0-3",), tuple(entries[3:])))
    assert commits.unsettled == CommitIds(("p0-3",), tuple(entries[3:])) and commits.pending == CommitIds()
    await commits.settle()
    assert await processed.filter_new(["p0-3"]) == [] and (await queue.stats()).pending == 3
    waiter = commits.request()
    commits.fail_waiters("run ended (failed) before the checkpoint")
    with pytest.raises(RuntimeError, match="before the checkpoint"):
        await asyncio.wait_for(waiter, 1)


async def test_ids_handed_over_after_a_checkpoint_was_begun_wait_for_the_next_one(parts):
    """Commits owns what waits for a checkpoint: what was handed over before a commit is in its file and settled
    with it; what comes while it is being written (the loop goes on between awaits) is neither, and goes into the
    next one."""
    commits, queue, processed, entries = parts
    commits.settle_later(entries[:1], ["p0-0"])

    def write_trainer(out: Path) -> None:  # runs in the checkpoint thread while the loop could hand over more
        out.mkdir()
        commits.settle_later(entries[1:2], ["p0-1"])

    await commits.commit(RunState(), 1, write_trainer)
    first = saved_state(commits.last_checkpoint)
    assert (first["commit_sample_ids"], first["commit_entry_ids"]) == (["p0-0"], entries[:1])
    assert await processed.filter_new(["p0-0", "p0-1"]) == ["p0-1"] and (await queue.stats()).pending == 3
    assert commits.pending == CommitIds(("p0-1",), tuple(entries[1:2]))
    await commits.commit(RunState(), 2, lambda out: out.mkdir())
    second = saved_state(commits.last_checkpoint)
    assert (second["commit_sample_ids"], second["commit_entry_ids"]) == (["p0-1"], entries[1:2])
    assert await processed.filter_new(["p0-1"]) == [] and (await queue.stats()).pending == 2


async def test_a_checkpoint_that_fails_to_write_settles_nothing_and_its_ids_go_to_the_next(parts):
    commits, queue, processed, entries = parts
    commits.settle_later(entries[:1], ["p0-0"])
    await commits.commit(RunState(), 1, lambda out: out.mkdir(), settle=False)  # written, not settled
    commits.settle_later(entries[1:2], ["p0-1"])

    def broken(out: Path) -> None:
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        await commits.commit(RunState(), 2, broken)
    assert (await queue.stats()).pending == 4 and await processed.filter_new(["p0-0", "p0-1"]) == ["p0-0", "p0-1"]
    # nothing is lost: the written commit's ids and the later ones are all in the next checkpoint
    assert commits.pending == CommitIds(("p0-0", "p0-1"), tuple(entries[:2])) and commits.unsettled is None
    await commits.commit(RunState(), 3, lambda out: out.mkdir())
    assert saved_state(commits.last_checkpoint)["commit_entry_ids"] == entries[:2]
    assert (await queue.stats()).pending == 2 and await processed.filter_new(["p0-0", "p0-1"]) == []
