"""Settings of the rollout service (``FLEETRL_ROLLOUT_*`` env, a YAML/TOML file, CLI flags)."""

from __future__ import annotations

import logging
import os
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationInfo, field_validator, model_validator

from services.rollout.agents.settings import AgentSettings, ProgramSettings
from services.rollout.engines.settings import EngineSettings, HFEngineSettings
from services.rollout.sessions.settings import SessionSettings
from services.rollout.weights.settings import SidecarSettings, refuse_legacy_env
from services.rollout.worker.settings import WorkerSampling
from shared.model_dir import model_dir_problem
from shared.run_settings import RunSettings, move_legacy
from shared.settings import ServiceSettings, service_config


class LimitsSettings(BaseModel):
    """Admission control: what the service accepts before it answers 4xx / 429 / 503."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024, description="Larger request bodies get 413.")
    max_inflight_sequences: int = Field(
        default=1024, ge=1, description="Sequences admitted (running + queued) at most; beyond it requests get 429."
    )
    max_prompts_per_request: int = Field(default=512, ge=1, description="Batch size of one request at most.")
    max_n: int = Field(default=128, ge=1, description="Samples per prompt (`n`) at most.")
    max_stop_strings: int = Field(
        default=64, ge=0, le=4096, description="Stop strings per request at most (each is checked on every "
        "generated token); beyond it 400.")
    max_stop_string_chars: int = Field(default=256, ge=1, le=65536, description="Characters of one stop string at most.")
    max_stop_token_ids: int = Field(default=256, ge=0, le=65536, description="stop_token_ids per request at most.")
    max_stop_regexes: int = Field(
        default=8, ge=0, le=256, description="stop_regex patterns per request at most (each is searched on every "
        "generated token, on the engine's thread); beyond it 400.")
    max_stop_regex_chars: int = Field(default=256, ge=1, le=4096, description="Characters of one stop_regex at most.")
    max_chat_template_chars: int = Field(
        default=65536, ge=1, description="Characters of a request's own chat template at most "
        "(with trust_request_chat_template).")
    chat_template_timeout_s: float = Field(
        default=5.0, gt=0, le=600, description="Rendering a request's own chat template stops after this long (400).")
    pause_wait_s: float = Field(
        default=30.0, ge=0, description="How long a request waits for paused generation to continue before 503."
    )
    retry_after_s: int = Field(default=1, ge=1, description="Retry-After seconds sent with 429 / 503.")


class WorkerSettings(BaseModel):
    """The rollout worker: prompts stream -> n samples -> /score -> experiences stream."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(default=False, description="Run the worker loop inside the service process.")
    reward_url: str | None = Field(default=None, description="Base URL of the reward service (POST {url}/score).")
    reward_token: SecretStr | None = Field(default=None, description="The reward service's auth_token, sent as "
                                           "Authorization: Bearer (fleetrl run sets it); unset: none sent.")
    consumer_name: str | None = Field(default=None, description="Consumer name in the 'rollout' group; default host-pid.")
    concurrency: int = Field(default=8, ge=1, le=1024, description="Prompt groups generated at the same time.")
    prompts_max_deliveries: int = Field(default=5, ge=1, description="Deliveries before a prompt is dead-lettered.")
    reward_timeout_s: float = Field(default=60.0, gt=0, description="Timeout of one /score call.")
    reward_backoff_max_s: float = Field(default=10.0, gt=0, description="Longest wait between /score retries.")
    reward_max_attempts: int = Field(default=20, ge=1, description="/score tries per group (5xx, 429, no answer) "
                                     "before the prompt is failed with the reason (then dead-lettered).")
    reward_max_retry_s: float = Field(default=300.0, gt=0, description="Time a group spends retrying /score at most, "
                                      "then the prompt is failed with the reason.")
    reward_batch_ms: float = Field(
        default=2.0, ge=0.0, le=1000.0,
        description="A group's /score call waits up to this long for other groups' calls, and those made together go "
        "as one request, each group getting its own scores back (the groups of one engine batch finish together; "
        "one request of 64 items costs about what one of 8 does). A refused combined request is sent again group "
        "by group, so only the group at fault fails. 0: one request per group.")
    group_retries: int = Field(default=3, ge=0, description="Regenerations of a group whose samples were aborted.")
    max_prompt_chars: int | None = Field(
        default=None, ge=1, description="Characters of a task's prompt (its text, or its messages' contents) at most; "
        "a longer one is dead-lettered at once, before it is tokenised. Unset: 16 x the model's context length (a "
        "prompt past that cannot fit the context).")
    poll_interval_s: float = Field(default=0.5, gt=0, description="Re-check period while the worker holds back.")
    drain_timeout_s: float = Field(default=20.0, ge=0, le=3600,
                                   description="Leaving the pool (SIGTERM, POST /drain): time the groups in progress "
                                   "get to finish; the rest are handed back at once (docs/elastic.md).")
    sampling: WorkerSampling = Field(default_factory=WorkerSampling)
    rollout_function: str = Field(
        default="single_turn", description="What the worker does with a prompt task: single_turn (n samples, one "
        "/score call), multi_turn (environments and tools; `agent`), openai_agent (your OpenAI-client program per "
        "sample, recorded through a session; `program`), or your own 'package.module:function'.")
    agent: AgentSettings = Field(default_factory=AgentSettings, description="The multi_turn rollout function.")
    program: ProgramSettings = Field(default_factory=ProgramSettings,
                                     description="The openai_agent rollout function: your agent program per sample.")
    function_settings: Any = Field(
        default=None, description="Settings of a rollout function you registered, checked against the settings "
        "model it registered (docs/plugins.md); the function reads them as ctx.settings.function_settings.")

    @field_validator("rollout_function")
    @classmethod
    def _loadable(cls, v: str) -> str:
        from services.rollout.worker.functions import load_rollout_function

        load_rollout_function(v)  # a LoadError (a ValueError) names the path and what is wrong
        return v

    @field_validator("function_settings")
    @classmethod
    def _function_settings(cls, v: Any, info: ValidationInfo) -> Any:
        from services.rollout.worker.functions import function_settings

        spec = info.data.get("rollout_function")
        return v if spec is None else function_settings(spec, v)

    @model_validator(mode="after")
    def _reward(self) -> WorkerSettings:
        if self.enabled and not self.reward_url:
            raise ValueError("worker.enabled needs worker.reward_url (the reward service's base URL)")
        if self.rollout_function == "openai_agent" and not self.program.command:
            raise ValueError("worker.rollout_function openai_agent needs worker.program.command (your agent "
                             "program's argv, e.g. ['{python}', 'my_agent.py'])")
        return self


class RolloutSettings(ServiceSettings):
    """The rollout service."""

    model_config = service_config("ROLLOUT")

    port: int = Field(default=8001, ge=0, le=65535, description="HTTP port (0 picks a free one).")
    model: str = Field(description="Model directory (Hugging Face format); the tokenizer always comes from here.")
    served_model_name: str | None = Field(default=None, description="Name in /v1/models; default: the model path.")
    engine: EngineSettings = Field(default_factory=HFEngineSettings, description="Engine kind and its settings.")
    limits: LimitsSettings = Field(default_factory=LimitsSettings)
    worker: WorkerSettings = Field(default_factory=WorkerSettings)
    run: RunSettings = Field(default_factory=RunSettings, description="Run-wide settings every service of the run "
                             "shares (shared/run_settings.py); checked at start against the run's record in Redis.")
    extensions: list[str] = Field(
        default_factory=list, description="'module:factory' import paths; factory(service) -> APIRouter (your routes)."
    )
    weight_sidecar: bool | None = Field(
        default=None,
        description="Join the learner's weight updates (sidecar + /weights routes; sidecar settings: `weights`). "
        "Default: on when the rollout worker is enabled, i.e. when this replica trains with a learner.",
    )
    incremental_streaming_output: bool = Field(
        default=False, description="/generate streams deltas instead of SGLang's default cumulative chunks."
    )
    weights: SidecarSettings = Field(
        default_factory=SidecarSettings,
        description="The weight sidecar (env FLEETRL_ROLLOUT_WEIGHTS__<KEY>); services/rollout/weights/settings.py.",
    )
    sessions: SessionSettings = Field(
        default_factory=SessionSettings,
        description="Session mode: agents' calls recorded as trajectories (services/rollout/sessions/settings.py).",
    )
    advertise_url: str | None = Field(
        default=None, description="The base URL other replicas and clients reach this replica at (session mode: "
        "POST /sessions answers it as replica_url, and other replicas send a session's calls here). Default: "
        "http://<host>:<port>; with host 0.0.0.0 the address of this machine's hostname (a container's or pod's IP). "
        "Set it when that is not how others reach it (NAT, several networks, https).")
    tool_call_parser: str | None = Field(
        default="hermes", description="How /v1/chat/completions reads tool calls from the model's text when the request "
        "declares tools (services/rollout/agents/tool_calls.py); None: never parsed.")

    trust_request_chat_template: bool = Field(
        default=False, description="Let a request replace the model's chat template "
        "(chat_template_kwargs.chat_template); off: such a request is a 400. Only for clients you trust: the "
        "template is sandboxed and time-bounded, but it is code the caller wrote (vLLM's flag of the same name).")

    @model_validator(mode="before")
    @classmethod
    def _run_wide_renamed(cls, data: Any) -> Any:
        return move_legacy("rollout", data, logging.getLogger("services.rollout.settings").warning)

    @field_validator("tool_call_parser")
    @classmethod
    def _known_parser(cls, v: str | None) -> str | None:
        from services.rollout.agents.tool_calls import TOOL_CALL_FORMATS

        if v is not None and v not in TOOL_CALL_FORMATS:
            raise ValueError(f"tool_call_parser {v!r} is unknown; known: {sorted(TOOL_CALL_FORMATS)} (or null)")
        return v

    @field_validator("advertise_url")
    @classmethod
    def _absolute_url(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if not v.startswith(("http://", "https://")) or len(v.split("://", 1)[1].strip("/")) == 0:
            raise ValueError(f"advertise_url {v!r}: an absolute http(s) URL, e.g. http://rollout-3.internal:8001")
        return v.rstrip("/")

    @field_validator("weights", mode="before")
    @classmethod
    def _no_legacy_weight_env(cls, v: object) -> object:
        refuse_legacy_env(os.environ)  # FLEETRL_WEIGHTS_* configured the sidecar before it was this section
        return v

    @field_validator("extensions")
    @classmethod
    def _weight_routes_are_no_extension(cls, v: list[str]) -> list[str]:
        for path in v:
            if path.split(":", 1)[0] in ("services.rollout.routes.weights", "services.rollout.weights.routes"):
                raise ValueError(f"extensions: {path!r}: the weight routes are not an extension; set weight_sidecar: "
                                 "true (the sidecar serves them, and is on by default when the worker is)")
        return v

    @field_validator("model")
    @classmethod
    def _model_exists(cls, v: str) -> str:
        problem = model_dir_problem(v)  # a local checkpoint or an org/name hub id (shared/model_dir.py)
        if problem:
            raise ValueError(problem)
        return v

    @model_validator(mode="after")
    def _agent_sessions(self) -> RolloutSettings:
        if self.worker.enabled and self.worker.rollout_function == "openai_agent" and not self.sessions.enabled:
            raise ValueError("worker.rollout_function openai_agent records the program's model calls in sessions: "
                             "set sessions.enabled: true")
        if self.worker.enabled and self.worker.rollout_function == "openai_agent" and self.control_token is None:
            raise ValueError("worker.rollout_function openai_agent needs control_token: the program calls its "
                             "session with that session's key, which derives from it (fleetrl run sets one)")
        return self

    @property
    def sidecar_on(self) -> bool:
        """Whether this replica runs the weight sidecar and serves ``/weights/*``: ``weight_sidecar``, by default
        on with the worker."""
        return self.weight_sidecar if self.weight_sidecar is not None else self.worker.enabled

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model

    @property
    def shares_records(self) -> bool:
        """Whether this replica reads or writes queue records on a shared Redis: the worker (prompts in, experiences
        out) or sessions (experiences out) with a ``redis_url``; then it needs ``run_key`` (or
        ``allow_unsigned_records``) to start."""
        return bool(self.redis_url) and (self.worker.enabled or self.sessions.enabled)
