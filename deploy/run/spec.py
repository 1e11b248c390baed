"""The run spec (``fleetrl.yaml``): one typed, strict file for a whole run. Every service's settings are derived
from it (``deploy/run/derive.py``), so what the services share is written once.

Relative paths in the file (``model``, ``data.path``, ``eval.data``, ``export``, ``run_dir``, files named under
``services``, a python reward scorer's ``sys_path`` entries — by default the file's directory, so a reward module
beside the spec imports — and an hf_rm scorer's ``model``) are relative to the file's own directory; without ``run_dir`` the run lives in
``./runs/<run_name>`` under the directory ``fleetrl run`` is started from.

``plugins`` (modules of the operator's that register engines, scorers, algorithms, losses ...) are imported by the
load step (``deploy/run/load.py``'s ``load_spec``; validating a spec never imports) before the rest of it is
validated, with the spec's ``sys_path`` (by default, when there are plugins, the file's
directory: a module beside the spec imports) first on ``sys.path``; both are passed to every service's settings, so
each service registers the same kinds (docs/plugins.md).

The learner's own section types are reused as they are (``data``, ``algorithm``, ``optim``, ``train``): one
definition, documented once, in ``services/learner/settings.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from services.learner.algorithms.algorithm_settings import AlgorithmSettings, GRPOSettings, runs_fleet
from services.learner.settings import DataSettings, OptimSettings, TrainSettings
from services.reward.scorer_config import ScorerConfig
from shared.model_dir import looks_like_hub_id
from shared.plugins import import_plugins
from shared.settings import redis_url_with_scheme

from .placement import PlacementSpec


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RewardSpec(_Strict):
    """How samples are scored: the reward service's scorers (``fleetrl run`` starts it), or a running one."""

    scorers: list[ScorerConfig] | None = Field(
        default=None, description="The reward service's scorers (see examples/reward/); it is started with the run.")
    url: str | None = Field(default=None, description="Base URL of a reward service already running (POST /score).")
    stall_after_s: float = Field(
        default=60.0, gt=0.0, le=86_400.0, description="A scorer failing this long makes the display say the run "
        "is stalled on it (its name, URL and last error).")
    give_up_after_s: float = Field(
        default=600.0, ge=0.0, le=604_800.0, description="A scorer failing this long stops the run (the learner "
        "checkpoints; the same command resumes); 0: never give up.")

    @model_validator(mode="after")
    def _one_source(self) -> RewardSpec:
        if (self.scorers is None) == (self.url is None):
            raise ValueError("set exactly one of reward.scorers (a reward service started with the run) and "
                             "reward.url (one already running)")
        return self


class SamplingSpec(_Strict):
    """How the rollout fleet samples; the learner asks for it in every prompt and scores with what each sample
    was drawn with."""

    group_size: int = Field(default=8, ge=1, le=1024, description="Samples per prompt.")
    max_new_tokens: int = Field(default=256, ge=1, description="Tokens generated per sample at most.")
    temperature: float = Field(default=1.0, ge=0.0, description="Sampling temperature.")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="Nucleus mass (1: off).")
    top_k: int = Field(default=-1, ge=-1, description="Top-k (-1: off).")
    min_p: float = Field(default=0.0, ge=0.0, le=1.0, description="Min-p filter (0: off).")
    stop: list[str] = Field(default_factory=list, description="Stop strings.")


class RolloutPoolSpec(_Strict):
    """An elastic rollout pool: ``fleetrl run`` starts ``min`` replicas and grows or shrinks the pool between
    ``min`` and ``max`` on the learner's demand signal (docs/elastic.md); a replica that dies is replaced."""

    min: int = Field(default=1, ge=1, le=64, description="Replicas the pool never goes below (started first).")
    max: int = Field(default=4, ge=1, le=64, description="Replicas the pool never goes above.")
    cooldown_up_s: float = Field(default=5.0, ge=0, le=3600,
                                 description="Seconds after any change before the pool grows again (the learner's "
                                             "signal itself measures pool.min_steps steps at each new size first).")
    cooldown_down_s: float = Field(default=30.0, ge=0, le=3600,
                                   description="Seconds after any change before the pool shrinks again.")
    down_stable_s: float = Field(default=20.0, ge=0, le=3600,
                                 description="The signal must ask for fewer replicas this long before one is drained.")
    signal_max_age_s: float = Field(default=60.0, gt=0, le=3600,
                                    description="A demand signal older than this is ignored (the pool holds).")
    drain_timeout_s: float = Field(default=30.0, ge=0, le=3600,
                                   description="Time a drained replica's groups get to finish before it hands them back.")
    max_replacements: int = Field(default=3, ge=0, le=1000,
                                  description="Times one replica that keeps dying is replaced before the pool gives up "
                                              "on it (and says why).")

    @model_validator(mode="after")
    def _bounds(self) -> RolloutPoolSpec:
        if self.min > self.max:
            raise ValueError(f"replicas.rollout: min ({self.min}) is above max ({self.max})")
        return self


class ReplicasSpec(_Strict):
    """Processes per service on this machine."""

    rollout: int | RolloutPoolSpec = Field(
        default=1, description="Rollout replicas (each with its worker and sidecar): a number (fixed), or "
        "{min: 1, max: 4} for an elastic pool driven by the learner's demand signal (docs/elastic.md).")
    reward: int = Field(default=1, ge=1, le=64, description="Reward replicas (rollout replica i uses i mod n).")
    learner: int = Field(
        default=1, ge=1, le=64, description="Learner ranks (one process each, rank 0 serves HTTP and Redis, the "
        "others follow it): gloo on the CPU, one GPU each on CUDA; the learner's backend (services.learner.backend) "
        "replicates or shards the model over them (docs/scale.md). A run resumes on another number of ranks.")

    @model_validator(mode="after")
    def _rollout_count(self) -> ReplicasSpec:
        if isinstance(self.rollout, int) and not 1 <= self.rollout <= 64:
            raise ValueError(f"replicas.rollout: {self.rollout} replicas; a number from 1 to 64, or {{min: 1, max: 4}}")
        return self

    @property
    def pool(self) -> RolloutPoolSpec | None:
        """The elastic pool's settings, or None for a fixed number of replicas."""
        return self.rollout if isinstance(self.rollout, RolloutPoolSpec) else None

    @property
    def rollout_max(self) -> int:
        """Rollout replicas planned (ports, devices): all of a fixed pool, ``max`` of an elastic one."""
        return self.pool.max if self.pool else int(self.rollout)

    @property
    def rollout_start(self) -> int:
        """Rollout replicas started with the run."""
        return self.pool.min if self.pool else int(self.rollout)


class RedisSpec(_Strict):
    """Where the run's queue lives."""

    url: str | None = Field(default=None, description="An external Redis; unset: an embedded server in run_dir/redis.")

    @field_validator("url")
    @classmethod
    def _url_scheme(cls, v: str | None) -> str | None:
        return redis_url_with_scheme(v)  # named redis.url here, not as the rollout's redis_url


class EvalSpec(_Strict):
    """Held-out accuracy: greedy answers of the policy the rollout fleet serves, scored by the reward service."""

    data: str | None = Field(default=None, description="Held-out prompts (same format and keys as data); unset: none.")
    every: int | None = Field(default=None, ge=1, description="Evaluate every N learner steps (and before and after).")
    max_samples: int | None = Field(default=None, ge=1, description="Use only the first N held-out rows.")
    success_threshold: float = Field(
        default=1.0, description="Held-out accuracy is the share of answers whose reward is at least this (1.0: "
        "full credit; lower it for graded rewards). The mean reward is reported beside it.")


class ServicesSpec(_Strict):
    """Each service's own settings (a mapping, or the path of its settings file) for what the run spec does not
    set: e.g. ``rollout: {engine: {kind: hf, max_batch_size: 256}}``. Setting something the run spec sets, to
    another value, is an error naming both places."""

    learner: dict[str, Any] | str | None = Field(default=None, description="Learner settings (services/learner).")
    rollout: dict[str, Any] | str | None = Field(default=None, description="Rollout settings (services/rollout).")
    reward: dict[str, Any] | str | None = Field(default=None, description="Reward settings (services/reward).")


class RunSpec(_Strict):
    """One run: model, data, reward, algorithm, sampling, staleness, fleet shape, and where Redis is."""

    plugins: list[str] = Field(
        default_factory=list, description="Modules of yours imported before the rest of the spec is read, and by "
        "every service before its settings: the engines, scorers, algorithms, losses, corrections, rollout functions "
        "and environments they register can be named in this spec (docs/plugins.md), e.g. [my_plugins] for "
        "my_plugins.py beside the spec. Code runs only where the operator's spec names it.")
    sys_path: list[str] | None = Field(
        default=None, description="Directories put first on sys.path before plugins are imported (by fleetrl run "
        "and by every service); relative to the spec's directory. Unset: the spec's directory when plugins are set.")
    run_name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$", description="The run's name (its Redis namespace).")
    run_dir: str | None = Field(default=None, description="Logs, configs, checkpoints; default ./runs/<run_name>.")
    model: str = Field(description="The policy to start from: a local Hugging Face model directory.")
    data: DataSettings = Field(description="The prompt set (learner data settings: path, input_key, label_key, ...).")
    reward: RewardSpec | None = Field(default=None, description="How samples are scored (RL algorithms).")
    mode: str | None = Field(default=None, description="Shorthand for algorithm.name, e.g. mode: rm (reward-model "
                             "training), dpo, online_dpo, rejection_sampling, sft, grpo: the algorithm with its "
                             "defaults; an algorithm section of another name is an error.")
    algorithm: AlgorithmSettings = Field(default_factory=GRPOSettings, description="The learner's algorithm.")
    optim: OptimSettings = Field(default_factory=OptimSettings, description="Optimizer and LR schedule.")
    train: TrainSettings = Field(default_factory=TrainSettings, description="Batch shapes, max_steps, seed.")
    sampling: SamplingSpec = Field(default_factory=SamplingSpec)
    staleness: int = Field(
        default=1, ge=0, description="How many weight versions a sample's policy may be behind the learner's when it "
        "is trained: rollout workers stop taking prompts beyond it and the learner drops (and re-issues) older groups.")
    window: int | None = Field(
        default=None, ge=1, description="Prompt groups issued but not yet trained at most; default 2 x "
        "train.groups_per_step.")
    checkpoint_every: int = Field(default=10, ge=1, description="Checkpoint every N learner steps (and at the end).")
    export: str | None = Field(default=None, description="Write the final policy here (Hugging Face format); "
                               "{run_name} and {run_dir} are replaced, so each run of a spec exports apart: e.g. "
                               "'{run_dir}/export' or 'exports/{run_name}'.")
    replicas: ReplicasSpec = Field(default_factory=ReplicasSpec)
    placement: PlacementSpec = Field(default_factory=PlacementSpec,
                                     description="Devices of the learner and the replicas (deploy/run/placement.py).")
    redis: RedisSpec = Field(default_factory=RedisSpec)
    eval: EvalSpec = Field(default_factory=EvalSpec)
    services: ServicesSpec = Field(default_factory=ServicesSpec)

    @field_validator("plugins")
    @classmethod
    def _plugins_imported(cls, v: list[str]) -> list[str]:
        """Validating never imports: :func:`~deploy.run.load.load_spec` (the load step) imports ``plugins`` before
        the sections validate against the kinds they register; a spec built otherwise naming modules not
        imported is refused, not half-checked."""
        missing = [name for name in v if name not in sys.modules]
        if missing:
            raise ValueError(f"plugins {', '.join(map(repr, missing))} are not imported: load the spec with "
                             "deploy.run.load.load_spec (as fleetrl run does), which imports them first")
        return v

    @model_validator(mode="before")
    @classmethod
    def _mode_names_the_algorithm(cls, data: Any) -> Any:
        if not isinstance(data, dict) or data.get("mode") is None:
            return data
        mode, algorithm = data["mode"], data.get("algorithm")
        algorithm = dict(algorithm) if isinstance(algorithm, dict) else {}
        if algorithm.get("name", mode) != mode:
            raise ValueError(f"mode {mode} and algorithm.name {algorithm['name']} disagree: set one of them")
        return {**data, "algorithm": {**algorithm, "name": mode}}

    @model_validator(mode="after")
    def _consistent(self) -> RunSpec:
        if self.data.path is None:
            raise ValueError("data.path is required: the prompt set (JSONL, Parquet or a saved HF dataset)")
        if self.is_rl and self.reward is None:
            raise ValueError(f"algorithm {self.algorithm.name} needs reward: scorers or url")
        if self.eval.every is not None and self.eval.data is None:
            raise ValueError("eval.every needs eval.data (the held-out prompts)")
        if not self.is_rl and "groups_per_step" in self.train.model_fields_set:
            raise ValueError("train.groups_per_step: an sft run takes algorithm.batch_size pairs per step; set that "
                             "instead")
        if self.replicas.learner > 1 and not self.is_rl:
            raise ValueError(f"replicas.learner: {self.replicas.learner} ranks; algorithm {self.algorithm.name} trains "
                             "on one rank: set replicas.learner: 1")
        if self.eval.data is not None and not self.is_rl and not self.heldout_pairs:
            raise ValueError("eval.data: held-out evaluation goes through the rollout fleet, which an sft run does "
                             "not start; evaluate its export with an RL run's eval or fleetrl eval")
        return self

    @property
    def is_rl(self) -> bool:
        """RL runs start the rollout and reward fleets; SFT is the learner alone."""
        return runs_fleet(self.algorithm)

    @property
    def heldout_pairs(self) -> bool:
        """A preference run (rm, dpo): eval.data holds held-out pairs, measured by the learner itself."""
        return getattr(self.algorithm, "data_kind", None) == "pairs"

    @property
    def group_window(self) -> int:
        return self.window if self.window is not None else 2 * self.train.groups_per_step


def import_spec_plugins(raw: dict[str, Any]) -> None:
    """Import the modules of ``raw``'s ``plugins`` (paths already resolved), ``sys_path`` first on ``sys.path``.
    ValueError, one line naming ``sys_path[j]`` or ``plugins[i]`` and the reason; not lists: the fields say so."""
    modules, paths = raw.get("plugins"), raw.get("sys_path")
    if not isinstance(modules, list) or not modules:
        return
    paths = paths if isinstance(paths, list) else []
    for j, entry in enumerate(paths):
        if not isinstance(entry, str) or not Path(entry).is_dir():
            raise ValueError(f"sys_path[{j}]: no directory at {entry}")
    for i, name in enumerate(modules):
        try:
            import_plugins([name], paths)
        except ValueError as exc:
            reason = str(exc).removeprefix("plugins: ").splitlines()[0]
            raise ValueError(f"plugins[{i}]: {reason}") from exc


def resolve_paths(raw: dict[str, Any], base: Path) -> dict[str, Any]:
    """``raw`` with the spec's relative paths made absolute against ``base`` (the spec file's directory)."""

    def absolute(value: Any) -> Any:
        if isinstance(value, str) and value and not Path(value).expanduser().is_absolute():
            return str((base / value).resolve())
        return value

    out = dict(raw)
    model = out.get("model")
    if isinstance(model, str) and ((base / model).exists() or not looks_like_hub_id(model)):
        out["model"] = absolute(model)  # a local directory (perhaps one an earlier run will export)
    for key in ("export", "run_dir"):
        if key in out:
            out[key] = absolute(out[key])
    if isinstance(out.get("sys_path"), list):
        out["sys_path"] = [absolute(e) for e in out["sys_path"]]
    elif out.get("sys_path") is None and out.get("plugins"):  # a module beside the spec imports
        out["sys_path"] = [str(base.resolve())]
    if isinstance(out.get("export"), str) and isinstance(out.get("run_name"), str):  # one export per run
        run_dir = out.get("run_dir") or str((Path("runs") / out["run_name"]).resolve())
        export = raw["export"].replace("{run_dir}", run_dir).replace("{run_name}", out["run_name"])
        out["export"] = absolute(export)
    for section, key in (("data", "path"), ("eval", "data")):
        if isinstance(out.get(section), dict) and key in out[section]:
            out[section] = {**out[section], key: absolute(out[section][key])}
    if isinstance(out.get("services"), dict):
        out["services"] = {k: absolute(v) for k, v in out["services"].items()}
    reward = out.get("reward")
    if isinstance(reward, dict) and isinstance(reward.get("scorers"), list):
        out["reward"] = {**reward, "scorers": [_scorer_paths(s, base, absolute) for s in reward["scorers"]]}
    return out


def _scorer_paths(scorer: Any, base: Path, absolute) -> Any:
    """A scorer's paths against the spec's directory: a python scorer's ``sys_path`` entries (with none, the
    spec's directory itself: a reward module beside the spec imports), an hf_rm's local ``model``."""
    if not isinstance(scorer, dict):
        return scorer
    out = dict(scorer)
    if out.get("kind") == "python":
        entries = out.get("sys_path")
        out["sys_path"] = [absolute(e) for e in entries] if isinstance(entries, list) else (
            entries if entries is not None else [str(base.resolve())])
    model = out.get("model")
    if out.get("kind") == "hf_rm" and isinstance(model, str) and (
            (base / model).exists() or not looks_like_hub_id(model)):
        out["model"] = absolute(model)
    return out
