"""One rollout round of a GRPO step, part by part, measured in one run (issue 28's staleness-0 critical path):

1. **generation**: the hf engine in this process (the benchmark's tiny model: hidden 128, 2 layers, one torch thread)
   generates ``--groups`` x ``--samples`` sequences of ``--new-tokens`` tokens. A: the samples of a group share their
   prompt (what a GRPO round is; the engine prefills each distinct prompt once); B: the same number of rows, every
   one its own prompt of the same length (what each row cost before the prefill was shared). Rounds alternate A B.
2. **scoring**: a reward service process (the exact-answer check) scores the round: one ``/score`` request of all
   ``groups x samples`` items (what ``worker.reward_batch_ms`` makes of calls made together) against ``--groups``
   concurrent requests of ``--samples`` items (one per group, as before).

    .venv/bin/python benchmarks/rollout_round.py [--groups 8 --samples 8 --new-tokens 4 --rounds 20]

Prints each figure's median and the ratios. The machine's own speed moves by up to ~45 % over seconds here
(docs/benchmarks.md), so compare figures of one run only.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.reward_throughput import start_service, stop


async def generation(model_dir: Path, args) -> dict[str, float]:
    import torch

    from services.rollout.engines.hf.engine import HFEngine
    from services.rollout.engines.settings import HFEngineSettings
    from services.rollout.engines.types import SamplingParams, SequenceRequest

    torch.set_num_threads(1)
    engine = HFEngine(HFEngineSettings(device="cpu", max_batch_size=256, torch_threads=1), str(model_dir))
    await engine.start()
    rng = random.Random(0)
    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0, ignore_eos=True)

    def prompt() -> list[int]:
        return engine.tokenizer.encode(f"sort {rng.randrange(10**4):04d}=", add_special_tokens=False)

    async def round_(shared: bool) -> float:
        prompts = [prompt() for _ in range(args.groups)]
        rows = [prompts[g] if shared else prompt() for g in range(args.groups) for _ in range(args.samples)]
        reqs = [SequenceRequest(rid=f"r{rng.random()}", prompt_ids=p, params=params) for p in rows]
        t0 = time.perf_counter()
        await engine.generate_many(reqs)
        return time.perf_counter() - t0

    try:
        for _ in range(3):
            await round_(True)
            await round_(False)
        out: dict[str, list[float]] = {"shared": [], "distinct": []}
        for _ in range(args.rounds):
            out["shared"].append(await round_(True))
            out["distinct"].append(await round_(False))
    finally:
        await engine.stop()
    return {k: statistics.median(v) for k, v in out.items()}


async def scoring(url: str, args) -> dict[str, float]:
    def items(n: int) -> list[dict]:
        return [{"prompt": "sort 3721=", "response": "1237", "label": "1237"} for _ in range(n)]

    out: dict[str, list[float]] = {"one": [], "per_group": []}
    async with httpx.AsyncClient(timeout=30) as client:
        async def one() -> None:
            (await client.post(f"{url}/score", json={"items": items(args.groups * args.samples)})).raise_for_status()

        async def per_group() -> None:
            replies = await asyncio.gather(*(client.post(f"{url}/score", json={"items": items(args.samples)})
                                             for _ in range(args.groups)))
            for r in replies:
                r.raise_for_status()

        for _ in range(3):
            await one()
            await per_group()
        for _ in range(args.rounds):
            for name, call in (("one", one), ("per_group", per_group)):
                t0 = time.perf_counter()
                await call()
                out[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in out.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args(argv)

    from deploy.local.tiny_model import build_tiny_causal_lm

    with tempfile.TemporaryDirectory(prefix="fleetrl-round-") as tmp:
        root = Path(tmp)
        model = build_tiny_causal_lm(root / "model", hidden_size=128, layers=2, heads=4, max_positions=64, seed=0)
        gen = asyncio.run(generation(model, args))
        rows = args.groups * args.samples
        print(f"generation, {args.groups} prompts x {args.samples} samples x {args.new_tokens} tokens (median of "
              f"{args.rounds}): samples of a prompt together {gen['shared'] * 1e3:.1f} ms, {rows} distinct prompts "
              f"{gen['distinct'] * 1e3:.1f} ms: {gen['distinct'] / gen['shared']:.2f}x")
        proc, url = start_service(root, "reward", [{"name": "exact", "kind": "rule",
                                                   "check": {"type": "exact", "strip": True}}])
        try:
            score = asyncio.run(scoring(url, args))
        finally:
            stop(proc)
        print(f"scoring the round (median of {args.rounds}): one /score request of {rows} items "
              f"{score['one'] * 1e3:.1f} ms, {args.groups} concurrent requests of {args.samples} "
              f"{score['per_group'] * 1e3:.1f} ms: {score['per_group'] / score['one']:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
