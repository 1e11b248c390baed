"""Waiting out a Redis outage (services/learner/watches/redis_outage.py); a real Redis restarted under a running learner is
tests/learner/test_process.py::test_redis_restart_mid_run_is_waited_out."""

import asyncio

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from services.learner.watches.redis_outage import wait_for_redis


class Redis:
    """Answers PING after ``down`` failed ones."""

    def __init__(self, down: int) -> None:
        self.down, self.pings = down, 0

    async def ping(self) -> bool:
        self.pings += 1
        if self.pings <= self.down:
            raise RedisConnectionError("connection refused")
        return True


async def test_recovers_once_redis_answers_again():
    redis, recovered = Redis(down=1), []

    async def recover() -> None:
        recovered.append(redis.pings)

    assert await wait_for_redis(redis, RedisConnectionError("x"), asyncio.Event(), max_s=10, error="x",
                                recover=recover)
    assert redis.pings == 2 and recovered == [2]  # recovered after the PING that answered, once


async def test_stopping_ends_the_wait_unless_it_is_the_runs_last_steps():
    stop = asyncio.Event()
    stop.set()

    async def recover() -> None:
        pass

    assert not await wait_for_redis(Redis(down=0), RedisConnectionError("x"), stop, max_s=10, error="x",
                                    recover=recover)
    assert await wait_for_redis(Redis(down=0), RedisConnectionError("x"), stop, max_s=10, error="x",
                                recover=recover, final=True)


async def test_gives_up_past_the_bound_naming_the_first_error():
    async def recover() -> None:
        pass

    with pytest.raises(RuntimeError, match=r"redis_outage_max_s=0\); last error: first"):
        await asyncio.wait_for(wait_for_redis(Redis(down=99), RedisConnectionError("x"), asyncio.Event(), max_s=0.3,
                                              error="first", recover=recover), 10)
