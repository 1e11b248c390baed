"""SGLang: the server's TP ranks join the group (``/init_weights_update_group``, ranks ``rank_offset +
tp_rank``) and receive one flat bucket per ``/update_weights_from_distributed`` call
(``load_format: "flattened_bucket"``): one control call per bucket, never one per parameter. The last
call carries ``weight_version`` and flushes the cache. The group is kept between rounds and replaced
(``/destroy_weights_update_group``) when the publisher forms a new one.

Spoken as SGLang 0.5.23 serves it. ``load_format`` on ``/update_weights_from_distributed`` came with 0.5.6; an
older server ignores the field and waits for one broadcast per tensor, so the bytes of a flat bucket would land
in the wrong tensors. Before it first joins a group the sink reads the server's release (``GET /server_info``,
``/get_server_info`` before 0.5.23) and refuses one older than 0.5.6, naming it. Generation through the
sglang engine works with those releases too (0.5.4's ``/generate`` takes every field the engine sends)."""

from __future__ import annotations

from services.rollout.weights.receiver import RoundWatcher
from services.rollout.weights.sinks.base import RoundFailed, UpdateRefused
from services.rollout.weights.sinks.remote import HTTP_SLACK_S, RemoteEngineSink, release
from shared.weight_sync.wire import Manifest, Member, Rendezvous

FLAT_BUCKETS_SINCE = (0, 5, 6)  # the first SGLang release whose distributed update takes load_format



class SGLangSink(RemoteEngineSink):
    """The sglang engine's sink (``SGLangEngine.weight_sink``): the server joins the group (module docstring)."""
    adapter_load, adapter_unload = "/load_lora_adapter", "/unload_lora_adapter"  # the server's runtime LoRA API

    def __init__(self, engine, settings) -> None:
        super().__init__(engine, settings)
        self.server_version: str | None = None  # the server's release, once read

    async def _check_release(self) -> None:
        if self.server_version is None:
            info = await self.call("/server_info", None, HTTP_SLACK_S, absent_ok=True, method="GET")
            if info is None:  # before 0.5.23
                info = await self.call("/get_server_info", None, HTTP_SLACK_S, absent_ok=True, method="GET") or {}
            self.server_version = str(info.get("version") or "unknown")
        got = release(self.server_version)
        if got is not None and got < FLAT_BUCKETS_SINCE:
            raise UpdateRefused(
                f"SGLang {self.server_version} at {self.engine.base_url} cannot take flat buckets over the collective "
                "(/update_weights_from_distributed has load_format since 0.5.6): run SGLang >= 0.5.6 (FleetRL speaks "
                "0.5.23), or turn this replica's weight sync off (weights.enabled: false)")

    async def run_round(self, rdv: Rendezvous, member: Member, manifest: Manifest, watcher: RoundWatcher) -> None:
        if manifest.adapter is not None:
            await self.run_adapter_round(rdv, member, manifest, watcher)
            return
        await self._check_release()
        await self._pause()
        try:
            if rdv.fresh_group or self.group_name != rdv.group_name:  # (a fresh group may reuse a name)
                await self._leave()
                if not rdv.fresh_group:
                    raise RoundFailed(f"round {rdv.round} reuses group {rdv.group_name}, which this server is not in")
                await self.call("/init_weights_update_group", {
                    "master_address": rdv.master_addr, "master_port": rdv.master_port, "rank_offset": member.rank,
                    "world_size": rdv.world_size, "group_name": rdv.group_name, "backend": rdv.backend,
                }, rdv.init_timeout_s + HTTP_SLACK_S)
                self.group_name = rdv.group_name
            self.dirty = True
            last = len(manifest.buckets) - 1
            for b in manifest.buckets:
                body = {
                    "names": [e.name for e in b.tensors], "dtypes": [e.dtype for e in b.tensors],
                    "shapes": [list(e.shape) for e in b.tensors], "group_name": rdv.group_name,
                    "load_format": "flattened_bucket", "flush_cache": b.index == last,
                    "abort_all_requests": False,
                }
                if b.index == last:
                    body["weight_version"] = str(manifest.version)
                await self.call("/update_weights_from_distributed", body, rdv.collective_timeout_s + HTTP_SLACK_S)
            self.engine.set_weight_version(manifest.version)
            self.dirty = False
        except RoundFailed:
            self.group_name = None  # the server's group may be broken: form a new one next round
            raise
        finally:
            await self._resume()

    async def _leave(self) -> None:
        if self.group_name is not None:
            name, self.group_name = self.group_name, None
            try:
                await self.call("/destroy_weights_update_group", {"group_name": name}, HTTP_SLACK_S)
            except RoundFailed:
                pass  # a server without the group (restarted) has nothing to destroy

    async def load_snapshot(self, manifest: Manifest) -> None:
        raise UpdateRefused("the sglang sink loads over the collective only; set transport=collective")

    async def close(self) -> None:
        await self._leave()
