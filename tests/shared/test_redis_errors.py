"""One meaning of "Redis is unavailable" for every service (shared/redis_errors.py): an outage is waited out, a
mistake is reported."""

from __future__ import annotations

import pytest
from redis.exceptions import AuthenticationError, AuthorizationError, BusyLoadingError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from shared.redis_errors import REDIS_UNAVAILABLE, raise_if_refused, redis_unavailable


@pytest.mark.parametrize("exc", [RedisConnectionError("down"), RedisTimeoutError("slow"), BusyLoadingError("loading"),
                                 ConnectionRefusedError(111, "refused"), TimeoutError("socket")])
def test_outages_are_unavailable(exc):
    assert redis_unavailable(exc)
    with pytest.raises(REDIS_UNAVAILABLE):
        raise exc


@pytest.mark.parametrize("exc", [ResponseError("NOGROUP No such key"), AuthenticationError("invalid password"),
                                 ValueError("bad"), KeyError("x")])
def test_mistakes_are_not_outages(exc):
    """A refused password is a setting to fix: waiting it out would wait forever."""
    assert not redis_unavailable(exc)


def test_a_refused_password_is_raised_where_an_outage_would_be_waited_out():
    """redis-py derives AuthenticationError from its ConnectionError, so ``except REDIS_UNAVAILABLE`` catches it; a
    handler that waits outages out raises it at once instead (a wrong password never turns into a long wait)."""
    for exc in (AuthenticationError("invalid password"), AuthorizationError("NOPERM")):
        with pytest.raises(type(exc)):
            try:
                raise exc
            except REDIS_UNAVAILABLE as caught:
                raise_if_refused(caught)
                pytest.fail("a refused password was taken for an outage")
    raise_if_refused(RedisConnectionError("down"))  # an outage: the handler goes on to wait
