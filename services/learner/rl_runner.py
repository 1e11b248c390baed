"""The RL run owner: issues prompts, takes experiences, trains on complete groups, publishes, checkpoints.

The runner is the loop; its parts each hold one job: :class:`~.prompt_feeder.PromptFeeder` (prompts out: the
window, re-issues), :class:`~.group_buffer.GroupBuffer` (experiences in: filing, dedupe, staleness, taking a
batch), :class:`~.commits.Commits` (the ack rule below), the trainer and the weight publisher.

Loop (one asyncio task; the torch step runs in a worker thread so the HTTP routes stay responsive)::

    feed prompts while fewer than rollout.window groups are in flight
    re-issue prompts whose group has not completed within rollout.prompt_timeout_s
    if groups_per_step complete, fresh groups are buffered: train on them
        (then publish every publish.every steps, checkpoint every checkpoint.every steps)
    else: consume experiences (group "learner") and file them by group

**Ack rule: experiences are acknowledged only after a checkpoint that includes the step that used them
is on disk.** At that commit the trained sample ids are added to ``ProcessedIds`` and every entry
consumed since the previous commit and either trained or dropped is XACKed (entries of groups still
being assembled stay pending). The commit lists are also written into the checkpoint and settled again
on resume, so a crash between the write and the acks loses nothing.

**What a crash replays.** A restarted learner loads the latest checkpoint (weights, optimizer, RNG,
dataset position, prompts in flight) and its step counter continues from there. The experiences of
steps after that checkpoint were never acknowledged: they come back from the consumer's pending list
and are trained again — on the restored weights, so no sample is in two committed steps. Prompts
issued after the checkpoint are issued again with the same ids; their samples carry the same sample
ids, so the copies are dropped as duplicates. The restored weights are published as a new version at
start, so the fleet leaves the abandoned branch.

**Redis outages.** Any Redis error that means "not answering right now" (down, restarting, loading its
AOF) makes the loop wait and retry with a capped backoff (phase ``waiting_for_redis`` in ``/status``, a
log line per attempt) for up to ``queue.redis_outage_max_s``; a publish that fails on Redis fails that
round, not the run. After an outage the owner re-reads its own pending experiences (anything delivered
while the connection broke) and re-issues prompts the server lost (not persisted before a crash).

**Leases and dead letters.** The experience entries the owner holds (buffered, or trained and awaiting
the commit) are renewed on the stream (:class:`~shared.experience_queue.Lease`), so they never go idle
while it runs. Dead-lettered prompts and experiences of the run are followed (:class:`DeadLetterWatch`):
their prompt is re-issued at once, and after ``rollout.dead_letter_retries`` of them the dataset position
is given up with the reason (``prompts_abandoned``) — the owner never waits on work that only sits in a
dead-letter stream. A prompt a worker dead-lettered as one that can never succeed (reason ``permanent: ...``,
in a dead letter signed by the fleet) is given up at once, not re-issued.

**Staleness.** A complete group holding a token older than ``current - max_staleness`` (a sample's
``weight_version`` is its oldest token's, partial rollouts included) is dropped (counted) and its prompt
re-issued under a new attempt id (``e{epoch}-{index}-r{n}``), so no prompt is lost. Dedupe is by sample id
(ProcessedIds for committed ones, the :class:`GroupBuffer` for held ones) and by dataset position (a
position already trained takes no more groups).

**Dynamic sampling** (``algorithm.dynamic_sampling``, DAPO): a complete group whose rewards are all equal is
dropped and its dataset position finished untrained, so the window feeds a fresh prompt in its place; at most
``max_refills_per_step`` per step, after which such groups are trained (counted).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from services.learner.checkpoint import CheckpointManager
from services.learner.commits import Commits
from services.learner.data import PromptSet, epoch_plan, parse_item_id, passes_note
from services.learner.distributed.env import RankInfo
from services.learner.grants import unissued
from services.learner.group_buffer import Filed, GroupBuffer, position_of
from services.learner.observability import MetricsSink
from services.learner.pool_watch import PoolWatch
from services.learner.prompt_feeder import PromptFeeder
from services.learner.queue_watch import REDIS_DOWN, DeadLetter, DeadLetterWatch
from services.learner.run_state import RunState
from services.learner.settings import LearnerSettings
from services.learner.start_gate import wait_start_gate
from services.learner.weights.transport import PublishFailed
from shared import keys
from shared.experience_queue import PERMANENT, Delivery, Lease, ProcessedIds, StreamQueue
from shared.schemas import Experience, PromptTask
from shared.signing import signer_for
from shared.training_health import Peaks, check_health

HEALTH_HISTORY = 100
"""Steps of metrics kept for /status's ``health`` (collapse and spike checks, shared/training_health.py)."""
HEALTH_KEYS = ("reward_mean", "entropy", "kl", "mismatch_k3")

log = logging.getLogger(__name__)


def publish_due(step: int, every: int, waiting: list[str]) -> bool:
    """Publish after this step? Every ``every`` steps, and sooner while replicas wait for a version the
    publisher could not serve them (they joined late: see ``WeightPublisher.replicas_waiting``)."""
    return step % every == 0 or bool(waiting)


class RLRunner:
    """Owns one RL run. ``await run(stop)``; ``status()`` for the HTTP surface; ``request_checkpoint()``."""

    needs_redis = True

    def __init__(self, settings: LearnerSettings, redis: Any, sink: MetricsSink) -> None:
        self.s = settings
        self.redis = redis
        self.sink = sink
        q = settings.queue
        run = settings.run_name
        signer = signer_for(settings.run_key)  # prompts go out signed; experiences must come in signed
        self.prompts = StreamQueue(redis, keys.prompts_stream(run), "rollout", PromptTask, max_backlog=q.max_backlog,
                                   signer=signer, dead_letter_maxlen=q.dead_letter_maxlen)
        self.experiences = StreamQueue(redis, keys.experiences_stream(run), "learner", Experience,
                                       max_deliveries=q.max_deliveries, claim_idle_ms=q.claim_idle_ms,
                                       signer=signer, dead_letter_maxlen=q.dead_letter_maxlen)
        self.processed = ProcessedIds(redis, keys.processed_ids(run, "learner"), max_ids=q.processed_ids_max,
                                      ttl_s=q.processed_ids_ttl_s)
        self.state = RunState()
        self.trainer = None
        self.feeder: PromptFeeder | None = None  # once the prompt set is loaded (start)
        self.publisher = None
        self.phase = "starting"
        self.error: str | None = None
        self.total_steps = 0
        self.last_metrics: dict[str, Any] = {}
        self.recent: deque[dict[str, Any]] = deque(maxlen=HEALTH_HISTORY)  # what /status's health is judged on
        self.peaks = Peaks()  # with the run's best windows, so a slow collapse is seen too
        self.buffer = GroupBuffer()
        self._refills = 0  # groups dropped by dynamic sampling since the last training step
        # stream entry ids we hold (buffered or awaiting the commit), renewed so they never go idle
        self.lease = Lease(self.experiences, settings.queue.consumer, on_lost=self._lease_lost)
        self.ckpt = CheckpointManager(settings.checkpoint_dir, settings.checkpoint.keep)
        self.commits = Commits(self.ckpt, self.processed, self.experiences, self.lease, self.buffer)
        self.dead_letters: DeadLetterWatch | None = None
        self._next_dead_letter_poll = 0.0
        self._publish_failed = False
        self._published_step = -1
        self._wait_started: float | None = None
        self._wait_s = 0.0
        self._loop_s: dict[str, float] = {}  # where the loop spent the time since the last step's line (loop_s)
        self.pool = PoolWatch(redis, run, settings.pool)  # the elastic pool's demand signal, every step
        self.ranks = RankInfo.from_env()
        self.link = None  # OwnerLink to the follower ranks when WORLD_SIZE > 1

    # ---- start -----------------------------------------------------------------------------------
    async def _start(self) -> None:
        from services.learner.training.models import load_tokenizer

        tokenizer = await asyncio.to_thread(load_tokenizer, self.s.model)
        data = await asyncio.to_thread(PromptSet.load, self.s.data, self.s.train.seed, tokenizer)
        latest = self.ckpt.latest() if self.s.checkpoint.resume else None
        if latest is not None:
            self.state = RunState.load(latest / "run_state.json")
            log.info("resuming from %s", latest)
        plan = epoch_plan(self.s.data, self.s.train.groups_per_step, self.s.train.max_steps, len(data))
        self.feeder = PromptFeeder(self.prompts, data, plan.epochs, self.state, self.s, self.sink, self._abandon)
        if plan.note:
            log.warning("%s", plan.note)
        log.info("%s", passes_note(self.s))
        items = len(data) * plan.epochs
        self.total_steps = math.ceil(items / self.s.train.groups_per_step)
        if self.s.train.max_steps:
            self.total_steps = min(self.total_steps, self.s.train.max_steps)
        resume_dir = latest / "trainer" if latest is not None else None
        # a fresh run's first prompts need nothing of the trainer: they go out while it loads, so the rollout fleet
        # generates them with the start weights it serves meanwhile (launch -> first step overlaps the two)
        early = asyncio.create_task(self._feed_early()) if self._may_feed_early(latest) else None
        try:
            await self._load_trainer(latest, resume_dir)
        except BaseException:
            if early is not None:
                early.cancel()
            raise
        if early is not None:
            await early
            now = time.time()  # their rollout.prompt_timeout_s counts from when the learner can train on them
            for item in self.state.in_flight.values():
                item.issued_at = max(item.issued_at, now)

    def _may_feed_early(self, latest: Path | None) -> bool:
        """Prompts before the trainer exists only for a fresh, single-rank run with no start gate (the gate holds
        the fleet's held-out evaluation of the start policy first; a resumed run first settles its checkpoint)."""
        return latest is None and not self.s.train.start_gate and not self.ranks.multi

    async def _feed_early(self) -> None:
        """Best effort: the first window of prompts while the trainer loads, where no weights were published yet
        (else the loop issues them after ``_connect`` publishes ours); a Redis problem leaves them to the loop."""
        try:
            if int(await self.redis.get(keys.weights_version(self.s.run_name)) or 0) != 0:
                return
            await self.experiences.ensure_group()
            await self.prompts.ensure_group()
            await self.feeder.feed()
        except REDIS_DOWN as exc:
            log.info("first prompts wait until the trainer is loaded (Redis: %s)", exc)

    async def _load_trainer(self, latest: Path | None, resume_dir: Path | None) -> None:
        from services.learner.training.rl_trainer import RLTrainer

        if self.ranks.multi:
            from services.learner.distributed.ranks import OwnerLink

            self.link = await asyncio.to_thread(OwnerLink, self.s, self.ranks)
            await asyncio.to_thread(self.link.start, self.total_steps, resume_dir)
        self.trainer = await asyncio.to_thread(RLTrainer, self.s, self.total_steps, resume_dir,
                                               self.ranks.local_rank)
        self._limits = self.trainer.limits()
        if latest is not None:
            self.commits.last_checkpoint = str(latest)
        from services.learner.weights import WeightPublisher

        self.publisher = WeightPublisher(self.redis, self.s.run_name, self.s.publish.sync)
        actor = self.trainer.actor
        if self.s.publish.in_place and not actor.owns_parameter_memory and not hasattr(actor.model, "merge_and_unload"):
            buckets = await asyncio.to_thread(self.publisher.flatten, actor.model)
            log.info("actor weights laid out in %d publish buckets: publishing sends them without a copy", buckets)
        self.dead_letters = DeadLetterWatch(self.redis, self.s.run_name, self.state.dead_letter_cursors,
                                            signer=self.experiences.signer)
        if self.experiences.signer is None:
            log.warning("run_key is unset (allow_unsigned_records): prompts go out unsigned and experiences are "
                        "trained on without checking who wrote them; give every service of the run the same run_key "
                        "(docs/security-redis.md)")
        self._published_step = -1
        self.sink.open(self.total_steps, self.trainer.global_step)

    async def _start_gate(self, stop: asyncio.Event) -> bool:
        """Hold here, loaded, until the launcher opens ``train.start_gate`` (False: stopped meanwhile)."""
        t = self.s.train
        if not t.start_gate:
            return True
        self.phase = "waiting_for_start_gate"
        log.info("loaded; waiting for the launcher's go (its step-0 held-out evaluation) before the first step "
                 "(train.start_gate, at most %.0fs)", t.start_gate_timeout_s)
        key, opened = keys.learner_start_gate(self.s.run_name), False

        async def wait() -> None:
            nonlocal opened
            opened = await wait_start_gate(self.redis, key, t.start_gate, t.start_gate_timeout_s, stop)

        await self._until_redis_answers(wait, stop)
        if opened:
            log.info("start gate open")
        return opened

    async def _connect(self) -> None:
        """The start-up steps that need Redis (idempotent: run again after an outage during start-up)."""
        await self.experiences.ensure_group()
        await self.prompts.ensure_group()
        st = self.state
        self.commits.carry_recorded(st)  # finish the commit the resumed checkpoint recorded
        await self.commits.settle()
        if self._published_step < 0:
            published = int(await self.redis.get(keys.weights_version(self.s.run_name)) or 0)
            if published != self.state.weight_version or published > 0:
                # the fleet holds weights we are not resuming from, or replicas (re)started with the run wait for
                # the latest version, which this new process holds nothing of to serve them: give the fleet our
                # weights under a new version (else their workers hold back, past max_staleness, until a step
                # that cannot come without their experiences)
                await self._publish(strict=True)
            self._published_step = self.trainer.global_step
        self.lease.start()

    # ---- the loop ----------------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        try:
            await self._start()
            if not await self._start_gate(stop):
                self.phase = "stopped"  # stopped before anything was published or trained: nothing to save
                return
            await self._until_redis_answers(self._connect, stop)
            self.phase = "running"
            while not stop.is_set() and not self._done():
                try:
                    await self._iteration()
                except REDIS_DOWN as exc:
                    await self._wait_for_redis(exc, stop)
            await self._until_redis_answers(lambda: self._finish(stopped=stop.is_set()), stop, final=True)
        except asyncio.CancelledError:
            self.phase = "stopped"
            raise
        except Exception as exc:
            self.phase, self.error = "failed", f"{type(exc).__name__}: {exc}"
            log.exception("learner run failed")
            raise
        finally:
            self.commits.fail_waiters(f"run ended ({self.phase}) before the checkpoint")
            await self.lease.stop()
            if self.publisher is not None:
                await self.publisher.close()
            if self.link is not None:
                try:  # followers leave their loop (a follower stuck in a collective times out instead)
                    await asyncio.to_thread(self.link.stop)
                except Exception:
                    log.exception("could not stop the follower ranks")

    async def _iteration(self) -> None:
        with self._lap("settle"):
            await self.commits.settle()
            if self.link is not None:
                await asyncio.to_thread(self.link.heartbeat)
        with self._lap("dead_letters"):
            await self._watch_dead_letters()
        with self._lap("feed"):
            await self.feeder.feed()
            await self.feeder.reissue_timeouts({position_of(g) for g in self.buffer.complete})
        with self._lap("take"):
            groups = await self._take_batch()
        if groups:
            await self._train(groups)
        elif self.commits.waiters:
            with self._lap("checkpoint"):
                await self._commit()
        else:
            with self._lap("receive"):
                await self._receive()

    @contextlib.contextmanager
    def _lap(self, part: str):
        """Adds the time inside to ``part`` of the step's ``loop_s`` (metrics.jsonl): where the loop spent the time
        between two steps' lines (``benchmarks/vs_trl_trace.py`` prints it)."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._loop_s[part] = self._loop_s.get(part, 0.0) + time.perf_counter() - t0

    # ---- Redis outages -------------------------------------------------------------------------------
    async def _until_redis_answers(self, op, stop: asyncio.Event, final: bool = False) -> None:
        """Run ``op()`` to completion, waiting out Redis outages (``op`` must be safe to run again)."""
        while True:
            try:
                await op()
                return
            except REDIS_DOWN as exc:
                await self._wait_for_redis(exc, stop, final=final)

    async def _wait_for_redis(self, exc: BaseException, stop: asyncio.Event, final: bool = False) -> None:
        """Wait (capped backoff, bounded by queue.redis_outage_max_s) until Redis answers a PING, then
        recover what an outage can lose. Raises when the bound passes; returns early when stopping."""
        phase = self.phase
        self.phase = "waiting_for_redis"
        self.error = f"Redis unavailable: {type(exc).__name__}: {exc}"
        self.state.bump("redis_outages")
        self.sink.count("redis_outages")
        start = time.monotonic()
        delay = 0.25
        while True:
            waited = time.monotonic() - start
            if waited > self.s.queue.redis_outage_max_s:
                raise RuntimeError(f"Redis did not answer for {waited:.0f}s (queue.redis_outage_max_s="
                                   f"{self.s.queue.redis_outage_max_s:.0f}); last error: {self.error}") from exc
            log.warning("Redis unavailable (%s: %s); waited %.1fs, retrying in %.1fs", type(exc).__name__, exc,
                        waited, delay)
            if final:
                await asyncio.sleep(delay)
            else:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
            if stop.is_set() and not final:
                self.phase = phase
                return
            delay = min(delay * 2, 2.0)
            try:
                await asyncio.wait_for(self.redis.ping(), 5.0)
                # what an outage can lose: entries delivered while the connection broke, prompts not persisted
                self.experiences.replay_history(self.s.queue.consumer)
                await self.feeder.reissue_lost(self.redis)
                break
            except REDIS_DOWN + (asyncio.TimeoutError,) as again:
                exc = again
        log.info("Redis answers again after %.1fs", time.monotonic() - start)
        self.phase, self.error = phase, None

    # ---- dead letters ----------------------------------------------------------------------------------
    async def _watch_dead_letters(self) -> None:
        if time.monotonic() < self._next_dead_letter_poll:
            return
        self._next_dead_letter_poll = time.monotonic() + 1.0
        for dl in await self.dead_letters.poll():
            await self._on_dead_letter(dl)
        self.state.dead_letter_cursors = dict(self.dead_letters.cursors)

    async def _on_dead_letter(self, dl: DeadLetter) -> None:
        parsed = parse_item_id(dl.group_id) if dl.group_id else None
        if parsed is None:
            log.warning("dead letter %s in %s belongs to no prompt of this run (%s)", dl.entry, dl.stream, dl.reason)
            return
        key, attempt = parsed
        item = self.state.in_flight.get(key)
        if item is None or item.attempt != attempt or self.buffer.is_complete(dl.group_id):
            return  # trained, re-issued already, or complete without the dead-lettered copy
        item.dead_letters += 1
        if dl.reason.startswith(PERMANENT):  # the worker knows it can never succeed: issuing it again cannot help
            self._abandon(key, f"{dl.stream} entry dead-lettered as one that can never succeed: {dl.reason}")
            return
        if item.dead_letters > self.s.rollout.dead_letter_retries:
            self._abandon(key, f"{dl.stream} entry dead-lettered {item.dead_letters} times; last: {dl.reason}")
            return
        log.warning("prompt %s: its %s entry was dead-lettered (%s); re-issuing it", dl.group_id, dl.stream, dl.reason)
        await self.feeder.reissue(key, f"dead-lettered: {dl.reason}")

    def _abandon(self, key: str, reason: str) -> None:
        """Give dataset position ``key`` up (its retries are spent): out of flight, with the reason, counted."""
        log.error("giving up dataset position %s: %s", key, reason)
        self.state.in_flight.pop(key, None)
        self.state.abandoned[key] = reason
        for gid in self.buffer.groups_of(key):
            self._drop_group(gid)
        self.state.bump("prompts_abandoned")
        self.sink.count("prompts_abandoned")

    def _lease_lost(self, entry_ids: list[str]) -> None:
        log.error("%d experience entries this learner holds were taken by another consumer of group 'learner' "
                  "(is a second learner running on run %r?)", len(entry_ids), self.s.run_name)

    def _exhausted(self) -> bool:
        """Every prompt of the run was issued (a runner not started yet has issued none)."""
        return self.feeder is not None and self.feeder.exhausted()

    def _done(self) -> bool:
        if self.s.train.max_steps and self.trainer.global_step >= self.s.train.max_steps:
            return True
        return self._exhausted() and not self.state.in_flight

    # ---- experiences in ------------------------------------------------------------------------------
    async def _receive(self) -> None:
        if self._wait_started is None:
            self._wait_started = time.perf_counter()
        before = self.experiences.rejected_signature
        t0 = time.perf_counter()
        deliveries = await self.experiences.consume(self.s.queue.consumer, count=self.s.queue.consume_count,
                                                    block_ms=self.s.queue.block_ms)
        with contextlib.suppress(*REDIS_DOWN):  # the pool signal's backlog: what waited for a replica meanwhile
            await self.pool.sample_wait(time.perf_counter() - t0)
        unsigned = self.experiences.rejected_signature - before
        if unsigned:  # dead-lettered by the queue before decoding (shared/signing.py)
            self.state.bump("experiences_unsigned", unsigned)
            self.sink.count("experiences_unsigned", unsigned)
        await self._admit(deliveries)

    async def _admit(self, deliveries: list[Delivery[Experience]]) -> None:
        fresh = [d for d in deliveries if d.id not in self.lease.held]  # held already (replayed history)
        if not fresh:
            return
        new = set(await self.processed.filter_new([d.record.id for d in fresh]))
        st = self.state
        for d in fresh:
            e = d.record
            self.lease.hold([d.id])
            st.bump("experiences_consumed")
            self.sink.count("experiences_consumed")
            problem = unissued(e, st.in_flight, st.grant_key, self.s.rollout.group_size)
            if problem is not None:
                log.warning("dropping experience %s: %s", e.id, problem)
                st.bump("experiences_unissued")
                self.sink.count("experiences_unissued")
                st.commit_entry_ids.append(d.id)
                continue
            problem = self._invalid(e)
            if problem is not None:
                log.warning("rejecting experience %s: %s", e.id, problem)
                st.bump("experiences_rejected")
                self.sink.count("experiences_rejected")
                st.commit_entry_ids.append(d.id)  # its prompt is re-issued when the group times out
                continue
            if e.id not in new or self.buffer.file(d.id, e, st.in_flight) is Filed.DUPLICATE:
                st.bump("experiences_deduplicated")
                self.sink.count("experiences_deduplicated")
                st.commit_entry_ids.append(d.id)

    def _invalid(self, e: Experience) -> str | None:
        vocab, max_len = self._limits
        length = len(e.prompt_token_ids) + len(e.response_token_ids)
        if max_len is not None and length > max_len:
            return f"{length} tokens exceed the model's {max_len} positions"
        for name in ("prompt_token_ids", "response_token_ids"):
            ids = np.asarray(getattr(e, name))
            if ids.size and (ids.min() < 0 or ids.max() >= vocab):
                return f"{name} holds ids outside the vocabulary [0, {vocab})"
        if not np.isfinite(np.asarray(e.response_logprobs, dtype=np.float64)).all() or not math.isfinite(e.reward):
            return "non-finite logprob or reward"
        return None

    def _drop_group(self, gid: str) -> list[Experience]:
        held = self.buffer.drop(gid)
        self.state.commit_entry_ids += [h.entry for h in held]
        return [h.exp for h in held]

    async def _take_batch(self) -> list[str]:
        """Up to groups_per_step fresh complete groups (dropping stale ones, and with dynamic sampling those
        without signal), or [] if not ready."""
        limit = self.state.weight_version - self.s.rollout.max_staleness
        for gid in self.buffer.stale(limit):
            oldest = self.buffer.oldest_version(gid)
            dropped = self._drop_group(gid)
            self.state.bump("experiences_dropped_stale", len(dropped))
            self.sink.count("experiences_dropped_stale", len(dropped))
            key, attempt = parse_item_id(gid)
            log.info("dropped stale group %s (version %d < %d); re-issuing", gid, oldest, limit)
            item = self.state.in_flight.get(key)
            # (not re-issued, or given up, already)
            if item is not None and item.attempt == attempt and \
                    await self.feeder.reissue(key, f"stale group (weight version {oldest} < {limit})"):
                item.stale_drops += 1
        if self.s.algorithm.dynamic_sampling.enabled:
            self._filter_without_signal()
        if self._held_for() is not None:
            return []
        return self.buffer.take(self.s.train.groups_per_step, self.state.in_flight, self._exhausted())

    def _held_for(self) -> str | None:
        """A position whose group went stale and whose re-issued group is not complete yet, re-issued less than
        ``rollout.stale_hold_s`` ago: the learner does not step until it lands (or the hold runs out), so a prompt
        that scores slower than ``max_staleness`` steps is trained, not re-issued until ``max_attempts``."""
        hold = self.s.rollout.stale_hold_s
        if hold <= 0:
            return None
        complete = {position_of(g) for g in self.buffer.complete}
        now = time.time()
        return next((key for key, item in self.state.in_flight.items()
                     if item.stale_drops and now - item.issued_at < hold and key not in complete), None)

    def _filter_without_signal(self) -> None:
        """Dynamic sampling: finish the positions of zero-variance groups untrained (the window then feeds fresh
        prompts), up to the step's refill cap; past the cap they stay and are trained."""
        cap = self.s.algorithm.dynamic_sampling.max_refills_per_step
        st = self.state
        for gid in self.buffer.without_signal():
            if self._refills >= cap:
                st.bump("dynamic_sampling_cap_reached")
                self.sink.count("dynamic_sampling_cap_reached")
                return
            key = position_of(gid)
            self._drop_group(gid)
            for other in self.buffer.groups_of(key):  # other attempts of a finished position: superseded
                st.bump("experiences_deduplicated", len(self._drop_group(other)))
            del st.in_flight[key]
            self._refills += 1
            st.bump("groups_filtered")
            self.sink.count("groups_filtered")

    # ---- training --------------------------------------------------------------------------------------
    async def _train(self, gids: list[str]) -> None:
        if self._wait_started is not None:
            self._wait_s += time.perf_counter() - self._wait_started
            self._wait_started = None
        st = self.state
        groups = [self.buffer.experiences(gid) for gid in gids]
        exps = [e for group in groups for e in group]
        staleness = [st.weight_version - e.weight_version for e in exps]  # of each sample's oldest token
        spans = [max(v for _, v in e.version_spans) - e.weight_version if e.version_spans else 0 for e in exps]
        with self._lap("train"):
            if self.link is not None:
                metrics = await asyncio.to_thread(self.link.train, self.trainer, groups)
            else:
                metrics = await asyncio.to_thread(self.trainer.train_step, exps)
        step = self.trainer.global_step
        self._refills = 0
        for gid in gids:
            key = position_of(gid)
            held = self.buffer.remove(gid)
            st.commit_entry_ids += [h.entry for h in held]
            st.commit_sample_ids += [h.exp.id for h in held]
            del st.in_flight[key]
            for other in self.buffer.groups_of(key):  # other attempts: superseded
                st.bump("experiences_deduplicated", len(self._drop_group(other)))
        st.bump("groups_trained", len(gids))
        st.bump("samples_trained", len(exps))
        self.sink.count("samples_trained", len(exps))
        self.sink.observe_staleness(staleness)
        self.sink.observe_version_spans(spans)
        self.commits.steps_since += 1
        due = publish_due(step, self.s.publish.every, self.publisher.replicas_waiting) or self._publish_failed
        with self._lap("publish"):
            if due and await self._publish():
                metrics.update(self.sink.observe_publish(self.publisher.last_report))
        metrics.update({
            "step": step, "weight_version": st.weight_version, "groups": len(gids),
            "staleness_mean": sum(staleness) / len(staleness), "staleness_max": max(staleness),
            "version_span_mean": sum(spans) / len(spans), "version_span_max": max(spans),
            "wait_time_s": self._wait_s, "in_flight": len(st.in_flight), "epoch": st.epoch,
            **{k: v for k, v in st.counters.items()},
        })
        if self.s.observability.log_sample_ids:
            metrics["sample_ids"] = [e.id for e in exps]
        with self._lap("log_samples"):
            self.sink.log_samples(step, exps)
        with self._lap("pool_signal"):
            await self._publish_pool_signal(step, int(sum(len(e.response_token_ids) for e in exps)))
        self._wait_s = 0.0
        self.sink.in_flight.set(len(st.in_flight))
        self.last_metrics = metrics
        self.recent.append(row := {"step": step, **{k: v for k, v in metrics.items() if k in HEALTH_KEYS}})
        self.peaks.add(row)
        metrics["loop_s"], self._loop_s = {k: round(v, 6) for k, v in self._loop_s.items()}, {}  # not a scalar
        with self._lap("log_step"):  # (in the next step's loop_s)
            self.sink.log_step(step, metrics)
        if self.commits.due(step, self.s.checkpoint.every):
            with self._lap("checkpoint"):
                await self._commit()

    async def _publish_pool_signal(self, step: int, tokens: int) -> None:
        """This step's demand signal for the rollout pool (Redis key, gauges, /status); a Redis error costs the
        signal of this step only."""
        self.pool.step_done(self._wait_s, tokens)
        try:
            sig = await self.pool.publish(step)
        except REDIS_DOWN as exc:
            log.warning("pool signal of step %d not published (%s: %s)", step, type(exc).__name__, exc)
            return
        self.sink.observe_pool(sig)

    async def _publish(self, strict: bool = False) -> bool:
        """Publish the actor as a new version. A publish that fails on Redis fails this round, not the run
        (the next step publishes again), unless ``strict`` (start-up and the final publish: retried)."""
        if self.link is not None:
            weights = await asyncio.to_thread(self.link.policy_weights, self.trainer)
        else:
            weights = await asyncio.to_thread(self.trainer.policy_weights)
        try:
            self.state.weight_version = await self.publisher.publish(weights)
        except PublishFailed as exc:  # staging, writing or a transport failed: this round, never the learner
            self._publish_failed = True
            self.state.bump("publishes_failed")
            self.sink.count("publishes_failed")
            log.warning("publishing step %d failed (%s); the fleet keeps version %d, the next step publishes again",
                        self.trainer.global_step, exc, self.state.weight_version)
            return False
        except REDIS_DOWN as exc:
            if strict:
                raise
            self._publish_failed = True
            self.state.bump("publishes_failed")
            self.sink.count("publishes_failed")
            log.warning("publishing step %d failed on Redis (%s: %s); the fleet keeps version %d, the next "
                        "step publishes again", self.trainer.global_step, type(exc).__name__, exc,
                        self.state.weight_version)
            return False
        self._publish_failed = False
        self._published_step = self.trainer.global_step
        return True

    # ---- commit ------------------------------------------------------------------------------------------
    async def _commit(self, settle: bool = True) -> None:
        """Checkpoint (trainer and run state), then settle exactly what it covers (see ``Commits``)."""
        def write_trainer(out: Path) -> None:
            if self.link is not None:
                self.link.save(self.trainer, out)
            else:
                self.trainer.save(out)

        await self.commits.commit(self.state, self.trainer.global_step, write_trainer, settle=settle)

    def request_checkpoint(self) -> asyncio.Future:
        """A future resolved with ``{"step", "path"}`` once a checkpoint is written (at a step boundary)."""
        return self.commits.request()

    async def _finish(self, stopped: bool) -> None:
        self.phase = "stopping" if stopped else "finishing"
        step = self.trainer.global_step
        if self._published_step != step and not stopped:
            await self._publish(strict=True)
        if self.commits.needed_at_finish():
            await self._commit(settle=False)
        try:
            await self.commits.settle()
        except REDIS_DOWN as exc:
            if not stopped:
                raise  # finishing: wait for Redis and settle (see run)
            log.warning("stopping while Redis is unavailable (%s); %s records what to acknowledge, settled when "
                        "the run resumes", exc, self.commits.last_checkpoint)
        if self.s.checkpoint.export_dir and not stopped:
            await asyncio.to_thread(self.trainer.export, Path(self.s.checkpoint.export_dir))
        self.phase = "stopped" if stopped else "finished"
        log.info("run %s at step %d (weight version %d)", self.phase, step, self.state.weight_version)

    # ---- status --------------------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        st = self.state
        return {
            "phase": self.phase,
            **({"waiting": "the launcher's go to start (train.start_gate): fleetrl run is measuring the starting "
                           "policy on the held-out set"} if self.phase == "waiting_for_start_gate" else {}),
            "error": self.error,
            "algorithm": self.s.algorithm.name,
            "step": self.trainer.global_step if self.trainer else 0,
            "total_steps": self.total_steps,
            "weight_version": st.weight_version,
            "epoch": st.epoch,
            "next_index": st.next_index,
            "prompts_in_flight": len(st.in_flight),
            "groups_buffered": len(self.buffer),
            "groups_complete": len(self.buffer.complete),
            "counters": dict(st.counters),
            "staleness_histogram": {str(k): v for k, v in sorted(self.sink.staleness_counts.items())},
            "version_span_histogram": {str(k): v for k, v in sorted(self.sink.version_span_counts.items())},
            "abandoned": dict(list(st.abandoned.items())[-5:]),
            "records_signed": self.experiences.signer is not None,  # run_key set: unsigned entries are dead-lettered
            "last_checkpoint": self.commits.last_checkpoint,
            "ranks": self.ranks.world_size,
            "replica_digests": self.link.replica_digests if self.link is not None else [],
            "last_metrics": {k: v for k, v in self.last_metrics.items() if k != "sample_ids"},
            "health": [asdict(w) for w in check_health(list(self.recent), peaks=self.peaks)],
            "last_publish": self._publish_status(),
            "pool": self.pool.last.to_dict() if self.pool.last is not None else None,
        }

    def _publish_status(self) -> dict[str, Any] | None:
        """The last weight publish: version, seconds, phases, replicas per outcome, and who waits for the next."""
        report = self.publisher.last_report if self.publisher is not None else None
        if report is None:
            return None
        return {"version": report.version, "seconds": round(report.seconds, 4), "phases": report.phases,
                "loaded": report.loaded, "dropped": report.dropped, "refused": report.refused,
                "rounds": report.rounds, "errors": report.errors[-3:],
                "replicas_waiting": self.publisher.replicas_waiting,
                "failed_in_a_row": self.publisher.history.failed_in_a_row}

    async def weights_problem(self) -> str | None:
        """Which replicas serve old weights and why (e.g. 'rollout-0 on weights v0, learner on v12: the last 5
        weight rounds failed: ...'), or None: shown as what the learner waits for."""
        if self.publisher is None:
            return None
        return await self.publisher.lag_problem()
