"""A consumer process for the crash-recovery test: processes entries slowly and idempotently.

Processing an entry = in one MULTI: HINCRBY results <task id> 1 and mark the id processed; then ack.
Run: python -m tests.shared.queue_consumer REDIS_URL CONSUMER_NAME DELAY_S
"""

import asyncio
import sys

import redis.asyncio as aioredis

from shared.experience_queue import ProcessedIds, StreamQueue
from shared.schemas import PromptTask

STREAM, GROUP, RESULTS, SEEN = "crash:s", "crash:g", "crash:results", "crash:seen"


async def handle_batch(q: StreamQueue, seen: ProcessedIds, deliveries, delay: float) -> None:
    for d in deliveries:
        if await seen.filter_new([d.record.id]):
            await asyncio.sleep(delay)  # "work"
            pipe = q.redis.pipeline(transaction=True)
            pipe.hincrby(RESULTS, d.record.id, 1)
            await seen.mark([d.record.id], pipe=pipe)
            await pipe.execute()
        await q.ack([d.id])


async def main(url: str, name: str, delay: float) -> None:
    client = aioredis.from_url(url, socket_timeout=10)
    q = StreamQueue(client, STREAM, GROUP, PromptTask, claim_idle_ms=300)
    seen = ProcessedIds(client, SEEN)
    while True:
        batch = await q.consume(name, count=10, block_ms=200)
        await handle_batch(q, seen, batch, delay)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3])))
