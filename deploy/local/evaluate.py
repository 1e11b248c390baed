"""Greedy held-out accuracy of whatever policy a rollout service serves, judged by the reward service."""

from __future__ import annotations

from dataclasses import dataclass

import httpx

SUCCESS_THRESHOLD = 1.0
"""An answer is correct when its reward is at least this (``eval.success_threshold``; 1.0: full credit)."""


def one_version(versions: set[str], mixed_ok: bool = False) -> str:
    """The weight version a pass's answers came from; with ``mixed_ok``, several (the fleet updated mid-pass)
    are said as their range, ``"83-84"``, else they raise RuntimeError."""
    if len(versions) == 1:
        return next(iter(versions))
    if not mixed_ok or not versions:
        raise RuntimeError(f"held-out answers came from several weight versions: {sorted(versions)}")
    ordered = sorted(versions, key=lambda v: (len(v), v))  # numeric strings in numeric order
    return f"{ordered[0]}-{ordered[-1]}"


def generate(client: httpx.Client, rollout_url: str, rows: list[dict], params: dict) -> list[dict]:
    """``/generate`` outputs for ``rows``, prompt-major (``params["n"]`` per row): a row with ``input_ids`` (a
    chat prompt rendered by :mod:`shared.chat_prompt`) goes as its ids, the others as their ``input`` text — at
    most two calls."""
    n = int(params.get("n", 1))
    out: list[dict | None] = [None] * (len(rows) * n)
    by_ids = [i for i, row in enumerate(rows) if row.get("input_ids") is not None]
    by_text = [i for i, row in enumerate(rows) if row.get("input_ids") is None]
    for idx, field in ((by_ids, "input_ids"), (by_text, "text")):
        if not idx:
            continue
        prompts = [rows[i]["input_ids"] if field == "input_ids" else rows[i]["input"] for i in idx]
        r = client.post(f"{rollout_url}/generate", json={field: prompts, "sampling_params": params})
        raise_for_rollout(r)
        got = r.json()
        for k, i in enumerate(idx):
            out[i * n:(i + 1) * n] = got[k * n:(k + 1) * n]
    return out  # type: ignore[return-value]


def raise_for_rollout(response: httpx.Response) -> None:
    """An error reply of a rollout service as an HTTPStatusError whose message is the service's own words
    (``the rollout service answered 400: prompt (10 tokens) + max_new_tokens (100) exceeds the context length 64;
    ...``), not httpx's
    ``Client error '400 Bad Request' for url ...``, which hid why."""
    if response.is_success:
        return
    try:
        detail = response.json().get("detail")
    except (ValueError, AttributeError):
        detail = None
    said = detail.splitlines()[0] if isinstance(detail, str) and detail else " ".join(response.text.split())[:200]
    hint = " (sampling.max_new_tokens in the spec)" if "max_new_tokens" in said else ""  # held-out uses the spec's
    raise httpx.HTTPStatusError(f"the rollout service answered {response.status_code}: {said}{hint}",
                                request=response.request, response=response)


def reward_prompt(row: dict):
    """What the reward service is given as a held-out row's prompt: its chat messages (as in training), or text."""
    return row.get("prompt", row["input"])


class RewardUnavailable(Exception):
    """The reward service could not score held-out answers; the message names the user's scorer and its URL
    (what the reward service said), never the reward service's own port or a client library's text."""


def score(client: httpx.Client, reward_url: str, items: list[dict], headers: dict[str, str] | None = None) -> list:
    """``/score`` of ``items``: their scores (None for a marked failure). A failed call raises
    :class:`RewardUnavailable` with the reward service's own words (which scorer, which URL, why)."""
    try:
        s = client.post(f"{reward_url}/score", headers=headers or {}, json={"items": items})
    except httpx.TransportError as exc:
        raise RewardUnavailable(f"the reward service does not answer ({type(exc).__name__}); its log says why") \
            from exc
    if s.status_code != 200:
        raise RewardUnavailable(reward_error_line(s))
    return s.json()["scores"]


def reward_error_line(response: httpx.Response) -> str:
    """A reward service's error reply in one line: the ``detail`` of its envelope (it names each failing scorer
    and its URL: ``reward scorer 'myrm' at http://host:5099/get_reward failed after 3 tries: cannot connect``)."""
    try:
        detail = response.json().get("detail")
    except (ValueError, AttributeError):
        detail = None
    if isinstance(detail, str) and detail:
        return detail.splitlines()[0]
    return f"the reward service answered {response.status_code}: {' '.join(response.text.split())[:200]}"


@dataclass
class GreedyPass:
    """One greedy pass over held-out rows: accuracy (the share of rewards >= ``success_threshold``), the mean
    reward, the weight version the answers came from, and every answer (prompt, completion, reward, tokens)."""

    accuracy: float
    mean_reward: float | None
    weight_version: str
    samples: list[dict]


def greedy_pass(rollout_url: str, reward_url: str, rows: list[dict], *, max_new_tokens: int = 8,
                batch: int = 100, timeout: float = 300.0, mixed_ok: bool = False,
                reward_token: str | None = None, success_threshold: float = SUCCESS_THRESHOLD) -> GreedyPass:
    """Generate greedily for each row (its ``input_ids``, else its ``input`` text) through /generate, score
    against ``label`` with /score. An answer is correct when its reward is >= ``success_threshold``; an answer
    the reward service marked failed (score null) counts as wrong and is left out of the mean."""
    correct = 0
    rewards: list[float] = []
    samples: list[dict] = []
    versions: set[str] = set()
    auth = {"Authorization": f"Bearer {reward_token}"} if reward_token else {}  # the reward's auth_token
    with httpx.Client(timeout=timeout) as client:
        for i in range(0, len(rows), batch):
            chunk = rows[i:i + batch]
            outs = generate(client, rollout_url, chunk, {"temperature": 0.0, "max_new_tokens": max_new_tokens})
            versions.update(str(o["meta_info"]["weight_version"]) for o in outs)
            scores = score(client, reward_url, [
                {"prompt": reward_prompt(row), "response": o["text"], "label": row["label"],
                 "metadata": row.get("metadata", {})} for row, o in zip(chunk, outs)], auth)
            for row, o, v in zip(chunk, outs, scores):
                correct += int(v is not None and v >= success_threshold)
                rewards.extend([float(v)] if v is not None else [])
                meta = o.get("meta_info") or {}
                samples.append({"prompt": row["input"], "completion": o["text"], "label": row.get("label"),
                                "reward": v, "tokens": meta.get("completion_tokens"),
                                "hit_max_new_tokens": (meta.get("finish_reason") or {}).get("type") == "length"})
    return GreedyPass(correct / len(rows), sum(rewards) / len(rewards) if rewards else None,
                      one_version(versions, mixed_ok), samples)


def greedy_accuracy(rollout_url: str, reward_url: str, rows: list[dict], *, max_new_tokens: int = 8,
                    batch: int = 100, timeout: float = 300.0, mixed_ok: bool = False,
                    reward_token: str | None = None) -> tuple[float, str]:
    """(accuracy, weight_version) of :func:`greedy_pass` at the default success threshold."""
    p = greedy_pass(rollout_url, reward_url, rows, max_new_tokens=max_new_tokens, batch=batch, timeout=timeout,
                    mixed_ok=mixed_ok, reward_token=reward_token)
    return p.accuracy, p.weight_version
