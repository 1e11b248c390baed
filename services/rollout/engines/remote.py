"""Base of engines that drive an engine server (SGLang, vLLM) over its public HTTP API only.

``base_url`` and ``client`` (one shared ``httpx.AsyncClient`` with timeouts and a bounded pool) are
public: the weight-sync sidecar calls the server's own weight-update endpoints through them.
Aborting a sequence closes its HTTP request (both servers abort a request whose client went away);
subclasses may also call the server's abort endpoint.

Health checks and abort calls go through ``control``, a second client with a small pool of its own: with
``max_connections`` generations streaming, ``client``'s pool is full, and a health check waiting for a
free connection there would report a busy server as dead. The servers' own health routes answer while
they generate (vLLM ``/health``; SGLang ``/health_generate`` succeeds on any recent progress).
"""

from __future__ import annotations

import asyncio
import json
import logging
from abc import abstractmethod
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing

import httpx

from services.rollout.engines.base import Engine, EngineUnavailable
from services.rollout.engines.settings import RemoteEngineSettings
from services.rollout.engines.types import Finish, SequenceDelta, SequenceRequest

log = logging.getLogger(__name__)

_CONTROL_CONNECTIONS = 8


class RemoteEngine(Engine):
    settings: RemoteEngineSettings

    def __init__(self, settings: RemoteEngineSettings, model_path: str) -> None:
        super().__init__(settings, model_path)
        self.base_url: str = settings.base_url
        self.client: httpx.AsyncClient | None = None
        self._control: httpx.AsyncClient | None = None
        self._aborts: dict[str, asyncio.Event] = {}
        #: the LoRA adapter requests name (the sidecar's adapter rounds load one per version), None: the base model
        self.adapter: str | None = None

    def use_adapter(self, version: int, name: str) -> None:
        """Serve ``version`` as the server's loaded adapter ``name`` (an adapter round). Both change together, with
        no await between, so a request's recorded ``weight_version`` is that of the adapter it names."""
        super().set_weight_version(version)
        self.adapter = name

    def set_weight_version(self, v: int) -> None:
        """A whole version (full round): requests name the served model again."""
        super().set_weight_version(v)
        self.adapter = None

    async def _start(self) -> None:
        s = self.settings
        headers = {"Authorization": f"Bearer {s.api_key.get_secret_value()}"} if s.api_key else {}
        self.client = httpx.AsyncClient(
            base_url=self.base_url, headers=headers,
            timeout=httpx.Timeout(s.request_timeout_s, connect=s.connect_timeout_s),
            limits=httpx.Limits(max_connections=s.max_connections, max_keepalive_connections=s.max_connections),
        )
        self._control = httpx.AsyncClient(
            base_url=self.base_url, headers=headers,
            timeout=httpx.Timeout(s.health_timeout_s, connect=s.connect_timeout_s),
            limits=httpx.Limits(max_connections=_CONTROL_CONNECTIONS, max_keepalive_connections=_CONTROL_CONNECTIONS),
        )

    async def _stop(self) -> None:
        for client in (self.client, self._control):
            if client is not None:
                await client.aclose()
        self.client = self._control = None

    @property
    def control(self) -> httpx.AsyncClient:
        """The client of the server's control routes (health, aborts, weights); EngineUnavailable when closed."""
        if self._control is None:
            raise EngineUnavailable("the engine client is closed")
        return self._control

    @control.setter
    def control(self, client: httpx.AsyncClient) -> None:
        self._control = client

    async def _stream(self, request: SequenceRequest) -> AsyncGenerator[SequenceDelta, None]:
        if self.client is None:
            raise EngineUnavailable("the engine client is closed")
        # the adapter of the version Engine.stream just recorded (captured before the first await: a round that
        # loads the next adapter meanwhile does not change what this request runs on)
        adapter = self.adapter
        aborted = asyncio.Event()
        self._aborts[request.rid] = aborted
        waiter = asyncio.ensure_future(aborted.wait())
        try:
            async with aclosing(self._remote(request, adapter)) as deltas:
                while True:
                    nxt = asyncio.ensure_future(deltas.__anext__())
                    await asyncio.wait({nxt, waiter}, return_when=asyncio.FIRST_COMPLETED)
                    if not nxt.done():
                        nxt.cancel()
                        await asyncio.gather(nxt, return_exceptions=True)
                        yield SequenceDelta([], [], "", Finish("abort", message="aborted"))
                        return
                    try:
                        delta = nxt.result()
                    except StopAsyncIteration:
                        raise EngineUnavailable("the engine server ended the response without a finish reason") from None
                    yield delta
                    if delta.finish is not None:
                        return
        except httpx.HTTPError as exc:
            raise EngineUnavailable(f"engine server {self.base_url}: {type(exc).__name__}: {exc}") from exc
        finally:
            waiter.cancel()
            self._aborts.pop(request.rid, None)

    async def abort(self, rid: str) -> None:
        event = self._aborts.get(rid)
        if event is not None:
            event.set()
            await self._server_abort([rid])

    async def _abort_all(self) -> None:
        rids = list(self._aborts)
        for rid in rids:
            self._aborts[rid].set()
        await self._server_abort(rids)

    async def _server_abort(self, rids: list[str]) -> None:
        """Tell the server too (optional; closing the connection already aborts)."""

    # ---- helpers for subclasses --------------------------------------------------------------------
    @abstractmethod
    def _remote(self, request: SequenceRequest, adapter: str | None = None) -> AsyncGenerator[SequenceDelta, None]:
        """Send one sequence to the server (on LoRA adapter ``adapter``, None: the base model) and translate its
        reply into deltas."""

    def _client(self) -> httpx.AsyncClient:
        if self.client is None:
            raise EngineUnavailable("the engine client is closed")
        return self.client

    async def _post_json(self, path: str, payload: dict) -> dict:
        r = await self._client().post(path, json=payload)
        self._raise_for(r, path)
        return r.json()

    async def _post_sse(self, path: str, payload: dict) -> AsyncIterator[dict]:
        async with self._client().stream("POST", path, json=payload) as r:
            if r.status_code >= 400:
                await r.aread()
                self._raise_for(r, path)
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    return
                obj = json.loads(data)
                if isinstance(obj, dict) and "error" in obj and "choices" not in obj and "text" not in obj:
                    raise EngineUnavailable(f"engine server {self.base_url}{path} stream error: {obj['error']}")
                yield obj

    def _raise_for(self, r: httpx.Response, path: str) -> None:
        if r.status_code >= 400:
            raise EngineUnavailable(f"engine server {self.base_url}{path} answered {r.status_code}: {r.text[:500]}")
