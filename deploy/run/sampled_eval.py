"""Sampled held-out accuracy and pass@k: ``k`` samples per prompt from a rollout service, each judged by the
reward service (a reward >= eval.success_threshold, default 1.0, is correct), summarised with the unbiased pass@k estimator of Chen et al.
(2021): per prompt with ``n`` samples of which ``c`` are correct, ``1 - C(n-c, k) / C(n, k)``, averaged."""

from __future__ import annotations

from math import comb
from typing import Any

import httpx

from deploy.local.evaluate import SUCCESS_THRESHOLD, generate, reward_prompt, score


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimate of the chance that at least one of ``k`` samples is correct, from ``n`` samples of which
    ``c`` were correct (``k <= n``)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n (n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def ks_for(n: int) -> list[int]:
    """The k reported for n samples per prompt: 1, 2, 4, ... up to n, and n itself."""
    ks, k = [], 1
    while k < n:
        ks.append(k)
        k *= 2
    return [*ks, n]


def sampled_accuracy(rollout_url: str, reward_url: str, rows: list[dict], *, samples: int, max_new_tokens: int,
                     temperature: float = 1.0, top_p: float = 1.0, seed: int | None = None, batch: int = 100,
                     timeout: float = 300.0, success_threshold: float = SUCCESS_THRESHOLD,
                     answers_out: list[dict] | None = None) -> dict[str, Any]:
    """``samples`` answers per row (``{"input", "label", "metadata"?}``) sampled at ``temperature`` / ``top_p``
    (``n`` = ``samples`` per prompt; with ``seed``, answer j of every prompt uses ``seed + j``, so the same
    model gives the same answers again); returns ``{"samples_per_prompt", "temperature", "top_p", "seed",
    "accuracy" (mean over all samples), "pass_at_k" ({k: estimate}), "weight_versions"}``. ``answers_out``, when
    given, gets every sampled answer, prompt-major: ``{"prompt", "completion", "label", "reward", "sample" (j)}``
    (what ``fleetrl eval --samples`` writes to ``sampled.jsonl``; e.g. on-policy preference pairs are built from
    it, ``deploy/local/sort_prefs.py --policy-samples``)."""
    if samples < 1:
        raise ValueError(f"--samples {samples}: sample at least one answer per prompt")
    correct = [0] * len(rows)
    versions: set[str] = set()
    params: dict[str, Any] = {"temperature": temperature, "top_p": top_p, "max_new_tokens": max_new_tokens,
                              "n": samples}
    if seed is not None:
        params["sampling_seed"] = seed
    per_call = max(1, batch // samples)  # prompts per /generate call: about ``batch`` answers
    with httpx.Client(timeout=timeout) as client:
        for at in range(0, len(rows), per_call):
            chunk = list(enumerate(rows[at:at + per_call], start=at))
            outs = generate(client, rollout_url, [row for _, row in chunk], params)  # prompt-major
            versions.update(str(o["meta_info"]["weight_version"]) for o in outs)
            judged = [(i, row) for i, row in chunk for _ in range(samples)]
            scores = score(client, reward_url, [
                {"prompt": reward_prompt(row), "response": o["text"], "label": row["label"],
                 "metadata": row.get("metadata", {})} for (_, row), o in zip(judged, outs, strict=True)])
            for j, ((i, row), o, v) in enumerate(zip(judged, outs, scores, strict=True)):
                correct[i] += int(v is not None and v >= success_threshold)
                if answers_out is not None:
                    answers_out.append({"prompt": row["input"], "completion": o["text"], "label": row.get("label"),
                                        "reward": v, "sample": j % samples})
    n = len(rows)
    return {
        "samples_per_prompt": samples, "temperature": temperature, "top_p": top_p, "seed": seed,
        "accuracy": sum(correct) / (n * samples),
        "pass_at_k": {str(k): sum(pass_at_k(samples, c, k) for c in correct) / n for k in ks_for(samples)},
        "weight_versions": sorted(versions),
    }
