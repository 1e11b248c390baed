"""Per-row sampling (services/rollout/engines/hf/sampling.py): filters, greedy, seeds, logprobs."""

from __future__ import annotations

import torch

from services.rollout.engines.hf.sampling import RowSampling, filtered_logprobs, sample


def rows(n, temperature=1.0, top_k=-1, top_p=1.0, min_p=0.0, gens=None):
    return RowSampling(
        temperature=torch.full((n,), float(temperature)), top_k=torch.full((n,), top_k, dtype=torch.long),
        top_p=torch.full((n,), float(top_p)), min_p=torch.full((n,), float(min_p)), generators=gens or [None] * n)


LOGITS = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]])


def test_plain_temperature_is_log_softmax_of_scaled_logits():
    lp = filtered_logprobs(LOGITS, rows(1, temperature=0.5))
    assert torch.allclose(lp, torch.log_softmax(LOGITS / 0.5, -1))


def test_top_k_renormalises_over_the_k_best():
    lp = filtered_logprobs(LOGITS, rows(1, top_k=2))
    assert torch.isinf(lp[0, 2:]).all()
    assert torch.allclose(lp[0, :2], torch.log_softmax(LOGITS[0, :2], -1))


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = torch.softmax(LOGITS, -1)[0]  # ~[0.64, 0.24, 0.09, 0.03, 0.01]
    lp = filtered_logprobs(LOGITS, rows(1, top_p=0.8))
    kept = torch.isfinite(lp[0])
    assert kept.tolist() == [True, True, False, False, False]
    assert torch.allclose(lp[0, :2].exp(), probs[:2] / probs[:2].sum())


def test_min_p_and_greedy():
    lp = filtered_logprobs(LOGITS, rows(1, min_p=0.3))
    assert torch.isfinite(lp[0]).tolist() == [True, True, False, False, False]
    tokens, chosen, _ = sample(LOGITS, rows(1, temperature=0.0, top_k=1), None)
    assert tokens.tolist() == [0]
    assert torch.allclose(chosen, torch.log_softmax(LOGITS, -1)[:, 0])  # greedy: raw log_softmax


def test_per_row_seeds_are_independent_of_batch_company():
    logits = torch.randn(1, 50).repeat(3, 1)
    g = lambda s: torch.Generator().manual_seed(s)
    alone, _, _ = sample(logits[:1], rows(1, gens=[g(5)]), torch.Generator().manual_seed(0))
    batch, _, _ = sample(logits, rows(3, gens=[None, g(5), g(6)]), torch.Generator().manual_seed(1))
    assert batch[1] == alone[0]


def test_chosen_logprob_is_that_of_the_sampled_token():
    logits = torch.randn(4, 30)
    tokens, chosen, full = sample(logits, rows(4, temperature=0.7, top_k=10), torch.Generator().manual_seed(0))
    assert torch.allclose(chosen, full.gather(-1, tokens[:, None])[:, 0])
    assert torch.isfinite(chosen).all()
