"""What a service's OpenAPI spec declares beyond FastAPI's own: every error a route can answer, in the envelope.

Routes declare the statuses that are theirs (``responses=error_responses(429, 503)``); the app factory's
spec adds, reading each operation of FastAPI's spec, what the kit itself answers:

- 500 on every operation (a bug: :mod:`.internal_errors`) and 413 (:mod:`.body_limit`, by Content-Length);
- 400 on every operation that takes input (validation: :mod:`.validation`), in place of FastAPI's 422
  ``HTTPValidationError``, which no FleetRL service answers;
- 401 and 403 on every operation behind ``ControlDep`` (:mod:`.auth`: its bearer scheme is in the
  operation's ``security``).
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI

from shared.service_kit.auth import CONTROL_SCHEME
from shared.service_kit.envelope import ErrorResponse

DESCRIPTIONS = {
    400: "Invalid request: a field fails validation, or the service cannot serve what it asks for.",
    401: "Control route: no bearer token, or a wrong one.",
    403: "Control route: the control plane is off (no control_token is configured).",
    409: "Conflict with the service's state.",
    413: "The request body (or batch) is over the service's limit.",
    422: "An item cannot be processed as sent.",
    429: "Over capacity; retry after Retry-After seconds.",
    500: "Internal error (a bug); the connection stays open.",
    502: "An upstream (a scorer) failed.",
    503: "Unavailable now (paused, engine or upstream unavailable); retry.",
    504: "Timed out.",
}
_REF = {"$ref": "#/components/schemas/ErrorResponse"}
_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")


Responses = dict[int | str, dict[str, Any]]
"""What a route's ``responses=`` takes (FastAPI's type): status -> OpenAPI response."""


def error_responses(*statuses: int) -> Responses:
    """``responses=`` for a route: each status answered with the envelope."""
    return {s: {"model": ErrorResponse, "description": DESCRIPTIONS.get(s, "Error.")} for s in statuses}


def _kit_statuses(operation: dict[str, Any]) -> list[int]:
    statuses = [413, 500]
    if operation.get("requestBody") or operation.get("parameters"):
        statuses.append(400)
    if any(CONTROL_SCHEME in requirement for requirement in operation.get("security", [])):
        statuses += [401, 403]
    return sorted(statuses)


def complete_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """``spec`` (FastAPI's) with the kit's error responses added and FastAPI's unused 422 removed."""
    schemas = spec.setdefault("components", {}).setdefault("schemas", {})
    error_schema = ErrorResponse.model_json_schema(ref_template="#/components/schemas/{model}")
    schemas.update(error_schema.pop("$defs", {}))
    schemas["ErrorResponse"] = error_schema
    for item in spec.get("paths", {}).values():
        for method, operation in item.items():
            if method not in _METHODS:
                continue
            responses = operation.setdefault("responses", {})
            if "HTTPValidationError" in json.dumps(responses.get("422", {})):
                del responses["422"]
            for status in _kit_statuses(operation):
                responses.setdefault(str(status), {"description": DESCRIPTIONS[status],
                                                   "content": {"application/json": {"schema": _REF}}})
    rest = json.dumps({k: v for k, v in spec.items() if k != "components"})
    if '/HTTPValidationError"' not in rest:  # only FastAPI's 422 referred to them
        schemas.pop("HTTPValidationError", None)
        schemas.pop("ValidationError", None)
    return spec


def install_openapi(app: FastAPI) -> None:
    """Make ``app.openapi()`` (and ``/openapi.json``) the completed spec (FastAPI builds and caches it once)."""
    default = app.openapi
    completed: list[dict[str, Any]] = []

    def openapi() -> dict[str, Any]:
        spec = default()
        if not completed or completed[0] is not spec:
            completed[:] = [complete_spec(spec)]
        return spec

    app.openapi = openapi  # type: ignore[method-assign]
