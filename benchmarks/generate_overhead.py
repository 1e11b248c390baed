"""What the rollout service's HTTP layer costs, and what dynamic batching buys (hf engine, tiny model).

Measured in one run, on the same tiny model and engine settings:

1. the hf engine called in-process on one batch of B prompts (``generate_many``) — tokens/s;
2. the same batch through ``POST /generate`` of the rollout service (its own process) — tokens/s,
   target >= 0.9 of (1);
3. B concurrent clients sending one prompt each — tokens/s, target >= 0.7 of (2);
4. single-prompt requests one after another — tokens/s; (3) should be >= 4x this.

    .venv/bin/python benchmarks/generate_overhead.py [--batch 64] [--new-tokens 128] [--threads 1]

Every run uses ``ignore_eos`` so each sequence generates exactly ``--new-tokens`` tokens. Each figure is
the best of ``--repeats`` runs (the rounds are interleaved: the machine may be shared and its load drift).

Clients: the HTTP figures use a lean asyncio HTTP/1.1 client (one connection per request), so they
measure the server and not the client library — on a 2-core machine the load generator shares the CPU
with the server, and ``httpx`` alone costs ~2.5 ms per request there. The same concurrent load sent
through ``httpx.AsyncClient`` is printed as well, for comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from deploy.local.tiny_model import build_tiny_causal_lm
from shared.ports import free_port
from tests.procs import spawn, stop, wait_http_ok


def prompts(batch: int) -> list[str]:
    return [f"Prompt number {i}: tell me something about {i * 7 % 13}." for i in range(batch)]


def sampling(new_tokens: int) -> dict:
    return {"max_new_tokens": new_tokens, "temperature": 1.0, "ignore_eos": True}


async def start_engine(model_dir: Path, args):
    import torch

    from services.rollout.engines import create_engine
    from services.rollout.engines.settings import HFEngineSettings

    torch.set_num_threads(args.threads)
    engine = create_engine(HFEngineSettings(device="cpu", max_batch_size=args.batch, max_wait_ms=4,
                                            **_prefix_cache(args)), str(model_dir))
    await engine.start()
    return engine


async def in_process_once(engine, args, rep: int) -> int:
    from services.rollout.engines.types import SamplingParams, SequenceRequest

    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0, ignore_eos=True)
    seqs = [SequenceRequest(rid=f"b{rep}-{i}", prompt_ids=tuple(engine.tokenizer.encode(p)), params=params)
            for i, p in enumerate(prompts(args.batch))]
    outs = await engine.generate_many(seqs)
    return sum(len(o.output_ids) for o in outs)


async def post(port: int, obj: dict) -> dict:
    """One POST over a fresh HTTP/1.1 connection; returns the JSON body (raises on a non-200)."""
    body = json.dumps(obj).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /generate HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
    await writer.drain()
    data = await reader.read()
    writer.close()
    head, _, payload = data.partition(b"\r\n\r\n")
    if b" 200 " not in head.split(b"\r\n", 1)[0]:
        raise RuntimeError(f"server answered {head[:200]!r}: {payload[:300]!r}")
    return json.loads(payload)


def count_tokens(reply) -> int:
    return sum(len(x["output_ids"]) for x in reply) if isinstance(reply, list) else len(reply["output_ids"])


async def timed(run) -> float:
    t0 = time.perf_counter()
    tokens = await run()
    return tokens / (time.perf_counter() - t0)


async def rounds(engine, port: int, args) -> dict[str, float]:
    """Interleave the measurements round by round (the machine may be shared and its load drift);
    the first round warms up; each figure is the best of the other rounds."""
    one_batch = {"text": prompts(args.batch), "sampling_params": sampling(args.new_tokens)}
    runs = {
        "engine": lambda rep: in_process_once(engine, args, rep),
        "batched": lambda rep: _count(post(port, one_batch)),
        "concurrent": lambda rep: _concurrent(port, args),
    }
    best = dict.fromkeys(runs, 0.0)
    for rep in range(args.repeats + 1):
        for name, run in runs.items():
            tps = await timed(lambda run=run, rep=rep: run(rep))
            if rep:
                best[name] = max(best[name], tps)
    return best


async def _count(reply_coro) -> int:
    return count_tokens(await reply_coro)


async def _concurrent(port: int, args) -> int:
    replies = await asyncio.gather(*(post(port, {"text": p, "sampling_params": sampling(args.new_tokens)})
                                     for p in prompts(args.batch)))
    return sum(count_tokens(r) for r in replies)


async def httpx_concurrent(port: int, args) -> float:
    limits = httpx.Limits(max_connections=args.batch + 8)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=600, limits=limits) as client:
        async def run():
            replies = await asyncio.gather(*(
                client.post("/generate", json={"text": p, "sampling_params": sampling(args.new_tokens)})
                for p in prompts(args.batch)))
            return sum(count_tokens(r.raise_for_status().json()) for r in replies)
        await run()
        return max([await timed(run) for _ in range(2)])


async def http_sequential(port: int, args) -> float:
    t0 = time.perf_counter()
    tokens = 0
    for p in prompts(min(args.batch, args.sequential)):
        tokens += count_tokens(await post(port, {"text": p, "sampling_params": sampling(args.new_tokens)}))
    return tokens / (time.perf_counter() - t0)


def _prefix_cache(args) -> dict[str, int]:
    return {} if args.prefix_cache_tokens is None else {"prefix_cache_tokens": args.prefix_cache_tokens}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1, help="torch threads, in-process and in the server")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--sequential", type=int, default=8, help="requests in the sequential measurement")
    ap.add_argument("--prefix-cache-tokens", type=int, default=None,
                    help="the hf engine's prefix_cache_tokens (0 = off); unset = the engine's default")
    args = ap.parse_args()
    env = {"OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads), "TOKENIZERS_PARALLELISM": "false"}
    os.environ.update(env)

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_causal_lm(Path(tmp) / "tiny")
        port = free_port()
        cfg = Path(tmp) / "rollout.yaml"
        cfg.write_text(
            f"model: {model_dir}\nport: {port}\n"
            f"engine: {{kind: hf, device: cpu, max_batch_size: {args.batch}, max_wait_ms: 4, torch_threads: {args.threads}"
            + "".join(f", {k}: {v}" for k, v in _prefix_cache(args).items()) + "}\n"
        )
        log = Path(tmp) / "rollout.log"
        proc = spawn(["-m", "services.rollout", "--config", str(cfg)], log, env=env)
        try:
            wait_http_ok(f"http://127.0.0.1:{port}/health", proc, timeout=120, log=log)

            async def measure():
                engine = await start_engine(model_dir, args)
                try:
                    best = await rounds(engine, port, args)
                finally:
                    await engine.stop()
                return best, await http_sequential(port, args), await httpx_concurrent(port, args)

            best, sequential, via_httpx = asyncio.run(measure())
        finally:
            stop(proc)
    engine_tps, batched, concurrent = best["engine"], best["batched"], best["concurrent"]

    print(f"tiny model, batch {args.batch} x {args.new_tokens} new tokens, {args.threads} torch thread(s), "
          f"best of {args.repeats}")
    print(f"  engine in-process, one batch        : {engine_tps:9.1f} tok/s")
    print(f"  HTTP /generate, one batched call     : {batched:9.1f} tok/s   ratio to in-process {batched / engine_tps:.2f} "
          f"(target >= 0.9)")
    print(f"  HTTP, {args.batch} concurrent single clients: {concurrent:9.1f} tok/s   ratio to batched call "
          f"{concurrent / batched:.2f} (target >= 0.7)")
    print(f"  HTTP, sequential single requests     : {sequential:9.1f} tok/s   concurrent / sequential "
          f"{concurrent / sequential:.1f}x (target >= 4x)")
    print(f"  (same {args.batch} concurrent clients via httpx.AsyncClient: {via_httpx:9.1f} tok/s, "
          f"ratio to batched call {via_httpx / batched:.2f})")


if __name__ == "__main__":
    main()
