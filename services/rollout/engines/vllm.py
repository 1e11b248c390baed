"""Drive a running vLLM OpenAI server through its HTTP API (``/v1/completions`` with token-id prompts,
``return_token_ids``; ``/health``; 0.33's ``/weight_info``). No vLLM import in this process. Spoken as vLLM 0.33
serves it; 0.17 serves the same ``/v1/completions`` fields (docs/rollout.md, "Engine versions").

Run the server with ``--logprobs-mode processed_logprobs`` so logprobs are those of the distribution
the token was sampled from.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator

import httpx

from services.rollout.engines.base import EngineUnavailable
from services.rollout.engines.remote import RemoteEngine
from services.rollout.engines.settings import VLLMEngineSettings
from services.rollout.engines.types import FEATURES, Finish, SamplingParams, SequenceDelta, SequenceRequest

log = logging.getLogger(__name__)


def _token_id(key: str) -> int:
    return int(key.rsplit(":", 1)[1]) if key.startswith("token_id:") else -1


_STRUCTURED = {"regex": "regex", "json_schema": "json", "ebnf": "grammar", "json_object": "json_object"}
"""Grammar kinds (SGLang's names) -> vLLM's ``structured_outputs`` keys."""


def _features(p: SamplingParams) -> dict:
    """The optional features a sequence uses, in vLLM's request names (only those not at their default)."""
    out: dict = {}
    for name in p.features_used():
        if name == "grammar" and p.grammar is not None:
            kind, spec = p.grammar.kind, p.grammar.spec
            value = True if kind == "json_object" else json.loads(spec) if kind == "json_schema" else spec
            out["structured_outputs"] = {_STRUCTURED[kind]: value}
        elif name == "min_new_tokens":
            out["min_tokens"] = p.min_new_tokens
        else:
            out[name] = getattr(p, name)
    return out


class VLLMEngine(RemoteEngine):
    settings: VLLMEngineSettings
    kind = "vllm"
    honours = frozenset(FEATURES) - {"stop_regex"}  # vLLM has no stop regex
    weight_sink = "services.rollout.weights.sinks.vllm:VLLMSink"  # vLLM's native weight-transfer API
    scores_prompts = True

    async def prompt_logprobs(self, prompt_ids: list[int], start: int,
                              admit_timeout: float | None = None) -> list[float | None]:
        """``/v1/completions`` with ``prompt_logprobs: 0`` (0.17 and 0.33): per prompt token a dict keyed by token
        id holding at least that token's logprob (null for the first); one token is generated and dropped."""
        await self._admit(admit_timeout)
        if self.client is None:
            raise EngineUnavailable("the engine client is closed")
        body = {"model": self.served_model, "prompt": list(prompt_ids), "max_tokens": 1, "temperature": 0.0,
                "prompt_logprobs": 0, "return_token_ids": True}
        try:
            out = await self._post_json("/v1/completions", body)
        except httpx.HTTPError as exc:
            raise EngineUnavailable(f"engine server {self.base_url}: {type(exc).__name__}: {exc}") from exc
        rows = (out.get("choices") or [{}])[0].get("prompt_logprobs") or []
        if len(rows) != len(prompt_ids):
            raise EngineUnavailable(f"engine server {self.base_url}: {len(rows)} prompt logprobs for "
                                    f"{len(prompt_ids)} prompt tokens")
        lps = [None if row is None else float(row[str(tid)]["logprob"]) for row, tid in zip(rows, prompt_ids)]
        return lps[start:]

    @property
    def served_model(self) -> str:
        return self.settings.served_model_name or self.model_path

    async def _start(self) -> None:
        await super()._start()
        try:  # adopt the server's weight version when it is an integer (0.33 keeps it: /finish_weight_update sets it)
            r = await self.control.get("/weight_info")  # 404 on 0.17 and on a server without VLLM_SERVER_DEV_MODE
            version = r.json().get("weight_version") if r.status_code == 200 else None
            if isinstance(version, str) and version.isdigit():
                self.set_weight_version(int(version))
        except Exception as exc:  # noqa: BLE001 - the server may not be up yet; health will say so
            log.info("vLLM server not reachable yet at %s: %r", self.base_url, exc)

    async def _probe(self) -> bool:
        r = await self.control.get("/health")
        return r.status_code == 200

    def payload(self, request: SequenceRequest, adapter: str | None = None) -> dict:
        p = request.params
        body = {
            # a loaded LoRA adapter is addressed by its name in `model`
            "model": adapter or self.served_model, "prompt": list(request.prompt_ids), "max_tokens": p.max_new_tokens,
            "temperature": p.temperature, "top_p": p.top_p, "top_k": p.top_k, "min_p": p.min_p, "n": 1,
            "stop": list(p.stop), "stop_token_ids": list(p.stop_token_ids), "ignore_eos": p.ignore_eos,
            "skip_special_tokens": p.skip_special_tokens, "include_stop_str_in_output": p.no_stop_trim,
            "logprobs": p.top_logprobs, "return_token_ids": True, "return_tokens_as_token_ids": True,
            "stream": request.stream,
        }
        if p.seed is not None:
            body["seed"] = p.seed
        body.update(_features(p))
        return body

    async def _remote(self, request: SequenceRequest, adapter: str | None = None) -> AsyncGenerator[SequenceDelta, None]:
        body = self.payload(request, adapter)
        if not request.stream:
            out = await self._post_json("/v1/completions", body)
            yield self._delta(out["choices"][0], 0)
            return
        count = 0
        async for chunk in self._post_sse("/v1/completions", body):
            if not chunk.get("choices"):
                continue
            delta = self._delta(chunk["choices"][0], count)
            count += len(delta.token_ids)
            yield delta
            if delta.finish is not None:
                return

    def _delta(self, choice: dict, before: int) -> SequenceDelta:
        ids = list(choice.get("token_ids") or [])
        lp = choice.get("logprobs") or {}
        lps = [float(x) if x is not None else 0.0 for x in (lp.get("token_logprobs") or [])]
        tops = None
        if lp.get("top_logprobs") is not None:
            tops = [sorted(((_token_id(k), float(v)) for k, v in (row or {}).items()), key=lambda t: -t[1])
                    for row in lp["top_logprobs"]]
        return SequenceDelta(ids, lps, choice.get("text") or "", self._finish(choice, before + len(ids), ids), tops)

    @staticmethod
    def _finish(choice: dict, total: int, ids: list[int]) -> Finish | None:
        reason = choice.get("finish_reason")
        if reason is None:
            return None
        if reason == "stop":
            matched = choice.get("stop_reason")
            return Finish("stop", matched=matched if matched is not None else (ids[-1] if ids else None))
        if reason == "length":
            return Finish("length", length=total)
        return Finish("abort", message=str(reason))
