"""A remote (``http``) scorer probed once before anything depends on it: one item in the scorer's own protocol
(FleetRL ``/score`` or OpenRLHF ``/get_reward``), with its headers and key, and the reply read as a real call's
reply is read. A probe that cannot be scored is one line naming the scorer, its URL and what came back::

    reward scorer 'myrm' at http://127.0.0.1:5099/get_reward: cannot connect (Connection refused)
    reward scorer 'myrm' at http://127.0.0.1:5099/get_reward: answered 404: {"detail":"Not Found"}
    reward scorer 'myrm' at http://127.0.0.1:5099/get_reward: the reply has no rewards (it was {'ok': True})

Used by ``fleetrl run`` / ``fleetrl eval`` before any service starts (``deploy/run/preflight.py``) and by the
reward service at start (``services/reward/cli.py``); ``--skip-preflight`` / ``probe_remote_scorers: false``
for a server that cannot take a probe. Synchronous (httpx), so it runs before an event loop exists; the scorers
are probed side by side, each within its own limit.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import httpx

from services.reward.errors import ScorerFailure
from services.reward.scorers.http_remote import (
    PROTOCOLS,
    answered,
    first_error,
    request_headers,
    short_reason,
    where,
)
from shared.reward_api import ScoreItem

PROBE_ITEM = ScoreItem(prompt="1 + 1 = ", response="2", label="2")
PROBE_TIMEOUT_S = 30.0  # a remote model's first call may be slow; a wrong URL fails at once (connect refused, 404)
CONNECT_TIMEOUT_S = 5.0


def probe_problem(config, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """One line when the http scorer ``config`` cannot score :data:`PROBE_ITEM`, else None. Raises nothing."""
    limit = min(config.timeout_s, timeout_s)
    protocol = PROTOCOLS[config.protocol]
    try:
        with httpx.Client(timeout=httpx.Timeout(limit, connect=min(limit, CONNECT_TIMEOUT_S)),
                          headers=request_headers(config)) as client:
            response = client.post(config.url, json=protocol.payload([PROBE_ITEM]))
    except httpx.TimeoutException:
        return f"{where(config)}: did not answer a probe within {limit:g} s (a slow server: raise timeout_s)"
    except httpx.ConnectError as exc:
        return f"{where(config)}: cannot connect ({short_reason(exc)})"
    except httpx.HTTPError as exc:
        return f"{where(config)}: {type(exc).__name__}: {short_reason(exc)}"
    if response.status_code != 200:
        return f"{where(config)}: {answered(response, 160)}"
    try:
        body = response.json()
    except ValueError:
        return f"{where(config)}: the reply is not JSON: {response.text[:120]!r}"
    try:
        protocol.values(body, 1)
    except ScorerFailure as exc:
        return f"{where(config)}: {exc.message}"
    except ValueError as exc:  # pydantic's ValidationError: a FleetRL reply of the wrong shape
        return f"{where(config)}: the reply is not what the {config.protocol} protocol says: " \
               f"{first_error(exc)}"
    return None


def probe_problems(configs: Sequence, timeout_s: float = PROBE_TIMEOUT_S) -> list[str]:
    """One line per ``http`` scorer of ``configs`` (other kinds are skipped) that cannot score a probe."""
    remote = [c for c in configs if getattr(c, "kind", None) == "http"]
    if not remote:
        return []
    with ThreadPoolExecutor(max_workers=min(8, len(remote))) as pool:
        found = list(pool.map(lambda c: probe_problem(c, timeout_s), remote))
    return [p for p in found if p]
