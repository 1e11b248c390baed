"""What the run owner watches on Redis besides its own streams, so that it never waits on work that is gone.

- :class:`DeadLetterWatch` follows the dead-letter streams of the run's prompts and experiences. A prompt
  task that was dead-lettered (it failed ``max_deliveries`` times on the rollout fleet) or an experience
  that was (undecodable, or delivered too often) means that group will never complete: the owner hears
  of it at once, with the reason, instead of after ``rollout.prompt_timeout_s``.
- :func:`prompts_lost_by_redis` tells, after Redis came back from an outage, which prompt entries the
  server no longer has because they were never persisted (with ``appendfsync everysec`` a crash loses up
  to the last second of writes). Stream ids only grow, so an entry id above the stream's last generated id
  was lost, while a missing entry at or below it was acknowledged (deleted) after its group was pushed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import cast

from redis.exceptions import ResponseError

from shared import keys
from shared.codec import CodecError, decode
from shared.schemas import Experience, PromptTask
from shared.signing import RecordSigner, dead_letter_bytes

log = logging.getLogger(__name__)

# Errors that mean "Redis cannot answer right now" (down, restarting, loading its AOF): wait and retry.


@dataclass(frozen=True)
class DeadLetter:
    """One dead-lettered entry of the run: which prompt task (group) it belonged to, and why."""

    stream: str  # "prompts" or "experiences"
    entry: str  # dead-letter stream entry id
    group_id: str | None  # PromptTask id (= group id); None when the payload could not be decoded
    reason: str


class DeadLetterWatch:
    """Reads the run's two dead-letter streams from a cursor (saved in checkpoints, so a restart re-reads
    what came after its checkpoint; acting on an entry twice is harmless to the owner)."""

    def __init__(self, redis, run: str, cursors: dict[str, str] | None = None, batch: int = 256,
                 signer: RecordSigner | None = None) -> None:
        self.redis = redis
        self.signer = signer  # with a run key: only dead letters the fleet signed name a prompt
        self.streams = {
            "prompts": keys.dead_letter_stream(keys.prompts_stream(run)),
            "experiences": keys.dead_letter_stream(keys.experiences_stream(run)),
        }
        self.cursors = {name: (cursors or {}).get(name, "0-0") for name in self.streams}
        self.batch = batch

    async def poll(self) -> list[DeadLetter]:
        """Dead letters added since the last poll (without blocking)."""
        resp = await self.redis.xread({self.streams[n]: self.cursors[n] for n in self.streams}, count=self.batch)
        out: list[DeadLetter] = []
        by_key = {v: k for k, v in self.streams.items()}
        for stream, entries in resp or []:
            name = by_key[stream.decode() if isinstance(stream, bytes) else stream]
            for eid, fields in entries:
                eid = eid.decode() if isinstance(eid, bytes) else eid
                self.cursors[name] = eid
                out.append(_parse(name, eid, fields, self.streams[name], self.signer))
        return out


def _parse(name: str, eid: str, fields: dict, stream: str = "", signer: RecordSigner | None = None) -> DeadLetter:
    f = {(k.decode() if isinstance(k, bytes) else k): v for k, v in fields.items()}
    reason = f.get("error", b"")
    reason = reason.decode(errors="replace") if isinstance(reason, bytes) else str(reason)
    group_id = None
    payload = f.get("payload") or b""
    if reason.startswith("signature:"):  # a record the fleet did not write: it names no prompt of ours
        return DeadLetter(stream=name, entry=eid, group_id=None, reason=reason)
    if signer is not None:
        original = f.get("original_id", b"")
        original = original.decode(errors="replace") if isinstance(original, bytes) else str(original)
        problem = signer.problem(stream, dead_letter_bytes(payload, reason, original), f.get("s"))
        if problem is not None:
            return DeadLetter(stream=name, entry=eid, group_id=None, reason=f"untrusted dead letter ({problem}): {reason}")
    if payload:
        try:
            record = decode(payload, expect=PromptTask if name == "prompts" else Experience)
            group_id = record.id if isinstance(record, PromptTask) else cast(Experience, record).group_id
        except CodecError:
            group_id = None
    return DeadLetter(stream=name, entry=eid, group_id=group_id, reason=reason)


async def last_generated_id(redis, stream: str) -> str:
    """The stream's last generated entry id ("0-0" if the stream does not exist)."""
    try:
        info = await redis.xinfo_stream(stream)
    except ResponseError as exc:
        if "no such key" in str(exc).lower():
            return "0-0"
        raise
    last = info.get("last-generated-id") or info.get(b"last-generated-id") or "0-0"
    return last.decode() if isinstance(last, bytes) else str(last)


def _id_tuple(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


async def prompts_lost_by_redis(redis, stream: str, entries: dict[str, str]) -> list[str]:
    """Of ``entries`` (item key -> prompt stream entry id), the keys whose entry Redis never persisted."""
    if not entries:
        return []
    last = _id_tuple(await last_generated_id(redis, stream))
    return [key for key, eid in entries.items() if eid and _id_tuple(eid) > last]
