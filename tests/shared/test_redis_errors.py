"""One meaning of "Redis is unavailable" for every service (shared/redis_errors.py): an outage is waited out, a
mistake is reported."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from redis.exceptions import AuthenticationError, AuthorizationError, BusyLoadingError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from shared.redis_errors import REDIS_FAILED, REDIS_UNAVAILABLE, raise_if_refused, redis_unavailable


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


def test_no_handler_spells_its_own_redis_error_tuple():
    """What a handler catches from Redis is one of the named tuples (``REDIS_UNAVAILABLE``: an outage to wait out;
    ``REDIS_FAILED``: any failure, where the caller degrades alike), never a tuple of its own: five different
    spellings had different contents (issue 42)."""
    root = Path(__file__).resolve().parents[2]
    found = []
    for folder in ("shared", "services", "deploy"):
        for path in (root / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ExceptHandler) and isinstance(node.type, ast.Tuple):
                    names = {n.attr if isinstance(n, ast.Attribute) else getattr(n, "id", "") for n in node.type.elts}
                    if any(name.endswith("RedisError") for name in names):
                        found.append(f"{path.relative_to(root)}:{node.lineno}")
    assert not found, f"catch REDIS_FAILED or REDIS_UNAVAILABLE (shared/redis_errors.py) instead: {found}"


def test_any_redis_failure_is_failed_and_an_outage_is_one_of_them():
    for exc in (ResponseError("WRONGTYPE"), AuthenticationError("invalid password"), RedisConnectionError("down"),
                OSError("broken pipe")):
        assert isinstance(exc, REDIS_FAILED)
    assert not isinstance(ValueError("bad"), REDIS_FAILED)
