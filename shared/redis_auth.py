"""A service's first word with Redis: a server that refuses our credentials is a one-line error naming the
setting, at start — never a traceback from deep inside a worker, never a service that comes up and waits.

Only what a retry cannot fix is reported here (a missing or wrong password, a URL that names no Redis); a server
that is not up yet is left to each service's own waiting (the learner waits out outages, entrypoints wait for
``tcp://redis``)."""

from __future__ import annotations

from urllib.parse import urlsplit

from shared.redact import redact_text, redact_url


def redis_auth_problem(url: str, setting: str = "redis_url", timeout_s: float = 5.0) -> str | None:
    """Why this service cannot use the Redis at ``url`` (one line naming ``setting``), or None (it answered, or it
    is not reachable right now, which the service waits out)."""
    import redis
    from redis.exceptions import (
        AuthenticationError,
        AuthorizationError,
        ConnectionError,
        ResponseError,
        TimeoutError,
    )

    try:
        client = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
    except ValueError as exc:
        return f"{setting}: {redact_url(url)!r} is not a Redis URL ({redact_text(str(exc))})"
    try:
        client.ping()
    except (AuthenticationError, AuthorizationError) as exc:
        return _refused(url, setting, exc)
    except ResponseError as exc:
        return _refused(url, setting, exc) if "NOAUTH" in str(exc) or "WRONGPASS" in str(exc) else None
    except (ConnectionError, TimeoutError, OSError):
        return None
    finally:
        client.close()
    return None


def _refused(url: str, setting: str, exc: Exception) -> str:
    how = (f"it requires a password and {setting} gives none" if urlsplit(url).password is None else
           f"it refused the password (or user) in {setting}")
    return (f"Redis at {redact_url(url)} refused this service: {how} ({redact_text(str(exc)).splitlines()[0]}); "
            f"put the right password in {setting}: redis://:PASSWORD@host:port/db (rediss:// for TLS)")
