"""The codec's fast path for experiences must accept exactly what full validation accepts, with equal results."""

import msgpack
import numpy as np
import pytest
from pydantic import BaseModel, ValidationError

from shared import codec
from shared.codec import CodecError, decode, decode_validated, encode
from shared.schemas import Experience
from shared.wire_structs import ExperienceData
from tests.shared.test_codec import make_experience as make_codec_experience


def make_experience(**over) -> Experience:
    return make_codec_experience(**{"index": 1, "label": {"answer": [2]}, **over})


def test_wire_struct_mirrors_the_model_fields():
    assert set(ExperienceData.__struct_fields__) == set(Experience.model_fields)


def test_fast_path_round_trip_is_exact_and_taken():
    exp = make_experience()
    payload = encode(exp)
    fast = codec._decode_experience_fast(payload)
    assert fast is not None, "a record as the encoder writes it must take the fast path"
    assert fast == exp == decode_validated(payload, Experience)
    assert fast.model_fields_set == decode_validated(payload, Experience).model_fields_set
    assert isinstance(fast.response_logprobs.numpy(), np.ndarray)
    assert fast.response_logprobs.numpy().dtype == np.float32
    with pytest.raises(ValidationError):  # records stay immutable (frozen)
        fast.reward = 2.0  # type: ignore[misc]


def test_fast_encoding_is_the_same_wire_format():
    exp = make_experience()
    fast = codec._encode_experience_fast(exp)
    assert fast is not None
    # the general decoder (plain msgpack + pydantic) reads it, and so does any msgpack reader
    assert decode_validated(fast, Experience) == exp
    assert msgpack.unpackb(fast)["data"]["response_token_ids"]["dtype"] == "<i4"


class _Note(BaseModel):
    text: str


def test_values_msgspec_cannot_encode_take_the_general_path():
    exp = make_experience(metadata={"note": _Note(text="hi")})
    assert codec._encode_experience_fast(exp) is None
    assert decode(encode(exp), Experience).metadata == {"note": {"text": "hi"}}


def _mutated(change) -> bytes:
    env = msgpack.unpackb(encode(make_experience()))
    change(env["data"])
    return msgpack.packb(env, use_bin_type=True)


def _set(field, value):
    return lambda d: d.__setitem__(field, value)


def _packed(field, dtype, values):
    arr = np.asarray(values, dtype=dtype)
    return _set(field, {"dtype": dtype, "n": len(arr), "b": arr.tobytes()})


MUTATIONS = {
    "empty id": _set("id", ""),
    "group_size 0": _set("group_size", 0),
    "negative index": _set("index", -1),
    "index outside the group": _set("index", 4),
    "unknown finish reason": _set("finish_reason", "bored"),
    "reward as a numeric string": _set("reward", "0.5"),
    "reward as text": _set("reward", "lots"),
    "int reward": _set("reward", 1),
    "integral float version": _set("weight_version", 3.0),
    "negative version": _set("weight_version", -1),
    "component not a number": _set("reward_components", {"a": "x"}),
    "metadata with int keys": _set("metadata", {1: "x"}),
    "extra field": _set("surprise", 1),
    "missing created_at": lambda d: d.pop("created_at"),
    "missing reward": lambda d: d.pop("reward"),
    "empty prompt": _packed("prompt_token_ids", "<i4", []),
    "misaligned logprobs": _packed("response_logprobs", "<f4", [-1.0]),
    "int64 token ids": _packed("response_token_ids", "<i8", [8, 9, 2]),
    "float64 logprobs": _packed("response_logprobs", "<f8", [-0.5, -1.0, -2.0]),
    "short bytes": lambda d: d["response_token_ids"].__setitem__("n", 4),
    "array as a list": _set("response_token_ids", [8, 9, 2]),
    "label null": _set("label", None),
    "texts null": lambda d: d.update(prompt_text=None, response_text=None),
}


@pytest.mark.parametrize("name", list(MUTATIONS))
def test_decode_agrees_with_full_validation(name):
    payload = _mutated(MUTATIONS[name])
    try:
        expected = decode_validated(payload, Experience)
    except CodecError as exc:
        with pytest.raises(CodecError) as got:
            decode(payload, Experience)
        assert str(got.value) == str(exc)
        assert codec._decode_experience_fast(payload) is None
        return
    fast = codec._decode_experience_fast(payload)
    if fast is not None:
        assert fast == expected
    got = decode(payload, Experience)
    if "created_at" in name:  # filled from the default factory (the clock) on each decode
        got, expected = (r.model_copy(update={"created_at": 0.0}) for r in (got, expected))
    assert got == expected
    assert got.model_fields_set == expected.model_fields_set


def test_wrong_version_is_refused_with_the_version_in_the_message():
    env = msgpack.unpackb(encode(make_experience()))
    env["v"] = 99
    payload = msgpack.packb(env, use_bin_type=True)
    assert codec._decode_experience_fast(payload) is None
    with pytest.raises(CodecError, match="schema version 99"):
        decode(payload, Experience)
