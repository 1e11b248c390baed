"""Unit test: a sample request's ``stop`` as the stop token ids and stop strings the samplers get."""

from __future__ import annotations

import pytest

from services.learner.tinker.sampling import stop_lists


@pytest.mark.parametrize(("stop", "tokens", "strings"), [
    (None, None, ()),  # EOS stops, as by default
    ("\n\n", None, ("\n\n",)),
    (["a", "bc"], None, ("a", "bc")),
    ([7, 9], (7, 9), ()),
    ([], (), ()),  # nothing stops but max_tokens (the sampler ignores EOS)
])
def test_stop_lists(stop, tokens, strings):
    assert stop_lists(stop) == (tokens, strings)
