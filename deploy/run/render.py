"""``fleetrl render k8s|compose|ray SPEC``: the run spec carried to a cluster. Each service's settings are derived
from the spec exactly as ``fleetrl run`` derives them (``derive.py``), then completed with what the cluster wires:
service names for the reward URL, the volumes the paths live on, replica counts. Secrets are never written: the
control token, the Redis password and the run key stay where the static shapes keep them (a Kubernetes Secret,
compose's environment, the Ray launcher's environment), and a spec that would put one in a file is refused.

Paths. Under Kubernetes and compose the spec's directory is the models volume, mounted at ``/models``: ``model:
sft-model`` becomes ``/models/sft-model``, ``data.path: data/train.jsonl`` ``/models/data/train.jsonl``, a reward
module beside the spec imports from ``/models``. The export goes to the checkpoints volume (``/checkpoints/<its
path under the spec's directory or the run dir>``), the learner's run dir is ``/checkpoints/learner``. On Ray the
paths stay as they are here: every node must see them (a shared filesystem), as ``fleetrl run --on ray`` says.

Not carried: held-out evaluation (``eval``) is done by ``fleetrl run`` itself, so the rendered run has none; measure
the export with ``fleetrl eval SPEC --model DIR`` afterwards. ``placement`` is the local machine's GPU layout.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from shared.settings import SettingsError

from .derive import deep_merge, service_config, validate
from .plan import KINDS, run_dir_of
from .render_ranks import compose_learner_ranks, k8s_learner_ranks
from .spec import RunSpec

MODELS = "/models"
CHECKPOINTS = "/checkpoints"
PORTS = {"rollout": 8001, "reward": 8002, "learner": 8003}
SECRET_KEY = re.compile(r"^(.*[_-])?(token|password|passwd|secret|api_?key|authorization|credentials?)$|^run_key$",
                        re.IGNORECASE)
URL_WITH_PASSWORD = re.compile(r"^[a-z][a-z0-9+.-]*://[^/@\s]*:[^/@\s]+@", re.IGNORECASE)
REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the ConfigMap's service files) as ``|`` blocks, readable in the manifest; no anchors."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump(data: Any) -> str:
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, width=120)


def dump_all(docs: list[Any]) -> str:
    return yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False, width=120)


class RenderError(ValueError):
    """The spec cannot be carried to the cluster as it is; the message names the setting and what to do."""


@dataclass
class Carried:
    """The run's services for a cluster: each one's settings (no secrets), replicas, and what was not carried."""

    spec: RunSpec
    configs: dict[str, dict[str, Any]]  # "reward" (absent with reward.url), "rollout", "learner"
    replicas: dict[str, int]
    wait_files: list[str] = field(default_factory=list)  # files the services wait for (the model's config.json)
    notes: list[str] = field(default_factory=list)

    @property
    def own_reward(self) -> bool:
        return "reward" in self.configs

    @property
    def rollout_gpus(self) -> int:
        engine = self.configs["rollout"].get("engine") or {}
        return int(str(engine.get("device", "cpu")).startswith("cuda"))

    @property
    def learner_gpus(self) -> int:
        """GPUs per learner rank (one on CUDA)."""
        model = self.configs["learner"].get("model") or {}
        return int(str(model.get("device", "cpu")).startswith("cuda"))

    @property
    def learner_ranks(self) -> int:
        return self.replicas.get("learner", 1)


def _relocate(value: Any, moves: list[tuple[Path, str]], outside: set[str]) -> Any:
    """``value`` with every absolute local path under one of ``moves``' directories moved to its mount point."""
    if isinstance(value, dict):
        return {k: _relocate(v, moves, outside) for k, v in value.items()}
    if isinstance(value, list):
        return [_relocate(v, moves, outside) for v in value]
    if isinstance(value, str) and value.startswith("/"):
        path = Path(value)
        for base, mount in moves:
            if path == base or base in path.parents:
                rel = path.relative_to(base).as_posix()
                return mount if rel == "." else f"{mount}/{rel}"
        if path.exists():
            outside.add(value)
    return value


def _export_target(export: str, spec_dir: Path, run_dir: Path) -> str:
    path = Path(export)
    for base in (run_dir, spec_dir):
        if path == base or base in path.parents:
            return f"{CHECKPOINTS}/{path.relative_to(base).as_posix()}"
    return f"{CHECKPOINTS}/{path.name}"


def check_no_secrets(configs: dict[str, dict[str, Any]]) -> None:
    """RenderError naming each setting that would put a secret (a token, password, key, or a URL with a password)
    into a rendered file."""
    found: list[str] = []

    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                here = f"{where}.{k}"
                if SECRET_KEY.match(str(k)) and v not in (None, "", {}, []):
                    found.append(here)
                else:
                    walk(v, here)
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{where}[{i}]")
        elif isinstance(node, str) and URL_WITH_PASSWORD.match(node):
            found.append(f"{where} (a URL with a password)")

    for service, config in configs.items():
        walk(config, service)
    if found:
        raise RenderError(f"{', '.join(found)}: a secret would be written into the rendered files in clear; remove it "
                          "from the spec and give it to the service through its environment from a secret store "
                          "(a Kubernetes Secret, compose's environment, the Ray launcher's environment)")


def carry(spec: RunSpec, spec_file: str | Path, *, target: str) -> Carried:
    """The run's service settings for ``target`` ("k8s", "compose" or "ray"), validated by each service's settings
    class. Raises RenderError / SettingsError naming the setting."""
    if not spec.is_rl:
        raise RenderError(f"algorithm {spec.algorithm.name}: an sft run is the learner alone; run it with fleetrl run "
                          f"and render the RL spec that starts from its export")
    spec_dir = Path(spec_file).resolve().parent
    run_dir = run_dir_of(spec)
    notes: list[str] = []
    configs: dict[str, dict[str, Any]] = {}
    if spec.reward.scorers is not None:
        configs["reward"] = service_config(spec, "reward", spec_file)
    configs["rollout"] = service_config(spec, "rollout", spec_file)
    configs["learner"] = deep_merge({"observability": {"progress_bar": False, "plot": False}},
                                    service_config(spec, "learner", spec_file))
    check_no_secrets(configs)
    for svc, cfg in configs.items():  # as each service will read them (local paths: they exist here)
        probe = copy.deepcopy(cfg)
        if svc != "reward":  # what the cluster gives each process from its secrets, for validation only
            probe.setdefault("redis_url", "redis://redis:6379/0")
        validate(KINDS[svc].settings_cls, svc, probe)
    configs["rollout"] = deep_merge(configs["rollout"], {"worker": {"enabled": True}})  # what fleetrl run sets
    learner = configs["learner"]
    if target == "ray":
        learner["run_dir"] = str(run_dir / "learner")
        notes.append(f"the paths are this machine's ({spec_dir}, {run_dir}): every Ray node must see them")
    else:
        export = (learner.get("checkpoint") or {}).get("export_dir")
        if export:
            learner["checkpoint"]["export_dir"] = _export_target(export, spec_dir, run_dir)
        learner["run_dir"] = f"{CHECKPOINTS}/learner"
        outside: set[str] = set()
        moves = [(spec_dir, MODELS)]
        configs = {svc: _relocate(cfg, moves, outside) for svc, cfg in configs.items()}
        learner = configs["learner"]
        for path in sorted(outside):
            notes.append(f"{path} is outside the spec's directory: the containers must have it at that path")
        for svc in configs:
            configs[svc]["port"] = PORTS[svc]
        host = {"k8s": "fleetrl-reward", "compose": "reward"}[target]
        reward_url = f"http://{host}:{PORTS['reward']}" if spec.reward.scorers is not None else spec.reward.url
        configs["rollout"] = deep_merge(configs["rollout"], {"worker": {"enabled": True, "reward_url": reward_url}})
        if target == "compose":
            learner.setdefault("publish", {}).setdefault("sync", {})["master_addr"] = "learner"
        else:  # the pod IP comes from the environment (FLEETRL_LEARNER_PUBLISH__SYNC__MASTER_ADDR)
            learner.setdefault("publish", {}).setdefault("sync", {}).update({"rendezvous_port": 29600,
                                                                           "rendezvous_ports": 4})
    if spec.redis.url and target != "ray":
        notes.append("redis.url is not carried: the rendered run has its own Redis (password from the secret)")
    if spec.eval.data:
        notes.append("eval is not carried (fleetrl run measures held-out accuracy itself): after the run, "
                     f"fleetrl eval {Path(spec_file).name} --model <the export>")
    if spec.replicas.pool is not None:
        notes.append(f"replicas.rollout is an elastic pool: it starts at {spec.replicas.pool.min}; "
                     + ("rollout_pool carries min/max to the Ray launcher" if target == "ray" else
                        "scale it with deploy/k8s/autoscaling/ (HPA or KEDA)" if target == "k8s" else
                        "compose scales by hand (docker compose up --scale rollout=N)"))
    model = learner["model"]["actor"]
    wait = [f"{model}/config.json"] if model.startswith(f"{MODELS}/") else []
    replicas = {"rollout": spec.replicas.rollout_start, "reward": spec.replicas.reward if "reward" in configs else 0,
                "learner": spec.replicas.learner}
    if spec.replicas.learner > 1:
        _learner_ranks_device(learner)
        notes.append(f"the learner's {spec.replicas.learner} ranks write their checkpoint shards into one directory: "
                     + ("every Ray node must see run_dir" if target == "ray" else
                        "the checkpoints volume must be ReadWriteMany when the ranks' pods land on several nodes"
                        if target == "k8s" else "the checkpoints volume is shared by the learner's containers"))
    return Carried(spec, configs, replicas, wait, notes)


def _learner_ranks_device(learner: dict[str, Any]) -> None:
    """Several learner ranks on GPUs take one each: a bare ``cuda`` (each rank's own, from its LOCAL_RANK), never
    one named GPU for all of them."""
    model = learner.setdefault("model", {})
    device = str(model.get("device") or "auto")
    if device.startswith("cuda:"):
        raise RenderError(f"services.learner.model.device is {device}, but replicas.learner ranks take one GPU "
                          "each: set it to cuda (or auto)")


# ---- Kubernetes ----------------------------------------------------------------------------------------------------

def _docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((K8S / name).read_text()) if d]


def _env(container: dict, name: str, value: str | None) -> None:
    """Set (or with None remove) a plain env var of ``container``, keeping its place in the list."""
    env = container.setdefault("env", [])
    for i, e in enumerate(env):
        if e["name"] == name:
            if value is None:
                del env[i]
            else:
                env[i] = {"name": name, "value": value}
            return
    if value is not None:
        env.append({"name": name, "value": value})


def _wait_for(container: dict, files: list[str]) -> None:
    env = {e["name"]: e for e in container.get("env", [])}
    if "FLEETRL_WAIT_FOR" not in env:
        return
    parts = [p for p in env["FLEETRL_WAIT_FOR"]["value"].split() if not p.startswith("file:")]
    _env(container, "FLEETRL_WAIT_FOR", " ".join(parts + [f"file:{f}" for f in files]))


def _gpu(container: dict, count: int) -> None:
    if count:
        container.setdefault("resources", {}).setdefault("limits", {})["nvidia.com/gpu"] = count


def k8s_manifests(carried: Carried) -> dict[str, list[dict]]:
    """File name -> documents: deploy/k8s/'s shapes with the run's settings, replicas and volumes."""
    spec = carried.spec
    labels = {"fleetrl.dev/run": spec.run_name}
    out: dict[str, list[dict]] = {}
    config = _docs("config.yaml")[0]
    config["data"] = {f"{svc}.yaml": dump(cfg) for svc, cfg in carried.configs.items()}
    out["config.yaml"] = [config]
    out["storage.yaml"] = _docs("storage.yaml")
    out["redis.yaml"] = _docs("redis.yaml")
    if carried.own_reward:
        reward = _docs("reward.yaml")
        deploy = reward[0]
        deploy["spec"]["replicas"] = carried.replicas["reward"]
        pod = deploy["spec"]["template"]["spec"]
        pod["containers"][0]["volumeMounts"].append({"name": "models", "mountPath": MODELS, "readOnly": True})
        pod["volumes"].append({"name": "models", "persistentVolumeClaim": {"claimName": "fleetrl-models",
                                                                          "readOnly": True}})
        out["reward.yaml"] = reward
    rollout = _docs("rollout.yaml")
    rollout[0]["spec"]["replicas"] = carried.replicas["rollout"]
    c = rollout[0]["spec"]["template"]["spec"]["containers"][0]
    _wait_for(c, carried.wait_files)
    if not carried.own_reward:  # the run's token is never sent to someone else's reward service
        c["env"] = [e for e in c["env"] if e["name"] != "FLEETRL_ROLLOUT_WORKER__REWARD_TOKEN"]
        _env(c, "FLEETRL_WAIT_FOR", " ".join(p for p in next(e["value"] for e in c["env"]
                                                            if e["name"] == "FLEETRL_WAIT_FOR").split()
                                             if "fleetrl-reward" not in p))
    _gpu(c, carried.rollout_gpus)
    out["rollout.yaml"] = rollout
    learner = _docs("learner.yaml")
    c = learner[0]["spec"]["template"]["spec"]["containers"][0]
    _wait_for(c, carried.wait_files)
    _gpu(c, carried.learner_gpus)
    if carried.learner_ranks > 1:
        learner = k8s_learner_ranks(learner, carried.learner_ranks, PORTS["learner"])
    out["learner.yaml"] = learner
    for docs in out.values():
        for d in docs:
            d["metadata"].setdefault("labels", {}).update(labels)
            template = d.get("spec", {}).get("template")
            if isinstance(template, dict):
                template.setdefault("metadata", {}).setdefault("labels", {}).update(labels)
    return out


def kustomization(carried: Carried, files: list[str]) -> str:
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    kust["resources"] = files
    head = [f"# The run spec {carried.spec.run_name!r} on Kubernetes (fleetrl render k8s). Before kubectl apply -k:",
            "#   kubectl create secret generic fleetrl-token --from-literal=token=$(openssl rand -hex 16) \\",
            "#     --from-literal=redis-password=$(openssl rand -hex 24) --from-literal=run-key=$(openssl rand -hex 32)",
            f"#   copy the spec's directory onto the fleetrl-models volume (it is {MODELS} in every pod)",
            *[f"# note: {n}" for n in carried.notes]]
    return "\n".join(head) + "\n" + dump(kust)


def write_k8s(carried: Carried, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    manifests = k8s_manifests(carried)
    written = []
    for name, docs in manifests.items():
        path = out_dir / name
        path.write_text(f"# rendered by fleetrl render k8s from the run spec {carried.spec.run_name!r}\n"
                        + dump_all(docs))
        written.append(path)
    path = out_dir / "kustomization.yaml"
    path.write_text(kustomization(carried, list(manifests)))
    return [*written, path]


# ---- compose -------------------------------------------------------------------------------------------------------

_NEED = "set {0} to a secret ({1})"
_TOKEN = "${FLEETRL_TOKEN:?" + _NEED.format("FLEETRL_TOKEN", "openssl rand -hex 16") + "}"
_REDIS_PW = "${REDIS_PASSWORD:?" + _NEED.format("REDIS_PASSWORD", "openssl rand -hex 24") + "}"
_RUN_KEY = "${FLEETRL_RUN_KEY:?" + _NEED.format("FLEETRL_RUN_KEY", "openssl rand -hex 32") + "}"


def compose_file(carried: Carried, spec_dir: Path) -> dict[str, Any]:
    """A compose project for the run: Redis, the reward service (when the spec has scorers), the rollout replicas
    and the learner, from the repo's images; the spec's directory bind-mounted read-only at /models; secrets only
    as ``${VAR}`` references to the environment."""
    redis_url = f"redis://:{_REDIS_PW}@redis:6379/0"
    base = {"restart": "on-failure", "networks": ["fleet"]}
    common_env = {"REDIS_URL": redis_url, "OMP_NUM_THREADS": "${FLEETRL_THREADS:-1}",
                  "FLEETRL_WAIT_TIMEOUT_S": "${FLEETRL_WAIT_TIMEOUT_S:-1800}"}
    models = f"{spec_dir}:{MODELS}:ro"
    health = {"interval": "10s", "timeout": "10s", "retries": 5, "start_period": "120s"}

    def check(port: int) -> dict:
        return {**health, "test": ["CMD", "python", "-c", ("import urllib.request as u; "
                                   f"u.urlopen('http://127.0.0.1:{port}/health', timeout=8)")]}

    def image(svc: str) -> dict:
        return {"image": f"${{FLEETRL_{svc.upper()}_IMAGE:-fleetrl-{svc}}}",
                "build": {"context": str(REPO), "dockerfile": f"deploy/docker/{svc}.Dockerfile",
                          "args": {"BASE_IMAGE": "${FLEETRL_BASE_IMAGE:-fleetrl-base}"}}}

    files = " ".join(f"file:{f}" for f in carried.wait_files)
    services: dict[str, Any] = {
        "redis": {"image": "${REDIS_IMAGE:-redis:7}",
                  "command": ["redis-server", "--requirepass", _REDIS_PW, "--appendonly", "yes", "--appendfsync",
                              "everysec", "--auto-aof-rewrite-min-size", "4mb", "--dir", "/data"],
                  "environment": {"REDISCLI_AUTH": _REDIS_PW}, "volumes": ["redis-data:/data"],
                  "restart": "unless-stopped", "networks": ["fleet"],
                  "healthcheck": {"test": ["CMD-SHELL", "redis-cli ping | grep -q PONG"], "interval": "5s",
                                  "timeout": "3s", "retries": 10}},
    }
    if carried.own_reward:
        services["reward"] = {
            **base, **image("reward"), "command": ["python", "-m", "services.reward", "--config", "/config/reward.yaml"],
            "environment": {**common_env, "FLEETRL_REWARD_HOST": "0.0.0.0", "FLEETRL_REWARD_AUTH_TOKEN": _TOKEN},
            "volumes": [models, "./config/reward.yaml:/config/reward.yaml:ro"], "expose": [str(PORTS["reward"])],
            "deploy": {"replicas": carried.replicas["reward"]}, "healthcheck": check(PORTS["reward"])}
    rollout_env = {**common_env, "FLEETRL_ROLLOUT_HOST": "0.0.0.0", "FLEETRL_ROLLOUT_REDIS_URL": redis_url,
                   "FLEETRL_ROLLOUT_RUN_KEY": _RUN_KEY, "FLEETRL_ROLLOUT_CONTROL_TOKEN": _TOKEN,
                   "FLEETRL_WAIT_FOR": " ".join(["tcp://redis:6379", *(["http://reward:8002/health"]
                                                                       if carried.own_reward else []), files]).strip()}
    if carried.own_reward:
        rollout_env["FLEETRL_ROLLOUT_WORKER__REWARD_TOKEN"] = _TOKEN
    depends = {"redis": {"condition": "service_healthy"}}
    services["rollout"] = {
        **base, **image("rollout"), "stop_grace_period": "60s",
        "command": ["python", "-m", "services.rollout", "--config", "/config/rollout.yaml"],
        "environment": rollout_env, "volumes": [models, "./config/rollout.yaml:/config/rollout.yaml:ro"],
        "expose": [str(PORTS["rollout"])], "deploy": {"replicas": carried.replicas["rollout"]},
        "depends_on": {**depends, **({"reward": {"condition": "service_healthy"}} if carried.own_reward else {})},
        "healthcheck": check(PORTS["rollout"])}
    services["learner"] = {
        **base, **image("learner"), "networks": {"fleet": {"aliases": ["learner"]}},
        "command": ["python", "-m", "services.learner", "--config", "/config/learner.yaml"],
        "environment": {**common_env, "FLEETRL_LEARNER_HOST": "0.0.0.0", "FLEETRL_LEARNER_REDIS_URL": redis_url,
                        "FLEETRL_LEARNER_RUN_KEY": _RUN_KEY, "FLEETRL_LEARNER_CONTROL_TOKEN": _TOKEN,
                        "FLEETRL_WAIT_FOR": f"tcp://redis:6379 http://rollout:8001/health {files}".strip()},
        "volumes": [models, "checkpoints:/checkpoints", "./config/learner.yaml:/config/learner.yaml:ro"],
        "ports": ["${FLEETRL_LEARNER_PORT:-8003}:8003"],
        "depends_on": {**depends, "rollout": {"condition": "service_healthy"}}, "healthcheck": check(PORTS["learner"])}
    for svc, gpus in (("rollout", carried.rollout_gpus), ("learner", carried.learner_gpus)):
        if gpus:
            services[svc].setdefault("deploy", {})["resources"] = {
                "reservations": {"devices": [{"driver": "nvidia", "count": gpus, "capabilities": ["gpu"]}]}}
    if carried.learner_ranks > 1:
        compose_learner_ranks(services, carried.learner_ranks, carried.learner_gpus)
    return {"name": f"fleetrl-{carried.spec.run_name.lower().replace('.', '-')}", "services": services,
            "networks": {"fleet": {}}, "volumes": {"redis-data": {}, "checkpoints": {}}}


def write_compose(carried: Carried, spec_file: Path, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config").mkdir(exist_ok=True)
    written = []
    for svc, cfg in carried.configs.items():
        path = out_dir / "config" / f"{svc}.yaml"
        path.write_text(f"# {svc} of the run spec {carried.spec.run_name!r} (fleetrl render compose)\n"
                        + dump(cfg))
        written.append(path)
    head = [f"# The run spec {carried.spec.run_name!r} with compose (fleetrl render compose {spec_file.name}).",
            ("#   export FLEETRL_TOKEN=$(openssl rand -hex 16) REDIS_PASSWORD=$(openssl rand -hex 24) "
            "FLEETRL_RUN_KEY=$(openssl rand -hex 32)"),
            f"#   docker compose -f {out_dir / 'docker-compose.yml'} up",
            (f"# The spec's directory ({spec_file.resolve().parent}) is {MODELS}, read-only; the export and checkpoints "
            "are on the checkpoints volume."),
            *[f"# note: {n}" for n in carried.notes]]
    path = out_dir / "docker-compose.yml"
    path.write_text("\n".join(head) + "\n"
                    + dump(compose_file(carried, spec_file.resolve().parent)))
    return [*written, path]


# ---- Ray -----------------------------------------------------------------------------------------------------------

def ray_launch(carried: Carried, *, redis_url: str | None = None, ray_address: str | None = None) -> dict[str, Any]:
    """The Ray launcher's settings (deploy/ray/settings.py ``LaunchSettings``) for the run. ``redis_url`` is
    written only without a password; otherwise ``${REDIS_URL}``, read from the launcher's environment."""
    spec = carried.spec
    url = redis_url or spec.redis.url
    written_url = url if url and not URL_WITH_PASSWORD.match(url) else "${REDIS_URL}"
    cfg = carried.configs

    def group(svc: str, replicas: int, cpus: float, gpus: int) -> dict[str, Any]:
        return {"replicas": replicas, "num_cpus": cpus, "num_gpus": gpus, "port": 0, "config": cfg[svc]}

    threads = lambda svc: float((cfg[svc].get("engine") or cfg[svc].get("train") or {}).get("torch_threads") or 1)
    out: dict[str, Any] = {"ray_address": ray_address, "run_name": spec.run_name, "redis_url": written_url,
                           "workdir": str(REPO),
                           "rollout": group("rollout", carried.replicas["rollout"], threads("rollout"),
                                            carried.rollout_gpus),
                           "learner": group("learner", carried.learner_ranks, threads("learner"),
                                            carried.learner_gpus)}
    out["reward"] = group("reward", carried.replicas["reward"], 1.0, 0) if carried.own_reward else {"replicas": 0}
    if not carried.own_reward:
        out["rollout"]["config"] = deep_merge(cfg["rollout"], {"worker": {"reward_url": spec.reward.url}})
    if spec.replicas.pool is not None:
        pool = spec.replicas.pool.model_dump()
        out["rollout_pool"] = pool
    return out


def write_ray(carried: Carried, out_dir: Path, **kw: Any) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    launch = ray_launch(carried, **kw)
    head = [f"# The run spec {carried.spec.run_name!r} on Ray (fleetrl render ray); run it with",
            f"#   FLEETRL_TOKEN=... python -m deploy.ray --config {out_dir / 'fleet.yaml'}",
            "# or let fleetrl run --on ray SPEC do both. ${REDIS_URL} is read from the environment.",
            *[f"# note: {n}" for n in carried.notes]]
    path = out_dir / "fleet.yaml"
    path.write_text("\n".join(head) + "\n" + dump(launch))
    return [path]


def render(target: str, spec: RunSpec, spec_file: Path, out_dir: Path, **kw: Any) -> tuple[Carried, list[Path]]:
    if target not in ("k8s", "compose", "ray"):
        raise RenderError(f"render {target!r}: one of k8s, compose, ray")
    try:
        carried = carry(spec, spec_file, target=target)
    except SettingsError as exc:
        raise RenderError(str(exc)) from exc
    if target == "k8s":
        return carried, write_k8s(carried, out_dir)
    if target == "compose":
        return carried, write_compose(carried, spec_file, out_dir)
    return carried, write_ray(carried, out_dir, **kw)
