"""The experience queue: typed records on Redis Streams with consumer groups, at-least-once.

One ``StreamQueue`` wraps one stream and one consumer group (FleetRL uses one group per stream:
rollout workers on the prompts stream, the learner on the experiences stream).

Guarantees
- **At-least-once.** ``consume`` hands out entries; they stay pending until ``ack``. Call ``ack``
  only once the result is durable. A consumer that restarts first pages through its own pending
  entries, each once (``XPENDING`` + ``XRANGE``): replaying its own history is not a new delivery and
  does not raise an entry's delivery count, however many entries it holds.
- **Leases.** A live consumer keeps the entries it is still working on with a :class:`Lease`, which
  renews them (``XCLAIM … JUSTID``: idle time reset, delivery count unchanged) every third of
  ``claim_idle_ms``. So only a dead or hung (stopped) consumer's entries go idle.
- **Crash recovery.** Entries pending on any consumer for longer than ``claim_idle_ms`` are
  reclaimed with XAUTOCLAIM by whichever consumer asks next (so a dead consumer's work moves on).
- **Dead letters.** An entry that cannot be decoded, or that has been delivered more than
  ``max_deliveries`` times (first delivery plus reclaims from dead consumers), or that a consumer
  ``fail``-ed that often, moves to ``<stream>:dead`` with the error text and original id; the consumer
  goes on. A failure the consumer knows to be permanent (``fail(..., permanent=True)``: the record can never
  succeed) moves it there at once, reason ``permanent: ...``.
- **Signed records.** With a :class:`~shared.signing.RecordSigner` (the run key), ``produce`` signs each
  payload and ``consume`` verifies it before decoding: an entry without a valid signature is dead-lettered
  (``signature: ...``) and counted (``rejected_signature``), never handed out.
- **Bounded dead letters.** A dead-letter stream keeps about its newest ``dead_letter_maxlen`` entries
  (approximate MAXLEN trim at each write): it is a record for operators, not work anyone waits for.
- **No trimming of pending work.** Nothing is ever trimmed by length. An entry is deleted (XDEL)
  only when it is acknowledged (or dead-lettered), so the stream length is exactly
  pending (delivered, not yet acknowledged) + backlog (not yet delivered to any consumer).
- **Backpressure.** ``produce`` waits while the backlog — entries no consumer has taken yet — is
  at ``max_backlog`` (bounded by its timeout; the wait is visible in ``stats`` and metrics)
  instead of dropping anything. Entries a consumer holds unacknowledged do not count: a consumer
  that acknowledges late on purpose (the learner acks at checkpoints) must not stall its own
  producers, which would deadlock the loop. The consumer bounds what it holds.

Idempotency: redelivery means a handler can see a record twice. :class:`ProcessedIds` records
the ids whose results are durable; mark them in the same MULTI as the result when you can.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar, cast

import redis.asyncio as aioredis
from pydantic import BaseModel
from redis.commands.core import AsyncScript
from redis.exceptions import ResponseError
from redis.typing import EncodableT, FieldT

from shared import keys
from shared.codec import CodecError, decode, encode
from shared.signing import SIGNATURE_FIELD, RecordSigner, dead_letter_bytes

log = logging.getLogger(__name__)

R = TypeVar("R", bound=BaseModel)
T = TypeVar("T")
PAYLOAD = b"p"
PERMANENT = "permanent: "
"""How the reason of a dead letter failed as permanent starts (``StreamQueue.fail(..., permanent=True)``): the record
can never succeed, so whoever acts on dead letters need not issue it again."""


_RENEW_CHUNK = 512
# KEYS[1] stream; ARGV: group, consumer, ids... -> the ids not (or no longer) pending on this consumer.
# XCLAIM with JUSTID resets the idle time without raising the delivery count; the owner check keeps a
# consumer that was stopped for a while from taking back what another consumer reclaimed meanwhile.
_RENEW_LUA = """
local lost = {}
for i = 3, #ARGV do
  local row = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)
  if #row == 0 or row[1][2] ~= ARGV[2] then
    lost[#lost + 1] = ARGV[i]
  else
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'JUSTID')
  end
end
return lost
"""

# KEYS[1] stream; ARGV: group, consumer, idle ms, ids... -> the ids handed back. For each entry still pending on
# this consumer: XCLAIM to itself with IDLE (it reads as idle past claim_idle_ms, so the next XAUTOCLAIM of any
# consumer takes it) and RETRYCOUNT one less (that XAUTOCLAIM adds the one back: a hand-back is not a delivery).
_HAND_BACK_LUA = """
local back = {}
for i = 4, #ARGV do
  local row = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)
  if #row > 0 and row[1][2] == ARGV[2] then
    local n = math.max(tonumber(row[1][4]) - 1, 0)
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'IDLE', ARGV[3], 'RETRYCOUNT', n, 'JUSTID')
    back[#back + 1] = ARGV[i]
  end
end
return back
"""


class BackpressureTimeout(TimeoutError):
    """``produce`` waited longer than its timeout for the backlog to drain."""


@dataclass(frozen=True)
class Delivery(Generic[R]):
    """One entry handed to a consumer."""

    id: str
    record: R
    deliveries: int


@dataclass
class QueueStats:
    stream: str
    length: int
    backlog: int
    pending: int
    pending_per_consumer: dict[str, int]
    dead_letters: int
    oldest_pending_age_s: float | None
    produce_wait_s_total: float
    produced: int
    acked: int
    dead_lettered: int
    rejected_signature: int = 0

    def as_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class _Counters:
    produced: int = 0
    acked: int = 0
    dead_lettered: int = 0
    rejected_signature: int = 0
    produce_wait_s: float = 0.0


def _s(x: bytes | str | int | None) -> str:
    """A Redis reply field as text (bytes decoded; an int or None as its text)."""
    return x.decode() if isinstance(x, bytes) else x if isinstance(x, str) else str(x)


def _entry_age_s(entry_id: str) -> float:
    return max(0.0, time.time() - int(entry_id.split("-", 1)[0]) / 1000.0)


class StreamQueue(Generic[R]):
    """A typed, at-least-once queue on one Redis stream and one consumer group."""

    def __init__(
        self,
        redis: aioredis.Redis,
        stream: str,
        group: str,
        record: type[R],
        *,
        max_backlog: int = 1024,
        max_deliveries: int = 5,
        claim_idle_ms: int = 30_000,
        backpressure_poll_s: float = 0.05,
        signer: RecordSigner | None = None,
        dead_letter_maxlen: int = 10_000,
    ) -> None:
        if max_backlog < 1 or max_deliveries < 1 or claim_idle_ms < 1 or dead_letter_maxlen < 1:
            raise ValueError("max_backlog, max_deliveries, claim_idle_ms and dead_letter_maxlen must be positive")
        self.redis = redis
        self.stream = stream
        self.group = group
        self.record = record
        self.max_backlog = max_backlog
        self.max_deliveries = max_deliveries
        self.claim_idle_ms = claim_idle_ms
        self.backpressure_poll_s = backpressure_poll_s
        self.dead_stream = keys.dead_letter_stream(stream)
        self.signer = signer
        self.dead_letter_maxlen = dead_letter_maxlen
        self._counters = _Counters()
        self._history_done: set[str] = set()  # consumers that have re-read their own pending entries
        self._history_cursor: dict[str, str] = {}  # consumer -> last own pending entry id handed out again
        self._group_ready = False
        self._next_claim_at = 0.0  # monotonic time of the next XAUTOCLAIM scan
        self._renew_script: AsyncScript | None = None
        self._hand_back_script: AsyncScript | None = None

    # ---- set-up -------------------------------------------------------------------------------
    async def ensure_group(self, force: bool = False) -> None:
        """Create the stream and its consumer group if missing (idempotent; one round trip per queue object)."""
        if self._group_ready and not force:
            return
        try:
            await self.redis.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._group_ready = True

    async def _with_group(self, call: Callable[[], Awaitable[T]]) -> T:
        """``call()``, once more after recreating the group if Redis says it is gone (NOGROUP: Redis lost its data,
        a restart without persistence or a FLUSHALL, while this object thought the group existed)."""
        await self.ensure_group()
        try:
            return await call()
        except ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            await self.ensure_group(force=True)
            return await call()

    # ---- producing ------------------------------------------------------------------------------
    async def backlog(self) -> int:
        """Entries no consumer has taken yet (stream length minus entries pending on consumers)."""
        async def read():
            pipe = self.redis.pipeline(transaction=True)
            pipe.xlen(self.stream)
            pipe.xpending(self.stream, self.group)
            return await pipe.execute()

        length, pending = await self._with_group(read)
        return max(0, int(length) - int(pending.get("pending", 0)))

    async def produce(self, records: list[R] | R, timeout: float | None = 60.0) -> list[str]:
        """Append records, waiting while the backlog is at ``max_backlog``. Returns entry ids.

        A batch larger than the limit is admitted when the backlog is empty, so it cannot wait forever.
        Raises BackpressureTimeout if the backlog does not drain within ``timeout`` seconds.
        """
        batch = records if isinstance(records, list) else [records]
        if not batch:
            return []
        payloads = [encode(r) for r in batch]
        await self._wait_for_room(len(payloads), timeout)
        pipe = self.redis.pipeline(transaction=False)
        for p in payloads:
            fields: dict[FieldT, EncodableT] = {PAYLOAD: p}
            if self.signer is not None:
                fields[SIGNATURE_FIELD] = self.signer.sign(self.stream, p)
            pipe.xadd(self.stream, fields)
        ids = [_s(i) for i in await pipe.execute()]
        self._counters.produced += len(ids)
        return ids

    async def _wait_for_room(self, n: int, timeout: float | None) -> None:
        start = time.monotonic()
        delay = self.backpressure_poll_s
        while True:
            backlog = await self.backlog()
            if backlog == 0 or backlog + n <= self.max_backlog:
                break
            waited = time.monotonic() - start
            if timeout is not None and waited >= timeout:
                self._counters.produce_wait_s += waited
                raise BackpressureTimeout(
                    f"{self.stream}: backlog {backlog} stayed above max_backlog={self.max_backlog} for {waited:.1f}s"
                )
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, 0.5)
        self._counters.produce_wait_s += time.monotonic() - start

    # ---- consuming ------------------------------------------------------------------------------
    async def consume(self, consumer: str, count: int = 16, block_ms: int = 1000) -> list[Delivery[R]]:
        """Up to ``count`` deliveries: own pending entries first (after a restart: each once, in id order,
        page by page), then entries reclaimed from consumers idle past ``claim_idle_ms``, then new ones
        (blocking up to ``block_ms``)."""
        await self.ensure_group()
        raw: list[tuple[str, dict | None]] = []
        counts: dict[str, int] | None = None
        if consumer not in self._history_done:
            raw, counts = await self._history_page(consumer, count)
            if not raw:
                self._history_done.add(consumer)
                self._history_cursor.pop(consumer, None)
        if not raw and time.monotonic() >= self._next_claim_at:
            # An entry becomes claimable only after claim_idle_ms of idleness, so scanning for such entries
            # more often than every claim_idle_ms/2 (at most once a second) only costs round trips.
            raw = await self._autoclaim(consumer, count)
            counts = None
            if len(raw) < count:  # nothing more to reclaim right now
                self._next_claim_at = time.monotonic() + min(1.0, self.claim_idle_ms / 2000.0)
        if not raw:
            raw = await self._read(consumer, ">", count, block_ms)
            counts = {eid: 1 for eid, _ in raw}  # entries read with ">" are delivered for the first time
        if not raw:
            return []
        if counts is None:  # reclaimed: the claim raised each count; look them up
            counts = await self._delivery_counts([eid for eid, _ in raw])
        out: list[Delivery[R]] = []
        for eid, fields in raw:
            n = counts.get(eid, 1)
            if fields is None:  # deleted while pending (Redis 7 reports these); nothing to deliver
                await self._ack_delete([eid])
                continue
            payload = fields.get(PAYLOAD) if PAYLOAD in fields else fields.get(PAYLOAD.decode())
            if n > self.max_deliveries:
                await self._dead_letter(eid, payload, f"delivered {n} times (max_deliveries={self.max_deliveries})", n)
                continue
            if self.signer is not None:
                sig = fields.get(SIGNATURE_FIELD) if SIGNATURE_FIELD in fields else fields.get(SIGNATURE_FIELD.decode())
                problem = self.signer.problem(self.stream, payload, sig)
                if problem is not None:
                    log.warning("%s: entry %s fails verification and is dead-lettered: %s", self.stream, eid, problem)
                    self._counters.rejected_signature += 1
                    await self._dead_letter(eid, payload, f"signature: {problem}", n)
                    continue
            try:
                if payload is None:
                    raise CodecError(f"entry has no {PAYLOAD.decode()!r} field")
                record = decode(payload, expect=self.record)
            except CodecError as exc:
                await self._dead_letter(eid, payload, f"undecodable: {exc}", n)
                continue
            out.append(Delivery(id=eid, record=record, deliveries=n))
        return out

    def replay_history(self, consumer: str) -> None:
        """Hand out ``consumer``'s own pending entries again, from the first (e.g. after a connection to Redis
        broke: an entry delivered while the reply was lost is pending on it but was never seen)."""
        self._history_done.discard(consumer)
        self._history_cursor.pop(consumer, None)

    async def _history_page(self, consumer: str, count: int) -> tuple[list[tuple[str, dict | None]], dict[str, int]]:
        """The next ``count`` of this consumer's own pending entries after the cursor, with their delivery counts.

        Read with XPENDING + XRANGE, which leave delivery counts alone (XREADGROUP on the history would raise
        them, so a restarted consumer would dead-letter its own valid entries); the page's leases are renewed
        (idle time reset) so that no one reclaims what is being handed out again."""
        cursor = self._history_cursor.get(consumer)
        try:
            rows = await self.redis.xpending_range(self.stream, self.group, min=f"({cursor}" if cursor else "-",
                                                   max="+", count=count, consumername=consumer)
        except ResponseError as exc:  # the stream or group was deleted under us: no history left
            if "NOGROUP" not in str(exc):
                raise
            await self.ensure_group(force=True)
            return [], {}
        if not rows:
            return [], {}
        ids = [_s(r["message_id"]) for r in rows]
        counts = {_s(r["message_id"]): int(r["times_delivered"]) for r in rows}
        self._history_cursor[consumer] = ids[-1]
        lost = set(await self.renew(consumer, ids))
        pipe = self.redis.pipeline(transaction=False)
        kept = [eid for eid in ids if eid not in lost]
        for eid in kept:
            pipe.xrange(self.stream, min=eid, max=eid, count=1)
        entries: list[tuple[str, dict | None]] = []
        for eid, found in zip(kept, await pipe.execute()):
            entries.append((eid, found[0][1] if found and found[0][1] else None))
        if not entries and len(rows) == count:  # a whole page taken by others meanwhile: look further
            return await self._history_page(consumer, count)
        return entries, counts

    async def _read(self, consumer: str, start: str, count: int, block_ms: int | None):
        try:
            resp = await self.redis.xreadgroup(self.group, consumer, {self.stream: start}, count=count, block=block_ms)
        except ResponseError as exc:  # the stream or group was deleted under us: recreate, read again
            if "NOGROUP" not in str(exc):
                raise
            await self.ensure_group(force=True)
            resp = await self.redis.xreadgroup(self.group, consumer, {self.stream: start}, count=count, block=block_ms)
        entries: list[tuple[str, dict | None]] = []
        for _stream, items in cast("list[tuple[bytes, list[tuple[bytes, dict | None]]]]", resp or []):
            for eid, fields in items:
                entries.append((_s(eid), fields if fields else None))
        return entries

    async def _autoclaim(self, consumer: str, count: int):
        resp = await self._with_group(lambda: self.redis.xautoclaim(self.stream, self.group, consumer,
                                                                    self.claim_idle_ms, "0-0", count=count))
        claimed = resp[1] if resp else []
        deleted = resp[2] if len(resp) > 2 else []
        if deleted:  # entries deleted while pending: drop them from the PEL
            await self.redis.xack(self.stream, self.group, *deleted)
        return [(_s(eid), fields if fields else None) for eid, fields in claimed if eid is not None]

    async def _delivery_counts(self, ids: list[str]) -> dict[str, int]:
        pipe = self.redis.pipeline(transaction=False)
        for eid in ids:
            pipe.xpending_range(self.stream, self.group, min=eid, max=eid, count=1)
        counts: dict[str, int] = {}
        for eid, rows in zip(ids, await pipe.execute()):
            if rows:
                counts[eid] = int(rows[0]["times_delivered"])
        return counts

    # ---- leases -------------------------------------------------------------------------------------
    async def renew(self, consumer: str, ids: list[str]) -> list[str]:
        """Renew the lease of ``consumer`` on ``ids`` (reset their idle time; delivery counts unchanged).
        Returns the ids it no longer holds (acknowledged meanwhile, or reclaimed by another consumer)."""
        lost: list[str] = []
        for i in range(0, len(ids), _RENEW_CHUNK):
            chunk = ids[i:i + _RENEW_CHUNK]
            if self._renew_script is None:
                self._renew_script = self.redis.register_script(_RENEW_LUA)
            raw = await self._renew_script(keys=[self.stream], args=[self.group, consumer, *chunk])
            lost += [_s(x) for x in raw]
        return lost

    async def hand_back(self, consumer: str, ids: list[str]) -> list[str]:
        """Give up ``consumer``'s lease on ``ids`` at once (a replica leaving the pool): each entry still pending on
        it is made claimable now, not after ``claim_idle_ms``, by the next XAUTOCLAIM of any consumer (which
        ``consume`` runs at least once a second), and handing back does not count as a delivery, so a prompt
        handed back is never dead-lettered for it. Returns the ids handed back (the others were settled or
        reclaimed meanwhile)."""
        if not ids:
            return []
        if self._hand_back_script is None:
            self._hand_back_script = self.redis.register_script(_HAND_BACK_LUA)
        idle_ms = self.claim_idle_ms + 3_600_000  # past any claim_idle_ms a consumer of this group uses
        back: list[str] = []
        for i in range(0, len(ids), _RENEW_CHUNK):
            chunk = ids[i:i + _RENEW_CHUNK]
            raw = await self._hand_back_script(keys=[self.stream], args=[self.group, consumer, idle_ms, *chunk])
            back += [_s(x) for x in raw]
        return back

    # ---- settling -------------------------------------------------------------------------------
    async def ack(self, ids: list[str]) -> int:
        """Acknowledge (and delete) entries whose results are durable. Returns how many were pending."""
        if not ids:
            return 0
        n = await self._ack_delete(ids)
        self._counters.acked += n
        return n

    async def _ack_delete(self, ids: list[str]) -> int:
        pipe = self.redis.pipeline(transaction=True)
        pipe.xack(self.stream, self.group, *ids)
        pipe.xdel(self.stream, *ids)
        acked, _ = await pipe.execute()
        return int(acked)

    async def fail(self, delivery: Delivery[R], error: str, *, permanent: bool = False) -> bool:
        """Report that processing failed. A ``permanent`` failure (the record can never succeed, on any consumer)
        dead-letters the entry now, whatever its delivery count, with the reason ``permanent: <error>``. Any other
        dead-letters it once it has been delivered ``max_deliveries`` times (``failed N times: <error>``). Returns
        True when dead-lettered; otherwise the entry stays pending, is redelivered (to any consumer) after
        ``claim_idle_ms``, and this returns False."""
        if permanent:
            await self._dead_letter(delivery.id, encode(delivery.record), f"{PERMANENT}{error}", delivery.deliveries)
            return True
        if delivery.deliveries >= self.max_deliveries:
            await self._dead_letter(delivery.id, encode(delivery.record), f"failed {delivery.deliveries} times: {error}",
                                    delivery.deliveries)
            return True
        return False

    async def _dead_letter(self, eid: str, payload: bytes | None, reason: str, deliveries: int | None = None) -> None:
        fields: dict[FieldT, EncodableT] = {
            "payload": payload if payload is not None else b"",
            "error": reason, "original_id": eid, "stream": self.stream, "group": self.group,
            "at": str(time.time()),
        }
        if deliveries is not None:  # how often it was handed out before it went here
            fields["deliveries"] = str(deliveries)
        if self.signer is not None:  # whoever acts on dead letters can tell ours from ones written by others
            fields["s"] = self.signer.sign(self.dead_stream, dead_letter_bytes(payload, reason, eid))
        pipe = self.redis.pipeline(transaction=True)
        pipe.xadd(self.dead_stream, fields, maxlen=self.dead_letter_maxlen, approximate=True)
        pipe.xack(self.stream, self.group, eid)
        pipe.xdel(self.stream, eid)
        await pipe.execute()
        self._counters.dead_lettered += 1

    async def dead_letters(self, count: int = 100) -> list[dict[str, str]]:
        """The newest dead-letter entries (payload omitted), newest first."""
        rows = await self.redis.xrevrange(self.dead_stream, count=count)
        out = []
        for eid, fields in cast("list[tuple[bytes, dict[bytes, bytes]]]", rows):
            f = {_s(k): v for k, v in fields.items()}
            out.append({"id": _s(eid), "error": _s(f.get("error", b"")), "original_id": _s(f.get("original_id", b""))})
        return out

    # ---- observing ------------------------------------------------------------------------------
    @property
    def rejected_signature(self) -> int:
        """Entries this queue object dead-lettered for a missing or bad run-key signature."""
        return self._counters.rejected_signature

    async def stats(self) -> QueueStats:
        async def read():
            pipe = self.redis.pipeline(transaction=True)
            pipe.xlen(self.stream)
            pipe.xpending(self.stream, self.group)
            pipe.xlen(self.dead_stream)
            return await pipe.execute()

        length, pending, dead = await self._with_group(read)
        per_consumer = {_s(c["name"]): int(c["pending"]) for c in (pending.get("consumers") or [])}
        oldest = pending.get("min")
        return QueueStats(
            stream=self.stream,
            length=int(length),
            backlog=max(0, int(length) - int(pending.get("pending", 0))),
            pending=int(pending.get("pending", 0)),
            pending_per_consumer=per_consumer,
            dead_letters=int(dead),
            oldest_pending_age_s=_entry_age_s(_s(oldest)) if oldest else None,
            produce_wait_s_total=self._counters.produce_wait_s,
            produced=self._counters.produced,
            acked=self._counters.acked,
            dead_lettered=self._counters.dead_lettered,
            rejected_signature=self._counters.rejected_signature,
        )


class Lease:
    """Keeps the entries a live consumer is still working on from being reclaimed by others.

    ``hold(ids)`` when work on entries starts, ``release(ids)`` once they are acknowledged or failed (a
    failed entry must go idle to be redelivered). Between ``start()`` and ``stop()`` every held entry is
    renewed every ``interval_s`` (default: a third of the queue's ``claim_idle_ms``), so only a consumer
    that died or hung (stopped) lets its entries go idle. Entries it turns out to have lost (reclaimed by
    another consumer while this one was stopped, or settled elsewhere) are released and handed to
    ``on_lost``. A renewal that fails (Redis down) is logged and tried again at the next interval."""

    def __init__(self, queue: StreamQueue, consumer: str, *, interval_s: float | None = None,
                 on_lost: Callable[[list[str]], None] | None = None) -> None:
        self.queue, self.consumer = queue, consumer
        self.interval_s = interval_s if interval_s is not None else max(0.02, queue.claim_idle_ms / 3000.0)
        self.on_lost = on_lost
        self.held: set[str] = set()
        self.renewals = 0
        self._task: asyncio.Task | None = None

    def hold(self, ids: Iterable[str]) -> None:
        self.held.update(ids)

    def release(self, ids: Iterable[str]) -> None:
        self.held.difference_update(ids)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"lease-{self.queue.stream}-{self.consumer}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def renew_now(self) -> list[str]:
        """Renew every held entry once; returns (and releases) the ones lost."""
        ids = list(self.held)
        if not ids:
            return []
        lost = [i for i in await self.queue.renew(self.consumer, ids) if i in self.held]
        self.renewals += 1
        if lost:
            self.release(lost)
            if self.on_lost is not None:
                self.on_lost(lost)
        return lost

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.renew_now()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - Redis down: the next interval tries again
                log.warning("%s: could not renew %d leases of %s (%s: %s); retrying in %.1fs", self.queue.stream,
                            len(self.held), self.consumer, type(exc).__name__, exc, self.interval_s)


class ProcessedIds:
    """The set of record ids whose results are durable, for idempotent consumers — bounded.

    Bounds (both settings of the learner's ``queue``): the whole set expires ``ttl_s`` after the last mark (a run
    left alone for that long takes its record with it), and it holds at most ``max_ids`` ids (past that, the
    excess is evicted at the next mark). Why that is safe for the learner: this set is the *second* line of its
    dedupe. A sample id can only come back while its dataset position is still in the learner's in-flight record
    (``RunState.in_flight``): a trained position leaves that record in the same step, and an experience of a
    position not in flight is dropped whatever this set says. So an id needs to be here only for as long as its
    position could still be in flight after a resume, which a checkpoint bounds; ``max_ids`` is set well above
    ``rollout.window x rollout.group_size x`` the re-issues a position can see. What the set must keep telling is
    that a run name was used (``run_guard``): evicting never empties it.
    """

    def __init__(self, redis: aioredis.Redis, key: str, *, max_ids: int = 1_000_000,
                 ttl_s: float | None = 30 * 86400) -> None:
        if max_ids < 1:
            raise ValueError("max_ids must be positive")
        self.redis = redis
        self.key = key
        self.max_ids = max_ids
        self.ttl_s = ttl_s
        self.evicted = 0

    async def filter_new(self, ids: list[str]) -> list[str]:
        """The ids (in order) not yet marked processed."""
        if not ids:
            return []
        flags = await self.redis.smismember(self.key, ids)
        return [i for i, seen in zip(ids, flags) if not seen]

    async def mark(self, ids: list[str], pipe=None) -> None:
        """Mark ids processed; pass a pipeline to make it atomic with the result's write."""
        if not ids:
            return
        own = pipe is None
        if own:
            pipe = self.redis.pipeline(transaction=True)
        pipe.sadd(self.key, *ids)
        if self.ttl_s is not None:
            pipe.expire(self.key, max(1, int(self.ttl_s)))
        if own:
            await pipe.execute()
        await self._trim()

    async def _trim(self) -> None:
        size = int(await self.redis.scard(self.key))
        if size > self.max_ids:
            await self.redis.spop(self.key, size - self.max_ids)
            self.evicted += size - self.max_ids
            log.info("%s: evicted %d processed ids past max_ids=%d", self.key, size - self.max_ids, self.max_ids)

    async def count(self) -> int:
        return int(await self.redis.scard(self.key))
