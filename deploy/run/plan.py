"""The processes of a run: which service, under which name, with which settings — derived from the run spec,
completed with what only the launcher knows (ports, Redis, the reward URL, the run key, the control token — which
is also the auth_token of the reward services it starts, and what their rollout workers send them), and validated
by each service's own settings class before anything starts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from services.learner.settings import LearnerSettings
from services.reward.settings import RewardSettings
from services.rollout.settings import RolloutSettings
from shared.ports import free_port

from .derive import deep_merge, service_config, validate
from .placement import gpu_count, place
from .spec import RunSpec


@dataclass(frozen=True)
class ServiceKind:
    """A service: the module ``python -m`` runs, and its settings class (torch-free, like every settings class)."""

    module: str
    settings_cls: type[BaseModel]


KINDS = {
    "reward": ServiceKind("services.reward", RewardSettings),
    "rollout": ServiceKind("services.rollout", RolloutSettings),
    "learner": ServiceKind("services.learner", LearnerSettings),
}

RESOLVED_SPEC = "fleetrl.resolved.yaml"
"""The spec as ``fleetrl run`` resolved it (overrides applied, defaults filled), under run_dir; the learner
records it as the run's configuration in TensorBoard / wandb (``observability.run_config``)."""

LEARNER_DEFAULTS = {"observability": {"progress_bar": False}}
"""What the learner does differently under ``fleetrl run`` unless its own settings say otherwise (the run has
one progress display)."""


@dataclass(frozen=True)
class ProcessPlan:
    name: str  # "reward-0", "rollout-1", "learner"
    kind: str  # key of KINDS
    config: dict[str, Any]

    @property
    def url(self) -> str:
        return f"http://{self.config.get('host', '127.0.0.1')}:{self.config['port']}"

    @property
    def module(self) -> str:
        return KINDS[self.kind].module


def run_dir_of(spec: RunSpec) -> Path:
    return Path(spec.run_dir) if spec.run_dir else (Path("runs") / spec.run_name).resolve()


RUN_KEY_FILE = "run_key"
"""Under run_dir (0600): the key every queue record of the run is signed with (``run_key``, shared/signing.py);
kept so that the same command resumes with the same key."""


def plan(spec: RunSpec, spec_file: str | Path, redis_url: str | None, token: str,
         run_key: str = "<generated per run: run_dir/run_key>", gpus: int | None = None) -> list[ProcessPlan]:
    """The run's processes in start order (reward, rollout, learner), placed on devices (``placement.py``;
    ``gpus``: the host's GPU count, probed when None). Raises SettingsError naming the setting."""
    out: list[ProcessPlan] = []
    reward_urls: list[str] = []
    if spec.is_rl and spec.reward.scorers is not None:
        base = service_config(spec, "reward", spec_file)
        for i in range(spec.replicas.reward):
            p = ProcessPlan(f"reward-{i}", "reward", {**base, "port": free_port(), "auth_token": token})
            reward_urls.append(p.url)
            out.append(p)
    elif spec.is_rl:
        reward_urls.append(spec.reward.url.rstrip("/"))
    if spec.is_rl:
        base = service_config(spec, "rollout", spec_file)
        for i in range(spec.replicas.rollout_max):  # an elastic pool's beyond min start on demand
            fleet = {"port": free_port(), "redis_url": redis_url, "control_token": token, "run_key": run_key,
                     "worker": {"enabled": True, "reward_url": reward_urls[i % len(reward_urls)],
                                "consumer_name": f"rollout-{i}"}}
            if spec.reward.scorers is not None:  # ours: it takes the run's token (never sent to reward.url's)
                fleet["worker"]["reward_token"] = token
            if spec.replicas.pool is not None:  # a drained replica's groups get this long to finish
                fleet["worker"]["drain_timeout_s"] = spec.replicas.pool.drain_timeout_s
            out.append(ProcessPlan(f"rollout-{i}", "rollout", deep_merge(base, fleet)))
    learner = deep_merge(LEARNER_DEFAULTS, service_config(spec, "learner", spec_file))
    fleet = {"port": free_port(), "control_token": token, "run_dir": str(run_dir_of(spec) / "learner"),
             "observability": {"run_config": str(run_dir_of(spec) / RESOLVED_SPEC)}}
    if redis_url is not None and spec.is_rl:
        fleet["redis_url"] = redis_url
        fleet["run_key"] = run_key
    out.append(ProcessPlan("learner", "learner", deep_merge(learner, fleet)))
    if spec.is_rl:
        place(out[-1].config, [p.config for p in out if p.kind == "rollout"], spec.placement,
              gpu_count() if gpus is None else gpus, ranks=spec.replicas.learner)
    for p in out:
        validate(KINDS[p.kind].settings_cls, p.kind, p.config, spec)
    return out
