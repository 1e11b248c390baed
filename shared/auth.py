"""Bearer-token guard for control routes (pause, weight update, checkpoint, stop)."""

from __future__ import annotations

import hmac
from collections.abc import Callable

from fastapi import HTTPException, Request, status
from pydantic import SecretStr


def control_guard(token: SecretStr | None) -> Callable[[Request], None]:
    """A FastAPI dependency that admits a request only with ``Authorization: Bearer <token>``.

    Without a configured token the control plane is off: every control route answers 403.
    """
    expected = token.get_secret_value() if token is not None else None

    def guard(request: Request) -> None:
        if not expected:
            raise HTTPException(status.HTTP_403_FORBIDDEN, "control routes are off: no control_token is configured")
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not given:
            raise HTTPException(
                status.HTTP_401_UNAUTHORIZED,
                "control route: send Authorization: Bearer <control_token>",
                headers={"WWW-Authenticate": "Bearer"},
            )
        if not hmac.compare_digest(given.encode(), expected.encode()):
            raise HTTPException(status.HTTP_401_UNAUTHORIZED, "control route: wrong bearer token",
                                headers={"WWW-Authenticate": "Bearer"})

    return guard
