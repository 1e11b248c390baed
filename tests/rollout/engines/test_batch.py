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


class _Rows(torch.nn.Module):
    """Wraps a model and records the rows of every forward pass."""

    def __init__(self, model) -> None:
        super().__init__()
        self.inner, self.config, self.rows = model, model.config, []

    def forward(self, input_ids, **kw):
        self.rows.append(input_ids.shape[0])
        return self.inner(input_ids=input_ids, **kw)


def test_rows_with_one_prompt_share_its_prefill(model):
    """The n samples of a group (one prompt, n rows) are prefilled once per distinct prompt, and each row then
    steps exactly as if it had been prefilled alone, joining behind rows already running."""
    a, b = [5, 6, 7, 8, 9, 10], [11, 12]
    counted = _Rows(model)
    batch = KVBatch(counted)
    with torch.inference_mode():
        batch.prefill([[40, 41, 42]], pad_id=0, device=torch.device("cpu"))  # a row already running
        logits = batch.prefill([a, b, a, a, b], pad_id=0, device=torch.device("cpu"))
        assert counted.rows == [1, 2]  # two distinct prompts: a pass of two rows, not five
        for i, ids in enumerate([a, b, a, a, b]):
            assert torch.allclose(logits[i], alone(model, ids), atol=1e-5)
        assert batch.lengths == [3, 6, 2, 6, 6, 2]
        step = batch.step(torch.tensor([50, 30, 31, 32, 33, 34]))
        for i, ids in enumerate([a + [30], b + [31], a + [32], a + [33], b + [34]]):
            assert torch.allclose(step[i + 1], alone(model, ids), atol=1e-5)
        assert torch.allclose(step[0], alone(model, [40, 41, 42, 50]), atol=1e-5)


def test_an_emptied_batch_reuses_its_buffers_and_the_old_rows_leave_nothing_seen(model):
    """The next batch writes into the buffers the last one left (no fresh zeroed memory per round); whatever the old
    rows left in them, a newcomer's logits are those of running alone, at prefill and at each step."""
    batch = KVBatch(model)
    cpu = torch.device("cpu")
    with torch.inference_mode():
        batch.prefill([[5, 6, 7, 8, 9, 10, 11, 12], [13, 14, 15]], pad_id=0, device=cpu)
        batch.step(torch.tensor([20, 21]))
        storage = batch.keys[0].untyped_storage().data_ptr()
        batch.keep([])
        assert batch.size == 0
        first = batch.prefill([[30, 31], [32, 33, 34]], pad_id=0, device=cpu)  # shorter: old keys sit past their ends
        assert batch.keys[0].untyped_storage().data_ptr() == storage
        assert torch.allclose(first[0], alone(model, [30, 31]), atol=1e-5)
        assert torch.allclose(first[1], alone(model, [32, 33, 34]), atol=1e-5)
        step = batch.step(torch.tensor([40, 41]))
        assert torch.allclose(step[0], alone(model, [30, 31, 40]), atol=1e-5)
        assert torch.allclose(step[1], alone(model, [32, 33, 34, 41]), atol=1e-5)
        batch.drop()
        assert batch.keys == [] and batch.row_capacity == 0


def test_a_shared_prefill_that_fails_after_its_pass_leaves_the_batch_as_it_was(model, monkeypatch):
    """If copying the shared rows fails (no memory for the extra rows), the batch holds what it held before, so the
    decode loop's fallback can prefill the rows one by one on top of it."""
    batch = KVBatch(model)
    cpu = torch.device("cpu")
    with torch.inference_mode():
        batch.prefill([[40, 41, 42]], pad_id=0, device=cpu)

        real = batch._reserve

        def no_room(rows, columns):  # room for the pass's one distinct row, not for the copies
            if rows > 2:
                raise RuntimeError("out of memory")
            real(rows, columns)

        monkeypatch.setattr(batch, "_reserve", no_room)
        try:
            batch.prefill([[5, 6, 7], [5, 6, 7], [5, 6, 7]], pad_id=0, device=cpu)
        except RuntimeError:
            pass
        else:
            raise AssertionError("the failure was swallowed")
        assert batch.lengths == [3]
