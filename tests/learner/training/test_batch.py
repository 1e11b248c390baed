"""RL batches from experiences: multi-turn masks survive cutting a batch into micro-batches."""

import torch

from services.learner.training.batch import build_rl_batch
from shared.schemas import Experience, sample_id


def exp(i: int, response: list[int], mask: list[int] | None) -> Experience:
    return Experience(id=sample_id("g", i), prompt_id="g", group_id="g", group_size=2, index=i,
                      prompt_token_ids=[1, 7, 8], response_token_ids=response,
                      response_logprobs=[-1.0 if m else 0.0 for m in (mask or [1] * len(response))],
                      finish_reason="stop", reward=float(i), weight_version=0, action_mask=mask)


def test_a_micro_batch_keeps_every_model_turn_of_a_multi_turn_trajectory():
    # model turn (2 tokens), environment turn (3 tokens, mask 0), model turn (2 tokens): 4 actions in 7 columns
    multi = exp(0, [10, 11, 20, 21, 22, 12, 13], [1, 1, 0, 0, 0, 1, 1])
    batch = build_rl_batch([multi, exp(1, [30, 31], None)], pad_id=0)
    assert batch.action_mask[0].tolist() == [1, 1, 0, 0, 0, 1, 1]
    part = batch.select(torch.tensor([0]))  # a micro-batch holding only the multi-turn row
    assert part.action_mask.shape[1] == 7 and part.action_mask[0].tolist() == [1, 1, 0, 0, 0, 1, 1]
    assert part.engine_logprobs[0].tolist() == [-1.0, -1.0, 0.0, 0.0, 0.0, -1.0, -1.0]
    short = batch.select(torch.tensor([1]))  # padding-only columns still go
    assert short.action_mask.shape[1] == 2
