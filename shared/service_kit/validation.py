"""The one formatter of request-validation errors: pydantic's error list -> one readable line.

``items.0.response: Field required; sampling_params.bogus: unknown field (not part of this API)``: each
error's location without the ``body`` prefix, then what is wrong; special cases for what pydantic words
poorly (unknown fields, bad JSON, text that is not UTF-8, a missing body).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fastapi.exceptions import RequestValidationError


def validation_message(exc: RequestValidationError | Iterable[dict[str, Any]]) -> str:
    errors = exc.errors() if isinstance(exc, RequestValidationError) else exc
    parts = []
    for err in errors:
        loc = [str(p) for p in err.get("loc", ()) if p != "body"]
        where = ".".join(loc) or "body"
        kind = err.get("type")
        if kind == "extra_forbidden":
            parts.append(f"{where}: unknown field (not part of this API)")
        elif kind == "json_invalid":
            parts.append(f"body is not valid JSON: {err.get('ctx', {}).get('error', err.get('msg'))}")
        elif kind == "string_unicode":  # a lone surrogate where pydantic needs a str (a field name)
            parts.append(f"{where}: holds text that is not valid UTF-8 (a lone surrogate, perhaps in a field name)")
        elif kind == "missing" and where == "body":
            parts.append("body: a JSON object is required")
        else:
            msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
            parts.append(f"{where}: {msg}")
    return "; ".join(parts) or "invalid request"
