"""deploy/k8s/autoscaling/: the elastic rollout pool's controllers (issue 30), checked statically like the other
manifests. The HPA against the Kubernetes schemas (kubernetes-validate, strict); KEDA's objects (a CRD the schemas
do not know) against the fields KEDA documents; both aimed at the rollout Deployment, whose pods get the time a
drain needs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from services.rollout.settings import WorkerSettings
from shared import keys

kubernetes_validate = pytest.importorskip("kubernetes_validate")

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy/k8s"
AUTO = K8S / "autoscaling"


def docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def rollout_deployment() -> dict:
    return next(d for d in docs(K8S / "rollout.yaml") if d["kind"] == "Deployment")


def test_the_hpa_is_valid_and_follows_the_learners_signal():
    (hpa,) = docs(AUTO / "hpa.yaml")
    kubernetes_validate.validate(hpa, "1.30.0", strict=True)
    spec = hpa["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                      "name": rollout_deployment()["metadata"]["name"]}
    (metric,) = spec["metrics"]
    # AverageValue 1: the replica count is the learner's desired_replicas itself
    assert metric["external"]["target"] == {"type": "AverageValue", "averageValue": "1"}
    assert "fleetrl_learner_pool{field=\"desired_replicas\"}" in (AUTO / "hpa.yaml").read_text()
    assert spec["behavior"]["scaleDown"]["stabilizationWindowSeconds"] > 0  # hysteresis on the way down
    assert 1 <= spec["minReplicas"] <= spec["maxReplicas"]


def test_the_keda_scaled_object_reads_the_prompts_stream_with_the_redis_password():
    objs = {d["kind"]: d for d in docs(AUTO / "keda.yaml")}
    assert set(objs) == {"ScaledObject", "TriggerAuthentication"}
    assert all(d["apiVersion"] == "keda.sh/v1alpha1" for d in objs.values())
    so = objs["ScaledObject"]["spec"]
    assert set(so) <= {"scaleTargetRef", "minReplicaCount", "maxReplicaCount", "pollingInterval", "cooldownPeriod",
                       "advanced", "triggers", "idleReplicaCount", "fallback", "initialCooldownPeriod"}
    assert so["scaleTargetRef"] == {"name": rollout_deployment()["metadata"]["name"]}
    assert 1 <= so["minReplicaCount"] <= so["maxReplicaCount"]
    (trigger,) = so["triggers"]
    meta = trigger["metadata"]
    assert trigger["type"] == "redis-streams"
    assert set(meta) <= {"address", "host", "port", "stream", "consumerGroup", "pendingEntriesCount", "streamLength",
                         "lagCount", "activationLagCount", "databaseIndex", "enableTLS"}
    run = yaml.safe_load(yaml.safe_load((K8S / "config.yaml").read_text())["data"]["rollout.yaml"])["run_name"]
    assert meta["stream"] == keys.prompts_stream(run) and meta["consumerGroup"] == "rollout"
    assert meta["address"].split(":")[0] in {d["metadata"]["name"] for d in docs(K8S / "redis.yaml")}
    assert all(isinstance(v, str) for v in meta.values())  # KEDA's metadata is a map of strings
    auth = objs["TriggerAuthentication"]
    assert trigger["authenticationRef"] == {"name": auth["metadata"]["name"]}
    assert auth["spec"]["secretTargetRef"] == [{"parameter": "password", "name": "fleetrl-token",
                                                "key": "redis-password"}]


def test_rollout_pods_get_the_time_a_drain_needs():
    pod = rollout_deployment()["spec"]["template"]["spec"]
    drain = WorkerSettings.model_fields["drain_timeout_s"].default
    assert pod["terminationGracePeriodSeconds"] >= drain + 20, "SIGTERM drains: the grace period must cover it"


def test_compose_gives_rollout_containers_the_time_a_drain_needs():
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    drain = WorkerSettings.model_fields["drain_timeout_s"].default
    for name, svc in compose["services"].items():
        if name.startswith("rollout"):
            assert int(svc["stop_grace_period"].rstrip("s")) >= drain + 20, name
