"""Unit tests: the wire format against the tinker client's own converters (what it writes we read, what we write
it reads), and each loss against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

tinker = pytest.importorskip("tinker")
from tinker import types
from tinker.proto.request_conv import forward_backward_request_to_proto
from tinker.proto.response_conv import deserialize_forward_backward_output, deserialize_sample_response

from services.learner.tinker.errors import BadRequest
from services.learner.tinker.losses import LOSSES, lookup
from services.learner.tinker.wire import (
    SampledOut,
    decode_forward_backward,
    decompress,
    encode_forward_backward_output,
    encode_sample_response,
)


def test_forward_backward_request_as_the_client_writes_it_dense_sparse_and_zstd():
    import zstandard

    dense = types.Datum(model_input=types.ModelInput.from_ints([5, 6, 7]),
                        loss_fn_inputs={"target_tokens": [6, 7, 8], "weights": [0.0, 1.0, 0.5]})
    sparse = types.Datum(model_input=types.ModelInput.from_ints([1, 2]),
                         loss_fn_inputs={"target_tokens": torch.tensor([[0, 3], [4, 0]]),
                                         "advantages": np.array([0.25, -1.0], dtype=np.float32)})
    req = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=[dense, sparse], loss_fn="ppo",
                                                          loss_fn_config={"clip_low_threshold": 0.9}),
        model_id="s:train:0", seq_id=3)
    msg = forward_backward_request_to_proto(req)
    msg.forward_only = True
    body = zstandard.ZstdCompressor().compress(msg.SerializeToString())
    call = decode_forward_backward(decompress(body, "zstd"))
    assert (call.model_id, call.seq_id, call.loss_fn, call.forward_only) == ("s:train:0", 3, "ppo", True)
    assert call.loss_fn_config == {"clip_low_threshold": 0.9}
    assert call.data[0].tokens == [5, 6, 7]
    assert call.data[0].inputs["target_tokens"].tolist() == [6, 7, 8]
    assert call.data[0].inputs["weights"].tolist() == [0.0, 1.0, 0.5]
    assert call.data[1].inputs["target_tokens"].tolist() == [[0, 3], [4, 0]]  # CSR back to dense
    assert call.data[1].inputs["advantages"].tolist() == [0.25, -1.0]


def test_garbage_bodies_are_400_not_500():
    with pytest.raises(BadRequest, match="protobuf"):
        decode_forward_backward(b"\xff\xff\xff garbage")
    with pytest.raises(BadRequest, match="zstd"):
        decompress(b"not zstd", "zstd")
    with pytest.raises(BadRequest) as exc:
        decompress(b"x", "br")
    assert exc.value.status == 415


def test_results_as_the_client_reads_them():
    out = encode_forward_backward_output([{"logprobs": np.array([-1.0, -2.0], np.float32)},
                                          {"logprobs": np.array([-0.5], np.float32)}], {"loss:sum": 3.5})
    parsed = deserialize_forward_backward_output(out)
    assert parsed.metrics == {"loss:sum": 3.5}
    assert [o["logprobs"].tolist() for o in parsed.loss_fn_outputs] == [[-1.0, -2.0], [-0.5]]
    sample = deserialize_sample_response(encode_sample_response(
        [SampledOut([4, 2], [-0.1, -0.2], "stop"), SampledOut([9], [-3.0], "length")], [None, -1.5, -2.5]))
    assert [s.tokens for s in sample.sequences] == [[4, 2], [9]]
    assert [s.stop_reason for s in sample.sequences] == ["stop", "length"]
    assert sample.sequences[0].logprobs == pytest.approx([-0.1, -0.2])
    assert sample.prompt_logprobs[0] is None and sample.prompt_logprobs[1:] == pytest.approx([-1.5, -2.5])


LOGP = torch.tensor([-1.0, -2.0])
OLD = torch.tensor([-1.5, -1.0])
ADV = torch.tensor([2.0, -1.0])


@pytest.mark.parametrize(("name", "inputs", "config", "expected"), [
    ("cross_entropy", {"weights": torch.tensor([1.0, 0.5])}, {}, 1.0 + 0.5 * 2.0),
    ("cross_entropy", {}, {}, 3.0),
    ("importance_sampling", {"logprobs": OLD, "advantages": ADV}, {},
     -(math.exp(0.5) * 2.0 + math.exp(-1.0) * -1.0)),
    # ratios e^0.5 = 1.65 (A > 0: clipped to 1.2) and e^-1 = 0.37 (A < 0: min(-0.37, -0.8) = -0.8)
    ("ppo", {"logprobs": OLD, "advantages": ADV}, {}, -(1.2 * 2.0 + 0.8 * -1.0)),
    ("ppo", {"logprobs": OLD, "advantages": ADV}, {"clip_low_threshold": 0.5, "clip_high_threshold": 2.0},
     -(math.exp(0.5) * 2.0 + 0.5 * -1.0)),
    ("cispo", {"logprobs": OLD, "advantages": ADV}, {}, -(1.2 * -1.0 * 2.0 + 0.8 * -2.0 * -1.0)),
    ("dro", {"logprobs": OLD, "advantages": ADV}, {"beta": 0.1},
     -((-1.0 * 2.0 - 0.05 * 0.25) + (-2.0 * -1.0 - 0.05 * 1.0))),
])
def test_losses_by_hand(name, inputs, config, expected):
    assert float(lookup(name, config).fn(LOGP, inputs, config)) == pytest.approx(expected, rel=1e-6)


def test_cispo_gradient_flows_through_logp_only():
    logp = LOGP.clone().requires_grad_(True)
    LOSSES["cispo"].fn(logp, {"logprobs": OLD, "advantages": ADV}, {}).backward()
    assert logp.grad.tolist() == pytest.approx([-1.2 * 2.0, -0.8 * -1.0])


def test_unknown_losses_and_config_keys_are_named():
    with pytest.raises(BadRequest, match="served: cispo, cross_entropy, dro, importance_sampling, ppo"):
        lookup("gspo", {})
    with pytest.raises(BadRequest, match="mean nothing"):
        lookup("cross_entropy", {"beta": 1.0})
    with pytest.raises(BadRequest, match="clip_low_threshold"):
        LOSSES["ppo"].fn(LOGP, {"logprobs": OLD, "advantages": ADV}, {"clip_low_threshold": 1.5})
