"""The learner's ranks (``replicas.learner: N``) in rendered runs: how N processes find rank 0 without a
hand-written torchrun line. Rank 0 hosts the rendezvous store on ``MASTER_PORT`` at ``MASTER_ADDR``
(``services/learner/distributed/env.py``); the others dial it.

- Kubernetes: the learner Job becomes an Indexed Job of N pods (completion index = ``RANK``, read through the
  downward API) with a headless Service, so rank 0 is ``fleetrl-learner-0.fleetrl-learner-ranks``; the HTTP
  Service selects rank 0's pod only, and probes ask ``/health`` of rank 0 only (the others serve no HTTP).
- compose: ``learner`` is rank 0; ``learner-rank-1`` .. ``learner-rank-<N-1>`` follow it (``MASTER_ADDR: learner``).
- Ray: the launcher's placement group (``deploy/ray/launcher.py``: bundle i is rank i) sets the same variables.
"""

from __future__ import annotations

import copy
from typing import Any

DIST_PORT = 29500  # MASTER_PORT of the learner's ranks (the weight sync's rendezvous uses 29600-29603)
HEADLESS = "fleetrl-learner-ranks"
INDEX_ANNOTATION = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
INDEX_LABEL = "batch.kubernetes.io/job-completion-index"


def _rank0_probe(probe: dict[str, Any], port: int) -> dict[str, Any]:
    """``probe`` (an httpGet of /health) as a command that asks rank 0 only; ranks > 0 pass."""
    out = {k: v for k, v in probe.items() if k != "httpGet"}
    path = probe.get("httpGet", {}).get("path", "/health")
    check = f"import urllib.request as u; u.urlopen('http://127.0.0.1:{port}{path}', timeout=8)"
    out["exec"] = {"command": ["sh", "-c", f'[ "$RANK" != 0 ] || python -c "{check}"']}
    return out


def k8s_learner_ranks(docs: list[dict[str, Any]], ranks: int, port: int) -> list[dict[str, Any]]:
    """deploy/k8s/learner.yaml's Job and Service for ``ranks`` > 1 learner ranks (a headless Service added)."""
    docs = copy.deepcopy(docs)
    job, service = docs[0], docs[1]
    spec = job["spec"]
    spec.update(completionMode="Indexed", completions=ranks, parallelism=ranks)
    pod = spec["template"]["spec"]
    pod["subdomain"] = HEADLESS  # each pod: <job name>-<index>.<subdomain>
    c = pod["containers"][0]
    c["env"] = [
        {"name": "RANK", "valueFrom": {"fieldRef": {"fieldPath": INDEX_ANNOTATION}}},
        {"name": "WORLD_SIZE", "value": str(ranks)},
        {"name": "LOCAL_RANK", "value": "0"},  # one GPU per pod
        {"name": "MASTER_ADDR", "value": f"{job['metadata']['name']}-0.{HEADLESS}"},
        {"name": "MASTER_PORT", "value": str(DIST_PORT)},
        *c.get("env", []),
    ]
    c.setdefault("ports", []).append({"name": "ranks", "containerPort": DIST_PORT})
    for key in ("startupProbe", "readinessProbe", "livenessProbe"):
        if key in c:
            c[key] = _rank0_probe(c[key], port)
    service.setdefault("spec", {}).setdefault("selector", {})[INDEX_LABEL] = "0"  # HTTP: rank 0 only
    labels = spec["template"].get("metadata", {}).get("labels", {"app": "fleetrl-learner"})
    headless = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": HEADLESS},
                "spec": {"clusterIP": "None", "selector": dict(labels), "publishNotReadyAddresses": True,
                         "ports": [{"name": "ranks", "port": DIST_PORT, "targetPort": DIST_PORT}]}}
    return [job, service, headless]


def compose_learner_ranks(services: dict[str, Any], ranks: int, gpus_per_rank: int) -> None:
    """Add ``learner-rank-1`` .. to a compose file's ``services`` (``learner`` becomes rank 0), in place."""
    rank0 = services["learner"]
    env = {"WORLD_SIZE": str(ranks), "LOCAL_RANK": "0", "MASTER_ADDR": "learner", "MASTER_PORT": str(DIST_PORT)}
    rank0["environment"] = {**rank0["environment"], "RANK": "0", **env}
    for r in range(1, ranks):
        follower = copy.deepcopy(rank0)
        follower["environment"] = {**follower["environment"], "RANK": str(r)}
        for key in ("ports", "healthcheck", "networks"):
            follower.pop(key, None)
        follower["networks"] = ["fleet"]
        follower["depends_on"] = {**follower.get("depends_on", {}), "learner": {"condition": "service_started"}}
        services[f"learner-rank-{r}"] = follower
    if gpus_per_rank:  # one GPU each, named: a bare count would hand every container the first GPU
        for r in range(ranks):
            svc = services["learner" if r == 0 else f"learner-rank-{r}"]
            svc.setdefault("deploy", {})["resources"] = {
                "reservations": {"devices": [{"driver": "nvidia", "device_ids": [str(r)], "capabilities": ["gpu"]}]}}
