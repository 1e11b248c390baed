"""A LoRA learner's version as an adapter round: only the adapter's tensors go out (``lora_A`` / ``lora_B`` of each
adapted module, with their scaling), and each replica applies them to its own copy of the base model.

    weights = AdapterWeights(tensors, info, merged=lambda: merged_state_dict(actor))
    await publisher.publish(weights)     # adapter round when every live replica loads adapters, else merged

The publisher sends the adapter when every live replica advertises ``ReplicaInfo.adapters`` (collective
transport, a sink that loads adapters), and the merged model (``merged()``) otherwise: one replica that cannot
load adapters makes the whole publish a merged full round (the outbox holds one version's buckets, which a
late joiner is served from), and the publisher says once per replica why.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from shared.weight_sync.wire import AdapterInfo


@dataclass
class AdapterWeights:
    """A LoRA adapter to publish: ``tensors`` in :meth:`AdapterInfo.tensor_names` order, ``info`` (rank, alpha,
    each module's scaling), ``merged``: the merged model's weights, for replicas that cannot load adapters."""

    tensors: list[tuple[str, Any]]
    info: AdapterInfo
    merged: Callable[[], Any]

    def __post_init__(self) -> None:
        names = [n for n, _ in self.tensors]
        if names != self.info.tensor_names():
            raise ValueError("adapter tensors do not follow AdapterInfo.modules (lora_A, lora_B per module, in order)")

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for _, t in self.tensors)
