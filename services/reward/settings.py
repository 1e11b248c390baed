"""Settings of the reward service (env prefix ``FLEETRL_REWARD_``; YAML/TOML via ``--config``)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, SecretStr, field_validator

from services.reward.scorer_config import ScorerConfig
from shared.settings import ServiceSettings, service_config

DEFAULT_STRIP_TOKENS = ["<pad>", "<|endoftext|>", "</s>", "<|end_of_text|>", "<|eot_id|>", "<|im_end|>"]


class RewardSettings(ServiceSettings):
    """The scorers and the limits of the HTTP surface."""

    model_config = service_config("REWARD")

    port: int = Field(default=8002, ge=0, le=65535, description="HTTP port (0 picks a free one).")
    control_token: ClassVar[None] = None  # type: ignore[misc]  # not a setting here: the reward service has no control routes (auth_token)
    auth_token: SecretStr | None = Field(
        default=None, description="Bearer token that /score, /get_reward and /scorers require (Authorization: Bearer "
        "<token>); /health and /metrics stay open. Unset: no check (keep host on loopback). fleetrl run sets one.")
    scorers: list[ScorerConfig] = Field(
        min_length=1, description="Scorers; the reward is the weighted sum of their values (see examples/reward/)."
    )
    max_body_bytes: int = Field(default=32 * 1024 * 1024, ge=1024, description="Larger request bodies get 413.")
    max_items: int = Field(default=8192, ge=1, description="Items (or queries) per request at most; more gets 413.")
    probe_remote_scorers: bool = Field(
        default=True, description="At start, call each http scorer once with a probe item in its protocol and refuse "
        "to start, in one line naming the scorer and its URL, when one cannot score it (false: for a remote that "
        "cannot take a probe; fleetrl run --skip-preflight sets false).")
    health_timeout_s: float = Field(default=10.0, gt=0.0, description="Limit of the scorer checks behind GET /health.")
    strip_tokens: list[str] = Field(
        default_factory=lambda: list(DEFAULT_STRIP_TOKENS),
        description="/get_reward: special-token text stripped from both ends of each query (as OpenRLHF does).",
    )

    @field_validator("auth_token")
    @classmethod
    def _token_is_usable(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not value.get_secret_value().strip():
            raise ValueError("auth_token is empty: set a secret (e.g. openssl rand -hex 16), or leave it unset for "
                             "no check")
        return value

    @field_validator("scorers")
    @classmethod
    def _unique_names(cls, scorers: list) -> list:
        seen: set[str] = set()
        for s in scorers:
            if s.name in seen:
                raise ValueError(f"scorer name {s.name!r} is used twice; give each scorer its own name")
            seen.add(s.name)
        return scorers
