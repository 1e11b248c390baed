"""Continuous batching: rows joining and leaving the KV cache give the same logits as running alone."""

from __future__ import annotations

import torch

from services.rollout.engines.hf.batch import KVBatch


def alone(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0, -1]


def test_join_step_leave_matches_unbatched(model):
    a, b, c = [5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15, 16, 17, 18, 19, 20, 21]
    batch = KVBatch(model)
    with torch.inference_mode():
        first = batch.prefill([a, b], pad_id=0, device=torch.device("cpu"))
        assert torch.allclose(first[0], alone(model, a), atol=1e-5)
        assert torch.allclose(first[1], alone(model, b), atol=1e-5)
        step = batch.step(torch.tensor([30, 31]))
        assert torch.allclose(step[1], alone(model, b + [31]), atol=1e-5)
        joined = batch.prefill([c], pad_id=0, device=torch.device("cpu"))  # longer than the cache: old rows padded
        assert torch.allclose(joined[0], alone(model, c), atol=1e-5)
        batch.keep([1, 2])  # a leaves; its padding columns are trimmed
        assert batch.size == 2
        step = batch.step(torch.tensor([32, 33]))
        assert torch.allclose(step[0], alone(model, b + [31, 32]), atol=1e-5)
        assert torch.allclose(step[1], alone(model, c + [33]), atol=1e-5)
        batch.keep([])
        assert batch.size == 0
