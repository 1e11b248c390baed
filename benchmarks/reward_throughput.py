"""Reward service throughput through POST /score, measured in one run:

1. the rule scorer (math verifier + format check), requests of 256 items;
2. an hf_rm scorer with 32 concurrent clients sending one item per request, dynamically batched
   (max_batch_size 32) vs forced batch size 1 — the ratio is what dynamic batching buys.

Each configuration is its own service process, started here, on loopback.

    .venv/bin/python benchmarks/reward_throughput.py [--hidden-size 256 --layers 4 --torch-threads 1]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from shared.ports import free_port


def start_service(workdir: Path, name: str, scorers: list[dict]) -> tuple[subprocess.Popen, str]:
    cfg = workdir / f"{name}.yaml"
    cfg.write_text(yaml.safe_dump({"scorers": scorers, "log_level": "WARNING"}))
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
    with open(workdir / f"{name}.log", "wb") as log:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen([sys.executable, "-m", "services.reward", "--config", str(cfg), "--port", str(port)],
                                cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited: {(workdir / f'{name}.log').read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    proc.kill()
    raise TimeoutError(f"{name} did not become healthy")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()


def math_items(n: int, offset: int = 0) -> list[dict]:
    items = []
    for i in range(offset, offset + n):
        a, b = i % 97, (i * 7) % 89
        answer = a + b if i % 3 else a + b + 1  # a third of them wrong
        items.append({"prompt": f"What is {a} + {b}? Think step by step.",
                      "response": f"First {a}, then add {b}. So the result is \\boxed{{{answer}}}.",
                      "label": str(a + b)})
    return items


async def bench_rules(url: str, requests: int, batch: int) -> float:
    async with httpx.AsyncClient(timeout=120) as client:
        await client.post(f"{url}/score", json={"items": math_items(batch)})  # warm-up
        start = time.perf_counter()
        for r in range(requests):
            reply = await client.post(f"{url}/score", json={"items": math_items(batch, r * batch)})
            reply.raise_for_status()
        elapsed = time.perf_counter() - start
    return requests * batch / elapsed


async def bench_rm(url: str, clients: int, per_client: int) -> float:
    # One AsyncClient per simulated client (as separate rollout workers would have): a single httpx
    # client shared by 32 concurrent connections is itself the bottleneck (~60 req/s measured here).
    items = math_items(clients * per_client)
    pool = [httpx.AsyncClient(timeout=300) for _ in range(clients)]
    try:
        await asyncio.gather(*(c.post(f"{url}/score", json={"items": [it]}) for c, it in zip(pool, items)))  # warm-up

        async def worker(k: int) -> None:
            for j in range(per_client):
                reply = await pool[k].post(f"{url}/score", json={"items": [items[k * per_client + j]]})
                reply.raise_for_status()

        start = time.perf_counter()
        await asyncio.gather(*(worker(k) for k in range(clients)))
        elapsed = time.perf_counter() - start
    finally:
        await asyncio.gather(*(c.aclose() for c in pool))
    return clients * per_client / elapsed


def batch_stats(url: str) -> str:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    count = total = 0.0
    for line in text.splitlines():
        if line.startswith("fleetrl_reward_batch_size_count"):
            count = float(line.rsplit(" ", 1)[1])
        elif line.startswith("fleetrl_reward_batch_size_sum"):
            total = float(line.rsplit(" ", 1)[1])
    return f"{total / count:.1f}" if count else "n/a"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden-size", type=int, default=256, help="Tiny RM hidden size.")
    parser.add_argument("--layers", type=int, default=4, help="Tiny RM layers.")
    parser.add_argument("--model", type=str, default=None, help="Use this RM checkpoint instead of a tiny one.")
    parser.add_argument("--device", type=str, default="cpu")
    parser.add_argument("--torch-threads", type=int, default=1, help="torch threads in the RM service.")
    parser.add_argument("--rule-requests", type=int, default=40, help="Requests of 256 items for the rule scorer.")
    parser.add_argument("--clients", type=int, default=32, help="Concurrent clients for hf_rm.")
    parser.add_argument("--per-client", type=int, default=8, help="Requests per client for hf_rm.")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="reward-bench-") as tmp:
        work = Path(tmp)
        model = args.model
        if model is None:
            from deploy.local.tiny_model import build_tiny_reward_model

            model = str(build_tiny_reward_model(work / "rm", hidden_size=args.hidden_size, layers=args.layers,
                                                heads=4))
        rules = [{"name": "math", "kind": "rule", "check": {"type": "math"}},
                 {"name": "boxed", "kind": "rule", "weight": 0.2,
                  "check": {"type": "format", "pattern": r"\\boxed\{.+\}"}}]

        def rm(batch: int) -> list[dict]:
            return [{"name": "rm", "kind": "hf_rm", "model": model, "device": args.device, "max_batch_size": batch,
                     "max_wait_ms": 5, "torch_threads": args.torch_threads}]

        results = {}
        proc, url = start_service(work, "rules", rules)
        try:
            results["rule"] = asyncio.run(bench_rules(url, args.rule_requests, 256))
        finally:
            stop(proc)
        for label, size in (("batched", args.clients), ("bs1", 1)):
            proc, url = start_service(work, f"rm-{label}", rm(size))
            try:
                results[label] = asyncio.run(bench_rm(url, args.clients, args.per_client))
                results[f"{label}_mean_batch"] = batch_stats(url)
            finally:
                stop(proc)

    print(f"rule scorer (math + format), batches of 256: {results['rule']:,.0f} items/s")
    print(f"hf_rm (hidden {args.hidden_size}, {args.layers} layers, {args.device}, {args.torch_threads} thread), "
          f"{args.clients} concurrent clients, 1 item/request:")
    print(f"  dynamic batching (max 32): {results['batched']:,.1f} items/s (mean batch {results['batched_mean_batch']})")
    print(f"  forced batch size 1:       {results['bs1']:,.1f} items/s (mean batch {results['bs1_mean_batch']})")
    print(f"  ratio batched / bs1:       {results['batched'] / results['bs1']:.2f}x")


if __name__ == "__main__":
    main()
