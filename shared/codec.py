"""Wire codec for queue payloads: msgpack, packed numeric arrays, a schema version. No pickle.

An encoded record is a msgpack map ``{"schema": <record kind>, "v": <version>, "data": {...}}``.
Fields listed in :data:`PACKED_FIELDS` travel as ``{"dtype": "<i4"|"<f4"|"|u1", "n": N, "b": bytes}``
(little-endian), which is ~4x smaller than msgpack lists and decodes with one ``numpy.frombuffer``.

Versions: v2 added the trajectory fields of an experience (``action_mask``, ``version_spans``,
``sampling``); v3 (written now) added ``grant`` to prompt tasks and experiences (the learner's proof that
it issued the group). v1 and v2 records, which a queue may still hold after an upgrade, decode with those
fields unset. A record of a version this build does not know is refused with the reason.

Decoding is strict: anything that is not a well-formed record of a known kind and version raises
:class:`CodecError` whose message names what is wrong.

Experiences, the hot record, take a fast path both ways (``shared.wire_structs``): encoded from the
model's fields without a pydantic dump, decoded and type-checked by a compiled msgspec struct, arrays as
zero-copy views. A payload the fast path refuses goes through full pydantic validation, so what is
accepted, and the error for what is not, are the same either way; only the speed differs.
"""

from __future__ import annotations

import threading
from typing import Any, TypeVar

import msgpack
import msgspec
import numpy as np
from pydantic import BaseModel, ValidationError

from shared.packed import PackedArray
from shared.schemas import Experience, PromptTask, SamplingRecord, experience_alignment_problem
from shared.wire_structs import ExperienceEnvelope

SCHEMA_VERSION = 3
READABLE_VERSIONS = frozenset({1, 2, 3})  # v1: before the trajectory fields; v2: before grant (all optional)

RECORD_KINDS: dict[str, type[BaseModel]] = {
    "prompt_task": PromptTask,
    "experience": Experience,
}
_KIND_OF: dict[type[BaseModel], str] = {cls: kind for kind, cls in RECORD_KINDS.items()}

# field name -> numpy dtype it is packed as, per record kind
PACKED_FIELDS: dict[str, dict[str, str]] = {
    "prompt_task": {"prompt_token_ids": "<i4"},
    "experience": {"prompt_token_ids": "<i4", "response_token_ids": "<i4", "response_logprobs": "<f4",
                   "action_mask": "|u1"},
}
_EXCLUDE: dict[str, set[str]] = {kind: set(fields) for kind, fields in PACKED_FIELDS.items()}
_ALLOWED_DTYPES = {"<i4", "<f4", "<i8", "<f8", "|u1"}
_NP_DTYPES = {d: np.dtype(d) for d in _ALLOWED_DTYPES}  # np.dtype(str) costs ~1 us; look them up once
_PACKED_KEYS = frozenset({"dtype", "n", "b"})

R = TypeVar("R", bound=BaseModel)


class CodecError(ValueError):
    """A payload could not be encoded or decoded; the message says why."""


def pack_array(values: Any, dtype: str) -> dict[str, Any]:
    """Pack a sequence of numbers as a typed little-endian byte string."""
    arr = np.asarray(values, dtype=np.dtype(dtype))
    if arr.ndim != 1:
        raise CodecError(f"packed arrays must be 1-D, got shape {arr.shape}")
    return {"dtype": dtype, "n": int(arr.shape[0]), "b": arr.tobytes()}


def unpack_array(obj: Any, field: str) -> np.ndarray:
    """Inverse of :func:`pack_array`; validates dtype and length. Zero-copy view of the bytes."""
    if not isinstance(obj, dict) or len(obj) != 3 or obj.keys() != _PACKED_KEYS:
        raise CodecError(f"field {field!r}: expected a packed array {{dtype, n, b}}, got {type(obj).__name__}")
    dtype, n, raw = obj["dtype"], obj["n"], obj["b"]
    np_dtype = _NP_DTYPES.get(dtype) if isinstance(dtype, str) else None
    if np_dtype is None:
        raise CodecError(f"field {field!r}: unsupported dtype {dtype!r} (allowed: {sorted(_ALLOWED_DTYPES)})")
    if not isinstance(raw, (bytes, bytearray)) or not isinstance(n, int):
        raise CodecError(f"field {field!r}: packed array needs bytes `b` and an integer `n`")
    if len(raw) != n * np_dtype.itemsize:
        raise CodecError(f"field {field!r}: {len(raw)} bytes do not hold {n} values of {dtype}")
    return np.frombuffer(raw, dtype=np_dtype)


_local = threading.local()


def _packer() -> msgpack.Packer:
    """One reusable Packer per thread (Packer objects are not thread-safe)."""
    p = getattr(_local, "packer", None)
    if p is None:
        p = _local.packer = msgpack.Packer(use_bin_type=True, autoreset=True)
    return p


def encode(record: BaseModel) -> bytes:
    """Encode a PromptTask or Experience for the queue."""
    kind = _KIND_OF.get(type(record))
    if kind is None:
        raise CodecError(f"no wire form for {type(record).__name__}; known: {sorted(RECORD_KINDS)}")
    if isinstance(record, Experience):
        fast = _encode_experience_fast(record)
        if fast is not None:
            return fast
    data = record.model_dump(mode="python", exclude=_EXCLUDE[kind])
    for field, dtype in PACKED_FIELDS[kind].items():
        value = getattr(record, field)
        if value is None:
            data[field] = None
        elif isinstance(value, PackedArray) and value.dtype == _NP_DTYPES[dtype]:
            arr = value.numpy()  # contiguous, read-only: msgpack copies straight from its buffer
            data[field] = {"dtype": dtype, "n": int(arr.shape[0]), "b": arr.data if arr.flags.c_contiguous else arr.tobytes()}
        else:
            data[field] = pack_array(value, dtype)
    return _packer().pack({"schema": kind, "v": SCHEMA_VERSION, "data": data})


_fast_encoder = msgspec.msgpack.Encoder()
_fast_decoder = msgspec.msgpack.Decoder(ExperienceEnvelope)
_EXPERIENCE_FIELDS = frozenset(Experience.model_fields)
_OPTIONAL_PACKED = frozenset({"action_mask"})


def _packed_view(value: Any, dtype: str) -> dict[str, Any] | None:
    if type(value) is not PackedArray:
        return None
    arr = value.numpy()
    if arr.dtype.str != dtype or not arr.flags.c_contiguous:
        return None
    return {"dtype": dtype, "n": len(arr), "b": arr.data}


def _encode_experience_fast(record: Experience) -> bytes | None:
    """The model's fields as they are (no pydantic dump), arrays straight from their buffers; None if a
    field needs the general path (an unusual array, or a value msgspec cannot encode as-is)."""
    data = dict(record.__dict__)
    for field, dtype in PACKED_FIELDS["experience"].items():
        if data[field] is None and field in _OPTIONAL_PACKED:
            continue
        packed = _packed_view(data[field], dtype)
        if packed is None:
            return None
        data[field] = packed
    if data["sampling"] is not None:
        data["sampling"] = data["sampling"].__dict__
    try:
        return _fast_encoder.encode({"schema": "experience", "v": SCHEMA_VERSION, "data": data})
    except (TypeError, ValueError, OverflowError):  # e.g. a pydantic model or a numpy scalar in metadata
        return None


def _trusted_model(cls: type[R], values: dict[str, Any], fields_set: frozenset[str]) -> R:
    """Build a model from values already validated to its schema, without validating them again."""
    obj = cls.__new__(cls)
    object.__setattr__(obj, "__dict__", values)
    object.__setattr__(obj, "__pydantic_fields_set__", set(fields_set))
    object.__setattr__(obj, "__pydantic_extra__", None)
    object.__setattr__(obj, "__pydantic_private__", None)
    return obj


def _decode_experience_fast(payload: bytes | bytearray | memoryview) -> Experience | None:
    """Decode a complete v1 experience as the encoder writes it; None means "take the general path"."""
    try:
        envelope = _fast_decoder.decode(payload)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None
    if envelope.v != SCHEMA_VERSION:
        return None
    values = msgspec.structs.asdict(envelope.data)
    for field, dtype in PACKED_FIELDS["experience"].items():
        packed, np_dtype = values[field], _NP_DTYPES[dtype]
        if packed is None:  # an optional array left out (the struct only lets the optional ones be None)
            continue
        if len(packed.b) != packed.n * np_dtype.itemsize:
            return None
        values[field] = PackedArray.wrap(np.frombuffer(packed.b, dtype=np_dtype))
    if values["version_spans"] is not None:
        values["version_spans"] = [tuple(span) for span in values["version_spans"]]
    sampling = values["sampling"]
    if sampling is not None:
        try:
            values["sampling"] = SamplingRecord.model_validate(msgspec.structs.asdict(sampling))
        except ValidationError:
            return None
    if experience_alignment_problem(
        len(values["prompt_token_ids"]), len(values["response_token_ids"]), len(values["response_logprobs"]),
        values["index"], values["group_size"], values["action_mask"], values["version_spans"],
        values["weight_version"],
    ):
        return None
    return _trusted_model(Experience, values, _EXPERIENCE_FIELDS)


def decode(payload: bytes, expect: type[R] | None = None) -> R:
    """Decode a queue payload; ``expect`` checks the record kind. Raises CodecError on any defect."""
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        raise CodecError(f"payload must be bytes, got {type(payload).__name__}")
    if expect is Experience:
        fast = _decode_experience_fast(payload)
        if fast is not None:
            return fast  # type: ignore[return-value]
    return decode_validated(payload, expect)


def decode_validated(payload: bytes | bytearray | memoryview, expect: type[R] | None = None) -> R:
    """The general decode: msgpack, envelope checks, full pydantic validation (and its error messages)."""
    try:
        envelope = msgpack.unpackb(payload, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types for garbage
        raise CodecError(f"payload is not valid msgpack: {exc}") from exc
    if not isinstance(envelope, dict) or not {"schema", "v", "data"} <= set(envelope):
        raise CodecError("payload is not a FleetRL record: expected a map with schema, v and data")
    kind, version, data = envelope["schema"], envelope["v"], envelope["data"]
    if version not in READABLE_VERSIONS:
        raise CodecError(f"schema version {version!r} is not supported (this build reads "
                         f"{', '.join(f'v{v}' for v in sorted(READABLE_VERSIONS))}; a newer FleetRL wrote it?)")
    cls = RECORD_KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise CodecError(f"unknown record kind {kind!r}; known: {sorted(RECORD_KINDS)}")
    if expect is not None and cls is not expect:
        raise CodecError(f"expected a {_KIND_OF[expect]!r} record, got {kind!r}")
    if not isinstance(data, dict):
        raise CodecError(f"{kind}: data must be a map")
    for field in PACKED_FIELDS[kind]:
        if data.get(field) is not None:
            data[field] = unpack_array(data[field], field)
    try:
        return cls.model_validate(data)  # type: ignore[return-value]
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or kind}: {e['msg']}" for e in exc.errors())
        raise CodecError(f"invalid {kind} record: {problems}") from exc
