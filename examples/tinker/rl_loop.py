"""Sort four digits with the Tinker API, in the shape of tinker-cookbook's ``rl_loop``: a short supervised
warm-up (``cross_entropy``), then RL: sample a group per prompt -> exact-match reward -> group-centred
advantages -> ``forward_backward(loss_fn="importance_sampling")`` -> ``optim_step`` ->
``save_weights_and_get_sampling_client`` -> sample again. Held-out accuracy (greedy) is measured after the
warm-up and at the end. Written only against the ``tinker`` client: point it at any Tinker endpoint.

    fleetrl run examples/tinker/fleetrl.yaml      # prints: export TINKER_BASE_URL=... TINKER_API_KEY=tml-...
    python examples/tinker/rl_loop.py --base-model examples/sort-digits/base-model

Prints one JSON line: held-out accuracy after the warm-up and after RL (greedy, and sampled at temperature 1),
and seconds per RL step.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time

import tinker
from tinker import types


def problems(seed: int, heldout: int) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    every = [f"{i:04d}" for i in range(10_000)]
    random.Random(seed).shuffle(every)
    rows = [(f"sort {d}=", "".join(sorted(d))) for d in every]
    return rows[heldout:], rows[:heldout]


def sl_datum(tok, prompt: str, answer: str) -> types.Datum:
    p, a = tok.encode(prompt), tok.encode(answer) + [tok.eos_token_id]
    ids = p + a
    weights = [0.0] * (len(p) - 1) + [1.0] * len(a)
    return types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                       loss_fn_inputs={"target_tokens": ids[1:], "weights": weights})


def rl_datum(prompt_ids: list[int], seq: types.SampledSequence, advantage: float) -> types.Datum:
    ids = prompt_ids + list(seq.tokens)
    n_prompt = len(prompt_ids) - 1
    return types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                       loss_fn_inputs={"target_tokens": ids[1:],
                                       "logprobs": [0.0] * n_prompt + list(seq.logprobs),
                                       "advantages": [0.0] * n_prompt + [advantage] * len(seq.tokens)})


def answer_of(tok, seq: types.SampledSequence) -> str:
    return tok.decode([t for t in seq.tokens if t != tok.eos_token_id]).strip()


def accuracy(sampler: tinker.SamplingClient, tok, rows: list[tuple[str, str]], temperature: float = 0.0) -> float:
    """Exact answers on ``rows``: greedy (temperature 0, as ``make demo`` measures) or sampled (what RL raises)."""
    futures = [sampler.sample(types.ModelInput.from_ints(tok.encode(p)), 1,
                              types.SamplingParams(max_tokens=6, temperature=temperature, seed=i))
               for i, (p, _) in enumerate(rows)]
    hits = sum(answer_of(tok, f.result().sequences[0]) == a for f, (_, a) in zip(futures, rows, strict=True))
    return hits / len(rows)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-model", required=True, help="the base_model name the server trains")
    ap.add_argument("--rank", type=int, default=32)
    ap.add_argument("--sl-steps", type=int, default=30)
    ap.add_argument("--sl-batch", type=int, default=64)
    ap.add_argument("--sl-lr", type=float, default=3e-3)
    ap.add_argument("--rl-steps", type=int, default=20)
    ap.add_argument("--groups", type=int, default=8, help="prompts per RL step")
    ap.add_argument("--group-size", type=int, default=8, help="samples per prompt")
    ap.add_argument("--rl-lr", type=float, default=1e-3)
    ap.add_argument("--heldout", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    train, held = problems(args.seed, args.heldout)
    rng = random.Random(args.seed)
    service = tinker.ServiceClient()
    training = service.create_lora_training_client(base_model=args.base_model, rank=args.rank,
                                                   seed=args.seed).result()
    tok = training.get_tokenizer()

    for step in range(args.sl_steps):  # supervised warm-up
        batch = [sl_datum(tok, p, a) for p, a in rng.sample(train, args.sl_batch)]
        fb = training.forward_backward(batch, "cross_entropy")
        training.optim_step(types.AdamParams(learning_rate=args.sl_lr))
        if step % 10 == 0 or step == args.sl_steps - 1:
            tokens = sum(sum(d.loss_fn_inputs["weights"].tolist()) for d in batch)
            print(f"warm-up step {step}: loss/token {fb.result().metrics['loss:sum'] / tokens:.3f}", file=sys.stderr)
    sampler = training.save_weights_and_get_sampling_client().result()
    warm = accuracy(sampler, tok, held)
    warm_sampled = accuracy(sampler, tok, held, temperature=1.0)

    start = time.monotonic()
    rewards = []
    for step in range(args.rl_steps):
        rows = rng.sample(train, args.groups)
        prompts = [tok.encode(p) for p, _ in rows]
        futures = [sampler.sample(types.ModelInput.from_ints(ids), args.group_size,  # seeded: a run repeats
                                  types.SamplingParams(max_tokens=6, temperature=1.0, seed=step * 10_000 + i))
                   for i, ids in enumerate(prompts)]
        batch = []
        for ids, (_, answer), fut in zip(prompts, rows, futures, strict=True):
            seqs = fut.result().sequences
            r = [1.0 if answer_of(tok, s) == answer else 0.0 for s in seqs]
            rewards.extend(r)
            mean = sum(r) / len(r)
            batch.extend(rl_datum(ids, s, ri - mean) for s, ri in zip(seqs, r, strict=True) if ri != mean)
        if batch:
            training.forward_backward(batch, "importance_sampling")
            training.optim_step(types.AdamParams(learning_rate=args.rl_lr))
        sampler = training.save_weights_and_get_sampling_client().result()
    rl_s = time.monotonic() - start
    result = {"warmup_accuracy": warm, "final_accuracy": accuracy(sampler, tok, held),
              "warmup_sampled_accuracy": warm_sampled, "final_sampled_accuracy": accuracy(sampler, tok, held, 1.0),
              "train_reward_mean": sum(rewards) / max(1, len(rewards)), "rl_steps": args.rl_steps,
              "s_per_rl_step": round(rl_s / max(1, args.rl_steps), 3)}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
