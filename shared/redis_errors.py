"""What "Redis is unavailable" means, once for every service: the errors a call raises while the server is down,
restarting (loading its data) or out of reach. A caller that waits an outage out catches ``REDIS_UNAVAILABLE``
and, first thing in that handler, calls :func:`raise_if_refused`: redis-py's refused password or ACL
(``AuthenticationError``, ``AuthorizationError``) are subclasses of its ``ConnectionError``, but they are a
setting to fix, and waiting them out would wait until the outage limit and then blame the wrong thing. Any other
Redis error (a wrong command, a NOGROUP) is a defect, not an outage.
"""

from __future__ import annotations

from redis.exceptions import AuthenticationError, AuthorizationError, BusyLoadingError, RedisError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

REDIS_UNAVAILABLE: tuple[type[BaseException], ...] = (
    RedisConnectionError, RedisTimeoutError, BusyLoadingError,
    ConnectionError, TimeoutError,  # the socket's own, where redis-py lets one through
)


REDIS_FAILED: tuple[type[BaseException], ...] = (RedisError, OSError)
"""Any failure of a Redis call, an outage or not (a refused password, a wrong type, a full server, a broken
socket): caught where the caller degrades the same way whatever the cause and says the cause (a best-effort
session record, a status probe, the CLI's one-line error). A caller that waits an outage out catches
``REDIS_UNAVAILABLE`` instead, and lets every other Redis error through."""


REDIS_REFUSED: tuple[type[BaseException], ...] = (AuthenticationError, AuthorizationError)
"""Caught by ``except REDIS_UNAVAILABLE`` (redis-py derives them from its ConnectionError), but not an outage."""


def redis_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` says Redis is down or out of reach (an outage to wait out), not a mistake to report."""
    return isinstance(exc, REDIS_UNAVAILABLE) and not isinstance(exc, REDIS_REFUSED)


def raise_if_refused(exc: BaseException) -> None:
    """Raise ``exc`` at once when it is Redis refusing our credentials (a setting to fix), not an outage."""
    if isinstance(exc, REDIS_REFUSED):
        raise exc
