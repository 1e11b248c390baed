"""Shared plumbing of sinks whose engine server receives the broadcast itself (SGLang, vLLM)."""

from __future__ import annotations

import re
from typing import Any

import httpx

from services.rollout.weights.sinks.base import RoundFailed, WeightSink

# added to a call's own collective / init bound so that the server answers before we give up on it
HTTP_SLACK_S = 15.0


def release(text: str) -> tuple[int, ...] | None:
    """An engine server's release as numbers: ``"0.5.4.post3"`` -> ``(0, 5, 4)``; None when it is not one."""
    m = re.match(r"v?(\d+)\.(\d+)(?:\.(\d+))?", text or "")
    return tuple(int(x or 0) for x in m.groups()) if m else None


class RemoteEngineSink(WeightSink):
    """Calls the engine server's weight endpoints with the engine's own ``httpx.AsyncClient``.

    If a round breaks after the server started loading, its weights may be partly updated: the sink
    keeps generation paused (``dirty``) until a later round completes, so mixed weights never serve."""

    def __init__(self, engine: Any, settings: Any) -> None:
        super().__init__(engine, settings)
        self.group_name: str | None = None
        self.dirty = False

    async def call(self, path: str, body: dict | None, timeout_s: float, params: dict | None = None,
                   absent_ok: bool = False, method: str = "POST") -> dict | None:
        """One call to the server's API; ``absent_ok``: a route this server release does not serve (404) gives
        None instead of :class:`RoundFailed` (the caller then speaks the older protocol)."""
        url = f"{str(self.engine.base_url).rstrip('/')}{path}"
        try:
            r = await self.engine.client.request(method, url, json=body, params=params, timeout=timeout_s)
        except httpx.HTTPError as exc:
            raise RoundFailed(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
        if r.status_code == 404 and absent_ok:
            return None
        if r.status_code >= 400:
            raise RoundFailed(f"{method} {path}: HTTP {r.status_code}: {r.text[:500]}")
        try:
            data = r.json() if r.content else {}
        except ValueError:
            data = {}
        if isinstance(data, dict) and data.get("success") is False:
            raise RoundFailed(f"{method} {path}: {data.get('message', 'failed')}")
        return data if isinstance(data, dict) else {}

    async def _pause(self) -> None:
        await self.paused().__aenter__()

    async def _resume(self) -> None:
        if not self.dirty:
            await self.engine.resume()
