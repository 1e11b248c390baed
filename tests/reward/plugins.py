"""User reward functions the tests load by import path (tests.reward.plugins:<name>)."""

from __future__ import annotations

import asyncio
import time


def openrlhf_sync(queries, prompts, labels, bonus: float = 0.0, **kwargs):
    """OpenRLHF signature, sync: 1 + bonus when the response (query minus prompt) equals the label."""
    rewards = [(1.0 + bonus) if q[len(p):].strip() == str(lab) else 0.0 for q, p, lab in zip(queries, prompts, labels)]
    return {"rewards": rewards, "scores": rewards, "extra_logs": {"n": [len(queries)] * len(queries)}}


async def openrlhf_async(queries, prompts, labels, **kwargs):
    """OpenRLHF signature, async: number of characters of the response."""
    await asyncio.sleep(0.01)
    return {"rewards": [float(len(q) - len(p)) for q, p in zip(queries, prompts)]}


def verl_sync(data_source, solution_str, ground_truth, extra_info=None):
    """verl signature, sync, returns a float: 1.0 on an exact match; data_source 'neg' flips the sign."""
    value = 1.0 if solution_str.strip() == str(ground_truth) else 0.0
    return -value if data_source == "neg" else value


async def verl_async(data_source, solution_str, ground_truth, extra_info=None):
    """verl signature, async, returns a dict: score = extra_info['scale'] (default 2.0)."""
    await asyncio.sleep(0.01)
    return {"score": float((extra_info or {}).get("scale", 2.0)), "note": "logged, not scored"}


def verl_blocking(data_source, solution_str, ground_truth, extra_info=None):
    """Blocks its thread for extra_info['sleep_s'] seconds (must not stall the event loop)."""
    time.sleep(float((extra_info or {}).get("sleep_s", 0.0)))
    return 0.5


def verl_raises(data_source, solution_str, ground_truth, extra_info=None):
    raise RuntimeError("user function exploded")


def verl_nan(data_source, solution_str, ground_truth, extra_info=None):
    return float("nan")


async def verl_slow_async(data_source, solution_str, ground_truth, extra_info=None):
    """verl signature, async: waits extra_info['sleep_s'] seconds (a slow verifier or judge), then 1.0."""
    await asyncio.sleep(float((extra_info or {}).get("sleep_s", 0.0)))
    return 1.0


def verl_dies(data_source, solution_str, ground_truth, extra_info=None):
    """Ends its own process (a crashing native extension, say)."""
    import os

    os._exit(3)


def verl_keyed(data_source, solution_str, ground_truth, extra_info=None, api_key: str = ""):
    """Like verl_blocking, with a keyword argument from the config's kwargs (a secret GET /scorers must not show)."""
    assert api_key, "kwargs did not reach the function"
    return verl_blocking(data_source, solution_str, ground_truth, extra_info)
