"""Compiled wire forms of the hot queue records: the codec's fast path.

Every experience crosses the queue once, so its decode cost bounds the learner's intake. Validating
it field by field in pydantic costs ~3x what the bytes cost to move; a msgspec ``Struct`` decodes and
type-checks the same msgpack map in C, and the packed arrays come out as zero-copy ``memoryview`` s.

These structs mirror :class:`shared.schemas.Experience` as the encoder writes it: every field present,
the same types and constraints. They accept a subset of what the pydantic model accepts (stricter:
no coercion, no defaults); anything they refuse goes through the model's own validation, which either
accepts it or raises the precise error. ``tests/shared/test_wire_structs.py`` holds the two in step.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

NonEmpty = Annotated[str, msgspec.Meta(min_length=1)]
NonNegative = Annotated[int, msgspec.Meta(ge=0)]
Positive = Annotated[int, msgspec.Meta(ge=1)]


class PackedI4(msgspec.Struct, forbid_unknown_fields=True):
    """``{"dtype": "<i4", "n": N, "b": bytes}``; ``b`` stays a view into the payload."""

    dtype: Literal["<i4"]
    n: NonNegative
    b: memoryview


class PackedF4(msgspec.Struct, forbid_unknown_fields=True):
    dtype: Literal["<f4"]
    n: NonNegative
    b: memoryview


class PackedU1(msgspec.Struct, forbid_unknown_fields=True):
    dtype: Literal["|u1"]
    n: NonNegative
    b: memoryview


class SamplingData(msgspec.Struct, forbid_unknown_fields=True):
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    max_tokens: Positive


class ExperienceData(msgspec.Struct, forbid_unknown_fields=True):
    id: NonEmpty
    prompt_id: NonEmpty
    group_id: NonEmpty
    group_size: Positive
    index: NonNegative
    prompt_token_ids: PackedI4
    response_token_ids: PackedI4
    response_logprobs: PackedF4
    finish_reason: Literal["stop", "length", "abort"]
    reward: float
    reward_components: dict[str, float]
    weight_version: NonNegative
    prompt_text: str | None
    response_text: str | None
    label: Any
    metadata: dict[str, Any]
    created_at: float
    generated_at: float
    action_mask: PackedU1 | None
    version_spans: list[tuple[NonNegative, NonNegative]] | None
    sampling: SamplingData | None
    grant: Annotated[str, msgspec.Meta(max_length=128)] | None


class ExperienceEnvelope(msgspec.Struct, forbid_unknown_fields=True):
    schema: Literal["experience"]
    v: int
    data: ExperienceData


PACKED_STRUCTS = (PackedI4, PackedF4, PackedU1)
