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

Prints the median of ``--repeats`` interleaved rounds of each and the ratio (target >= 0.8), by wall clock and by
this process's CPU time (steadier on a shared machine); ``--compare-prefix-cache`` runs every round with the hf
engine's prefix cache and without it. Every turn uses ``ignore_eos`` and the chat's end-of-turn token as a
stop token (a random tiny model rarely writes it), so nearly every turn is ``--new-tokens`` long.

    .venv/bin/python benchmarks/agent_rollout.py [--prompts 32] [--group 4] [--turns 4] [--new-tokens 32]
    .venv/bin/python benchmarks/agent_rollout.py --compare-prefix-cache   # A/B of the engine's prefix cache
    .venv/bin/python benchmarks/agent_rollout.py --compare-prefix-cache --hidden-size 512 --layers 8   # prefill costs
    .venv/bin/python benchmarks/agent_rollout.py --profile   # where the time goes, one round of each

Measured figures (target not met: ratio by CPU time ~0.5 before the hf engine's slot-buffer batch, ~0.6-0.7
after, median 0.72 of 6 runs since, on a shared 2-core machine) are in docs/rollout.md, section Engines.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from deploy.local.tiny_model import build_tiny_causal_lm
from shared.redis_server import EmbeddedRedis


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

        async def single_turn() -> tuple[int, float, float]:  # 1. on the engine, in the worker's shape
            t0, c0 = time.perf_counter(), time.process_time()
            tokens = sum(await asyncio.gather(*(group(i) for i in range(groups))))
            return tokens, time.perf_counter() - t0, time.process_time() - c0

        async def multi_turn(round_: int) -> tuple[int, float, float]:  # 2. through the worker
            tasks = [PromptTask(id=f"r{round_}-p{i}", prompt=[{"role": "user", "content": "hello, let us talk"}],
                                n=args.group) for i in range(args.prompts)]
            t0, c0 = time.perf_counter(), time.process_time()
            await prompts.produce(tasks)
            exps: list[Experience] = []
            while len(exps) < args.prompts * args.group:
                ds = await learner.consume("bench", count=256, block_ms=50)
                exps += [d.record for d in ds]
                await learner.ack([d.id for d in ds])
            elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
            tokens = sum(int(sum(e.action_mask)) if e.action_mask is not None else len(e.response_token_ids)
                         for e in exps)
            assert sum(e.metadata["turns"] for e in exps) == args.prompts * args.group * args.turns
            return tokens, elapsed, cpu

        cache = svc.engine.prefix_cache
        configs = {"prefix cache on": cache.max_tokens, "prefix cache off": 0} if args.compare_prefix_cache else \
            {f"prefix cache {'on' if cache.enabled else 'off'}": cache.max_tokens}
        if args.profile:
            for name, tokens_held in configs.items():
                cache.resize(tokens_held)
                cache.invalidate()
                print(f"== {name}")
                await profile(svc, single_turn, multi_turn, args.profile_functions)
            return
        runs: dict[str, tuple[list, list]] = {name: ([], []) for name in configs}
        task_ids = itertools.count()
        for round_ in range(args.repeats):  # interleaved: the machine may be shared and its load drift
            order = list(configs.items())
            for name, tokens_held in order if round_ % 2 == 0 else reversed(order):
                cache.resize(tokens_held)
                cache.invalidate()
                runs[name][0].append(await single_turn())
                runs[name][1].append(await multi_turn(next(task_ids)))
    finally:
        await r.aclose()
        await svc.stop()

    print(f"model hidden {args.hidden_size} x {args.layers} layers, hf engine, {args.threads} torch thread(s); {args.prompts} prompts x {args.group} samples, "
          f"{args.turns} turns of {args.new_tokens} tokens, {args.concurrency} groups in flight; medians of "
          f"{args.repeats} interleaved rounds (tok/s by wall clock, and by this process's CPU time)")
    for name, (singles, multis) in runs.items():
        s_wall = statistics.median(t / w for t, w, _ in singles)
        m_wall = statistics.median(t / w for t, w, _ in multis)
        s_cpu = statistics.median(t / c for t, _, c in singles)
        m_cpu = statistics.median(t / c for t, _, c in multis)
        ratios = [m[0] / m[1] / (s[0] / s[1]) for s, m in zip(singles, multis)]
        print(f"{name}:")
        print(f"  single-turn on the engine : {s_wall:7.0f} tok/s  ({s_cpu:7.0f} tok/CPU-s)  {singles[0][0]} tokens")
        print(f"  multi-turn via the worker : {m_wall:7.0f} tok/s  ({m_cpu:7.0f} tok/CPU-s)  {multis[0][0]} tokens")
        print(f"  ratio multi/single        : {m_wall / s_wall:.2f} (per round: {', '.join(f'{x:.2f}' for x in ratios)}; "
              f"by CPU time {m_cpu / s_cpu:.2f})  (target >= 0.8)")


async def profile(svc, single_turn, multi_turn, functions: bool) -> None:
    """Each mode under :class:`EngineProfile` (the decode thread's phases) with the event loop's CPU time; with
    ``functions`` once more under cProfile (the event loop's functions, CPU time; its overhead inflates them)."""
    import cProfile
    import pstats

    from benchmarks.engine_profile import EngineProfile

    rounds = itertools.count(10_000)
    for name, run in (("single-turn", single_turn), ("multi-turn", lambda: multi_turn(next(rounds)))):
        with EngineProfile(svc.engine) as eng:
            loop_cpu = time.thread_time()
            tokens, wall, cpu = await run()
            loop_cpu = time.thread_time() - loop_cpu
        print(eng.report(f"{name} ({tokens} tokens, {tokens / wall:.0f} tok/s, {cpu:.2f} s of process CPU)"))
        print(f"  event-loop thread (worker, agent, queue, template, engine front): {loop_cpu:.2f} s of CPU")
        if not functions:
            continue
        prof = cProfile.Profile(time.thread_time)  # CPU time: waits (I/O, the GIL) do not count
        prof.enable()
        await run()
        prof.disable()
        stats = pstats.Stats(prof)
        if os.environ.get("AGENT_BENCH_PSTATS"):  # the whole event-loop profile, for pstats / snakeviz
            stats.dump_stats(f"{os.environ['AGENT_BENCH_PSTATS']}.{name}")
        rows = sorted(((v[3], f"{k[0].rsplit('/', 2)[-1]}:{k[2]}") for k, v in stats.stats.items()
                       if "FleetRL" in k[0] or "/services/" in k[0] or "/shared/" in k[0]), reverse=True)
        print("  event loop under cProfile, top cumulative CPU (FleetRL code):")
        for cum, where in rows[:8]:
            print(f"    {cum:7.2f} s  {where}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=8, help="groups in flight (worker.concurrency)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--hidden-size", type=int, default=64, help="of the randomly initialised model (64: the tiny one)")
    ap.add_argument("--layers", type=int, default=2, help="of the randomly initialised model")
    ap.add_argument("--profile", action="store_true",
                    help="one round of each, profiled: where the decode thread and the event loop spend their time")
    ap.add_argument("--profile-functions", action="store_true",
                    help="with --profile: one more round of each under cProfile (the event loop's functions)")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved rounds; the median of each is reported")
    ap.add_argument("--compare-prefix-cache", action="store_true",
                    help="every round twice: with the engine's prefix cache and without (alternating order)")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_causal_lm(Path(tmp) / "tiny", hidden_size=args.hidden_size, layers=args.layers,
                                         heads=max(4, args.hidden_size // 64))
        redis = EmbeddedRedis(data_dir=Path(tmp) / "redis")
        redis.start()
        try:
            asyncio.run(bench(args, model_dir, redis.url))
        finally:
            redis.stop()


if __name__ == "__main__":
    main()
