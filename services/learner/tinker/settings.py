"""Settings of the learner's Tinker mode (env prefix ``FLEETRL_TINKER_``; YAML/TOML via ``--config``).

Torch-free: the entry point parses these before importing torch."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr, field_validator, model_validator

from shared.settings import ServiceSettings, service_config
from shared.weight_sync.settings import WeightSyncSettings


class TinkerSettings(ServiceSettings):
    """One base model served for LoRA or full fine-tuning and sampling through the Tinker API."""

    model_config = service_config("TINKER")

    port: int = Field(default=8010, ge=0, le=65535, description="HTTP port (0 picks a free one).")
    api_key: SecretStr = Field(description="The key clients send as X-API-Key (TINKER_API_KEY); the tinker client "
                                           "only sends keys that start with 'tml-'.")
    base_model: str = Field(description="The trainable base model: a local Hugging Face causal-LM directory.")
    model_name: str | None = Field(default=None, description="The name clients pass as base_model (besides the "
                                                             "directory itself); default: the directory's path.")
    device: str = Field(default="auto", description="'auto' (cuda if available, else cpu), 'cpu', 'cuda', 'cuda:1'.")
    dtype: str = Field(default="float32", pattern="^(float32|bfloat16|float16)$", description="Parameter dtype.")
    run_dir: str = Field(default="runs/tinker", description="Where save_state and sampler checkpoints go.")
    lora_alpha: int = Field(default=32, ge=1, description="LoRA alpha of every adapter (scale = alpha / rank).")
    max_lora_rank: int = Field(default=256, ge=1, le=4096, description="Larger LoRA ranks get 400.")
    max_models: int = Field(default=4, ge=1, le=256, description="Training models held at once; more get 409.")
    max_datums: int = Field(default=4096, ge=1, description="Datums per forward_backward request at most (413).")
    micro_batch_size: int = Field(default=16, ge=1, description="Datums per forward pass inside one request.")
    max_num_samples: int = Field(default=256, ge=1, description="num_samples per sample request at most (400).")
    max_sample_tokens: int = Field(default=2048, ge=1, description="max_tokens per sample request at most (400).")
    max_body_bytes: int = Field(default=64 * 1024 * 1024, ge=1024, description="Larger request bodies get 413.")
    samplers_cached: int = Field(default=4, ge=1, le=64, description="Sampler checkpoints kept loaded at once.")
    long_poll_s: float = Field(default=20.0, gt=0.0, le=40.0, description="How long retrieve_future waits for a "
                                                                          "result before it answers try_again.")
    future_ttl_s: float = Field(default=3600.0, gt=0.0, description="Results are kept this long for retrieval.")
    seq_gap_timeout_s: float = Field(default=30.0, gt=0.0, description="How long a model waits for a missing seq_id "
                                                                       "before it runs the next request it holds.")
    session_timeout_s: float = Field(default=120.0, ge=15.0, description="A session without a heartbeat this long "
                                                                        "ends: its models are dropped (the client "
                                                                        "beats every 10 s).")
    torch_threads: int | None = Field(default=None, ge=1, description="torch.set_num_threads; default: torch's.")
    seed: int = Field(default=0, description="Seed of model creation when the client gives none.")
    sample_poller: bool = Field(default=False, description="Tell clients to wait for samples through the batched "
                                "retrieve_futures poller and join_sampling_session (client 0.38's "
                                "sample_use_retrieve_futures / sample_join_sampling_session); off: each sample "
                                "polls retrieve_future.")
    rollout_urls: list[str] = Field(default_factory=list, description="Rollout replicas (base URLs) that sample: "
                                    "save_weights_for_sampler publishes to them through the weight publisher "
                                    "(needs redis_url and run_name, the replicas' own); empty: sampling runs in "
                                    "this process (the in-learner sampler).")
    sampler_wait_s: float = Field(default=60.0, gt=0.0, description="How long a sample waits for a rollout "
                                                                    "replica to serve the sampler's weight version.")
    rollout_timeout_s: float = Field(default=300.0, gt=0.0, description="Timeout of one /generate call.")
    weight_sync: WeightSyncSettings = Field(default_factory=WeightSyncSettings,
                                            description="The weight publisher's settings (rollout sampling).")

    @field_validator("api_key")
    @classmethod
    def _tinker_prefix(cls, value: SecretStr) -> SecretStr:
        key = value.get_secret_value()
        if not key.startswith("tml-") or len(key) < 12:
            raise ValueError("api_key must start with 'tml-' (the tinker client sends no other key) and be at least "
                             "12 characters: e.g. api_key: tml-$(openssl rand -hex 16)")
        return value

    @field_validator("base_model")
    @classmethod
    def _local_dir(cls, value: str) -> str:
        if not (Path(value) / "config.json").is_file():
            raise ValueError(f"base_model {value!r} is not a local Hugging Face model directory (no config.json); "
                             "build one with `fleetrl tiny-model DIR` or point it at a downloaded checkpoint")
        return value

    @model_validator(mode="after")
    def _rollout_needs_redis(self) -> TinkerSettings:
        if self.rollout_urls and not self.redis_url:
            raise ValueError("rollout_urls: sampling on rollout replicas publishes weights through Redis; set "
                             "redis_url (and run_name) to the replicas' own")
        for url in self.rollout_urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"rollout_urls: {url!r} is not an http(s) URL")
        return self

    def served_names(self) -> set[str]:
        """The names a request's base_model may use for the one model served."""
        names = {self.base_model, str(Path(self.base_model).resolve())}
        if self.model_name:
            names.add(self.model_name)
        return names

    def public_name(self) -> str:
        return self.model_name or self.base_model
