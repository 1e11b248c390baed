"""Shared plumbing of sinks whose engine server receives the broadcast itself (SGLang, vLLM)."""

from __future__ import annotations

import asyncio
import logging
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, ClassVar

import httpx

from services.rollout.weights.receiver import AbandonWatch, BucketReceiver, RoundWatcher
from services.rollout.weights.sinks.base import RoundFailed, UpdateRefused, WeightSink
from shared.weight_sync.wire import Manifest, Member, Rendezvous

log = logging.getLogger(__name__)

# added to a call's own collective / init bound so that the server answers before we give up on it
HTTP_SLACK_S = 15.0


def release(text: str) -> tuple[int, ...] | None:
    """An engine server's release as numbers: ``"0.5.4.post3"`` -> ``(0, 5, 4)``; None when it is not one."""
    m = re.match(r"v?(\d+)\.(\d+)(?:\.(\d+))?", text or "")
    return tuple(int(x or 0) for x in m.groups()) if m else None


class RemoteEngineSink(WeightSink):
    """Calls the engine server's weight endpoints with the engine's own ``httpx.AsyncClient``.

    If a round breaks after the server started loading, its weights may be partly updated: the sink
    keeps generation paused (``dirty``) until a later round completes, so mixed weights never serve.

    Adapter rounds (``weights.adapters: on``, the server started with LoRA enabled): the sidecar receives the
    adapter itself (a torch group of its own rank, not the server's), verifies it, writes it as a PEFT directory
    under ``adapter_dir`` and has the server load it under a name of its own per version (``fleetrl-v<N>``,
    :attr:`adapter_load`); requests then name that adapter (``RemoteEngine.use_adapter``), and each sample records
    the version whose adapter it ran on. The newest ``adapters_resident`` versions stay loaded (requests still
    running on an older one keep it); older ones are unloaded and their directories removed."""

    #: the server's adapter endpoints: load (body: lora_name, lora_path) and unload (body: lora_name)
    adapter_load: ClassVar[str] = ""
    adapter_unload: ClassVar[str] = ""

    def __init__(self, engine: Any, settings: Any) -> None:
        super().__init__(engine, settings)
        self.group_name: str | None = None
        self.dirty = False
        self.stale_versions = 2  # run.max_staleness + 1 (create_sidecar sets it)
        self.resident: list[tuple[int, str, Path]] = []  # adapter versions loaded in the server, oldest first
        self._adapter_receiver: BucketReceiver | None = None
        self._adapter_root: Path | None = None

    def adapters_to_keep(self) -> int:
        """Adapter versions kept loaded: ``adapters_resident``, else (0) ``run.max_staleness`` + 1
        (``stale_versions``, set by ``create_sidecar``); at least 2."""
        return max(2, self.settings.adapters_resident or self.stale_versions)

    def _root(self) -> Path:
        if self._adapter_root is None:
            if self.settings.adapter_dir:
                self._adapter_root = Path(self.settings.adapter_dir)
                self._adapter_root.mkdir(parents=True, exist_ok=True)
            else:
                self._adapter_root = Path(tempfile.mkdtemp(prefix="fleetrl-adapters-"))
        return self._adapter_root

    async def run_adapter_round(self, rdv: Rendezvous, member: Member, manifest: Manifest,
                                watcher: RoundWatcher) -> None:
        """Receive, verify, write and load one adapter version; then serve it and unload the oldest beyond
        :meth:`adapters_to_keep`. Generation is not paused: the requests running go on with their own adapter."""
        from services.rollout.weights.adapters import write_peft_dir
        from services.rollout.weights.receiver import RoundAbandoned
        from services.rollout.weights.sinks.hf import adapter_tensors

        assert manifest.adapter is not None
        if not self.adapter_load:
            raise UpdateRefused(f"the {getattr(self.engine, 'kind', '?')} sink has no adapter endpoint")
        if self._adapter_receiver is None:
            self._adapter_receiver = BucketReceiver(device="cpu" if rdv.backend == "gloo" else "cuda",
                                                    keep_staging=True, bind_addr=self.settings.bind_addr)
        receiver = self._adapter_receiver
        async with AbandonWatch(watcher.redis, watcher.run, rdv.round) as watch:
            receiving = asyncio.ensure_future(asyncio.to_thread(receiver.receive, rdv, member, manifest, watch.flag))
            try:
                got = await watch.outlast(receiving)
            except RoundAbandoned:
                if not receiving.done():
                    self._adapter_receiver = None
                raise
        try:
            got.verify(await watcher.checksums(rdv, manifest), required=self.settings.require_checksums)
            tensors = adapter_tensors(manifest, got.buffers)
        finally:
            receiver.recycle(got.buffers)
        if getattr(self.engine, "adapter", None) is None and self.engine.weight_version > 0:
            # a full round (a mixed fleet's merged one too) replaced the server's base: an adapter loaded now would
            # apply to those weights, not to the base; from now on this replica takes merged full rounds
            raise self._no_base_for(manifest.version, "the engine server")
        name = f"fleetrl-v{manifest.version}"
        path = self._root() / name
        try:
            await asyncio.to_thread(write_peft_dir, path, manifest.adapter, {k: v.cpu() for k, v in tensors.items()})
        except (OSError, ValueError) as exc:
            raise UpdateRefused(f"writing adapter version {manifest.version}: {exc}") from exc
        await self.call(self.adapter_load, {"lora_name": name, "lora_path": str(path)}, HTTP_SLACK_S + 60.0)
        self.resident.append((manifest.version, name, path))
        self.engine.use_adapter(manifest.version, name)  # new requests name it; sets the engine's weight_version
        while len(self.resident) > self.adapters_to_keep():
            _, old, old_path = self.resident.pop(0)
            try:
                await self.call(self.adapter_unload, {"lora_name": old}, HTTP_SLACK_S)
            except RoundFailed as exc:  # the version is served either way: an adapter left loaded is only memory
                log.warning("unloading adapter %s failed: %s", old, exc)
            shutil.rmtree(old_path, ignore_errors=True)

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
