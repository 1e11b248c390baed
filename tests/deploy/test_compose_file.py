"""docker-compose.yml and the Dockerfiles: the structure the issue asks for, checked without a container
engine (make compose-test runs the stack for real under podman-compose)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((REPO / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
HTTP_PORTS = {"reward": 8002, "rollout": 8001, "learner": 8003, "rollout-vllm": 8001, "rollout-sglang": 8001,
              "learner-deepspeed": 8003}
GPU = {"rollout-vllm": "vllm", "rollout-sglang": "sglang", "learner-deepspeed": "deepspeed"}


def test_default_stack_runs_on_cpu_without_profiles():
    default = {name for name, svc in SERVICES.items() if not svc.get("profiles")}
    assert default == {"redis", "prepare", "reward", "rollout", "learner", "demo"}
    for name, profile in GPU.items():
        assert SERVICES[name]["profiles"] == [profile]


def test_redis_persists_with_aof_on_a_volume():
    redis = SERVICES["redis"]
    assert redis["image"].startswith("${REDIS_IMAGE:-")
    assert "--appendonly" in redis["command"] and redis["command"][redis["command"].index("--appendonly") + 1] == "yes"
    assert "redis-data:/data" in redis["volumes"] and "redis-data" in COMPOSE["volumes"]
    assert {"models", "checkpoints"} <= set(COMPOSE["volumes"])


@pytest.mark.parametrize("name", sorted(HTTP_PORTS))
def test_services_have_health_checks_on_their_health_route(name):
    test = " ".join(SERVICES[name]["healthcheck"]["test"])
    assert f"127.0.0.1:{HTTP_PORTS[name]}/health" in test


@pytest.mark.parametrize("name", sorted(set(HTTP_PORTS) - {"reward"}))
def test_control_token_is_required_never_defaulted(name):
    env = SERVICES[name]["environment"]
    token_vars = {k: v for k, v in env.items() if k.endswith("_CONTROL_TOKEN")}
    assert len(token_vars) == 1, f"{name} sets no control token"
    assert re.fullmatch(r"\$\{FLEETRL_TOKEN:\?[^}]+\}", next(iter(token_vars.values())))


def test_reward_takes_no_control_token():  # it has no control routes: its bearer check is auth_token
    assert not [k for k in SERVICES["reward"]["environment"] if k.endswith("_CONTROL_TOKEN")]


def test_no_token_default_anywhere_in_the_file():
    text = (REPO / "docker-compose.yml").read_text()
    assert "FLEETRL_TOKEN:-" not in text and "FLEETRL_TOKEN-" not in text


@pytest.mark.parametrize("name", ["reward", "rollout", "rollout-vllm", "rollout-sglang"])
def test_scalable_services_name_no_replica(name):
    svc = SERVICES[name]
    assert "container_name" not in svc and "hostname" not in svc
    assert "ports" not in svc, "a fixed host port would stop --scale"
    assert "replicas" not in svc.get("deploy", {})


@pytest.mark.parametrize("name", ["rollout", "learner", "demo"])
def test_services_wait_for_dependencies_by_health_not_sleep(name):
    svc = SERVICES[name]
    waits = svc["environment"]["FLEETRL_WAIT_FOR"].split()
    assert any(w.endswith("/health") for w in waits)
    assert "sleep" not in " ".join(map(str, svc.get("command", [])))
    deps = svc.get("depends_on", {})
    assert all(d["condition"] in ("service_healthy", "service_completed_successfully") for d in deps.values())


def test_rollout_and_learner_start_after_the_init_service():
    assert SERVICES["rollout"]["depends_on"]["prepare"]["condition"] == "service_completed_successfully"
    for name in ("rollout", "learner", "rollout-vllm", "rollout-sglang", "learner-deepspeed"):
        assert "file:/models/READY" in SERVICES[name]["environment"]["FLEETRL_WAIT_FOR"]


@pytest.mark.parametrize("name", sorted(GPU))
def test_gpu_services_reserve_nvidia_devices_and_build_from_engine_images(name):
    devices = SERVICES[name]["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and devices[0]["capabilities"] == ["gpu"]
    base = SERVICES[name]["build"]["args"]["BASE_IMAGE"]
    assert any(img in base for img in ("vllm/vllm-openai", "lmsysorg/sglang", "pytorch/pytorch"))


def names_on_the_network(name: str) -> set[str]:
    """What other containers on the fleet network reach service ``name`` by: its name and its aliases."""
    nets = SERVICES[name].get("networks", [])
    aliases = [a for net in nets.values() for a in (net or {}).get("aliases", [])] if isinstance(nets, dict) else []
    return {name, *aliases}


@pytest.mark.parametrize("name,config", [("learner", "learner.yaml"), ("learner-deepspeed", "learner-deepspeed.yaml")])
def test_weight_sync_master_addr_is_a_name_the_learner_answers_to(name, config):
    """``hostname:`` names a container only to itself; other services resolve service names and aliases."""
    cfg = yaml.safe_load((REPO / "deploy/compose/config" / config).read_text())
    assert cfg["publish"]["sync"]["master_addr"] in names_on_the_network(name)


def test_no_service_relies_on_hostname():
    assert not [name for name, svc in SERVICES.items() if "hostname" in svc]


def _hosts(wait_for: str) -> set[str]:
    return {re.match(r"(?:https?|tcp)://([^:/]+)", w).group(1) for w in wait_for.split() if "://" in w
            and not w.startswith("file:")}


@pytest.mark.parametrize("profile_services", [("rollout-vllm", "learner-deepspeed"), ("rollout-sglang", "learner")])
def test_demo_waits_only_on_what_runs_with_the_gpu_profiles(profile_services):
    """The GPU command scales rollout (and learner) to 0: the demo must not depend on them, and every host it
    waits for must be answered by a service that does run."""
    demo = SERVICES["demo"]
    assert not demo.get("depends_on"), "depends_on a service scaled to 0 waits forever"
    running = {"redis", "reward", *profile_services}
    answered = set().union(*(names_on_the_network(s) for s in running))
    assert _hosts(demo["environment"]["FLEETRL_WAIT_FOR"]) <= answered


def _default(value: str) -> str:
    m = re.fullmatch(r"\$\{[A-Z_]+:-([^}]*)\}", value)
    assert m, f"{value!r}: a variable with a default"
    return m.group(1)


def test_gpu_services_name_their_devices_and_never_share_one_by_default():
    ids = {}
    for name in GPU:
        (device,) = SERVICES[name]["deploy"]["resources"]["reservations"]["devices"]
        assert "count" not in device, f"{name}: count takes the first free GPUs (GPU 0 for every service)"
        (value,) = device["device_ids"]
        ids[name] = set(_default(value).split(","))
    assert ids["rollout-vllm"].isdisjoint(ids["learner-deepspeed"])
    assert ids["rollout-sglang"].isdisjoint(ids["learner-deepspeed"])


@pytest.mark.parametrize("name", sorted(GPU))
def test_gpu_services_can_take_a_real_model(name):
    """A host directory (bind mount, read-only) or a hub id downloaded into the shared HF cache volume."""
    svc = SERVICES[name]
    vols = svc["volumes"]
    assert "${FLEETRL_MODEL_HOST_DIR:-user-model}:/user-model:ro" in vols and "user-model" in COMPOSE["volumes"]
    assert "hf-cache:/hf-cache" in vols and "hf-cache" in COMPOSE["volumes"]
    assert svc["environment"]["HF_HOME"] == "/hf-cache"
    dockerfile = (REPO / svc["build"]["dockerfile"]).read_text()
    assert re.search(r"chown fleetrl:fleetrl [^\n]*/hf-cache", dockerfile), "the non-root user must write the cache"


def test_engine_extras_pin_the_versions_of_the_engine_images():
    import tomllib

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra, service, image in (("vllm", "rollout-vllm", "vllm/vllm-openai"), ("sglang", "rollout-sglang",
                                                                                "lmsysorg/sglang")):
        tag = _default(SERVICES[service]["build"]["args"]["BASE_IMAGE"]).split(":")[-1].lstrip("v")
        assert f"{extra}=={tag}" in extras[extra], f"pip install fleetrl[{extra}] must match {image}:v{tag}"


def dockerfiles():
    return sorted((REPO / "deploy/docker").glob("*.Dockerfile"))


@pytest.mark.parametrize("path", dockerfiles(), ids=lambda p: p.name)
def test_dockerfiles_take_a_base_image_and_run_as_non_root(path):
    text = path.read_text()
    assert re.search(r"^ARG BASE_IMAGE=\S+\nFROM \$\{BASE_IMAGE\}", text, re.MULTILINE), "ARG BASE_IMAGE, then FROM it"
    users = re.findall(r"^USER (\S+)", text, re.MULTILINE)
    if path.name != "base.Dockerfile":  # the base only prepares the user; every service image runs as it
        assert users and users[-1] not in ("root", "0")


@pytest.mark.parametrize("path", dockerfiles(), ids=lambda p: p.name)
def test_dependencies_are_installed_before_the_code_is_copied(path):
    text = path.read_text()
    pip = text.find("pip install")
    code = text.find("COPY --chown=fleetrl:fleetrl services")
    assert code == -1 or pip == -1 or pip < code


@pytest.mark.parametrize("name", ["learner.Dockerfile", "learner-deepspeed.Dockerfile"])
def test_the_learner_images_install_the_tinker_extra(name):
    """The learner's Tinker mode (docs/tinker.md) needs the `tinker` extra (the client's protobuf schema, zstd):
    every learner image installs it from pyproject.toml, before the code, with torch left as the image has it."""
    import tomllib

    text = (REPO / "deploy/docker" / name).read_text()
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["tinker"]
    assert "tinker==0.38.0" in extra
    read = text.find('["optional-dependencies"]["tinker"]')
    assert read != -1, f"{name} does not read the tinker extra"
    pip = text.find("pip install", read)
    assert -1 < pip < text.find("COPY --chown=fleetrl:fleetrl services")
    assert "torch==$(python" in text[read:pip + 200]


def test_every_built_service_has_its_dockerfile():
    for name, svc in SERVICES.items():
        if "build" in svc:
            assert (REPO / svc["build"]["dockerfile"]).is_file(), name


def test_the_cpu_base_installs_the_cpu_torch():
    text = (REPO / "deploy/docker/base.Dockerfile").read_text()
    assert "ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu" in text
    assert "--mount=type=bind,source=deploy/docker/stage" in text


def test_docker_context_leaves_out_the_venv_and_runs():
    ignored = (REPO / ".dockerignore").read_text().split()
    assert {".venv", "runs", ".git"} <= set(ignored)


def test_podman_override_resets_only_keys_the_stack_sets():
    """deploy/compose/podman-local.yml clears keys with ``!reset``; podman-compose (1.5 and 1.6) crashes on a reset
    of a key the base service does not have (``ResetTag`` left in the merged file): make compose-test broke when
    ``demo`` lost its depends_on in docker-compose.yml and the override still reset it."""

    class Loader(yaml.SafeLoader):
        pass

    resets: list[tuple[str, str]] = []

    def reset(loader, node):  # remember where, then read the node as usual
        return ("!reset", loader.construct_mapping(node) if isinstance(node, yaml.MappingNode) else None)

    Loader.add_constructor("!reset", reset)
    Loader.add_constructor("!override", lambda loader, node: (
        "!override", loader.construct_sequence(node) if isinstance(node, yaml.SequenceNode) else None))
    override = yaml.load((REPO / "deploy" / "compose" / "podman-local.yml").read_text(), Loader=Loader)
    for name, service in override["services"].items():
        resets += [(name, key) for key, value in service.items() if isinstance(value, tuple) and value[0] == "!reset"]
    assert resets, "the override resets depends_on for podman 4.3; if that changed, update this test"
    missing = [(name, key) for name, key in resets if key not in SERVICES.get(name, {})]
    assert not missing, f"!reset of keys docker-compose.yml does not set (podman-compose fails on them): {missing}"


def test_podman_override_replaces_the_redis_healthcheck_it_changes():
    """podman-compose 1.6 merges an override's list into the base's (``test: [CMD-SHELL, ...] + [CMD, ...]``) and
    fails on the result ("'CMD-SHELL' takes a single string after it"): make compose-test failed at ``up``. The
    override's healthcheck replaces the base's with ``!override``."""

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_constructor("!reset", lambda loader, node: None)
    Loader.add_constructor("!override", lambda loader, node: ("!override", loader.construct_sequence(node)))
    override = yaml.load((REPO / "deploy" / "compose" / "podman-local.yml").read_text(), Loader=Loader)
    for name, service in override["services"].items():
        test = (service.get("healthcheck") or {}).get("test") if isinstance(service, dict) else None
        base = ((SERVICES.get(name) or {}).get("healthcheck") or {}).get("test")
        if isinstance(test, list) and base is not None:
            raise AssertionError(f"{name}: the override's healthcheck test would be appended to the base's {base}; "
                                 "write it as test: !override [...]")
        if isinstance(test, tuple):
            assert test[0] == "!override" and test[1][0] in ("CMD", "CMD-SHELL", "NONE"), (name, test)


def test_redis_requires_a_password_that_has_no_default_and_every_client_uses_it():
    """Redis is authenticated (issue 26): the server requires ${REDIS_PASSWORD:?...}, its health check looks for the
    PONG an unauthenticated ping does not get, and every service that reaches it carries the password in its URL."""
    redis = SERVICES["redis"]
    cmd = redis["command"]
    assert "--requirepass" in cmd and re.fullmatch(r"\$\{REDIS_PASSWORD:\?[^}]+\}", cmd[cmd.index("--requirepass") + 1])
    assert "PONG" in " ".join(redis["healthcheck"]["test"]) and "REDIS_PASSWORD" in redis["environment"]["REDISCLI_AUTH"]
    urls = {(name, key): value for name, svc in SERVICES.items() if name != "redis"
            for key, value in (svc.get("environment") or {}).items() if key.endswith("REDIS_URL")}
    assert urls and all(re.fullmatch(r"redis://:\$\{REDIS_PASSWORD:\?[^}]+\}@redis:6379/0", v) for v in urls.values()), urls
    text = (REPO / "docker-compose.yml").read_text()
    assert "REDIS_PASSWORD:-" not in text and "redis://redis:" not in text
    override = (REPO / "deploy" / "compose" / "podman-local.yml").read_text()
    assert '--requirepass "${REDIS_PASSWORD:?' in override  # make compose-test's Redis requires it too


@pytest.mark.parametrize("name", sorted(set(HTTP_PORTS) - {"reward"}))
def test_services_that_use_the_queue_hold_the_run_key_from_the_environment(name):
    env = SERVICES[name]["environment"]
    keys = [v for k, v in env.items() if k.endswith("_RUN_KEY")]
    assert len(keys) == 1 and re.fullmatch(r"\$\{FLEETRL_RUN_KEY:\?[^}]+\}", keys[0]), env


def test_the_reward_service_needs_the_token_and_every_rollout_sends_it():
    token = re.compile(r"\$\{FLEETRL_TOKEN:\?[^}]+\}")
    assert token.fullmatch(SERVICES["reward"]["environment"]["FLEETRL_REWARD_AUTH_TOKEN"])
    for name in ("rollout", "rollout-vllm", "rollout-sglang"):
        assert token.fullmatch(SERVICES[name]["environment"]["FLEETRL_ROLLOUT_WORKER__REWARD_TOKEN"]), name
    # the demo scores held-out answers on /score too (it got 401 and exited before measuring anything)
    assert token.fullmatch(SERVICES["demo"]["environment"]["FLEETRL_DEMO_REWARD_TOKEN"])


# 10 s past the drain: handing back what was cut off, the sidecar deregistering, the engine stopping
_AFTER_DRAIN_S = 10.0


@pytest.mark.parametrize("name", ["rollout", "rollout-vllm", "rollout-sglang"])
def test_a_rollout_container_stopped_by_a_scale_down_has_time_to_drain(name):
    """Compose stops a replica taken away by a scale-down with SIGTERM, then SIGKILL after stop_grace_period
    (compose's default: 10 s). SIGTERM drains the replica (docs/elastic.md): uvicorn's wait for open requests,
    then worker.drain_timeout_s for its groups, then the hand-back; a kill before that leaves its prompts leased
    until claim_idle_ms."""
    from deploy.compose.elastic_checks import grace_seconds
    from services.rollout.cli import GRACEFUL_SHUTDOWN_S
    from services.rollout.settings import WorkerSettings

    svc = SERVICES[name]
    config = next(v.split(":")[0] for v in svc["volumes"] if v.split(":")[1] == "/config/rollout.yaml")
    worker = yaml.safe_load((REPO / config).read_text()).get("worker") or {}
    drain_s = worker.get("drain_timeout_s", WorkerSettings().drain_timeout_s)
    needed = GRACEFUL_SHUTDOWN_S + drain_s + _AFTER_DRAIN_S
    assert grace_seconds(svc.get("stop_grace_period")) >= needed, \
        f"{name}: stop_grace_period {svc.get('stop_grace_period')} is shorter than its drain ({needed:.0f}s)"


@pytest.mark.parametrize("name", ["reward", "rollout", "learner"])
def test_the_service_is_the_containers_pid_1_so_sigterm_reaches_it(name):
    """The CPU images' entrypoint execs the service (deploy/docker/entrypoint.py main), so SIGTERM from `docker
    stop` / a scale-down reaches the service itself, which handles it (uvicorn's shutdown: the drain). A shell
    form ENTRYPOINT or CMD would put /bin/sh in between, which does not forward it."""
    text = (REPO / "deploy" / "docker" / f"{name}.Dockerfile").read_text()
    for instr in ("ENTRYPOINT", "CMD"):
        line = next(x for x in text.splitlines() if x.startswith(instr + " "))
        assert line.split(None, 1)[1].startswith("["), f"{name}: {instr} must be exec form: {line}"
    assert 'ENTRYPOINT ["python", "-m", "deploy.docker.entrypoint"]' in text  # which execs it: test_entrypoint.py
