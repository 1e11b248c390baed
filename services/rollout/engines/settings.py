"""Engine settings: one class per engine kind, and the engine plug-in point (:data:`ENGINES`) that maps each
``kind`` to its settings class and its engine class.

Importable without torch. ``RolloutSettings.engine`` holds the settings of one registered kind.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from shared.plugins import PluginPoint


class EngineSettingsBase(BaseModel):
    """Fields every engine kind has (subclass it for your own engine's settings)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    if TYPE_CHECKING:
        kind: str  # each kind's settings declare `kind: Literal["<kind>"]` (ENGINES.register checks it)

    context_length: int | None = Field(
        default=None, ge=8, description="Context window in tokens; unset reads max_position_embeddings from config.json."
    )
    health_timeout_s: float = Field(
        default=10.0, gt=0, description="Budget of one health check (/health) and of /health_generate's generation."
    )


class HFEngineSettings(EngineSettingsBase):
    """transformers in this process, with FleetRL's own batched decode loop (CPU or GPU)."""

    kind: Literal["hf"] = "hf"
    device: str = Field(default="auto", description="'auto' (cuda if available, else cpu), 'cpu', 'cuda', 'cuda:1', ...")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto", description="'auto' = bfloat16 on GPU, float32 on CPU."
    )
    max_batch_size: int = Field(default=64, ge=1, le=4096, description="Sequences decoded together at most.")
    max_wait_ms: float = Field(
        default=4.0, ge=0, le=1000, description="How long an idle engine waits to gather a batch before starting."
    )
    torch_threads: int | None = Field(default=None, ge=1, description="torch.set_num_threads; unset keeps torch's default.")
    prefix_cache_tokens: int = Field(
        default=16384, ge=0, le=10_000_000,
        description="Prefix cache: KV of this many token positions of recently finished sequences is kept (LRU) "
        "and a prompt that starts with one prefills only the rest (multi-turn rollouts: each turn extends the "
        "last). Memory: tokens x layers x 2 x kv_heads x head_dim x dtype bytes. 0 = off.",
    )
    stop_regex_window_chars: int = Field(
        default=1024, ge=16, le=65536, description="A stop_regex is searched in the last this many characters of "
        "the text, after each token (on the decode thread every sequence shares).")
    stop_regex_timeout_s: float = Field(
        default=0.005, gt=0, le=1.0, description="One stop_regex search gives up after this long (the `regex` "
        "module's timeout): the sequence then ends with finish_reason abort, naming the pattern.")
    max_grammar_chars: int = Field(
        default=65536, ge=1, le=16 * 1024 * 1024, description="Characters of one structured-output grammar (regex, "
        "JSON schema, EBNF) at most; beyond it 400.")
    grammar_compile_timeout_s: float = Field(
        default=10.0, gt=0, le=600, description="Compiling one grammar (in a worker thread) stops after this long (400).")
    health_stall_s: float = Field(
        default=60.0, gt=0, le=3600,
        description="/health: a decode loop with work that made no step for this long is unhealthy (503). "
        "Above the longest prefill or decode step the engine can take.",
    )
    gpu_memory_fraction: float | None = Field(
        default=None, gt=0.0, le=1.0,
        description="On a GPU: the share of its memory this engine's allocator may use (torch's per-process "
        "memory fraction), so the engine and a learner on the same GPU both fit; unset: no cap. fleetrl run sets "
        "it when it puts a replica on the learner's GPU (placement.engine_memory_fraction).",
    )

    @field_validator("prefix_cache_tokens")
    @classmethod
    def _prefix_cache(cls, v: int) -> int:
        if 0 < v < 16:
            raise ValueError(f"prefix_cache_tokens={v} holds less than one 16-token block: use 0 (off) or >= 16")
        return v

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        if v not in ("auto", "cpu") and not v.startswith("cuda") and not v.startswith("mps"):
            raise ValueError(f"device {v!r}: use 'auto', 'cpu', 'cuda' or 'cuda:<index>'")
        return v


class RemoteEngineSettings(EngineSettingsBase):
    base_url: str = Field(description="URL of the engine's own HTTP server, e.g. http://127.0.0.1:30000.")
    api_key: SecretStr | None = Field(default=None, description="Bearer token the engine server expects, if any "
                                      "(a secret: never printed in settings, logs or errors).")
    request_timeout_s: float = Field(default=600.0, gt=0, description="Read timeout of one generation call.")
    connect_timeout_s: float = Field(default=5.0, gt=0, description="TCP connect timeout.")
    max_connections: int = Field(default=512, ge=1, description="Connection-pool size to the engine server.")

    @field_validator("base_url")
    @classmethod
    def _url(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError(f"base_url {v!r} must start with http:// or https://")
        return v.rstrip("/")


class SGLangEngineSettings(RemoteEngineSettings):
    """A running SGLang server (``python -m sglang.launch_server``), driven through its HTTP API."""

    kind: Literal["sglang"] = "sglang"
    incremental_streaming_output: bool = Field(
        default=False, description="Match the server's --incremental-streaming-output flag (delta chunks)."
    )


class VLLMEngineSettings(RemoteEngineSettings):
    """A running vLLM OpenAI server (``vllm serve``), driven through its HTTP API.

    Start it with ``--logprobs-mode processed_logprobs`` so returned logprobs are those of the
    distribution the token was sampled from (after temperature / top-k / top-p), as the learner expects.
    """

    kind: Literal["vllm"] = "vllm"
    served_model_name: str | None = Field(
        default=None, description="The `model` name the vLLM server serves; unset = the --model path."
    )


#: engine kinds: settings model -> ``Engine`` subclass (an import path: torch loads only for hf). Register your
#: own with ``ENGINES.register("mine", MyEngineSettings, "package.module:MyEngine")`` (docs/plugins.md); a
#: section without ``kind`` (e.g. ``--device cpu`` alone) means hf.
ENGINES: PluginPoint[Any] = PluginPoint(
    "engine", where="rollout: engine.kind", doc="Generation engines behind one interface (services/rollout/engines).",
    base="services.rollout.engines.base:Engine", settings_base=EngineSettingsBase, default="hf")
ENGINES.register("hf", HFEngineSettings, "services.rollout.engines.hf.engine:HFEngine")
ENGINES.register("sglang", SGLangEngineSettings, "services.rollout.engines.sglang:SGLangEngine")
ENGINES.register("vllm", VLLMEngineSettings, "services.rollout.engines.vllm:VLLMEngine")

#: a settings field holding one engine kind's settings
EngineSettings = ENGINES.settings_type("EngineSettings")
