"""Learner tokens/s on a length-skewed batch: token-budget micro-batches vs fixed-count padded ones.

One run, the same batch and the same tiny model for both, steps alternating A B A B ...:

A. ``train.micro_batch_size: 8`` — today's default cut: passes of 8 samples in arrival order, each padded to
   its longest sample;
B. ``train.micro_batch_tokens: 8 x (longest sample)`` — the same memory bound per pass, but rows sorted by
   length and packed up to the budget (verl's dynamic batch size), so short samples do not pay for long ones.

Response lengths are log-uniform in [16, 1024] (most short, a few long: what RL on reasoning tasks looks like).
Throughput counts real (non-padding) tokens: prompt + response per sample, per second of ``train_step``.

    .venv/bin/python benchmarks/learner_throughput.py [--samples 64] [--pairs 3] [--threads 2]

Target: B / A >= 1.5 (median of the pairs).
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from deploy.local.tiny_model import build_tiny_causal_lm
from shared.schemas import Experience, sample_id

PROMPT_LEN = 16
MIN_LEN, MAX_LEN = 16, 1024


def skewed_batch(samples: int, group_size: int, seed: int, vocab: int) -> list[Experience]:
    rng = random.Random(seed)
    out = []
    for g in range(samples // group_size):
        gid = f"bench-{g}"
        prompt = [1] + [rng.randrange(5, vocab) for _ in range(PROMPT_LEN - 1)]
        for i in range(group_size):
            n = round(math.exp(rng.uniform(math.log(MIN_LEN), math.log(MAX_LEN))))
            out.append(Experience(
                id=sample_id(gid, i), prompt_id=gid, group_id=gid, group_size=group_size, index=i,
                prompt_token_ids=prompt, response_token_ids=[rng.randrange(5, vocab) for _ in range(n)],
                response_logprobs=[-5.0] * n, finish_reason="length" if n == MAX_LEN else "stop",
                reward=float(rng.random() < 0.5), weight_version=0))
    return out


def trainer(model_dir: Path, run_dir: Path, threads: int, **train):
    from services.learner.settings import LearnerSettings
    from services.learner.training.rl_trainer import RLTrainer

    data = run_dir / "prompts.jsonl"
    data.parent.mkdir(parents=True, exist_ok=True)
    data.write_text('{"input": "x", "label": 0}\n')
    s = LearnerSettings(
        model={"actor": str(model_dir), "device": "cpu"}, data={"path": str(data)}, run_dir=str(run_dir),
        algorithm={"name": "grpo"}, rollout={"group_size": 4},
        optim={"actor_lr": 1e-5, "warmup_ratio": 0.0, "schedule": "constant"},
        train={"groups_per_step": 16, "torch_threads": threads, **train},
    )
    return RLTrainer(s, total_steps=1000)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_causal_lm(Path(tmp) / "model", hidden_size=64, layers=2, heads=4,
                                         max_positions=PROMPT_LEN + MAX_LEN + 8)
        batch = skewed_batch(args.samples, 4, seed=0, vocab=250)
        tokens = sum(len(e.prompt_token_ids) + len(e.response_token_ids) for e in batch)
        longest = max(len(e.prompt_token_ids) + len(e.response_token_ids) for e in batch)
        lengths = sorted(len(e.response_token_ids) for e in batch)
        print(f"{len(batch)} samples, {tokens} real tokens; response lengths min {lengths[0]}, median "
              f"{lengths[len(lengths) // 2]}, max {lengths[-1]}")
        padded = trainer(model_dir, Path(tmp) / "a", args.threads, micro_batch_size=8)
        budget = trainer(model_dir, Path(tmp) / "b", args.threads, micro_batch_size=len(batch),
                         micro_batch_tokens=8 * longest)
        for t in (padded, budget):  # warm-up step each (allocations, first-call costs)
            t.train_step(batch)
        rates: dict[str, list[float]] = {"padded": [], "budget": []}
        for pair in range(args.pairs):
            for name, t in (("padded", padded), ("budget", budget)):
                start = time.perf_counter()
                t.train_step(batch)
                rates[name].append(tokens / (time.perf_counter() - start))
            print(f"  pair {pair + 1}: fixed-count padded {rates['padded'][-1]:8.0f} tok/s   token budget "
                  f"{rates['budget'][-1]:8.0f} tok/s   ratio {rates['budget'][-1] / rates['padded'][-1]:.2f}")
        ratios = [b / a for a, b in zip(rates["padded"], rates["budget"])]
        print(f"A. micro_batch_size 8 (padded)        : {statistics.median(rates['padded']):8.0f} tokens/s (median)")
        print(f"B. micro_batch_tokens {8 * longest:5d} (sorted) : {statistics.median(rates['budget']):8.0f} "
              f"tokens/s (median)")
        print(f"ratio B / A                           : {statistics.median(ratios):.2f}  (median of pairs; "
              "target >= 1.5)")


if __name__ == "__main__":
    main()
