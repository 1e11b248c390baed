"""``PackedArray``: an immutable, list-like sequence of numbers backed by a 1-D numpy array.

Experiences carry thousands of token ids and logprobs. As Python lists, encoding, decoding and
validating them costs more than moving them through Redis; as numpy arrays they pack and unpack
with one memcpy (or none). ``PackedArray`` keeps list behaviour where code expects it (``len``,
iteration, indexing, slicing to a list, ``==`` against lists, ``+`` with lists, JSON as a list)
and exposes ``.numpy()`` / ``np.asarray(x)`` / ``torch.as_tensor(np.asarray(x))`` for fast paths.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np
from pydantic import GetCoreSchemaHandler
from pydantic_core import PydanticCustomError, core_schema


class PackedArray(Sequence):
    __slots__ = ("_a",)

    def __init__(self, values: Any, dtype: str | np.dtype) -> None:
        a = np.asarray(values, dtype=np.dtype(dtype))
        if a.ndim != 1:
            raise ValueError(f"expected a 1-D sequence, got shape {a.shape}")
        if a.flags.writeable:
            a = a.copy() if a.base is not None else a
            a.flags.writeable = False
        self._a = a

    @classmethod
    def wrap(cls, array: np.ndarray) -> PackedArray:
        """Wrap a 1-D array without copying (it is made read-only)."""
        obj = cls.__new__(cls)
        if array.flags.writeable:
            array.flags.writeable = False
        obj._a = array
        return obj

    @property
    def dtype(self) -> np.dtype:
        return self._a.dtype

    def numpy(self) -> np.ndarray:
        """The read-only backing array (no copy)."""
        return self._a

    def tolist(self) -> list:
        return self._a.tolist()

    def tobytes(self) -> bytes:
        return self._a.tobytes()

    def __array__(self, dtype=None, copy=None):
        if dtype is None or np.dtype(dtype) == self._a.dtype:
            return self._a.copy() if copy else self._a
        return self._a.astype(dtype)

    def __len__(self) -> int:
        return int(self._a.shape[0])

    def __iter__(self):
        return iter(self._a.tolist())

    def __getitem__(self, i):
        if isinstance(i, slice):
            return self._a[i].tolist()
        return self._a[i].item()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PackedArray):
            return self._a.shape == other._a.shape and bool(np.array_equal(self._a, other._a))
        if isinstance(other, (list, tuple)):
            return self._a.tolist() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __add__(self, other):
        return self._a.tolist() + list(other)

    def __radd__(self, other):
        return list(other) + self._a.tolist()

    def __repr__(self) -> str:
        return repr(self._a.tolist())


def _make_validator(dtype: str):
    np_dtype = np.dtype(dtype)
    integral = np_dtype.kind in "iu"
    info = np.iinfo(np_dtype) if integral else None

    def validate(value: Any) -> PackedArray:
        if isinstance(value, PackedArray) and value.dtype == np_dtype:
            return value
        if isinstance(value, np.ndarray) and value.dtype == np_dtype and value.ndim == 1:
            return PackedArray.wrap(value)
        if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__len__"):
            raise PydanticCustomError("packed_array", "expected a list of numbers, got {t}", {"t": type(value).__name__})
        try:
            raw = np.asarray(value.numpy() if isinstance(value, PackedArray) else value)
        except (ValueError, TypeError) as exc:
            raise PydanticCustomError("packed_array", "expected a flat list of numbers: {e}", {"e": str(exc)}) from exc
        if raw.ndim != 1 and raw.size:
            raise PydanticCustomError("packed_array", "expected a flat list, got shape {s}", {"s": str(raw.shape)})
        raw = raw.reshape(-1)
        if raw.size and raw.dtype.kind not in ("iub" if integral else "iuf"):
            kind = "integers" if integral else "numbers"
            raise PydanticCustomError("packed_array", "expected {k}, got values of type {t}", {"k": kind, "t": str(raw.dtype)})
        if info is not None and raw.size and (raw.min() < info.min or raw.max() > info.max):
            raise PydanticCustomError("packed_array", "values outside the {d} range", {"d": str(np_dtype)})
        if not integral and raw.size and not np.isfinite(raw).all() and np.isnan(raw).any():
            raise PydanticCustomError("packed_array", "NaN is not a valid value", {})
        return PackedArray(raw, np_dtype)

    return validate


class _PackedType:
    dtype = "<i4"

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(
            _make_validator(cls.dtype),
            serialization=core_schema.plain_serializer_function_ser_schema(
                lambda v: v.tolist(), when_used="json-unless-none"
            ),
            json_schema_input_schema=core_schema.list_schema(
                core_schema.int_schema() if np.dtype(cls.dtype).kind in "iu" else core_schema.float_schema()
            ),
        )


if TYPE_CHECKING:  # to a type checker a field of these types holds what validation returns
    TokenIds: TypeAlias = PackedArray
    Logprobs: TypeAlias = PackedArray
    TokenMask: TypeAlias = PackedArray
else:

    class TokenIds(_PackedType):
        """Pydantic field type: token ids as int32."""

        dtype = "<i4"


    class Logprobs(_PackedType):
        """Pydantic field type: per-token logprobs as float32."""

        dtype = "<f4"


    class TokenMask(_PackedType):
        """Pydantic field type: a per-token 0/1 flag as uint8 (e.g. which tokens the model generated)."""

        dtype = "|u1"
