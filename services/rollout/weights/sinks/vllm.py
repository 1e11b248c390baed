"""vLLM: the native weight-transfer API (server started with ``VLLM_SERVER_DEV_MODE=1`` and
``--weight-transfer-config '{"backend":"nccl"}'``): ``/init_weight_transfer_engine`` when a new group
forms, then per round ``/start_weight_update`` -> ``/update_weights`` (packed: the buckets of the
manifest, whose boundaries follow vLLM's packing rule with ``packed_buffer_size_bytes`` =
``bucket_bytes``; the call returns when the broadcast is done) -> ``/finish_weight_update``."""

from __future__ import annotations

from services.rollout.weights.sinks.base import RoundFailed, UpdateRefused
from services.rollout.weights.sinks.remote import HTTP_SLACK_S, RemoteEngineSink
from shared.weight_sync.receiver import RoundWatcher
from shared.weight_sync.wire import Manifest, Member, Rendezvous


class VLLMSink(RemoteEngineSink):
    kind = "vllm"
    group_kind = "pynccl"  # vLLM's NCCLWeightTransferEngine joins a StatelessProcessGroup + PyNcclCommunicator

    async def run_round(self, rdv: Rendezvous, member: Member, manifest: Manifest, watcher: RoundWatcher) -> None:
        await self._pause()
        try:
            if self.group_name != rdv.group_name:
                if not rdv.fresh_group:
                    raise RoundFailed(f"round {rdv.round} reuses group {rdv.group_name}, which this server is not in")
                await self.call("/init_weight_transfer_engine", {"init_info": {
                    "master_address": rdv.master_addr, "master_port": rdv.master_port,
                    "rank_offset": member.rank, "world_size": rdv.world_size,
                }}, rdv.init_timeout_s + HTTP_SLACK_S)
                self.group_name = rdv.group_name
            await self.call("/start_weight_update", {}, HTTP_SLACK_S)
            self.dirty = True
            entries = [e for b in manifest.buckets for e in b.tensors]
            await self.call("/update_weights", {"update_info": {
                "names": [e.name for e in entries], "dtype_names": [e.dtype for e in entries],
                "shapes": [list(e.shape) for e in entries], "packed": True,
                "packed_buffer_size_bytes": manifest.bucket_bytes, "packed_num_buffers": 2,
            }}, rdv.collective_timeout_s * max(1, len(manifest.buckets)) + HTTP_SLACK_S)
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
