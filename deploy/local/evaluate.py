"""Greedy held-out accuracy of whatever policy a rollout service serves, judged by the reward service."""

from __future__ import annotations

import httpx


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
        r.raise_for_status()
        got = r.json()
        for k, i in enumerate(idx):
            out[i * n:(i + 1) * n] = got[k * n:(k + 1) * n]
    return out  # type: ignore[return-value]


def reward_prompt(row: dict):
    """What the reward service is given as a held-out row's prompt: its chat messages (as in training), or text."""
    return row.get("prompt", row["input"])


def greedy_accuracy(rollout_url: str, reward_url: str, rows: list[dict], *, max_new_tokens: int = 8,
                    batch: int = 100, timeout: float = 300.0, mixed_ok: bool = False,
                    reward_token: str | None = None) -> tuple[float, str]:
    """Generate greedily for each row (its ``input_ids``, else its ``input`` text) through /generate, score
    against ``label`` with /score.

    Returns (accuracy, weight_version the answers came from; see :func:`one_version` for ``mixed_ok``).
    """
    correct = 0.0
    versions: set[str] = set()
    auth = {"Authorization": f"Bearer {reward_token}"} if reward_token else {}  # the reward's auth_token
    with httpx.Client(timeout=timeout) as client:
        for i in range(0, len(rows), batch):
            chunk = rows[i:i + batch]
            outs = generate(client, rollout_url, chunk, {"temperature": 0.0, "max_new_tokens": max_new_tokens})
            versions.update(str(o["meta_info"]["weight_version"]) for o in outs)
            s = client.post(f"{reward_url}/score", headers=auth, json={"items": [
                {"prompt": reward_prompt(row), "response": o["text"], "label": row["label"],
                 "metadata": row.get("metadata", {})} for row, o in zip(chunk, outs)
            ]})
            s.raise_for_status()
            correct += sum(1.0 for v in s.json()["scores"] if v is not None and v >= 0.999)
    return correct / len(rows), one_version(versions, mixed_ok)
