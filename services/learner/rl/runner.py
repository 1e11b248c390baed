"""The RL run owner: issues prompts, takes experiences, trains on complete groups, publishes, checkpoints.

The runner is the loop; its parts each hold one job: :class:`~.prompt_feeder.PromptFeeder` (prompts out: the
window, re-issues), :class:`~.experience_intake.ExperienceIntake` (experiences in: checks, dedupe),
:class:`~.group_buffer.GroupBuffer` (experiences held by group), :class:`~.batch_picker.BatchPicker` (what a step
takes: staleness, dynamic sampling), :class:`~.positions.Positions` (how a dataset position ends),
:class:`~services.learner.watches.dead_letters.DeadLetterHandler`, :class:`~.commits.Commits` (the ack rule below),
:class:`~.publish_rounds.PublishRounds` (weights out), ``watches/redis_outage.py``, ``status.py`` (``/status``) and
the trainer.

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

**Redis outages** are waited out (``watches/redis_outage.py``); a publish that fails on Redis fails that round, not the
run (``publish_rounds.py``).

**Leases.** The experience entries the owner holds (buffered, or trained and awaiting the commit) are renewed on
the stream (:class:`~shared.experience_queue.Lease`), so they never go idle while it runs. Dead letters:
``watches/dead_letters.py``; staleness and dynamic sampling: ``batch_picker.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from services.learner.checkpoint import CheckpointManager
from services.learner.counters import Counters
from services.learner.data import PromptSet, epoch_plan, passes_note
from services.learner.distributed.env import RankInfo
from services.learner.observability import MetricsSink
from services.learner.rl.batch_picker import BatchPicker
from services.learner.rl.commits import Commits
from services.learner.rl.experience_intake import ExperienceIntake
from services.learner.rl.group_buffer import GroupBuffer, position_of
from services.learner.rl.positions import Positions
from services.learner.rl.prompt_feeder import PromptFeeder
from services.learner.rl.publish_rounds import PublishRounds
from services.learner.rl.start_gate import wait_start_gate
from services.learner.rl.status import run_status
from services.learner.run_state import RunState
from services.learner.settings import LearnerSettings
from services.learner.watches.dead_letters import DeadLetterHandler
from services.learner.watches.pool import PoolWatch
from services.learner.watches.queue import DeadLetterWatch
from services.learner.watches.redis_outage import wait_for_redis
from shared import keys
from shared.experience_queue import Lease, ProcessedIds, StreamQueue
from shared.redis_errors import REDIS_UNAVAILABLE, raise_if_refused
from shared.schemas import Experience, PromptTask
from shared.signing import signer_for
from shared.training_health import Peaks

if TYPE_CHECKING:
    from services.learner.distributed.ranks import OwnerLink
    from services.learner.training.backends import TrainEngine
    from services.learner.weights import WeightPublisher

HEALTH_HISTORY = 100
"""Steps of metrics kept for /status's ``health`` (collapse and spike checks, shared/training_health.py)."""
HEALTH_KEYS = ("reward_mean", "entropy", "kl", "mismatch_k3", "response_len_mean", "truncated_frac")

log = logging.getLogger(__name__)


class RLRunTrainer(Protocol):
    """What the RL runner asks of the trainer its algorithm names (``trainer_class``: RLTrainer, the online
    preference trainers, a plug-in's)."""

    global_step: int
    actor: TrainEngine[Any]

    def train_step(self, experiences: Sequence[Experience]) -> dict[str, float]: ...

    def limits(self) -> tuple[int, int | None]: ...

    def policy_weights(self) -> Any: ...

    def save(self, out_dir: Path) -> None: ...

    def export(self, out_dir: Path, checkpoint: Path | None = None) -> None: ...


@dataclass(frozen=True)
class RunParts:
    """The run's collaborators, built together once the run state is loaded and the trainer with it
    (``RLRunner._start``): none exists before, none is replaced after. Each was handed only the part of the run state
    it keeps (the feeder the dataset cursor and the positions in flight, ``Positions`` those and the given-up ones,
    the intake the positions and the grant key, the rounds the version published, the dead-letter handler its
    cursors), the ``Counters`` they all count with, and ``Commits`` as the place finished entries go."""

    trainer: RLRunTrainer
    counters: Counters
    positions: Positions
    feeder: PromptFeeder
    picker: BatchPicker
    intake: ExperienceIntake
    dead_letters: DeadLetterHandler
    publisher: WeightPublisher
    rounds: PublishRounds


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
        self.state = RunState()  # a fresh run's; a resume replaces it with its checkpoint's (_start), once
        self.parts: RunParts | None = None  # built at once when the run state and the trainer are loaded (_start)
        self.phase = "starting"
        self.error: str | None = None
        self.total_steps = 0
        self.last_metrics: dict[str, Any] = {}
        self.recent: deque[dict[str, Any]] = deque(maxlen=HEALTH_HISTORY)  # what /status's health is judged on
        self.peaks = Peaks()  # with the run's best windows, so a slow collapse is seen too
        self.buffer = GroupBuffer()
        # stream entry ids we hold (buffered or awaiting the commit), renewed so they never go idle
        self.lease = Lease(self.experiences, settings.queue.consumer, on_lost=self._lease_lost)
        self.ckpt = CheckpointManager(settings.checkpoint_dir, settings.checkpoint.keep)
        self.commits = Commits(self.ckpt, self.processed, self.experiences, self.lease, self.buffer)
        self._wait_started: float | None = None
        self._wait_s = 0.0
        self._loop_s: dict[str, float] = {}  # where the loop spent the time since the last step's line (loop_s)
        self.pool = PoolWatch(redis, run, settings.pool)  # the elastic pool's demand signal, every step
        self.ranks = RankInfo.from_env()
        self.link: OwnerLink | None = None  # OwnerLink to the follower ranks when WORLD_SIZE > 1

    def _lease_lost(self, entry_ids: list[str]) -> None:
        log.error("%d experience entries this learner holds were taken by another consumer of group 'learner' "
                  "(is a second learner running on run %r?)", len(entry_ids), self.s.run_name)

    # ---- start -----------------------------------------------------------------------------------
    @property
    def trainer(self) -> RLRunTrainer | None:
        """The run's trainer once loaded (``/status``'s step), else None."""
        return self.parts.trainer if self.parts is not None else None

    @property
    def picker(self) -> BatchPicker | None:
        """The run's batch picker once started (``/status``'s ``waiting``), else None."""
        return self.parts.picker if self.parts is not None else None

    @property
    def publisher(self) -> WeightPublisher | None:
        """The run's weight publisher once loaded (``/status``'s ``last_publish``), else None."""
        return self.parts.publisher if self.parts is not None else None

    async def _start(self) -> RunParts:
        from services.learner.training.models import load_tokenizer

        tokenizer = await asyncio.to_thread(load_tokenizer, self.s.model)
        data = await asyncio.to_thread(PromptSet.load, self.s.data, self.s.train.seed, tokenizer)
        latest = self.ckpt.latest() if self.s.checkpoint.resume else None
        if latest is not None:
            self.state, recorded = RunState.load_with_commit(latest / "run_state.json")
            self.commits.carry_recorded(recorded)  # the commit the checkpoint recorded is settled first (_connect)
            log.info("resuming from %s", latest)
        st = self.state
        plan = epoch_plan(self.s.data, self.s.train.groups_per_step, self.s.train.max_steps, len(data))
        counters = Counters(st, self.sink)  # the run's state as loaded: counted once, in both places
        positions = Positions(st.in_flight, st.abandoned, self.buffer, self.commits, counters)
        feeder = PromptFeeder(self.prompts, data, plan.epochs, st, self.s, counters, positions.abandon)
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
        early = asyncio.create_task(self._feed_early(feeder)) if self._may_feed_early(latest) else None
        try:
            trainer = await self._load_trainer(resume_dir)
        except BaseException:
            if early is not None:
                early.cancel()
            raise
        from services.learner.weights import WeightPublisher

        publisher = WeightPublisher(self.redis, self.s.run_name, self.s.publish.sync)
        watch = DeadLetterWatch(self.redis, self.s.run_name, st.dead_letter_cursors, signer=self.experiences.signer)
        self.parts = parts = RunParts(
            trainer=trainer, counters=counters, positions=positions, feeder=feeder,
            picker=BatchPicker(st, self.buffer, positions, self.s, counters, feeder.reissue),
            intake=ExperienceIntake(self.experiences, self.processed, self.lease, st.in_flight, st.grant_key,
                                    self.buffer, self.commits, trainer.limits(), self.s, counters),
            dead_letters=DeadLetterHandler(watch, st.in_flight, st.dead_letter_cursors, self.buffer, feeder.reissue,
                                           positions.abandon, self.s.rollout.dead_letter_retries),
            publisher=publisher, rounds=PublishRounds(publisher, st, counters))
        if latest is not None:
            self.commits.last_checkpoint = str(latest)
        actor = trainer.actor
        if self.s.publish.in_place and not actor.owns_parameter_memory and not hasattr(actor.model, "merge_and_unload"):
            buckets = await asyncio.to_thread(publisher.flatten, actor.model)
            log.info("actor weights laid out in %d publish buckets: publishing sends them without a copy", buckets)
        if self.experiences.signer is None:
            log.warning("run_key is unset (allow_unsigned_records): prompts go out unsigned and experiences are "
                        "trained on without checking who wrote them; give every service of the run the same run_key "
                        "(docs/security-redis.md)")
        self.sink.open(self.total_steps, trainer.global_step)
        if early is not None:
            await early
            now = time.time()  # their rollout.prompt_timeout_s counts from when the learner can train on them
            for item in st.in_flight.values():
                item.issued_at = max(item.issued_at, now)
        return parts

    def _may_feed_early(self, latest: Path | None) -> bool:
        """Prompts before the trainer exists only for a fresh, single-rank run with no start gate (the gate holds
        the fleet's held-out evaluation of the start policy first; a resumed run first settles its checkpoint)."""
        return latest is None and not self.s.train.start_gate and not self.ranks.multi

    async def _feed_early(self, feeder: PromptFeeder) -> None:
        """Best effort: the first window of prompts while the trainer loads, where no weights were published yet
        (else the loop issues them after ``_connect`` publishes ours); a Redis problem leaves them to the loop."""
        try:
            if int(await self.redis.get(keys.weights_version(self.s.run_name)) or 0) != 0:
                return
            await self.experiences.ensure_group()
            await self.prompts.ensure_group()
            await feeder.feed()
        except REDIS_UNAVAILABLE as exc:
            log.info("first prompts wait until the trainer is loaded (Redis: %s)", exc)

    async def _load_trainer(self, resume_dir: Path | None) -> RLRunTrainer:
        from services.learner.algorithms.rl_algorithms import trainer_class

        if self.ranks.multi:
            from services.learner.distributed.ranks import OwnerLink

            self.link = link = await asyncio.to_thread(OwnerLink, self.s, self.ranks)
            await asyncio.to_thread(link.start, self.total_steps, resume_dir)
        trainer: RLRunTrainer = await asyncio.to_thread(trainer_class(self.s.algorithm), self.s, self.total_steps,
                                                        resume_dir, self.ranks.local_rank)
        return trainer

    async def _start_gate(self, p: RunParts, stop: asyncio.Event) -> bool:
        """Hold here, loaded, until the launcher opens ``train.start_gate`` (False: stopped meanwhile)."""
        t = self.s.train
        gate = t.start_gate
        if not gate:
            return True
        self.phase = "waiting_for_start_gate"
        log.info("loaded; waiting for the launcher's go (its step-0 held-out evaluation) before the first step "
                 "(train.start_gate, at most %.0fs)", t.start_gate_timeout_s)
        key, opened = keys.learner_start_gate(self.s.run_name), False

        async def wait() -> None:
            nonlocal opened
            opened = await wait_start_gate(self.redis, key, gate, t.start_gate_timeout_s, stop)

        await self._until_redis_answers(p, wait, stop)
        if opened:
            log.info("start gate open")
        return opened

    async def _connect(self, p: RunParts) -> None:
        """The start-up steps that need Redis (idempotent: run again after an outage during start-up)."""
        await self.experiences.ensure_group()
        await self.prompts.ensure_group()
        await self.commits.settle()  # finish the commit the resumed checkpoint recorded
        if p.rounds.published_step < 0:
            published = int(await self.redis.get(keys.weights_version(self.s.run_name)) or 0)
            if published != self.state.weight_version or published > 0:
                # the fleet holds weights we are not resuming from, or replicas (re)started with the run wait for
                # the latest version, which this new process holds nothing of to serve them: give the fleet our
                # weights under a new version (else their workers hold back, past max_staleness, until a step
                # that cannot come without their experiences)
                await self._publish(p, strict=True)
            p.rounds.published_step = p.trainer.global_step
        self.lease.start()

    # ---- the loop ----------------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        try:
            p = await self._start()
            if not await self._start_gate(p, stop):
                self.phase = "stopped"  # stopped before anything was published or trained: nothing to save
                return
            await self._until_redis_answers(p, lambda: self._connect(p), stop)
            self.phase = "running"
            while not stop.is_set() and not self._done(p):
                try:
                    await self._iteration(p)
                except REDIS_UNAVAILABLE as exc:
                    raise_if_refused(exc)
                    await self._wait_for_redis(p, exc, stop)
            await self._until_redis_answers(p, lambda: self._finish(p, stopped=stop.is_set()), stop, final=True)
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
            if self.parts is not None:
                await self.parts.publisher.close()
            if self.link is not None:
                try:  # followers leave their loop (a follower stuck in a collective times out instead)
                    await asyncio.to_thread(self.link.stop)
                except Exception:
                    log.exception("could not stop the follower ranks")

    async def _iteration(self, p: RunParts) -> None:
        with self._lap("settle"):
            await self.commits.settle()
            if self.link is not None:
                await asyncio.to_thread(self.link.heartbeat)
        with self._lap("dead_letters"):
            await p.dead_letters.poll()
        with self._lap("feed"):
            await p.feeder.feed()
            await p.feeder.reissue_timeouts({position_of(g) for g in self.buffer.complete})
        with self._lap("take"):
            groups = await p.picker.take(p.feeder.exhausted())
        if groups:
            await self._train(p, groups)
        elif self.commits.waiters:
            with self._lap("checkpoint"):
                await self._commit(p)
        else:
            with self._lap("receive"):
                await self._receive(p)

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
    async def _until_redis_answers(self, p: RunParts, op, stop: asyncio.Event, final: bool = False) -> None:
        """Run ``op()`` to completion, waiting out Redis outages (``op`` must be safe to run again)."""
        while True:
            try:
                await op()
                return
            except REDIS_UNAVAILABLE as exc:
                raise_if_refused(exc)
                await self._wait_for_redis(p, exc, stop, final=final)

    async def _wait_for_redis(self, p: RunParts, exc: BaseException, stop: asyncio.Event, final: bool = False) -> None:
        """Wait (capped backoff, bounded by queue.redis_outage_max_s) until Redis answers a PING, then
        recover what an outage can lose. Raises when the bound passes; returns early when stopping."""
        phase = self.phase
        self.phase = "waiting_for_redis"
        self.error = f"Redis unavailable: {type(exc).__name__}: {exc}"
        p.counters.add("redis_outages")
        answered = await wait_for_redis(self.redis, exc, stop, max_s=self.s.queue.redis_outage_max_s,
                                        error=self.error, recover=lambda: self._recover_after_outage(p), final=final)
        self.phase = phase
        if answered:
            self.error = None

    async def _recover_after_outage(self, p: RunParts) -> None:
        """What an outage can lose: entries delivered while the connection broke, prompts not persisted."""
        self.experiences.replay_history(self.s.queue.consumer)
        await p.feeder.reissue_lost(self.redis)

    # ---- is the run done --------------------------------------------------------------------------------
    def _done(self, p: RunParts) -> bool:
        if self.s.train.max_steps and p.trainer.global_step >= self.s.train.max_steps:
            return True
        return p.feeder.exhausted() and not self.state.in_flight

    # ---- experiences in ------------------------------------------------------------------------------
    async def _receive(self, p: RunParts) -> None:
        if self._wait_started is None:
            self._wait_started = time.perf_counter()
        t0 = time.perf_counter()
        await p.intake.receive()
        with contextlib.suppress(*REDIS_UNAVAILABLE):  # the pool signal's backlog: what waited for a replica meanwhile
            await self.pool.sample_wait(time.perf_counter() - t0)

    # ---- training --------------------------------------------------------------------------------------
    async def _train(self, p: RunParts, gids: list[str]) -> None:
        if self._wait_started is not None:
            self._wait_s += time.perf_counter() - self._wait_started
            self._wait_started = None
        st = self.state
        groups = [self.buffer.experiences(gid) for gid in gids]
        exps = [e for group in groups for e in group]
        staleness = [st.weight_version - e.weight_version for e in exps]  # of each sample's oldest token
        spans = [max(v for _, v in e.version_spans) - e.weight_version if e.version_spans else 0 for e in exps]
        metrics: dict[str, Any]  # the trainer's numbers, then the step's own (not all numbers: sample_ids, loop_s)
        with self._lap("train"):
            if self.link is not None:
                metrics = await asyncio.to_thread(self.link.train, p.trainer, groups)
            else:
                metrics = await asyncio.to_thread(p.trainer.train_step, exps)
        step = p.trainer.global_step
        p.picker.stepped()
        p.positions.trained(gids)
        p.counters.add("groups_trained", len(gids))
        p.counters.add("samples_trained", len(exps))
        self.sink.observe_staleness(staleness)
        self.sink.observe_version_spans(spans)
        self.commits.steps_since += 1
        with self._lap("publish"):
            if p.rounds.due(step, self.s.publish.every) and await self._publish(p):
                metrics.update(self.sink.observe_publish(p.publisher.last_report))
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
                await self._commit(p)

    async def _publish_pool_signal(self, step: int, tokens: int) -> None:
        """This step's demand signal for the rollout pool (Redis key, gauges, /status); a Redis error costs the
        signal of this step only."""
        self.pool.step_done(self._wait_s, tokens)
        try:
            sig = await self.pool.publish(step)
        except REDIS_UNAVAILABLE as exc:
            log.warning("pool signal of step %d not published (%s: %s)", step, type(exc).__name__, exc)
            return
        self.sink.observe_pool(sig)

    async def _publish(self, p: RunParts, strict: bool = False) -> bool:
        """Publish the actor as a new version (``publish_rounds.py``: a failed round fails only itself, unless
        ``strict``)."""
        if self.link is not None:
            weights = await asyncio.to_thread(self.link.policy_weights, p.trainer)
        else:
            weights = await asyncio.to_thread(p.trainer.policy_weights)
        return await p.rounds.publish(weights, p.trainer.global_step, strict=strict)

    # ---- commit ------------------------------------------------------------------------------------------
    async def _commit(self, p: RunParts, settle: bool = True) -> None:
        """Checkpoint (trainer and run state), then settle exactly what it covers (see ``Commits``)."""
        trainer, link = p.trainer, self.link

        def write_trainer(out: Path) -> None:
            if link is not None:
                link.save(trainer, out)
            else:
                trainer.save(out)

        await self.commits.commit(self.state, trainer.global_step, write_trainer, settle=settle)

    def request_checkpoint(self) -> asyncio.Future:
        """A future resolved with ``{"step", "path"}`` once a checkpoint is written (at a step boundary)."""
        return self.commits.request()

    async def _finish(self, p: RunParts, stopped: bool) -> None:
        self.phase = "stopping" if stopped else "finishing"
        step = p.trainer.global_step
        if p.rounds.published_step != step and not stopped:
            await self._publish(p, strict=True)
        if self.commits.needed_at_finish():
            await self._commit(p, settle=False)
        try:
            await self.commits.settle()
        except REDIS_UNAVAILABLE as exc:
            if not stopped:
                raise  # finishing: wait for Redis and settle (see run)
            log.warning("stopping while Redis is unavailable (%s); %s records what to acknowledge, settled when "
                        "the run resumes", exc, self.commits.last_checkpoint)
        if self.s.checkpoint.export_dir and not stopped:
            last = self.commits.last_checkpoint  # this step's: written just above unless one was already
            await asyncio.to_thread(p.trainer.export, Path(self.s.checkpoint.export_dir),
                                    Path(last) if last else None)
        self.phase = "stopped" if stopped else "finished"
        log.info("run %s at step %d (weight version %d)", self.phase, step, self.state.weight_version)

    # ---- status --------------------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        return run_status(self)

    async def weights_problem(self) -> str | None:
        """Which replicas serve old weights and why (e.g. 'rollout-0 on weights v0, learner on v12: the last 5
        weight rounds failed: ...'), or None: shown as what the learner waits for."""
        if self.parts is None:
            return None
        return await self.parts.publisher.lag_problem()
