"""Which device each process of a run uses, and so how weights travel: ``fleetrl run`` resolves the learner's
device and each rollout replica's, derives every replica's weight transport from the pair
(:func:`shared.weight_sync.placement.choose_route`: the learner's own GPU -> ``ipc``, another GPU -> NCCL,
a CPU on either side -> gloo), gives a replica that shares the learner's GPU a memory budget, and refuses at
start, in one line, a placement that cannot work.

Devices come from, in order: the service's own settings (``services.rollout.engine.device``,
``services.learner.model.device``), the spec's ``placement`` section, then ``auto``: on a host with GPUs the
learner takes ``cuda:0`` (its ranks ``cuda:0`` .. ``cuda:N-1``, ``replicas.learner: N``) and replicas share
rank 0's GPU (no GPU left) or take the other GPUs in turn; without GPUs everything runs on the CPU. More learner
ranks than GPUs is refused: one rank per GPU.
"""

from __future__ import annotations

import shutil
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from services.rollout.weights.settings import REPLICA_TRANSPORTS
from shared.settings import SettingsError
from shared.weight_sync.placement import (
    PlacementError,
    Route,
    TransportPlacement,
    check_route,
    choose_route,
    parse_device,
)


class PlacementSpec(BaseModel):
    """Where the run's processes compute (``placement:`` in the run spec)."""

    model_config = ConfigDict(extra="forbid")

    learner: str = Field(default="auto", description="The learner's device: auto, cpu, cuda or cuda:<index>.")
    rollout: list[str] | str = Field(
        default="auto",
        description="Each rollout replica's device (one for all, or a list, replica i taking entry i mod n): "
                    "auto puts replicas on the learner's GPU when there is one GPU, on the other GPUs in turn when "
                    "there are several, on the CPU when there is none.")
    engine_memory_fraction: float = Field(
        default=0.35, gt=0.0, le=0.9,
        description="The share of a GPU's memory the hf engines placed on the learner's GPU may use together "
                    "(split between them); the learner keeps the rest.")


def gpu_count() -> int:
    """CUDA devices this host shows (no torch import on a host without an NVIDIA driver)."""
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:  # noqa: BLE001 - a broken CUDA install means no GPU for placement
        return 0


def _auto(device: str | None) -> bool:
    return device in (None, "", "auto")


def _normal(device: str) -> str:
    kind, index = parse_device(device)
    return "cpu" if kind == "cpu" else f"cuda:{index}"


def place(learner: dict[str, Any], rollouts: list[dict[str, Any]], spec: PlacementSpec, gpus: int,
          ranks: int = 1) -> list[str]:
    """Fill in devices and weight transports on the learner's and the replicas' settings (mappings, changed in
    place). ``ranks``: the learner's (``replicas.learner``): on CUDA rank i takes GPU i (the learner's device
    becomes a bare ``cuda``, which each rank resolves with its ``LOCAL_RANK``). Returns one line per replica
    saying where it runs and how weights reach it. Raises SettingsError (one line) for a placement that cannot
    work."""
    try:
        return _place(learner, rollouts, spec, gpus, ranks)
    except PlacementError as exc:
        raise SettingsError(f"placement: {exc}") from exc


def _learner_device(model: dict[str, Any], spec: PlacementSpec, gpus: int, ranks: int) -> str:
    """Rank 0's device (normalised); ``model['device']`` set to what every rank is given."""
    wanted = model.get("device") if not _auto(model.get("device")) else spec.learner
    l_dev = ("cuda:0" if gpus else "cpu") if _auto(wanted) else _normal(wanted)
    if l_dev != "cpu" and ranks > 1:
        if wanted not in ("cuda", "auto", None, "") and parse_device(wanted)[1] != 0:
            raise PlacementError(f"the learner's {ranks} ranks take one GPU each (cuda:0 to cuda:{ranks - 1}), so its "
                                 f"device cannot be {wanted}: set it to cuda (or cpu)")
        if ranks > gpus:
            raise PlacementError(f"replicas.learner: {ranks} ranks take one GPU each, but this host shows {gpus} "
                                 f"GPU(s): use at most {gpus} ranks, or placement.learner: cpu (gloo)")
        model["device"] = "cuda"  # each rank resolves it to cuda:<LOCAL_RANK>
        return l_dev
    if l_dev != "cpu" and parse_device(l_dev)[1] >= max(gpus, 1):
        raise PlacementError(f"the learner is placed on {l_dev}, but this host shows {gpus} GPU(s)")
    model["device"] = l_dev
    return l_dev


def _place(learner: dict[str, Any], rollouts: list[dict[str, Any]], spec: PlacementSpec, gpus: int,
           ranks: int) -> list[str]:
    model = learner.setdefault("model", {})
    l_dev = _learner_device(model, spec, gpus, ranks)
    used = ranks if l_dev != "cpu" else 1  # GPUs the learner's ranks hold (cuda:0 .. cuda:used-1)
    wanted = spec.rollout if isinstance(spec.rollout, list) else [spec.rollout]
    backends: dict[str, str] = {}
    lines: list[str] = []
    sharing: list[dict[str, Any]] = []
    for i, cfg in enumerate(rollouts):
        engine = cfg.setdefault("engine", {})
        if engine.get("kind", "hf") != "hf":
            continue  # a remote engine (vLLM, SGLang) is placed by its own server; its sidecar settings stand
        r_dev = engine.get("device") if not _auto(engine.get("device")) else wanted[i % len(wanted)]
        if _auto(r_dev):
            r_dev = "cpu" if not gpus else ("cuda:0" if gpus <= used else f"cuda:{used + i % (gpus - used)}")
        r_dev = _normal(r_dev)
        if r_dev != "cpu" and parse_device(r_dev)[1] >= max(gpus, 1):
            raise PlacementError(f"rollout-{i} is placed on {r_dev}, but this host shows {gpus} GPU(s)")
        engine["device"] = r_dev
        weights = cfg.setdefault("weights", {})
        chosen = "transport" in weights or "backend" in weights  # the operator chose: check it can work
        route = Route(weights.get("transport", "collective"), weights.get("backend", "gloo")) if chosen else \
            choose_route(l_dev, r_dev)
        # the placement rules its transport declares (a name not registered here: none; its settings refuse it)
        rules = REPLICA_TRANSPORTS.load(route.transport).placement if route.transport in REPLICA_TRANSPORTS else \
            TransportPlacement()
        if not chosen:
            weights["transport"] = route.transport
            if rules.uses_backend:
                weights["backend"] = route.backend
        check_route(route, l_dev, r_dev, placement=rules)
        if rules.uses_backend:
            backends[f"rollout-{i}"] = route.backend
        if r_dev == l_dev and r_dev != "cpu":
            sharing.append(engine)
        how = f"{route.transport} ({route.backend})" if rules.uses_backend else route.transport
        lines.append(f"rollout-{i} on {r_dev}, learner on {l_dev}: weights by {how}")
    if len(set(backends.values())) > 1:
        gloo = sorted(k for k, b in backends.items() if b == "gloo")
        nccl = sorted(k for k, b in backends.items() if b == "nccl")
        raise PlacementError(f"{', '.join(gloo)} need weights over gloo and {', '.join(nccl)} over nccl, but the "
                             "learner publishes over one backend: put every replica on a GPU or every one on the CPU")
    sync = learner.setdefault("publish", {}).setdefault("sync", {})
    if backends:
        need = next(iter(backends.values()))
        if sync.get("backend", need) != need:
            raise PlacementError(f"the learner's publish.sync.backend is {sync['backend']}, but the replicas' "
                                 f"placement needs {need}")
        sync["backend"] = need
    for engine in sharing:
        engine.setdefault("gpu_memory_fraction", round(spec.engine_memory_fraction / len(sharing), 4))
    return lines
