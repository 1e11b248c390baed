"""Multi-turn rollout throughput through the worker vs single-turn generation on the same engine (hf, tiny model).

In one run, one rollout service object in this process (hf engine, a private Redis), its worker running the
``multi_turn`` rollout function on the trivial ``echo`` environment (``--turns`` model turns per trajectory, a
fixed reward, so no reward service is involved):

1. single-turn: the same number of model turns as (2) will take, each ``--new-tokens`` tokens, generated as
   groups of ``--group`` samples with ``--concurrency`` groups in flight (the worker's shape), straight on the
   engine — model output tokens/s;
2. multi-turn: ``--prompts`` tasks of ``--group`` trajectories pushed to the prompts stream and run by the worker
   (token-in/token-out, template deltas, trajectories built and pushed as experiences) — model output tokens/s
   (tokens under the action mask), from the first push to the last experience.

Prints the best of ``--repeats`` interleaved rounds of each and the ratio (target >= 0.8). Every turn uses ``ignore_eos`` and the chat's end-of-turn token as a
stop token (a random tiny model rarely writes it), so nearly every turn is ``--new-tokens`` long.

    .venv/bin/python benchmarks/agent_rollout.py [--prompts 32] [--group 4] [--turns 4] [--new-tokens 32]
    .venv/bin/python benchmarks/agent_rollout.py --profile   # where the time goes, one round of each
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from deploy.local.redis_server import EmbeddedRedis
from deploy.local.tiny_model import build_tiny_causal_lm


async def bench(args, model_dir: Path, redis_url: str) -> None:
    import redis.asyncio as aioredis

    from services.rollout.engines.types import SamplingParams, SequenceRequest
    from services.rollout.service import RolloutService
    from services.rollout.settings import RolloutSettings
    from shared import keys
    from shared.experience_queue import StreamQueue
    from shared.schemas import Experience, PromptTask

    run = "agent-bench"
    settings = RolloutSettings(
        model=str(model_dir), redis_url=redis_url, run_name=run, weight_sidecar=False,
        engine={"kind": "hf", "device": "cpu", "torch_threads": args.threads, "max_batch_size": 64, "max_wait_ms": 2},
        worker={"enabled": True, "reward_url": "http://127.0.0.1:9", "concurrency": args.concurrency,
                "poll_interval_s": 0.05, "rollout_function": "multi_turn",
                "sampling": {"max_new_tokens": args.new_tokens, "ignore_eos": True},
                "agent": {"environment": "echo", "max_turns": args.turns,
                          "environment_args": {"turns": args.turns, "reply": "ok", "reward": 0.0}}})
    svc = RolloutService(settings)
    await svc.start()
    r = aioredis.from_url(redis_url, socket_timeout=30)
    try:
        prompt = svc.apply_chat_template([{"role": "user", "content": "hello, let us talk"}])
        im_end = svc.tokenizer.convert_tokens_to_ids("<|im_end|>")
        params = SamplingParams(max_new_tokens=args.new_tokens, ignore_eos=True, stop_token_ids=(im_end,))
        # warm-up
        await svc.generate([SequenceRequest(rid="warm", prompt_ids=tuple(prompt), params=params)])

        groups = args.prompts * args.turns
        sem = asyncio.Semaphore(args.concurrency)
        prompts = StreamQueue(r, keys.prompts_stream(run), "rollout", PromptTask)
        learner = StreamQueue(r, keys.experiences_stream(run), "learner", Experience)
        await learner.ensure_group()

        async def group(i: int) -> int:
            async with sem:
                seqs = [SequenceRequest(rid=f"s{i}-{j}", prompt_ids=tuple(prompt), params=params)
                        for j in range(args.group)]
                return sum(len(o.output_ids) for o in await svc.generate(seqs))

        async def single_turn() -> tuple[int, float]:  # 1. on the engine, in the worker's shape
            t0 = time.perf_counter()
            tokens = sum(await asyncio.gather(*(group(i) for i in range(groups))))
            return tokens, time.perf_counter() - t0

        async def multi_turn(round_: int) -> tuple[int, float, int, int]:  # 2. through the worker
            tasks = [PromptTask(id=f"r{round_}-p{i}", prompt=[{"role": "user", "content": "hello, let us talk"}],
                                n=args.group) for i in range(args.prompts)]
            t0 = time.perf_counter()
            await prompts.produce(tasks)
            exps: list[Experience] = []
            while len(exps) < args.prompts * args.group:
                ds = await learner.consume("bench", count=256, block_ms=50)
                exps += [d.record for d in ds]
                await learner.ack([d.id for d in ds])
            elapsed = time.perf_counter() - t0
            tokens = sum(int(sum(e.action_mask)) if e.action_mask is not None else len(e.response_token_ids)
                         for e in exps)
            return tokens, elapsed, sum(e.metadata["turns"] for e in exps), len(exps)

        if args.profile:
            await profile(svc, single_turn, multi_turn)
            return
        singles, multis = [], []
        for round_ in range(args.repeats):  # interleaved: the machine may be shared and its load drift
            singles.append(await single_turn())
            multis.append(await multi_turn(round_))
        single_tokens, single_s = max(singles, key=lambda x: x[0] / x[1])
        multi_tokens, multi_s, turns, n_exps = max(multis, key=lambda x: x[0] / x[1])
    finally:
        await r.aclose()
        await svc.stop()

    single_tps, multi_tps = single_tokens / single_s, multi_tokens / multi_s
    print(f"tiny model, hf engine, {args.threads} torch thread(s); {args.prompts} prompts x {args.group} samples, "
          f"{args.turns} turns of {args.new_tokens} tokens, {args.concurrency} groups in flight; best of "
          f"{args.repeats} interleaved rounds")
    print(f"single-turn on the engine : {single_tokens:6d} tokens in {single_s:6.2f} s = {single_tps:8.0f} tok/s")
    print(f"multi-turn via the worker : {multi_tokens:6d} tokens in {multi_s:6.2f} s = {multi_tps:8.0f} tok/s "
          f"({turns} model turns, {n_exps} trajectories)")
    print(f"ratio multi/single        : {multi_tps / single_tps:.2f}  (target >= 0.8)")


async def profile(svc, single_turn, multi_turn) -> None:
    """One round of each under :class:`EngineProfile` (the decode thread) and cProfile (the event loop)."""
    import cProfile
    import pstats

    from benchmarks.engine_profile import EngineProfile

    for name, run in (("single-turn", single_turn), ("multi-turn", lambda: multi_turn(10_000))):
        prof = cProfile.Profile()
        with EngineProfile(svc.engine) as eng:
            prof.enable()
            result = await run()
            prof.disable()
        print(eng.report(f"{name} ({result[0]} tokens, {result[0] / result[1]:.0f} tok/s)"))
        stats = pstats.Stats(prof)
        busy = sum(v[2] for v in stats.stats.values())  # event-loop thread: total own time of its functions
        print(f"  event-loop thread (worker, agent, queue, template): {busy:.2f} s own time; top cumulative:")
        rows = sorted(((v[3], f"{k[0].rsplit('/', 2)[-1]}:{k[2]}") for k, v in stats.stats.items()
                       if "FleetRL" in k[0] or "/services/" in k[0] or "/shared/" in k[0]), reverse=True)
        for cum, where in rows[:12]:
            print(f"    {cum:7.2f} s  {where}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=8, help="groups in flight (worker.concurrency)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--profile", action="store_true",
                    help="one round of each, profiled: where the decode thread and the event loop spend their time")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved rounds; the best of each is reported")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_causal_lm(Path(tmp) / "tiny")
        redis = EmbeddedRedis(data_dir=Path(tmp) / "redis")
        redis.start()
        try:
            asyncio.run(bench(args, model_dir, redis.url))
        finally:
            redis.stop()


if __name__ == "__main__":
    main()
