"""vLLM: the native weight-transfer API (vLLM >= 0.17, server started with ``VLLM_SERVER_DEV_MODE=1`` and
``--weight-transfer-config '{"backend":"nccl"}'``): ``/init_weight_transfer_engine`` when a new group
forms, then per round ``/start_weight_update`` -> ``/update_weights`` (packed: the buckets of the
manifest, whose boundaries follow vLLM's packing rule with ``packed_buffer_size_bytes`` =
``bucket_bytes``; the call returns when the broadcast is done) -> ``/finish_weight_update``.

The packed-transfer parameters moved between vLLM releases: older ones take them with each
``/update_weights``, newer ones once with ``/init_weight_transfer_engine`` (and refuse them per round).
The sink offers them at init; a server that refuses the field there gets them per round instead."""

from __future__ import annotations

from services.rollout.weights.receiver import RoundWatcher
from services.rollout.weights.sinks.base import RoundFailed, UpdateRefused
from services.rollout.weights.sinks.remote import HTTP_SLACK_S, RemoteEngineSink
from shared.weight_sync.wire import Manifest, Member, Rendezvous


class VLLMSink(RemoteEngineSink):
    group_kind = "pynccl"  # vLLM's NCCLWeightTransferEngine joins a StatelessProcessGroup + PyNcclCommunicator
    adapter_load, adapter_unload = "/v1/load_lora_adapter", "/v1/unload_lora_adapter"  # the server's runtime LoRA API

    def __init__(self, engine, settings) -> None:
        super().__init__(engine, settings)
        self.wire_at_init: bool | None = None  # where this server takes the packed parameters (None: unknown)

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

    async def run_round(self, rdv: Rendezvous, member: Member, manifest: Manifest, watcher: RoundWatcher) -> None:
        if manifest.adapter is not None:
            await self.run_adapter_round(rdv, member, manifest, watcher)
            return
        await self._pause()
        try:
            if rdv.fresh_group or self.group_name != rdv.group_name:  # (a fresh group may reuse a name)
                if not rdv.fresh_group:
                    raise RoundFailed(f"round {rdv.round} reuses group {rdv.group_name}, which this server is not in")
                await self._init(rdv, member, manifest)
                self.group_name = rdv.group_name
            await self.call("/start_weight_update", {}, HTTP_SLACK_S)
            self.dirty = True
            entries = [e for b in manifest.buckets for e in b.tensors]
            update = {"names": [e.name for e in entries], "dtype_names": [e.dtype for e in entries],
                      "shapes": [list(e.shape) for e in entries]}
            if not self.wire_at_init:
                update.update(self._wire(manifest))
            await self.call("/update_weights", {"update_info": update},
                            rdv.collective_timeout_s * max(1, len(manifest.buckets)) + HTTP_SLACK_S)
            await self.call("/finish_weight_update", {}, HTTP_SLACK_S)
            self.engine.set_weight_version(manifest.version)
            self.dirty = False
        except RoundFailed:
            self.group_name = None
            raise
        finally:
            await self._resume()

    async def load_snapshot(self, manifest: Manifest) -> None:
        raise UpdateRefused("the vllm sink loads over the collective only; set transport=collective")
