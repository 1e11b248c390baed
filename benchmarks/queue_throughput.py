"""Experiences/s through FleetRL's queue vs raw redis-py on the same bytes, in one run.

FleetRL path: encode Experience -> StreamQueue.produce -> consume (decode, typed) -> ack (XACK+XDEL).
Signed path:  the FleetRL path with the run key: HMAC-SHA256 of each payload at produce, checked at consume.
Raw path:     the same encoded bytes -> XADD (pipelined) -> XREADGROUP -> XACK (pipelined).
Samples have 1,024 response tokens with logprobs. Target: FleetRL >= 0.5 of raw.

    .venv/bin/python benchmarks/queue_throughput.py [--n 4000] [--batch 64] [--repeats 5] [--redis-url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time

import redis.asyncio as aioredis

from shared.codec import decode, decode_validated, encode
from shared.experience_queue import StreamQueue
from shared.redis_server import EmbeddedRedis
from shared.schemas import Experience, sample_id
from shared.signing import RecordSigner


def make_samples(n: int, tokens: int) -> list[Experience]:
    rng = random.Random(0)
    prompt = [rng.randrange(260) for _ in range(128)]
    out = []
    for i in range(n):
        out.append(Experience(
            id=sample_id(f"p{i // 8}", i % 8), prompt_id=f"p{i // 8}", group_id=f"p{i // 8}", group_size=8, index=i % 8,
            prompt_token_ids=prompt, response_token_ids=[rng.randrange(260) for _ in range(tokens)],
            response_logprobs=[-rng.random() * 5 for _ in range(tokens)], finish_reason="length",
            reward=rng.random(), reward_components={"exact": 1.0}, weight_version=1,
        ))
    return out


async def fleetrl_path(client, samples, batch, signer: RecordSigner | None = None) -> float:
    q = StreamQueue(client, "bench:fleet", "g", Experience, max_backlog=len(samples) + 1, signer=signer)
    await q.ensure_group()
    start = time.perf_counter()

    async def producer():
        for i in range(0, len(samples), batch):
            await q.produce(samples[i:i + batch])

    async def consumer():
        done = 0
        while done < len(samples):
            got = await q.consume("c", count=batch, block_ms=1000)
            await q.ack([d.id for d in got])
            done += len(got)

    await asyncio.gather(producer(), consumer())
    return len(samples) / (time.perf_counter() - start)


async def raw_path(client, payloads, batch) -> float:
    stream = "bench:raw"
    await client.xgroup_create(stream, "g", id="0", mkstream=True)
    start = time.perf_counter()

    async def producer():
        for i in range(0, len(payloads), batch):
            pipe = client.pipeline(transaction=False)
            for p in payloads[i:i + batch]:
                pipe.xadd(stream, {b"p": p})
            await pipe.execute()

    async def consumer():
        done = 0
        while done < len(payloads):
            resp = await client.xreadgroup("g", "c", {stream: ">"}, count=batch, block=1000)
            ids = [eid for _, items in resp or [] for eid, _ in items]
            if ids:
                await client.xack(stream, "g", *ids)
            done += len(ids)

    await asyncio.gather(producer(), consumer())
    return len(payloads) / (time.perf_counter() - start)


def codec_costs(samples: list[Experience], rounds: int = 5) -> dict[str, float]:
    """Microseconds per record (best of ``rounds`` passes): the codec's compiled path against the general
    one (pydantic dump and full validation) on the same records."""
    from shared.codec import _packer

    def general_encode(r: Experience) -> bytes:  # what encode() does for records without a compiled path
        data = r.model_dump(mode="python", exclude={"prompt_token_ids", "response_token_ids", "response_logprobs"})
        for f in ("prompt_token_ids", "response_token_ids", "response_logprobs"):
            a = getattr(r, f).numpy()
            data[f] = {"dtype": a.dtype.str, "n": len(a), "b": a.data}
        return _packer().pack({"schema": "experience", "v": 1, "data": data})

    payloads = [encode(s) for s in samples]
    signer = RecordSigner("k" * 32)
    sigs = [signer.sign("bench", p) for p in payloads]
    out = {}
    for name, fn, items in (("encode (compiled)", encode, samples), ("encode (general)", general_encode, samples),
                            ("decode (compiled)", lambda b: decode(b, Experience), payloads),
                            ("decode (general)", lambda b: decode_validated(b, Experience), payloads),
                            ("sign", lambda b: signer.sign("bench", b), payloads),
                            ("verify", lambda i: signer.problem("bench", payloads[i], sigs[i]), range(len(payloads)))):
        best = float("inf")
        for _ in range(rounds):
            t = time.perf_counter()
            for x in items:
                fn(x)
            best = min(best, (time.perf_counter() - t) / len(items) * 1e6)
        out[name] = best
    return out


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4000, help="experiences per path")
    ap.add_argument("--batch", type=int, default=64, help="produce/consume batch size")
    ap.add_argument("--tokens", type=int, default=1024, help="response tokens per sample")
    ap.add_argument("--repeats", type=int, default=5, help="alternating raw / FleetRL pairs")
    ap.add_argument("--redis-url", default=None, help="use this server instead of a private embedded one")
    args = ap.parse_args()

    server = None
    url = args.redis_url
    if url is None:
        server = EmbeddedRedis(data_dir=tempfile.mkdtemp(prefix="fleetrl-bench-"), appendonly=False).start()
        url = server.url
    client = aioredis.from_url(url, socket_timeout=30)
    try:
        await client.delete("bench:fleet", "bench:raw")
        samples = make_samples(args.n, args.tokens)
        payloads = [encode(s) for s in samples]
        size = sum(map(len, payloads)) / len(payloads)
        await raw_path(client, payloads[:200], args.batch)  # warm-up
        raws, fleets, signed = [], [], []
        signer = RecordSigner("a run key of 32 characters......")
        for _ in range(args.repeats):  # alternate, so all paths see the same machine load
            await client.delete("bench:raw", "bench:fleet")
            raws.append(await raw_path(client, payloads, args.batch))
            await client.delete("bench:raw", "bench:fleet")
            fleets.append(await fleetrl_path(client, samples, args.batch))
            await client.delete("bench:raw", "bench:fleet")
            signed.append(await fleetrl_path(client, samples, args.batch, signer))
        ratios = sorted(f / r for f, r in zip(fleets, raws))
        costs = codec_costs(samples[:500])
        print(f"samples: {args.n} x {args.tokens} tokens (+logprobs), {size / 1024:.1f} KiB each, batch {args.batch}, "
              f"{args.repeats} alternating pairs")
        for i, (r, f, s) in enumerate(zip(raws, fleets, signed), 1):
            print(f"  round {i}: raw {r:8.0f}/s   FleetRL {f:8.0f}/s   signed {s:8.0f}/s   ratio {f / r:.2f}   "
                  f"signed/unsigned {s / f:.2f}")
        print(f"raw redis-py XADD/XREADGROUP/XACK : {statistics.median(raws):10.0f} experiences/s (median)")
        print(f"FleetRL produce/consume/ack       : {statistics.median(fleets):10.0f} experiences/s (median; encode + decode + "
              "validation included)")
        print(f"FleetRL signed (run key)          : {statistics.median(signed):10.0f} experiences/s (median; HMAC-SHA256 "
              "at produce and consume)")
        print(f"ratio FleetRL / raw               : {statistics.median(ratios):10.2f}  (median of pairs; target >= 0.5)")
        print(f"ratio signed / unsigned           : {statistics.median(s / f for s, f in zip(signed, fleets)):10.2f}  "
              "(median of rounds)")
        print("codec per record (500 records in a loop, best of 5): " +
              ", ".join(f"{k} {v:.1f} us" for k, v in costs.items()))
    finally:
        await client.delete("bench:fleet", "bench:raw")
        await client.aclose()
        if server:
            server.stop()


if __name__ == "__main__":
    asyncio.run(main())
