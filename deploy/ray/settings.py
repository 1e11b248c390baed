"""The Ray launcher's one config file: where Redis is, and per service its replica count, resources and
its own service settings (the same YAML keys as ``python -m services.<svc> --config``).

Importable without ray. Example: deploy/ray/fleet.example.yaml.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from deploy.run.spec import RolloutPoolSpec


class ServiceGroup(BaseModel):
    """Replicas of one service: what each asks Ray for and the service's own settings."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    replicas: int = Field(default=1, ge=0, description="Actors to run (learner: ranks of its world).")
    num_cpus: float = Field(default=1.0, ge=0, description="CPUs Ray reserves per replica.")
    num_gpus: float = Field(default=0.0, ge=0, description="GPUs Ray reserves per replica (engine TP size, learner 1).")
    port: int = Field(default=0, ge=0, le=65535,
                      description="HTTP port of replica 0; replica i uses port + i (0: a free port per start).")
    config: dict[str, Any] = Field(default_factory=dict, description="The service's settings (its YAML keys).")
    config_file: Path | None = Field(default=None, description="Or: a YAML file with them (config keys win).")
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment of the service process.")
    max_restarts: int = Field(default=-1, ge=-1, description="Restarts Ray allows per replica (-1: unlimited).")
    health_timeout_s: float = Field(default=300.0, gt=0, description="How long a (re)started replica has to be healthy.")

    def settings(self) -> dict[str, Any]:
        base = yaml.safe_load(self.config_file.read_text()) if self.config_file else {}
        return {**(base or {}), **self.config}


class LearnerGroup(ServiceGroup):
    """The learner's ranks, placed together in one placement group (DeepSpeed's world)."""

    placement_strategy: Literal["PACK", "STRICT_PACK", "SPREAD", "STRICT_SPREAD"] = Field(
        default="PACK", description="How the ranks' bundles are placed across nodes.")
    dist_port: int = Field(default=29500, ge=1, le=65535, description="MASTER_PORT of the learner's world.")


class LaunchSettings(BaseModel):
    """A FleetRL deployment on a Ray cluster."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ray_address: str | None = Field(default=None, description="'auto', 'ray://head:10001', or unset: a local Ray.")
    namespace: str = Field(default="fleetrl", description="Ray namespace of the actors.")
    run_name: str = Field(default="default", pattern=r"^[A-Za-z0-9_.-]+$", description="Run namespace (Redis keys).")
    redis_url: str = Field(description="Redis every service uses (Ray does not manage the queue's state).")
    control_token_env: str = Field(
        default="FLEETRL_TOKEN", description="Environment variable holding the control-plane token (required).")
    run_key_env: str = Field(
        default="FLEETRL_RUN_KEY", description="Environment variable holding the run key that signs queue records "
        "(docs/security-redis.md); unset: the launcher generates one for this launch.")
    workdir: Path | None = Field(default=None, description="Where the services' code is on every node; default: "
                                                            "this checkout (or use a Ray runtime_env).")
    reward: ServiceGroup = Field(default_factory=lambda: ServiceGroup(port=8002))
    rollout: ServiceGroup = Field(default_factory=lambda: ServiceGroup(port=8001))
    learner: LearnerGroup = Field(default_factory=lambda: LearnerGroup(port=8003))
    rollout_pool: RolloutPoolSpec | None = Field(
        default=None, description="An elastic rollout pool (docs/elastic.md): rollout.replicas start, then the pool "
        "grows and shrinks between min and max on the learner's demand signal; unset: a fixed pool.")

    @model_validator(mode="after")
    def _check(self) -> LaunchSettings:
        if self.learner.replicas < 1:
            raise ValueError("learner.replicas (its ranks) must be at least 1")
        if self.rollout.replicas and not self.reward.replicas:
            raise ValueError("rollout replicas score through the reward service: set reward.replicas >= 1")
        pool = self.rollout_pool
        if pool is not None and not pool.min <= self.rollout.replicas <= pool.max:
            raise ValueError(f"rollout.replicas ({self.rollout.replicas}) starts the elastic pool: it must be between "
                             f"rollout_pool.min ({pool.min}) and rollout_pool.max ({pool.max})")
        return self

    @classmethod
    def from_file(cls, path: str | Path, **overrides: Any) -> LaunchSettings:
        """The file's settings; a ``redis_url`` of ``${VAR}`` is read from the environment (a URL with a password
        stays out of the file: ``fleetrl render ray`` writes ``${REDIS_URL}``)."""
        data = {**(yaml.safe_load(Path(path).read_text()) or {}), **overrides}
        url = data.get("redis_url")
        if isinstance(url, str) and "$" in url:
            expanded = os.path.expandvars(url)
            if "$" in expanded:
                raise ValueError(f"{path}: redis_url {url!r} names an environment variable that is not set")
            data["redis_url"] = expanded
        return cls(**data)


def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge ``extra`` into ``base`` (the launcher's wiring wins over the file's values)."""
    out = dict(base)
    for k, v in extra.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out
