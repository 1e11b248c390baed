"""vLLM: the native weight-transfer API (server started with ``VLLM_SERVER_DEV_MODE=1`` and
``--weight-transfer-config '{"backend":"nccl"}'``). Spoken as vLLM 0.33 serves it (``vllm/entrypoints/rl/online``),
with vLLM 0.17 kept working:

1. ``POST /pause?mode=abort`` - generation is already paused on our side (the sink pauses the rollout engine
   first, so none of our requests is left on the server); the server's own pause clears its prefix / KV caches
   once idle, so no cached prefix computed by the old weights is reused, and refuses other clients' requests
   until ``/resume`` (0.33: a retryable 503).
2. ``/init_weight_transfer_engine`` when a new group forms (0.33 takes the packed-transfer parameters
   ``packed``, ``packed_buffer_size_bytes`` = ``bucket_bytes``, ``packed_num_buffers`` here, once).
3. ``/start_weight_update`` -> ``/update_weights`` (names, dtype_names, shapes of the manifest's tensors; the
   buckets' boundaries follow vLLM's packing rule; the call returns when the broadcast is done) ->
   ``/finish_weight_update {"weight_version": "N"}`` (0.33 keeps the version: ``GET /weight_info``).
4. ``POST /resume``.

vLLM 0.17 serves neither ``/start_weight_update`` nor ``/finish_weight_update`` (its ``/update_weights`` alone
reloads layer by layer) and takes the packed-transfer parameters with each ``/update_weights`` (its init info
refuses them, with a bare HTTP 500: 0.17 does not say why). The sink reads the server's release first
(``GET /version``, served by both): 0.17.x and older get 0.17's protocol, 0.33 and newer 0.33's. A release in
between (not tested) is found out from its answers: a 404 for the session routes, an init refusal that names
``packed``.

If a round breaks after the server started loading, generation stays paused on both sides (``dirty``) until a
later round completes, so mixed weights never serve."""

from __future__ import annotations

import logging

from services.rollout.weights.receiver import RoundWatcher
from services.rollout.weights.sinks.base import RoundFailed, UpdateRefused
from services.rollout.weights.sinks.remote import HTTP_SLACK_S, RemoteEngineSink, release
from shared.weight_sync.wire import Manifest, Member, Rendezvous

log = logging.getLogger(__name__)


class VLLMSink(RemoteEngineSink):
    group_kind = "pynccl"  # vLLM's NCCLWeightTransferEngine joins a StatelessProcessGroup + PyNcclCommunicator
    adapter_load, adapter_unload = "/v1/load_lora_adapter", "/v1/unload_lora_adapter"  # the server's runtime LoRA API

    def __init__(self, engine, settings) -> None:
        super().__init__(engine, settings)
        self.wire_at_init: bool | None = None  # where this server takes the packed parameters (None: unknown)
        self.sessions: bool | None = None  # it serves /start_weight_update and /finish_weight_update (>= 0.18)
        self.server_paused = False
        self.server_version: str | None = None  # the server's release, once read

    async def _learn_release(self) -> None:
        if self.server_version is not None:
            return
        info = await self.call("/version", None, HTTP_SLACK_S, absent_ok=True, method="GET") or {}
        self.server_version = str(info.get("version") or "unknown")
        got = release(self.server_version)
        if got is not None and got < (0, 18):  # as the 0.17.0 wheel serves it
            self.wire_at_init, self.sessions = False, False
        elif got is not None and got >= (0, 33):  # as the 0.33.0 wheel serves it
            self.wire_at_init, self.sessions = True, True

    @staticmethod
    def _wire(manifest: Manifest) -> dict:
        return {"packed": True, "packed_buffer_size_bytes": manifest.bucket_bytes, "packed_num_buffers": 2}

    async def _init(self, rdv: Rendezvous, member: Member, manifest: Manifest) -> None:
        info = {"master_address": rdv.master_addr, "master_port": rdv.master_port,
                "rank_offset": member.rank, "world_size": rdv.world_size}
        timeout = rdv.init_timeout_s + HTTP_SLACK_S
        if self.wire_at_init is not False:
            try:
                await self.call("/init_weight_transfer_engine", {"init_info": {**info, **self._wire(manifest)}},
                                timeout)
                self.wire_at_init = True
                return
            except RoundFailed as exc:
                if "packed" not in str(exc):
                    raise
                self.wire_at_init = False  # an older release: the parameters go with every update
        await self.call("/init_weight_transfer_engine", {"init_info": info}, timeout)

    async def _start(self) -> None:
        """Open the server's update session (0.33); note a server without one (0.17). A session left open by a
        round that broke mid-update is closed first (0.33 refuses a second start)."""
        if self.sessions is False:
            return
        try:
            got = await self.call("/start_weight_update", {}, HTTP_SLACK_S, absent_ok=True)
        except RoundFailed as exc:
            if "already active" not in str(exc):
                raise
            log.warning("vLLM still had an update session open (a broken round): closing it and starting anew")
            await self.call("/finish_weight_update", {}, HTTP_SLACK_S)
            got = await self.call("/start_weight_update", {}, HTTP_SLACK_S)
        self.sessions = got is not None

    async def _server_pause(self) -> None:
        if not self.server_paused:
            await self.call("/pause", None, HTTP_SLACK_S, params={"mode": "abort"})
            self.server_paused = True

    async def _server_resume(self) -> None:
        if self.server_paused and not self.dirty:
            await self.call("/resume", None, HTTP_SLACK_S)
            self.server_paused = False

    async def run_round(self, rdv: Rendezvous, member: Member, manifest: Manifest, watcher: RoundWatcher) -> None:
        if manifest.adapter is not None:
            await self.run_adapter_round(rdv, member, manifest, watcher)
            return
        await self._learn_release()
        await self._pause()
        try:
            await self._server_pause()
            if rdv.fresh_group or self.group_name != rdv.group_name:  # (a fresh group may reuse a name)
                if not rdv.fresh_group:
                    raise RoundFailed(f"round {rdv.round} reuses group {rdv.group_name}, which this server is not in")
                await self._init(rdv, member, manifest)
                self.group_name = rdv.group_name
            await self._start()
            self.dirty = True
            entries = [e for b in manifest.buckets for e in b.tensors]
            update = {"names": [e.name for e in entries], "dtype_names": [e.dtype for e in entries],
                      "shapes": [list(e.shape) for e in entries]}
            if not self.wire_at_init:
                update.update(self._wire(manifest))
            await self.call("/update_weights", {"update_info": update},
                            rdv.collective_timeout_s * max(1, len(manifest.buckets)) + HTTP_SLACK_S)
            if self.sessions:
                await self.call("/finish_weight_update", {"weight_version": str(manifest.version)}, HTTP_SLACK_S)
            self.engine.set_weight_version(manifest.version)
            self.dirty = False
        except RoundFailed:
            self.group_name = None
            raise
        finally:
            try:
                await self._server_resume()
            finally:
                await self._resume()

    async def load_snapshot(self, manifest: Manifest) -> None:
        raise UpdateRefused("the vllm sink loads over the collective only; set transport=collective")

    async def close(self) -> None:
        """Release the server's side of the group (0.33's ``/shutdown_weight_transfer_engine``; 0.17 has none)."""
        if self.group_name is None:
            return
        self.group_name = None
        try:
            await self.call("/shutdown_weight_transfer_engine", {}, HTTP_SLACK_S, absent_ok=True)
        except RoundFailed as exc:
            log.info("vLLM /shutdown_weight_transfer_engine: %s", exc)
