"""The rollout worker loop (runs inside the rollout service process when ``worker.enabled``).

For each prompt task taken from ``keys.prompts_stream(run)`` (consumer group "rollout"): run the rollout
function (``worker.rollout_function``; ``single_turn`` generates ``task.n`` samples as one group on this
service's engine and scores them with one ``/score`` call, ``multi_turn`` runs environments and tools), push
one Experience per trajectory to ``keys.experiences_stream(run)``, and only then ack the prompt. While
a group is being generated and scored, however long that takes, the worker keeps its lease on the prompt
alive (:class:`~shared.experience_queue.Lease`), so no other worker takes it. Groups that finish together are
pushed together (one push of their experiences, then one acknowledgement of their prompts). A worker that dies or hangs
(stopped) mid-group stops renewing: another worker reclaims the prompt after ``claim_idle_ms`` and
regenerates it (sample ids are deterministic, so the learner drops duplicates). A Redis outage delays
pushing and acknowledging a finished group; the group is not thrown away.

Admission: no new prompt is taken while the experiences backlog is over ``max_experience_backlog`` or
while the learner's published version (``keys.weights_version(run)``) is more than ``max_staleness``
ahead of this engine's ``weight_version``. A group with aborted samples (a weight switch in abort
mode) is regenerated whole, so a group never mixes versions or carries a truncated sample.

A task that can never succeed (:class:`~services.rollout.worker.contract.PermanentTaskError`: a prompt past
the bounds or that does not fit the context, an environment the settings do not allow ...) is dead-lettered at
its first delivery with the reason and its lease acknowledged; it is not redelivered. What else fails a group
(an environment that fails past its retries, the reward service, a rollout function that raises or returns
something else than ``task.n`` trajectories) fails that delivery with the reason: redelivered, then
dead-lettered. The worker itself carries on.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from typing import Protocol, runtime_checkable

import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry, Counter, Gauge

from services.rollout.chat_tokens import ChatTokensCache
from services.rollout.experiences import ExperienceStream, experiences
from services.rollout.reward_client import RewardClient, RewardRejected, RewardUnavailable
from services.rollout.trajectory import Trajectory
from services.rollout.worker.contract import GroupFailed, PermanentTaskError, Replica, RolloutContext
from services.rollout.worker.functions import load_rollout_function
from services.rollout.worker.group import task_sampling
from services.rollout.worker.settings import WorkerRun
from shared import keys
from shared.experience_queue import BackpressureTimeout, Delivery, Lease, StreamQueue
from shared.redis_errors import REDIS_UNAVAILABLE, raise_if_refused
from shared.schemas import Experience, PromptTask
from shared.signing import signer_for

log = logging.getLogger(__name__)


@runtime_checkable
class WorkerReplica(Replica, Protocol):
    """The replica the worker runs on: what its rollout functions use (:class:`Replica`), and the weight version
    its engine serves now (no prompt is taken while the learner's is more than ``max_staleness`` ahead)."""

    @property
    def weight_version(self) -> int: ...


class RolloutWorker:
    def __init__(self, settings: WorkerRun, replica: WorkerReplica, registry: CollectorRegistry) -> None:
        self.settings = settings
        self.cfg = settings.worker
        self.bounds = settings.run  # run-wide: the same at every service of the run
        self.replica = replica
        self.consumer = self.cfg.consumer_name or f"{socket.gethostname()}-{os.getpid()}"
        self.rollout_function = load_rollout_function(self.cfg.rollout_function)  # checked by the settings too
        self._task: asyncio.Task | None = None
        self._groups: dict[str, asyncio.Task] = {}  # prompt entry id -> the task generating its group
        self.lease: Lease | None = None
        self._stopping = asyncio.Event()
        self._draining = asyncio.Event()
        self._active: set[asyncio.Task] = set()
        self._settling: set[str] = set()  # entry ids whose group is generated and being pushed / acknowledged
        self._to_settle: list[tuple[Delivery[PromptTask], list[Experience], asyncio.Future]] = []  # next push
        self._settler: asyncio.Task | None = None  # pushes and acknowledges what _to_settle holds
        self.drained: dict | None = None  # what drain() did, once it did
        self.redis: aioredis.Redis | None = None
        self._chat_tokens: ChatTokensCache | None = None
        r = registry
        self.m_prompts = Counter("fleetrl_rollout_worker_prompts", "Prompt tasks by outcome.", ["outcome"], registry=r)
        self.m_experiences = Counter("fleetrl_rollout_worker_experiences", "Experiences pushed.", registry=r)
        self.m_pushes = Counter("fleetrl_rollout_worker_pushes", "Pushes to the experiences stream (groups that finish "
                                "together share one).", registry=r)
        self.m_reward_retries = Counter("fleetrl_rollout_worker_reward_retries", "Retried /score calls.", registry=r)
        self.m_held = Counter("fleetrl_rollout_worker_held_back", "Admission checks that held back.", ["reason"], registry=r)
        self.m_active = Gauge("fleetrl_rollout_worker_active_groups", "Prompt groups in progress.", registry=r)

    # ---- lifecycle ---------------------------------------------------------------------------------
    async def start(self) -> None:
        if not self.settings.redis_url:
            raise RuntimeError("the rollout worker needs redis_url (--redis-url, FLEETRL_ROLLOUT_REDIS_URL, the "
                               "config file, or $REDIS_URL)")
        reward_url = self.cfg.reward_url
        if not reward_url:  # the worker's settings refuse enabled without it
            raise RuntimeError("the rollout worker needs worker.reward_url (the reward service's base URL)")
        self.redis = aioredis.from_url(self.settings.redis_url, socket_timeout=30, socket_connect_timeout=5)
        run = self.settings.run_name
        signer = signer_for(self.settings.run_key)  # prompts must be the learner's; experiences are signed as ours
        self.prompts = StreamQueue(self.redis, keys.prompts_stream(run), "rollout", PromptTask,
                                   max_deliveries=self.cfg.prompts_max_deliveries, claim_idle_ms=self.bounds.prompt_claim_idle_ms,
                                   signer=signer)
        self.experiences = ExperienceStream(self.redis, run, max_backlog=self.bounds.max_experience_backlog,
                                            signer=signer)
        if signer is None:
            log.warning("run_key is unset (allow_unsigned_records): prompt tasks are taken without checking who wrote "
                        "them and experiences go out unsigned; give every service of the run the same run_key "
                        "(docs/security-redis.md)")
        await self.prompts.ensure_group()
        await self.experiences.queue.ensure_group()
        token = self.cfg.reward_token.get_secret_value() if self.cfg.reward_token else None
        self.rewards = RewardClient(reward_url, self.cfg.reward_timeout_s, self.cfg.reward_backoff_max_s,
                                    on_retry=lambda _: self.m_reward_retries.inc(), token=token,
                                    max_attempts=self.cfg.reward_max_attempts, max_retry_s=self.cfg.reward_max_retry_s,
                                    batch_s=self.cfg.reward_batch_ms / 1000.0)
        self.lease = Lease(self.prompts, self.consumer, on_lost=self._lost)
        self.lease.start()
        self._task = asyncio.create_task(self._run(), name="rollout-worker")
        log.info("rollout worker %s started (run %s, concurrency %d)", self.consumer, run, self.cfg.concurrency)

    async def drain(self, timeout_s: float | None = None) -> dict:
        """Leave the pool without losing or repeating work: take no more prompts, give the groups in progress up
        to ``timeout_s`` (default ``worker.drain_timeout_s``) to finish and be pushed, then stop the others and hand
        their prompts back at once (``StreamQueue.hand_back``: another replica takes them on its next consume, and
        it does not count as a delivery). A group already generated is always pushed and acknowledged, never
        handed back, so nothing is generated twice. Idempotent; returns (and keeps in ``drained``) the counts."""
        if self.drained is not None:
            return self.drained
        timeout_s = self.cfg.drain_timeout_s if timeout_s is None else timeout_s
        self._draining.set()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)  # the loop ends without taking more
        t0 = asyncio.get_running_loop().time()
        held = len(self._active)
        if self._active:
            await asyncio.wait(set(self._active), timeout=timeout_s)
        # groups still generating are stopped; those already settling finish (their push and ack are short)
        unfinished = {eid: t for eid, t in self._groups.items() if not t.done() and eid not in self._settling}
        for t in unfinished.values():
            t.cancel()
        await asyncio.gather(*unfinished.values(), return_exceptions=True)
        if self._active:
            await asyncio.wait(set(self._active), timeout=30.0)
        back: list[str] = []
        if unfinished and self.redis is not None:
            try:
                back = await asyncio.wait_for(self.prompts.hand_back(self.consumer, list(unfinished)), 10.0)
            except Exception as exc:  # noqa: BLE001 - Redis away: the leases lapse after claim_idle_ms instead
                log.warning("draining %s: handing back %d prompt(s) failed (%s: %s); they are reclaimed after "
                            "claim_idle_ms", self.consumer, len(unfinished), type(exc).__name__, exc)
        self.m_prompts.labels("handed_back").inc(len(back))
        self.drained = {"held": held, "finished": held - len(unfinished), "handed_back": len(back),
                        "seconds": round(asyncio.get_running_loop().time() - t0, 3)}
        log.info("rollout worker %s drained: %d group(s) held, %d finished, %d handed back, %.1fs", self.consumer,
                 held, self.drained["finished"], len(back), self.drained["seconds"])
        return self.drained

    def _lease(self) -> Lease:
        if self.lease is None:
            raise RuntimeError("the rollout worker is not started")
        return self.lease

    def _redis(self) -> aioredis.Redis:
        if self.redis is None:
            raise RuntimeError("the rollout worker is not started")
        return self.redis

    @property
    def draining(self) -> bool:
        return self._draining.is_set()

    async def stop(self) -> None:
        if self._task is not None and self.redis is not None:
            await self.drain()  # SIGTERM and a drain alike: nothing held is lost or waits claim_idle_ms
        self._stopping.set()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._settler is not None:  # the groups generated are pushed before the connection closes
            await asyncio.wait([self._settler], timeout=30.0)
        if self.lease is not None:
            await self.lease.stop()
        if self.redis is not None:
            await self.rewards.aclose()
            await self.redis.aclose()

    # ---- loop --------------------------------------------------------------------------------------
    async def _run(self) -> None:
        active = self._active
        try:
            while not self._stopping.is_set() and not self._draining.is_set():
                try:
                    held = await self._held_back()
                    if held is not None:
                        await self._wait_while_held(held)
                        continue
                    room = self.cfg.concurrency - len(active)
                    if room <= 0:
                        await self._wait_first(active)
                        continue
                    for d in await self.prompts.consume(self.consumer, count=room, block_ms=500):
                        if d.id in self._groups:  # ours and still in progress (cannot happen while leased)
                            continue
                        self._lease().hold([d.id])
                        t = asyncio.create_task(self._handle(d))
                        self._groups[d.id] = t
                        active.add(t)
                        t.add_done_callback(active.discard)
                    self.m_active.set(len(active))
                except REDIS_UNAVAILABLE as exc:
                    raise_if_refused(exc)
                    log.warning("redis unavailable (%s); retrying", exc)
                    await asyncio.sleep(1.0)
                    # a prompt delivered while the connection broke is pending on us unseen: hand it out again
                    self.prompts.replay_history(self.consumer)
        finally:
            if not self._draining.is_set():  # stopped without a drain (a start that failed): cancel
                for t in active:
                    t.cancel()
                await asyncio.gather(*active, return_exceptions=True)

    async def _wait_first(self, active: set[asyncio.Task]) -> None:
        """Until a group finishes or the worker is told to drain."""
        drain = asyncio.create_task(self._draining.wait())
        try:
            await asyncio.wait({*active, drain}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            drain.cancel()

    async def _held_back(self) -> str | None:
        """Why no prompt may be taken now ("backlog", "staleness"), or None."""
        backlog = await self.experiences.backlog()
        if backlog >= self.bounds.max_experience_backlog:
            self.m_held.labels("backlog").inc()
            return "backlog"
        raw = await self._redis().get(keys.weights_version(self.settings.run_name))
        latest = int(raw) if raw is not None else 0
        if latest - self.replica.weight_version > self.bounds.max_staleness:
            self.m_held.labels("staleness").inc()
            return "staleness"
        return None

    async def _wait_while_held(self, reason: str) -> None:
        """Up to ``poll_interval_s`` before checking again; held for staleness, the wait ends as soon as this
        replica's engine loads a new version (a local check, every 5 ms), not a poll period later: with
        max_staleness 0 every step waits here for the publish, so a fixed sleep would be on every step's path."""
        if reason != "staleness":
            await asyncio.sleep(self.cfg.poll_interval_s)
            return
        version = self.replica.weight_version
        deadline = asyncio.get_running_loop().time() + self.cfg.poll_interval_s
        while self.replica.weight_version == version and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.005)

    def _lost(self, entry_ids: list[str]) -> None:
        """Another worker holds these prompts now (this one was stopped past claim_idle_ms): stop our copy."""
        for eid in entry_ids:
            task = self._groups.get(eid)
            if task is not None and not task.done():
                log.warning("prompt entry %s was reclaimed by another worker while this one was stopped; "
                            "abandoning this copy of its group", eid)
                self.m_prompts.labels("lease_lost").inc()
                task.cancel()

    async def _handle(self, d: Delivery[PromptTask]) -> None:
        try:
            group = await self._rollout(d.record)
            self._settling.add(d.id)  # generated: pushed and acknowledged even while draining
            await self._settle(d, group)
            self.m_prompts.labels("done").inc()
            self.m_experiences.inc(len(group))
        except asyncio.CancelledError:
            raise  # stays pending (lease released): reclaimed by a worker after claim_idle_ms
        except PermanentTaskError as exc:  # redelivering it cannot help: dead-lettered now, with the reason
            log.warning("prompt %s can never succeed; dead-lettered: %s", d.record.id, exc)
            await self._fail(d, str(exc), permanent=True)
        except (GroupFailed, RewardRejected, RewardUnavailable) as exc:
            log.warning("prompt %s failed (delivery %d): %s", d.record.id, d.deliveries, exc)
            await self._fail(d, str(exc))
        except Exception as exc:  # a bug: never lose the prompt, let it be redelivered
            log.exception("prompt %s: unexpected error", d.record.id)
            await self._fail(d, f"{type(exc).__name__}: {exc}")
        finally:
            self._lease().release([d.id])
            self._groups.pop(d.id, None)
            self._settling.discard(d.id)

    async def _fail(self, d: Delivery[PromptTask], reason: str, permanent: bool = False) -> None:
        dead = await self._until_redis_answers(lambda: self.prompts.fail(d, reason, permanent=permanent),
                                               f"failing {d.record.id}")
        self.m_prompts.labels("dead_letter" if dead else "failed").inc()

    async def _until_redis_answers(self, op, what: str):
        """Run ``op()`` until Redis answers it (a finished group is worth waiting for: Redis restarts are
        routine). Retries with a backoff up to 5 s, logging each failure; only stopping the worker ends it."""
        delay = 0.2
        while True:
            try:
                return await op()
            except REDIS_UNAVAILABLE as exc:
                raise_if_refused(exc)
                log.warning("%s: redis unavailable (%s: %s); retrying in %.1fs", what, type(exc).__name__, exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    # ---- one group ---------------------------------------------------------------------------------
    async def _rollout(self, task: PromptTask) -> list[Experience]:
        if self._chat_tokens is None:  # the tokenizer is there once the engine started
            self._chat_tokens = ChatTokensCache(self.replica.tokenizer)
        ctx = RolloutContext(task, task_sampling(self.cfg.sampling, task), self.cfg, self.replica, self.rewards,
                             self._chat_tokens)
        trajectories = await self.rollout_function(ctx)
        name = self.cfg.rollout_function
        if not isinstance(trajectories, list) or len(trajectories) != task.n:
            got = f"{len(trajectories)} trajectories" if isinstance(trajectories, list) else type(trajectories).__name__
            raise GroupFailed(f"rollout function {name!r} returned {got} for a group of {task.n}")
        bad = next((t for t in trajectories if not isinstance(t, Trajectory)), None)
        if bad is not None:
            raise GroupFailed(f"rollout function {name!r} returned a {type(bad).__name__}, not a Trajectory")
        try:
            return experiences(task, trajectories)
        except ValueError as exc:  # a trajectory the queue's record refuses (misaligned fields ...)
            raise GroupFailed(f"rollout function {name!r} returned a trajectory that is not a valid experience: "
                              f"{exc}") from exc

    async def _settle(self, d: Delivery[PromptTask], group: list[Experience]) -> None:
        """Push the group and acknowledge its prompt. Groups that finish together (one engine batch, one /score
        request) go together: one push of all their experiences, then one acknowledgement of all their prompts
        (two round trips for the lot instead of three per group). Returns once this group is pushed and acked."""
        done = asyncio.get_running_loop().create_future()
        self._to_settle.append((d, group, done))
        if self._settler is None or self._settler.done():
            self._settler = asyncio.create_task(self._settle_waiting())
        await asyncio.shield(done)  # a cancelled handler's group is still pushed and acknowledged

    async def _settle_waiting(self) -> None:
        await asyncio.sleep(0)  # the groups whose last await ended in the same turn join this push
        while self._to_settle:
            batch, self._to_settle = self._to_settle, []
            exps = [e for _, group, _ in batch for e in group]
            ids = [d.id for d, _, _ in batch]
            what = f"the group of {batch[0][0].record.id}" if len(batch) == 1 else f"{len(batch)} groups"
            try:
                await self._until_redis_answers(lambda exps=exps: self._push(exps), f"pushing {what}")
                self.m_pushes.inc()
                await self._until_redis_answers(lambda ids=ids: self.prompts.ack(ids), f"acknowledging the prompt(s) of {what}")
            except BaseException as exc:
                for _, _, done in batch:
                    if not done.done():
                        done.cancel() if isinstance(exc, asyncio.CancelledError) else done.set_exception(exc)
                if isinstance(exc, asyncio.CancelledError):
                    raise
                continue
            for _, _, done in batch:
                if not done.done():
                    done.set_result(None)

    async def _push(self, group: list[Experience]) -> None:
        while True:
            try:
                await self.experiences.push(group, timeout=30.0)
                return
            except BackpressureTimeout:
                self.m_held.labels("backlog").inc()
                log.info("experiences backlog full; still waiting to push %d experiences", len(group))
