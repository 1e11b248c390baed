"""Drive a running SGLang server through its HTTP API (``/generate``, ``/health_generate``,
``/model_info``, ``/abort_request``). No SGLang import in this process. Prompt logprobs: the server's own
``/generate`` with ``max_new_tokens: 0``, ``return_logprob`` and ``logprob_start_len``."""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator

import httpx

from services.rollout.engines.base import EngineUnavailable
from services.rollout.engines.remote import RemoteEngine
from services.rollout.engines.settings import SGLangEngineSettings
from services.rollout.engines.types import FEATURES, Finish, SamplingParams, SequenceDelta, SequenceRequest

log = logging.getLogger(__name__)


def parse_finish(obj: dict | None, n_tokens: int) -> Finish | None:
    if obj is None:
        return None
    kind = obj.get("type")
    if kind == "stop":
        return Finish("stop", matched=obj.get("matched"))
    if kind == "length":
        return Finish("length", length=obj.get("length", n_tokens))
    return Finish("abort", message=str(obj.get("message") or kind))


def _features(p: SamplingParams) -> dict:
    """The optional features a sequence uses, in SGLang's ``sampling_params`` names (only those not at their
    default, so a server that predates one is not sent it unless asked)."""
    out: dict = {}
    for name in p.features_used():
        if name == "grammar" and p.grammar is not None:
            kind, spec = p.grammar.kind, p.grammar.spec
            out.update({"json_schema": '{"type": "object"}'} if kind == "json_object" else {kind: spec})
        else:
            value = getattr(p, name)
            out[name] = list(value) if isinstance(value, tuple) else value
    return out


class SGLangEngine(RemoteEngine):
    settings: SGLangEngineSettings
    kind = "sglang"
    honours = frozenset(FEATURES)  # SGLang defines every one of them (0.5.x)
    weight_sink = "services.rollout.weights.sinks.sglang:SGLangSink"  # the server's own weight-update API
    scores_prompts = True

    async def prompt_logprobs(self, prompt_ids: list[int], start: int,
                              admit_timeout: float | None = None) -> list[float | None]:
        await self._admit(admit_timeout)
        if self.client is None:
            raise EngineUnavailable("the engine client is closed")
        body = {"input_ids": list(prompt_ids), "sampling_params": {"max_new_tokens": 0}, "return_logprob": True,
                "logprob_start_len": start}
        try:
            out = await self._post_json("/generate", body)
        except httpx.HTTPError as exc:
            raise EngineUnavailable(f"engine server {self.base_url}: {type(exc).__name__}: {exc}") from exc
        rows = (out.get("meta_info") or {}).get("input_token_logprobs") or []
        return [None if row[0] is None else float(row[0]) for row in rows]

    async def _start(self) -> None:
        await super()._start()
        try:  # adopt the server's weight version when it is an integer (SGLang's default is "default")
            r = await self.control.get("/model_info")
            version = r.json().get("weight_version") if r.status_code == 200 else None
            if isinstance(version, str) and version.isdigit():
                self.set_weight_version(int(version))
        except Exception as exc:  # noqa: BLE001 - the server may not be up yet; health will say so
            log.info("SGLang server not reachable yet at %s: %r", self.base_url, exc)

    async def _probe(self) -> bool:
        r = await self.control.get("/health_generate")
        return r.status_code == 200

    async def _server_abort(self, rids: list[str]) -> None:
        for rid in rids:
            try:
                await self.control.post("/abort_request", json={"rid": rid})
            except Exception as exc:  # noqa: BLE001 - best effort: closing the request aborts it anyway
                log.warning("SGLang /abort_request %s failed: %r", rid, exc)

    def payload(self, request: SequenceRequest, adapter: str | None = None) -> dict:
        p = request.params
        sp = {
            "max_new_tokens": p.max_new_tokens, "temperature": p.temperature, "top_p": p.top_p, "top_k": p.top_k,
            "min_p": p.min_p, "stop": list(p.stop), "stop_token_ids": list(p.stop_token_ids),
            "ignore_eos": p.ignore_eos, "skip_special_tokens": p.skip_special_tokens, "no_stop_trim": p.no_stop_trim,
        }
        if p.seed is not None:
            sp["sampling_seed"] = p.seed
        sp.update(_features(p))
        body = {"input_ids": list(request.prompt_ids), "sampling_params": sp, "return_logprob": True,
                "stream": request.stream, "rid": request.rid}
        if p.top_logprobs:
            body["top_logprobs_num"] = p.top_logprobs
        if adapter is not None:
            body["lora_path"] = adapter  # a loaded LoRA adapter, by the name it was loaded under
        return body

    async def _remote(self, request: SequenceRequest, adapter: str | None = None) -> AsyncGenerator[SequenceDelta, None]:
        body = self.payload(request, adapter)
        if not request.stream:
            out = await self._post_json("/generate", body)
            yield self._delta(out, 0, "")
            return
        seen_ids, seen_text = 0, ""
        incremental = self.settings.incremental_streaming_output
        async for chunk in self._post_sse("/generate", body):
            delta = self._delta(chunk, 0 if incremental else seen_ids, "" if incremental else seen_text)
            if not incremental:
                seen_ids += len(delta.token_ids)
                seen_text = chunk.get("text") or ""
            yield delta
            if delta.finish is not None:
                return

    def _delta(self, obj: dict, seen_ids: int, seen_text: str) -> SequenceDelta:
        meta = obj.get("meta_info") or {}
        ids = list(obj.get("output_ids") or [])[seen_ids:]
        lps_raw = (meta.get("output_token_logprobs") or [])[seen_ids:]
        text = obj.get("text") or ""
        text = text[len(seen_text):] if text.startswith(seen_text) else ""
        tops = None
        if meta.get("output_top_logprobs") is not None:
            tops = [[(int(t[1]), float(t[0])) for t in row or []] for row in meta["output_top_logprobs"][seen_ids:]]
        finish = parse_finish(meta.get("finish_reason"), seen_ids + len(ids))
        return SequenceDelta(ids, [float(t[0]) for t in lps_raw], text, finish, tops)
