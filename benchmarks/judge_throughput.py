"""LLM-judge scoring through the reward service: scored samples per second and judge calls per scored sample, with
the judge scorer's cache and dedup on and off, on GRPO-group output of the sort task.

1. The policy: the sort task's tiny model (``deploy/local/sort_task.py``, hidden 128, 2 layers) after a short
   supervised warm-up in-process (``--sft-steps``), as an RL run starts from it.
2. Its output: ``--prompts`` train prompts x ``--samples`` samples each at temperature 1 through the hf rollout
   engine in-process (the engine a rollout service runs), drawn afresh for each epoch: what GRPO steps' groups
   hold.
3. Scoring: a reward-service process with a pointwise ``judge`` scorer; each group is one ``/score`` request (as
   the rollout worker sends it), ``--concurrency`` groups in flight, over ``--epochs`` passes of the prompts (a
   prompt comes back each epoch with fresh samples, which may repeat its earlier answers). Once with cache and dedup on, once off
   (``dedup: false``, ``cache.size: 0``), each with a fresh service.

The judge is the scripted stand-in (``tests/reward/judge_stub_server.py``: an OpenAI-compatible chat endpoint whose
verdict is rule-based, ``--judge-delay-ms`` per call as a model's latency), or any endpoint with ``--judge-url``
(and ``--judge-model``; the template asks for a 0-10 score on a ``Score: N`` line). Judge calls are the reward
service's own count (``fleetrl_reward_judge_calls_total``).

    .venv/bin/python benchmarks/judge_throughput.py [--prompts 64 --samples 8 --epochs 2 --sft-steps 100]
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
from shared.ports import free_port
from tests.procs import spawn, wait_http_ok
from tests.reward.conftest import metric_value

TEMPLATE = ("Task: {prompt}\nReference answer: {label}\nRate the answer below from 0 (wrong) to 10 (right). End with "
            "a line 'Score: N'.\n<response>{response}</response>")


def warm_up(model_dir: Path, steps: int, seed: int) -> float:
    """Supervised warm-up on the sort task in-process (loss on the answer and EOS); returns the last loss."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from deploy.local.sort_task import make_splits

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    train, _ = make_splits(seed)
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    loss = torch.tensor(0.0)
    for _ in range(steps):
        rows = rng.sample(train, 64)
        seqs, masks = [], []
        for r in rows:
            p = tok.encode(r["input"], add_special_tokens=False)
            a = tok.encode(r["output"], add_special_tokens=False) + [tok.eos_token_id]
            seqs.append(p + a)
            masks.append([0] * len(p) + [1] * len(a))
        width = max(map(len, seqs))
        ids = torch.tensor([s + [tok.pad_token_id] * (width - len(s)) for s in seqs])
        labels = torch.tensor([[t if m else -100 for t, m in zip(s, mk)] + [-100] * (width - len(s))
                               for s, mk in zip(seqs, masks)])
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.save_pretrained(model_dir, safe_serialization=True)
    return loss.item()


async def groups_of_samples(model_dir: Path, prompts: int, samples: int, epochs: int, seed: int) -> list[list[dict]]:
    """Per epoch: the same ``prompts`` sort prompts, ``samples`` fresh samples each (temperature 1), from the hf
    engine in-process."""
    from deploy.local.sort_task import make_splits
    from services.rollout.engines.hf.engine import HFEngine
    from services.rollout.engines.settings import HFEngineSettings
    from services.rollout.engines.types import SamplingParams, SequenceRequest

    train, _ = make_splits(seed)
    rows = random.Random(seed + 1).sample(train, prompts)
    engine = HFEngine(HFEngineSettings(device="cpu", max_batch_size=256, torch_threads=1), str(model_dir))
    await engine.start()
    params = SamplingParams(max_new_tokens=8, temperature=1.0)
    out = []
    try:
        for e in range(epochs):
            reqs = [SequenceRequest(rid=f"e{e}-g{g}-{k}", params=params, prompt_ids=tuple(
                engine.tokenizer.encode(r["input"], add_special_tokens=False)))
                for g, r in enumerate(rows) for k in range(samples)]
            outs = await engine.generate_many(reqs)
            out.append([{"prompt": r["input"], "label": r["label"],
                         "responses": [o.text for o in outs[g * samples:(g + 1) * samples]]} for g, r in enumerate(rows)])
    finally:
        await engine.stop()
    return out


async def score_all(url: str, epochs: list[list[dict]], concurrency: int) -> tuple[float, int]:
    """Every group as one /score request, ``concurrency`` at a time, epoch after epoch; (seconds, samples)."""
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=600) as client:
        async def one(g: dict) -> None:
            async with gate:
                items = [{"prompt": g["prompt"], "response": r, "label": g["label"]} for r in g["responses"]]
                reply = await client.post(f"{url}/score", json={"items": items})
                reply.raise_for_status()

        t0 = time.perf_counter()
        for groups in epochs:
            await asyncio.gather(*(one(g) for g in groups))
        return time.perf_counter() - t0, sum(len(g["responses"]) for groups in epochs for g in groups)


def judge_scorer(args, url: str, model: str, on: bool) -> dict:
    scorer = {"name": "judge", "kind": "judge", "url": url, "model": model, "template": TEMPLATE,
              "parser": {"type": "number", "pattern": r"Score:\s*(\d+)", "max": 10, "normalize": True},
              "max_concurrency": args.judge_concurrency, "timeout_s": 120}
    if not on:
        scorer.update(dedup=False, cache={"size": 0})
    return scorer


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--samples", type=int, default=8, help="samples per prompt (the GRPO group)")
    ap.add_argument("--epochs", type=int, default=2, help="passes over the prompts")
    ap.add_argument("--sft-steps", type=int, default=100, help="supervised warm-up steps of the policy")
    ap.add_argument("--concurrency", type=int, default=8, help="/score requests (groups) in flight")
    ap.add_argument("--judge-concurrency", type=int, default=32, help="the judge scorer's max_concurrency")
    ap.add_argument("--judge-delay-ms", type=float, default=50.0, help="the stand-in judge's latency per call")
    ap.add_argument("--judge-url", default=None, help="a real judge: full /v1/chat/completions URL")
    ap.add_argument("--judge-model", default="judge", help="model name sent to --judge-url")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    from deploy.local.tiny_model import build_tiny_causal_lm

    with tempfile.TemporaryDirectory(prefix="fleetrl-judge-") as tmp:
        root = Path(tmp)
        model = build_tiny_causal_lm(root / "policy", hidden_size=128, layers=2, heads=4, max_positions=64,
                                     seed=args.seed)
        t0 = time.perf_counter()
        loss = warm_up(model, args.sft_steps, args.seed)
        print(f"policy: tiny sort model, {args.sft_steps} SFT steps in {time.perf_counter() - t0:.0f} s "
              f"(last loss {loss:.3f})")
        epochs = asyncio.run(groups_of_samples(model, args.prompts, args.samples, args.epochs, args.seed))
        groups = [g for e in epochs for g in e]
        distinct = [len(set(g["responses"])) for g in groups]
        right = statistics.mean(r == g["label"] for g in groups for r in g["responses"])
        print(f"samples: {args.epochs} epochs x {args.prompts} prompts x {args.samples}: {statistics.mean(distinct):.2f} "
              f"distinct responses per group (min {min(distinct)}, max {max(distinct)}), {right:.0%} right")

        stub = None
        if args.judge_url is None:
            port = free_port()
            log = root / "judge.log"
            stub = spawn(["-m", "tests.reward.judge_stub_server", "--port", str(port)], log)
            wait_http_ok(f"http://127.0.0.1:{port}/health", stub, timeout=60, log=log)
            httpx.post(f"http://127.0.0.1:{port}/control", json={"delay_s": args.judge_delay_ms / 1000}, timeout=10)
            judge_url, judge_model = f"http://127.0.0.1:{port}/v1/chat/completions", "stub"
            what = f"the stand-in judge, {args.judge_delay_ms:.0f} ms a call"
        else:
            judge_url, judge_model, what = args.judge_url, args.judge_model, f"{args.judge_url} ({args.judge_model})"
        results = {}
        try:
            for on in (True, False):
                proc, url = start_service(root, f"reward-{'on' if on else 'off'}", [judge_scorer(args, judge_url,
                                                                                               judge_model, on)])
                try:
                    seconds, samples = asyncio.run(score_all(url, epochs, args.concurrency))
                    metrics = httpx.get(f"{url}/metrics", timeout=10).text
                finally:
                    stop(proc)
                calls = metric_value(metrics, "fleetrl_reward_judge_calls_total", scorer="judge", outcome="answered")
                results[on] = (samples / seconds, calls / samples)
                hits = metric_value(metrics, "fleetrl_reward_judge_cache_total", scorer="judge", result="hit")
                saved = metric_value(metrics, "fleetrl_reward_judge_dedup_saved_total", scorer="judge")
                print(f"cache and dedup {'on ' if on else 'off'}: {samples} samples in {seconds:.2f} s = "
                      f"{samples / seconds:.1f} scored samples/s, {calls:.0f} judge calls, cache hits {hits:.0f}, "
                      f"dedup saved {saved:.0f}")
                retried = [line for line in (root / f"reward-{'on' if on else 'off'}.log").read_text().splitlines()
                           if "retrying" in line]
                if retried:  # a retried /score call judges its batch again (without the cache: all of it)
                    print(f"  {len(retried)} scorer call(s) retried, e.g. {retried[0][-300:]}")
        finally:
            if stub is not None:
                stop(stub)
    print(f"judge: {what}; {args.epochs} epochs, {args.concurrency} groups in flight, judge max_concurrency "
          f"{args.judge_concurrency}; speed-up {results[True][0] / results[False][0]:.2f}x")
    print(f"judge calls per scored sample: {results[True][1]:.2f} (cache and dedup on), {results[False][1]:.2f} (off)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
