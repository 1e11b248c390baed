"""What a training step takes from the group buffer (services/learner/rl/batch_picker.py), without a run around it.
The stale and dynamic-sampling paths run in a whole run in test_rl_runner.py."""

from prometheus_client import CollectorRegistry, generate_latest

from services.learner.checkpoint import CheckpointManager
from services.learner.counters import Counters
from services.learner.observability import MetricsSink
from services.learner.rl.batch_picker import BatchPicker
from services.learner.rl.commits import Commits
from services.learner.rl.group_buffer import GroupBuffer
from services.learner.rl.positions import Positions
from services.learner.run_state import InFlight, RunState
from shared.experience_queue import Lease, ProcessedIds, StreamQueue
from shared.schemas import Experience
from tests.learner.helpers import group, settings


def picker(tmp_path, reissued: list[tuple[str, str]], **sections) -> BatchPicker:
    s = settings(tmp_path, tmp_path, observability={"progress_bar": False}, **sections)
    registry = CollectorRegistry()
    sink = MetricsSink(s.observability, tmp_path / "run", registry)
    state, buffer = RunState(), GroupBuffer()

    async def reissue(key: str, why: str) -> bool:
        reissued.append((key, why))
        return True

    counters = Counters(state, sink)
    # the commits the positions hand finished entries to (never settled here: no Redis behind them)
    queue = StreamQueue(None, "fleetrl:picker-test:experiences", "learner", Experience)
    commits = Commits(CheckpointManager(tmp_path / "ckpt"), ProcessedIds(None, "fleetrl:picker-test:processed"),
                      queue, Lease(queue, "learner-0"), buffer)
    p = BatchPicker(state, buffer, Positions(state.in_flight, state.abandoned, buffer, commits, counters), s,
                    counters, reissue)
    p.registry = registry  # type: ignore[attr-defined]  (the test reads /metrics' text from it)
    p.run_state, p.commits = state, commits  # type: ignore[attr-defined]  (what the picker has narrower views of)
    return p


def fill(p: BatchPicker, groups: list[tuple[str, int, int]], version: int = 0,
         rewards: tuple[float, ...] = (1, 0, 1, 0)) -> None:
    """File complete groups of 4 (position, attempt of the group, attempt in flight), in this order."""
    for key, attempt, in_flight in groups:
        gid = key if attempt == 0 else f"{key}-r{attempt}"
        p.run_state.in_flight.setdefault(key, InFlight(epoch=0, index=int(key[3:]), attempt=in_flight, issued_at=0.0))
        for e in group(gid, [[5]] * 4, list(rewards), version=version):
            p.buffer.file(f"entry-{gid}-{e.index}", e, p.run_state.in_flight)


async def test_one_step_never_takes_two_attempts_of_the_same_prompt(tmp_path):
    """A prompt re-issued (timeout, stale drop, restart) can complete twice: the late first attempt and the
    re-issue. One step must take at most one group per dataset position (else it trains it twice, and the
    second group's bookkeeping failed the run: KeyError, found by make drills)."""
    p = picker(tmp_path, [])
    fill(p, [("e0-1", 0, 1), ("e0-1", 1, 1), ("e0-2", 0, 0), ("e0-3", 0, 0)])
    assert await p.take(exhausted=False) == ["e0-1", "e0-2"]  # in completion order, one group per position
    # the other attempt waits (superseded when e0-1 trains)
    assert [g for g in p.buffer.complete if g not in ("e0-1", "e0-2")] == ["e0-1-r1", "e0-3"]
    p.positions.trained(["e0-1", "e0-2"])
    assert p.buffer.complete == ["e0-3"]
    assert p.run_state.counters["experiences_deduplicated"] == 4 and set(p.run_state.in_flight) == {"e0-3"}
    pending = p.commits.pending  # the trained groups' entries and samples, and the superseded attempt's entries
    assert len(pending.entry_ids) == 12 and len(pending.sample_ids) == 8


async def test_a_stale_group_is_dropped_and_its_prompt_reissued_once(tmp_path):
    reissued: list[tuple[str, str]] = []
    p = picker(tmp_path, reissued, rollout={"group_size": 4}, run={"max_staleness": 1})
    p.run_state.weight_version = 3
    fill(p, [("e0-1", 0, 0)], version=1)  # 3 - 1 = 2 > max_staleness
    fill(p, [("e0-2", 0, 0)], version=2)
    assert await p.take(exhausted=False) == []  # one fresh group; a step takes groups_per_step (2)
    assert reissued == [("e0-1", "stale group (weight version 1 < 2)")]
    assert p.run_state.counters["experiences_dropped_stale"] == 4 and len(p.commits.pending.entry_ids) == 4
    assert await p.take(exhausted=True) == []  # the last, smaller batch waits for the re-issued position
    p.positions.abandon("e0-1", "given up")
    assert await p.take(exhausted=True) == ["e0-2"]


async def test_dynamic_sampling_finishes_flat_groups_untrained_up_to_the_cap(tmp_path):
    p = picker(tmp_path, [], algorithm={"name": "grpo", "dynamic_sampling": {"enabled": True,
                                                                            "max_refills_per_step": 1}})
    fill(p, [("e0-1", 0, 0)])
    fill(p, [("e0-2", 0, 0), ("e0-3", 0, 0)], rewards=(1, 1, 1, 1))  # rewards all equal: no signal
    assert await p.take(exhausted=False) == ["e0-1", "e0-3"]  # e0-2 finished untrained; past the cap e0-3 stays
    assert "e0-2" not in p.run_state.in_flight and p.run_state.counters["groups_filtered"] == 1
    assert p.run_state.counters["dynamic_sampling_cap_reached"] == 1
    p.stepped()
    assert p.refills == 0


async def test_a_prompt_dropped_stale_holds_the_step_until_its_new_group_lands(tmp_path):
    """rollout.stale_hold_s: a position whose group went stale and was re-issued holds the steps (bounded) until its
    new group is complete, so a prompt slower to score than max_staleness steps is trained. Without it the elastic
    drill's last 4 slow-scored prompts went stale on each of their 50 attempts (2 s of scoring, the learner stepping
    every second on fast prompts) and were given up. Off (0) the learner steps on what it has."""
    import time

    def picker_with(hold_s: float, reissued_at: float) -> BatchPicker:
        p = picker(tmp_path, [], rollout={"stale_hold_s": hold_s})
        fill(p, [("e0-2", 0, 0), ("e0-3", 0, 0)])
        # e0-1 went stale once and was re-issued at reissued_at; its new group is not back
        p.run_state.in_flight["e0-1"] = InFlight(epoch=0, index=1, attempt=1, issued_at=reissued_at, stale_drops=1)
        return p

    held = picker_with(30.0, time.time())
    assert await held.take(exhausted=False) == [] and held.held_for() == "e0-1"  # the step waits for it
    fill(held, [("e0-1", 1, 1)])
    assert await held.take(exhausted=False) == ["e0-2", "e0-3"] and held.held_for() is None  # landed: steps again

    assert await picker_with(30.0, time.time() - 31.0).take(exhausted=False) == ["e0-2", "e0-3"]  # hold ran out
    assert await picker_with(0.0, time.time()).take(exhausted=False) == ["e0-2", "e0-3"]  # off


async def test_a_stale_drop_is_counted_on_the_position_it_reissues(tmp_path):
    p = picker(tmp_path, [], rollout={"group_size": 4, "stale_hold_s": 30.0}, run={"max_staleness": 1})
    p.run_state.weight_version = 3
    fill(p, [("e0-1", 0, 0)], version=1)
    await p.take(exhausted=False)
    assert p.run_state.in_flight["e0-1"].stale_drops == 1


async def test_a_prompt_that_keeps_going_stale_is_named_once_with_the_settings_that_stop_it(tmp_path, caplog):
    """A prompt slower to score than the learner's steps goes stale on every attempt until it is given up (the elastic
    drill's slow verifier: 50 attempts, then dead): on its third drop the run says so once, naming
    rollout.stale_hold_s and rollout.max_staleness; nothing is said when the hold is on."""
    import logging

    caplog.set_level(logging.WARNING, logger="services.learner.rl.batch_picker")
    reissued: list[tuple[str, str]] = []
    p = picker(tmp_path, reissued, rollout={"group_size": 4}, run={"max_staleness": 1})
    for attempt in range(4):
        p.run_state.weight_version = 3 + attempt
        fill(p, [("e0-1", attempt, attempt)], version=attempt)  # each attempt arrives 3 versions late
        p.run_state.in_flight["e0-1"].attempt = attempt
        await p.take(exhausted=False)
        p.run_state.in_flight["e0-1"].attempt = attempt + 1  # what the re-issue does
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(reissued) == 4 and len(warnings) == 1, warnings
    assert warnings[0].startswith("prompt e0-1 went stale 3 times") and "rollout.stale_hold_s" in warnings[0]
    assert "run.max_staleness" in warnings[0]

    caplog.clear()
    held = picker(tmp_path / "held", [], rollout={"group_size": 4, "stale_hold_s": 0.001},
                  run={"max_staleness": 1})
    for attempt in range(4):
        held.run_state.weight_version = 3 + attempt
        fill(held, [("e0-1", attempt, attempt)], version=attempt)
        held.run_state.in_flight["e0-1"].attempt = attempt
        await held.take(exhausted=False)
        held.run_state.in_flight["e0-1"].attempt = attempt + 1
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]


async def test_a_hold_says_why_the_steps_wait(tmp_path):
    """While rollout.stale_hold_s holds the steps, /status's ``waiting`` (and so the fleetrl run display) names the
    prompt, the setting and the time left; a learner that does not step said nothing before."""
    import time

    p = picker(tmp_path, [], rollout={"stale_hold_s": 30.0})
    fill(p, [("e0-2", 0, 0), ("e0-3", 0, 0)])
    assert p.holding() is None
    p.run_state.in_flight["e0-1"] = InFlight(epoch=0, index=1, attempt=1, issued_at=time.time() - 10, stale_drops=1)
    why = p.holding()
    assert why is not None and why.startswith("prompt e0-1 went stale and is being generated again")
    assert "rollout.stale_hold_s 30s, 20s left" in why


async def test_a_superseded_attempt_is_counted_in_the_run_state_and_in_prometheus_alike(tmp_path):
    """Training one attempt of a position drops its other attempts as duplicates: the persisted count and the
    Prometheus counter move together (the drop bumped only the run state's count: /metrics said 0)."""
    p = picker(tmp_path, [])
    fill(p, [("e0-1", 0, 1), ("e0-1", 1, 1)])  # position e0-1's first attempt and its re-issue, both complete
    p.positions.trained(["e0-1"])
    assert p.run_state.counters["experiences_deduplicated"] == 4
    exposed = generate_latest(p.registry).decode()  # what /metrics serves
    assert "fleetrl_learner_experiences_deduplicated_total 4.0" in exposed
