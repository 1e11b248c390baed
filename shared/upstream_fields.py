"""Fields the upstream APIs define that FleetRL's wire models do not model one by one.

A client written for SGLang or OpenAI / vLLM sends its library's whole request schema, most of it ``null``
(SGLang's frontend sends every field of its ``SamplingParams``). Each table below lists, for one wire model,
the upstream fields FleetRL has no field for, with the value that means "not used" (their default). The
wire models take them through :func:`take_upstream`:

- ``null`` or the neutral value: accepted, and dropped (the default applies);
- :data:`ANY` fields are informational (routing hints, trace headers, metric labels): any value is accepted
  and has no effect on the result;
- any other value is kept aside (:func:`unhonoured`) and refused by the service with a 400 that names the
  field and the engine serving it;
- a field in no table and not modelled is refused at validation, naming it ("unknown field").

Kept in step with the pinned client versions by ``tests/shared/test_upstream_fields.py``, which reads the
installed ``sglang`` package's own source (SGLang 0.5.23: ``SamplingParams`` and ``GenerateReqInput``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

ANY = object()
"""Neutral marker of an informational field: every value is accepted and has no effect."""

# ---- SGLang 0.5.x --------------------------------------------------------------------------------------
SGLANG_SAMPLING: dict[str, Any] = {
    "beam_width": None,
    "structural_tag": None,
    "stream_interval": ANY,  # how often SGLang flushes a stream: this server sends every token
    "logit_bias": {},
    "custom_params": None,
    "watermark": None,
    # SamplingParams' internal fields (set by its own normalize(); sent only by clients that dump the struct)
    "stop_strs": None,
    "stop_regex_strs": None,
    "stop_str_max_len": 0,
    "stop_regex_max_len": 0,
    "is_normalized": False,
    "ebnf_full_assistant": False,
}
"""SGLang ``SamplingParams`` fields without a FleetRL field."""

SGLANG_GENERATE: dict[str, Any] = {
    "session_id": None,
    "input_embeds": None,
    "image_data": None,
    "video_data": None,
    "audio_data": None,
    "mm_hashes": None,
    "mm_content_hashes": None,
    "use_audio_in_video": False,
    "video_config": None,
    "watermark": None,
    "token_ids_logprob": None,
    "return_sampling_mask": False,
    "sampling_logprobs_mode": None,
    "return_flat_raw_top_logprobs": False,
    "return_flat_raw_output_top_logprobs": False,
    "return_flat_raw_top_logprobs_b64": False,
    "return_routed_experts": False,
    "routed_experts_start_len": 0,
    "return_indexer_topk": False,
    "modalities": None,
    "session_params": None,
    "lora_path": None,
    "lora_id": None,
    "custom_logit_processor": None,
    "positional_embed_overrides": None,
    "bootstrap_host": None,
    "bootstrap_port": None,
    "bootstrap_room": None,
    "bootstrap_pair_key": None,
    "decode_tp_size": None,
    "routed_dp_rank": None,
    "data_parallel_rank": None,
    "disagg_prefill_dp_rank": None,
    "routing_key": ANY,
    "conversation_id": ANY,
    "http_worker_ipc": None,
    "require_reasoning": False,
    "max_thinking_tokens": None,
    "priority": None,
    "extra_key": None,
    "custom_labels": ANY,
    "return_prompt_token_ids": False,
    "external_trace_header": ANY,
    "received_time": ANY,
    "need_wait_for_mm_inputs": None,
    "num_items_assigned": None,
    "encoder_urls": None,
    "max_dynamic_patch": None,
    "min_dynamic_patch": None,
    "image_max_dynamic_patch": None,
    "video_max_dynamic_patch": None,
    "images_config": None,
    "mm_processor_kwargs": None,
    "multi_item_delimiter_indices": None,
    "token_indices_to_pool": None,
    "cache_salt": None,
    "kv_hints": None,
}
"""SGLang ``GenerateReqInput`` fields without a FleetRL field."""

# ---- OpenAI and vLLM's extras ------------------------------------------------------------------------------
_OPENAI_COMMON: dict[str, Any] = {
    # OpenAI
    "metadata": ANY,
    "store": False,
    "service_tier": ANY,
    "safety_identifier": ANY,
    "prompt_cache_key": ANY,
    # vLLM's sampling extras
    "use_beam_search": False,
    "length_penalty": 1.0,
    "truncate_prompt_tokens": None,
    "prompt_logprobs": None,
    "allowed_token_ids": None,
    "bad_words": [],
    "structured_outputs": None,
    "logits_processors": None,
    "add_special_tokens": ANY,
    "priority": 0,
    "request_id": ANY,
    "cache_salt": None,
    "kv_transfer_params": None,
    "vllm_xargs": None,
    "logit_bias": {},
    "thinking_token_budget": None,
    "repetition_detection": None,
    "mm_processor_kwargs": None,
}

OPENAI_COMPLETION: dict[str, Any] = {**_OPENAI_COMMON, "prompt_embeds": None}
"""``/v1/completions`` fields (OpenAI's and vLLM's) without a FleetRL field."""

OPENAI_CHAT: dict[str, Any] = {
    **_OPENAI_COMMON,
    # OpenAI
    "audio": None,
    "modalities": None,
    "prediction": None,
    "reasoning_effort": None,
    "verbosity": None,
    "web_search_options": None,
    "functions": None,
    "function_call": None,
    # vLLM's chat extras
    "echo": False,
    "documents": None,
    "chat_template": None,
    "include_reasoning": ANY,
}
"""``/v1/chat/completions`` fields (OpenAI's and vLLM's) without a FleetRL field."""


def _neutral(value: Any, neutral: Any) -> bool:
    if value is None or neutral is ANY:
        return True
    if isinstance(neutral, bool):
        return value is neutral
    return value == neutral


def take_upstream(data: Any, table: Mapping[str, Any], modelled: set[str], null_is_default: set[str]) -> tuple[Any, dict[str, Any]]:
    """Split a request body (``mode="wrap"`` / ``"before"`` input) into what the wire model validates and the
    upstream-only fields set to something other than their neutral value (``{name: value}``).

    ``null_is_default``: modelled fields whose ``null`` means "the default" (dropped before validation)."""
    if not isinstance(data, dict):
        return data, {}
    kept: dict[str, Any] = {}
    set_aside: dict[str, Any] = {}
    for key, value in data.items():
        if key in modelled:
            if not (value is None and key in null_is_default):
                kept[key] = value
        elif key in table:
            if not _neutral(value, table[key]):
                set_aside[key] = value
        else:
            kept[key] = value  # unknown: the model's extra="forbid" names it
    return kept, set_aside


def describe(fields: Mapping[str, Any], prefix: str = "") -> str:
    """``a=1, b='x'`` for an error message (values cut to 60 characters)."""
    parts = []
    for name, value in fields.items():
        text = repr(value)
        parts.append(f"{prefix}{name}={text[:60]}{'...' if len(text) > 60 else ''}")
    return ", ".join(parts)
