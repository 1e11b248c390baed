import math

import msgpack
import pytest

from shared.codec import SCHEMA_VERSION, CodecError, decode, encode, pack_array
from shared.schemas import ChatMessage, Experience, PromptTask, SamplingOverrides, sample_id


def make_experience(**over) -> Experience:
    base = {
        "id": sample_id("p1", 0), "prompt_id": "p1", "group_id": "p1", "group_size": 4, "index": 0,
        "prompt_token_ids": [5, 6, 7], "response_token_ids": [8, 9, 2], "response_logprobs": [-0.5, -1.25, -0.125],
        "finish_reason": "stop", "reward": 1.0, "reward_components": {"exact": 1.0}, "weight_version": 3,
        "prompt_text": "1+1=", "response_text": "2", "label": "2", "metadata": {"epoch": 0},
    }
    base.update(over)
    return Experience(**base)


def test_experience_round_trip_is_exact():
    exp = make_experience()
    back = decode(encode(exp), expect=Experience)
    assert back == exp


def test_logprobs_travel_as_float32():
    exp = make_experience(response_logprobs=[-0.1, -1e-8, -30.123456789])
    back = decode(encode(exp), expect=Experience)
    for a, b in zip(back.response_logprobs, exp.response_logprobs):
        assert math.isclose(a, b, rel_tol=1e-6)


def test_prompt_task_round_trip_all_prompt_forms():
    tasks = [
        PromptTask(id="a", prompt="2+2=", label="4", n=8, sampling=SamplingOverrides(temperature=0.7, stop=["\n"])),
        PromptTask(id="b", prompt=[ChatMessage(role="user", content="hi")]),
        PromptTask(id="c", prompt_token_ids=[1, 2, 3]),
    ]
    for t in tasks:
        assert decode(encode(t), expect=PromptTask) == t


def test_token_ids_are_packed_not_lists():
    exp = make_experience(response_token_ids=list(range(1024)), response_logprobs=[-1.0] * 1024)
    env = msgpack.unpackb(encode(exp), raw=False)
    packed = env["data"]["response_token_ids"]
    assert packed["dtype"] == "<i4" and packed["n"] == 1024 and len(packed["b"]) == 4096


@pytest.mark.parametrize(
    "payload, needle",
    [
        (b"\xc1not msgpack", "not valid msgpack"),
        (msgpack.packb([1, 2, 3]), "not a FleetRL record"),
        (msgpack.packb({"schema": "experience", "v": 99, "data": {}}), "schema version 99"),
        (msgpack.packb({"schema": "bogus", "v": SCHEMA_VERSION, "data": {}}), "unknown record kind"),
        (msgpack.packb({"schema": "experience", "v": SCHEMA_VERSION, "data": {"id": "x"}}), "invalid experience"),
    ],
)
def test_malformed_payloads_raise_clear_errors(payload, needle):
    with pytest.raises(CodecError, match=needle):
        decode(payload)


def test_wrong_kind_is_rejected():
    with pytest.raises(CodecError, match="expected a 'experience' record, got 'prompt_task'"):
        decode(encode(PromptTask(id="a", prompt="x")), expect=Experience)


def test_truncated_packed_array_is_rejected():
    env = msgpack.unpackb(encode(make_experience()), raw=False)
    env["data"]["response_token_ids"]["b"] = env["data"]["response_token_ids"]["b"][:-1]
    with pytest.raises(CodecError, match="response_token_ids.*do not hold 3 values"):
        decode(msgpack.packb(env, use_bin_type=True))


def test_disallowed_dtype_is_rejected():
    env = msgpack.unpackb(encode(make_experience()), raw=False)
    env["data"]["response_token_ids"] = {"dtype": "|O", "n": 1, "b": b"x"}
    with pytest.raises(CodecError, match="unsupported dtype"):
        decode(msgpack.packb(env, use_bin_type=True))


def test_misaligned_logprobs_are_rejected_at_construction():
    with pytest.raises(ValueError, match="align one to one"):
        make_experience(response_logprobs=[-1.0])


def test_prompt_task_needs_exactly_one_prompt_form():
    with pytest.raises(ValueError, match="exactly one"):
        PromptTask(id="a")
    with pytest.raises(ValueError, match="exactly one"):
        PromptTask(id="a", prompt="x", prompt_token_ids=[1])
    with pytest.raises(ValueError, match="exactly one"):
        PromptTask(id="a", prompt="")


def test_pack_array_rejects_2d():
    with pytest.raises(CodecError, match="1-D"):
        pack_array([[1, 2]], "<i4")


TRAJECTORY = {
    "response_token_ids": [8, 9, 40, 41, 2], "response_logprobs": [-0.5, -1.0, 0.0, 0.0, -0.25],
    "action_mask": [1, 1, 0, 0, 1], "version_spans": [(0, 3), (4, 4)], "weight_version": 3,
    "sampling": {"temperature": 0.7, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "max_tokens": 64},
}


def test_trajectory_fields_round_trip_on_the_fast_path():
    from shared import codec

    exp = make_experience(**TRAJECTORY)
    payload = encode(exp)
    assert codec._decode_experience_fast(payload) == exp  # the compiled path takes it
    back = decode(payload, expect=Experience)
    assert back == exp and back.action_mask == [1, 1, 0, 0, 1] and back.sampling.temperature == 0.7
    assert back.token_versions() == [3, 3, 3, 3, 4]
    assert msgpack.unpackb(payload, raw=False)["data"]["action_mask"]["dtype"] == "|u1"


def test_a_v1_record_from_before_the_upgrade_still_decodes():
    env = msgpack.unpackb(encode(make_experience()), raw=False)
    for field in ("action_mask", "version_spans", "sampling"):
        del env["data"][field]
    env["v"] = 1
    back = decode(msgpack.packb(env, use_bin_type=True), expect=Experience)
    assert back.action_mask is None and back.version_spans is None and back.sampling is None
    assert back.token_versions() == [3, 3, 3]


def test_a_record_from_a_newer_build_is_refused_with_the_reason():
    env = msgpack.unpackb(encode(make_experience()), raw=False)
    env["v"] = SCHEMA_VERSION + 1
    with pytest.raises(CodecError, match=f"schema version {SCHEMA_VERSION + 1}.*newer FleetRL"):
        decode(msgpack.packb(env, use_bin_type=True), expect=Experience)


@pytest.mark.parametrize("over, needle", [
    ({"action_mask": [1, 1]}, "action_mask has 2 entries for 5"),
    ({"action_mask": [1, 1, 2, 0, 1]}, "other than 0 and 1"),
    ({"version_spans": [(1, 3)]}, "start at response token 0"),
    ({"version_spans": [(0, 3), (0, 4)]}, "increasing positions"),
    ({"version_spans": [(0, 3), (5, 4)]}, "increasing positions"),
    ({"version_spans": [(0, 4), (2, 5)]}, "must be the oldest"),
    ({"sampling": {"temperature": 1.0, "max_tokens": 0}}, "max_tokens"),
])
def test_trajectory_fields_must_be_consistent(over, needle):
    with pytest.raises(ValueError, match=needle):
        make_experience(**{**TRAJECTORY, **over})
