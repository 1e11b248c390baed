"""Who may make a session's calls: the holder of the control token, or of that session's own key.

A session's key is derived from the control token (``HMAC-SHA256(control_token, session id)``), so every
replica of the run (they share the token) checks it without holding the session, and a replica redirecting a
call to the session's owner can hand the owner the key in the redirect's query (``session_key``: HTTP clients
drop ``Authorization`` on a redirect to another host). ``POST /sessions`` answers the key as ``api_key``; the
``openai_agent`` rollout function gives its program that key as ``OPENAI_API_KEY``, never the control token: a
program can call its own session, nothing else.

Without a control token there are no session keys: session calls answer 403 (as the session lifecycle does).
"""

from __future__ import annotations

import hashlib
import hmac

from fastapi import Request

from shared.service_kit.auth import ControlOff, NotAuthorized

KEY_PARAM = "session_key"
"""Query parameter carrying a session key (the redirect to a session's owner adds it)."""


def session_key(control_token: str, session_id: str) -> str:
    return hmac.new(control_token.encode(), f"fleetrl-session:{session_id}".encode(), hashlib.sha256).hexdigest()[:40]


def control_token_of(request: Request) -> str | None:
    token = getattr(request.app.state.settings, "control_token", None)
    return token.get_secret_value() if token is not None else None


def authorize_call(request: Request, session_id: str) -> None:
    """Raise 401 / 403 unless the request carries the control token or ``session_id``'s key (bearer or query)."""
    token = control_token_of(request)
    if not token:
        raise ControlOff("session calls are off: no control_token is configured (sessions need one)")
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    candidates = [given] if scheme.lower() == "bearer" and given else []
    if KEY_PARAM in request.query_params:
        candidates.append(request.query_params[KEY_PARAM])
    if not candidates:
        raise NotAuthorized(f"session {session_id!r}: send Authorization: Bearer <the session's api_key (POST "
                            "/sessions answers it) or the control_token>")
    expected = (session_key(token, session_id).encode(), token.encode())
    if not any(hmac.compare_digest(c.encode(), e) for c in candidates for e in expected):
        raise NotAuthorized(f"session {session_id!r}: wrong key (use the session's api_key or the control_token)")
