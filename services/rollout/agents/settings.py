"""Settings of multi-turn rollouts (``worker.agent``): the environment, its tools, limits and failure policy."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator


class AgentSettings(BaseModel):
    """The ``multi_turn`` rollout function: an environment per trajectory, tool calls, turn and context limits."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    environments: dict[str, str] = Field(
        default_factory=dict, description="More environments a prompt task may pick by name (its "
        "metadata.environment): {name: 'package.module:factory' or a registered name}. A task picks only among "
        "these, the registered names and `environment`; an import path in a task is refused, never imported.")
    environment: str = Field(
        default="echo", description="The environment of tasks that name none: a registered name (see "
        "services/rollout/agents/environments.py), a name in `environments`, or 'package.module:factory'.")
    environment_args: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments of the environment's factory (a task's "
        "metadata.environment_args are merged over them).")
    max_turns: int = Field(default=8, ge=1, le=1024, description="Model turns per trajectory at most; a "
                           "trajectory that reaches it before the environment is done ends with finish reason length.")
    tool_call_format: str = Field(default="hermes", description="How the model writes tool calls (tool_calls.py).")
    tool_timeout_s: float = Field(default=10.0, gt=0, description="One tool call's time limit; past it the "
                                  "trajectory fails.")
    env_timeout_s: float = Field(default=30.0, gt=0, description="One environment reset / step / close's time "
                                 "limit; past it the trajectory fails.")
    max_result_chars: int = Field(default=4000, ge=16, description="Tool results are cut to this many characters.")
    trajectory_retries: int = Field(default=2, ge=0, description="Retries of a trajectory whose environment or "
                                    "tool failed; past them the group fails with the reason (then dead-lettered).")
    on_length: Literal["keep", "mask", "penalize"] = Field(
        default="keep", description="A trajectory cut by the turn or context limit: keep it as it is, mask it "
        "(nothing trained on, it still counts in its group's baseline), or give it `length_penalty` as its reward.")
    length_penalty: float = Field(default=-1.0, description="The reward of a cut trajectory with on_length: penalize.")

    @field_validator("tool_call_format")
    @classmethod
    def _known_format(cls, v: str) -> str:
        from services.rollout.agents.tool_calls import TOOL_CALL_FORMATS

        if v not in TOOL_CALL_FORMATS:
            raise ValueError(f"unknown tool_call_format {v!r}; known: {', '.join(sorted(TOOL_CALL_FORMATS))}")
        return v

    @field_validator("environments")
    @classmethod
    def _named_loadable(cls, v: dict[str, str]) -> dict[str, str]:
        from services.rollout.agents.environments import load_environment

        for name, path in v.items():
            if not name or ":" in name:
                raise ValueError(f"the name {name!r} must be a plain name (no ':'), e.g. my_env")
            load_environment(path)  # a LoadError (a ValueError) names the path and what is wrong
        return v

    @field_validator("environment")
    @classmethod
    def _loadable(cls, v: str, info: ValidationInfo) -> str:
        from services.rollout.agents.environments import load_environment

        load_environment((info.data.get("environments") or {}).get(v, v))
        return v

    @model_validator(mode="after")
    def _args_fit(self) -> AgentSettings:
        from services.rollout.agents.environments import environment_args

        environment_args(self.environments.get(self.environment, self.environment), self.environment_args,
                         partial=True)  # tasks may add what is missing; a wrong key or type is wrong already
        return self


class ProgramSettings(BaseModel):
    """The ``openai_agent`` rollout function: your agent program, run once per sample, its model calls recorded
    through a session of this replica (``services/rollout/agents/openai_agent.py``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    command: list[str] = Field(
        default_factory=list, description="The program's argv, e.g. ['python', 'my_agent.py']; '{python}' stands "
        "for this service's interpreter. It gets OPENAI_BASE_URL / OPENAI_API_KEY (a session of this replica and "
        "that session's own key: the openai client reads them), FLEETRL_MODEL and FLEETRL_TASK (the task as JSON, "
        "also on stdin).")
    cwd: str | None = Field(default=None, description="Its working directory (default: the service's).")
    env: dict[str, str] = Field(default_factory=dict, description="More environment variables for it.")
    inherit_env: list[str] = Field(
        default_factory=lambda: ["PATH", "HOME", "USER", "LANG", "LC_ALL", "TZ", "TMPDIR"],
        description="The only variables of the service's own environment the program gets (it never sees the "
        "control token, REDIS_URL or HF_TOKEN unless named here); `env` and the OpenAI variables come on top.")
    show_label: bool = Field(default=False, description="Put the task's label (the ground truth) in FLEETRL_TASK; off: "
                             "the program cannot read the answer it is judged against.")
    reward_from_output: bool = Field(
        default=False, description="Take the reward from the program's last stdout line ({\"reward\": ...}); off: "
        "the reward service always scores (a program, or the model text it echoes, cannot set its own reward).")
    max_file_bytes: int = Field(
        default=64 * 1024 * 1024, ge=1024 * 1024, description="Largest file the program may write, its stdout and "
        "stderr included (RLIMIT_FSIZE); past it the program is stopped and the run failed.")
    timeout_s: float = Field(default=300.0, gt=0, description="One run's time limit; past it the program (its "
                             "process group) is killed and the run failed.")
    retries: int = Field(default=2, ge=0, description="Runs of a sample that failed (exit code, timeout, no "
                         "model call, a rewritten history) tried again before the group fails with the reason.")
    max_output_bytes: int = Field(default=1_000_000, ge=1024, description="The tail of stdout / stderr read "
                                  "per run (the reward line is stdout's last line).")
