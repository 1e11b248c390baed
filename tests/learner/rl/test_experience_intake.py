"""What the learner refuses to train on (services/learner/rl/experience_intake.py). Admission over a real stream, with
grants and signatures, is in test_rl_runner.py and test_trust.py."""

import math

import pytest

from services.learner.rl.experience_intake import invalid_reason
from tests.learner.helpers import group


def one(**change):
    return group("e0-1", [[5, 6]], [1.0])[0].model_copy(update=change)


@pytest.mark.parametrize(("change", "reason"), [
    ({}, None),
    ({"response_token_ids": [5, 99]}, "response_token_ids holds ids outside the vocabulary [0, 99)"),
    ({"prompt_token_ids": [-1, 5]}, "prompt_token_ids holds ids outside the vocabulary [0, 99)"),
    ({"response_token_ids": [5] * 7, "response_logprobs": [-1.0] * 7}, "11 tokens exceed the model's 10 positions"),
    ({"response_logprobs": [-1.0, math.nan]}, "non-finite logprob or reward"),
    ({"reward": math.inf}, "non-finite logprob or reward"),
])
def test_an_experience_the_model_cannot_take_is_named_with_the_reason(change, reason):
    assert invalid_reason(one(**change), vocab=99, max_len=10) == reason


def test_a_model_without_a_position_limit_takes_any_length():
    assert invalid_reason(one(response_token_ids=[5] * 50, response_logprobs=[-1.0] * 50), 99, None) is None
