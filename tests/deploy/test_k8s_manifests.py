"""deploy/k8s/ manifests: valid against the Kubernetes OpenAPI schemas (kubernetes-validate, strict: an
unknown or misspelt field fails), probes on /health, Services that select something, secrets by reference.

kubernetes-validate ships the JSON schemas of every Kubernetes release in its wheel, so it works without
network (kubeconform would need a binary and its schema download)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

kubernetes_validate = pytest.importorskip("kubernetes_validate")

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy/k8s"
K8S_VERSION = "1.30.0"
MANIFESTS = sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")
DOCS = [(p.name, d) for p in MANIFESTS for d in yaml.safe_load_all(p.read_text()) if d]


@pytest.mark.parametrize("name,doc", DOCS, ids=[f"{n}:{d['kind']}/{d['metadata']['name']}" for n, d in DOCS])
def test_manifest_is_valid_against_the_schema(name, doc):
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_a_misspelt_field_is_caught():
    bad = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"}, "spec": {"portz": []}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


def test_kustomization_lists_every_manifest():
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert sorted(kust["resources"]) == sorted(p.name for p in MANIFESTS)


def workloads():
    return [d for _, d in DOCS if d["kind"] in ("Deployment", "StatefulSet", "Job")]


def the_learner() -> dict:
    return next(d for d in workloads() if d["metadata"]["name"] == "fleetrl-learner")


@pytest.mark.parametrize("doc", [d for d in workloads() if d["metadata"]["name"] not in ("fleetrl-redis",
                                                                                        "fleetrl-prepare")],
                         ids=lambda d: d["metadata"]["name"])
def test_services_probe_health_on_their_port_and_run_as_non_root(doc):
    pod = doc["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    (c,) = pod["containers"]
    port = c["ports"][0]["name"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"] == {"path": "/health", "port": port}, probe
    tokens = [e for e in c["env"] if e["name"].endswith("_CONTROL_TOKEN")]
    if doc["metadata"]["name"] == "fleetrl-reward":  # no control routes (the setting is deprecated there)
        assert not tokens
        return
    (token,) = tokens
    assert token["valueFrom"]["secretKeyRef"]["name"] == "fleetrl-token"


def test_every_service_selects_a_workload():
    labels = [d["spec"]["template"]["metadata"]["labels"] for d in workloads()]
    for _, svc in [(n, d) for n, d in DOCS if d["kind"] == "Service"]:
        sel = svc["spec"]["selector"]
        assert any(sel.items() <= lab.items() for lab in labels), svc["metadata"]["name"]


def test_learner_advertises_its_pod_ip_for_weight_sync():
    learner = the_learner()
    env = {e["name"]: e for e in learner["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["FLEETRL_LEARNER_PUBLISH__SYNC__MASTER_ADDR"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"


def test_learner_is_a_job_that_finishes_and_is_replaced_only_on_failure():
    """The learner exits 0 when training is done (exit_when_done): as a Deployment it was restarted forever."""
    from services.learner.settings import LearnerSettings

    learner = the_learner()
    assert learner["kind"] == "Job" and learner["apiVersion"] == "batch/v1"
    spec = learner["spec"]
    assert spec["parallelism"] == spec["completions"] == 1
    assert spec["podReplacementPolicy"] == "Failed", "never two learners on the checkpoints volume"
    assert spec["template"]["spec"]["restartPolicy"] == "OnFailure" and spec["backoffLimit"] >= 1
    config = yaml.safe_load(yaml.safe_load((K8S / "config.yaml").read_text())["data"]["learner.yaml"])
    assert config.get("exit_when_done", LearnerSettings.model_fields["exit_when_done"].default) is True


def test_learner_declares_the_configured_rendezvous_port_and_listens_on_its_pod_ip():
    from shared.weight_sync import WeightSyncSettings

    learner = the_learner()
    (c,) = learner["spec"]["template"]["spec"]["containers"]
    config = yaml.safe_load(yaml.safe_load((K8S / "config.yaml").read_text())["data"]["learner.yaml"])
    sync = WeightSyncSettings(**config["publish"]["sync"], master_addr="10.0.0.7")  # the pod IP, from the env
    assert sync.rendezvous_port > 0 and sync.listen_addr == "10.0.0.7"  # a fixed port, on the pod IP only
    assert {"name": "weight-sync", "containerPort": sync.rendezvous_port} in c["ports"]
    assert not any("BIND_ADDR" in e["name"] for e in c["env"])  # no wider bind than the pod IP


def _env(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", [])}


def test_redis_requires_the_password_from_the_secret_and_every_pod_connects_with_it():
    """Redis is authenticated (issue 26): started with --requirepass from the Secret, probed with it; every pod
    that reaches Redis takes the same Secret key before the URLs that expand it; the reward pod gets no Redis."""
    ref = {"secretKeyRef": {"name": "fleetrl-token", "key": "redis-password"}}
    redis = next(d for d in workloads() if d["metadata"]["name"] == "fleetrl-redis")
    (c,) = redis["spec"]["template"]["spec"]["containers"]
    assert c["args"][:2] == ["--requirepass", "$(REDIS_PASSWORD)"] and _env(c)["REDIS_PASSWORD"]["valueFrom"] == ref
    assert _env(c)["REDISCLI_AUTH"]["valueFrom"] == ref
    assert all("PONG" in " ".join(c[p]["exec"]["command"]) for p in ("readinessProbe", "livenessProbe"))
    for doc in workloads():
        if doc["metadata"]["name"] == "fleetrl-redis":
            continue
        (c,) = doc["spec"]["template"]["spec"]["containers"]
        names = [e["name"] for e in c.get("env", [])]
        urls = [e for e in c.get("env", []) if e["name"].endswith("REDIS_URL")]
        if doc["metadata"]["name"] == "fleetrl-reward":
            assert not urls, "the reward service does not use Redis"
            continue
        assert urls, doc["metadata"]["name"]
        assert _env(c)["REDIS_PASSWORD"]["valueFrom"] == ref
        for e in urls:
            assert e["value"] == "redis://:$(REDIS_PASSWORD)@fleetrl-redis:6379/0", e
            assert names.index("REDIS_PASSWORD") < names.index(e["name"])  # $(VAR) expands earlier variables only


@pytest.mark.parametrize("name,var", [("fleetrl-rollout", "FLEETRL_ROLLOUT_RUN_KEY"),
                                      ("fleetrl-learner", "FLEETRL_LEARNER_RUN_KEY")])
def test_queue_services_take_the_run_key_from_the_secret(name, var):
    doc = next(d for d in workloads() if d["metadata"]["name"] == name)
    (c,) = doc["spec"]["template"]["spec"]["containers"]
    assert _env(c)[var]["valueFrom"] == {"secretKeyRef": {"name": "fleetrl-token", "key": "run-key"}}


@pytest.mark.parametrize("name,var", [("fleetrl-reward", "FLEETRL_REWARD_AUTH_TOKEN"),
                                      ("fleetrl-rollout", "FLEETRL_ROLLOUT_WORKER__REWARD_TOKEN")])
def test_the_reward_service_needs_the_token_and_the_rollout_workers_send_it(name, var):
    doc = next(d for d in workloads() if d["metadata"]["name"] == name)
    (c,) = doc["spec"]["template"]["spec"]["containers"]
    assert _env(c)[var]["valueFrom"] == {"secretKeyRef": {"name": "fleetrl-token", "key": "token"}}
