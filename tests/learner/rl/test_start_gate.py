"""The learner's start gate on a real Redis: opens on this launch's value only, gives up with the setting's name
after its timeout, and lets a stop through."""

import asyncio

import pytest

from services.learner.rl.start_gate import StartGateTimeout, open_start_gate, wait_start_gate

KEY = "fleetrl:gate-test:learner:start_gate"


async def test_opens_on_this_launchs_value_not_an_earlier_ones(redis_server, redis_client):
    await redis_client.set(KEY, "earlier-launch")  # left by an earlier `fleetrl run` of the same run name
    waiter = asyncio.create_task(wait_start_gate(redis_client, KEY, "this-launch", 30, asyncio.Event(), poll_s=0.02))
    await asyncio.sleep(0.3)
    assert not waiter.done(), "an earlier launch's value opened the gate"
    await asyncio.to_thread(open_start_gate, redis_server.url, KEY, "this-launch")
    assert await asyncio.wait_for(waiter, 5) is True
    assert 0 < await redis_client.ttl(KEY) <= 86_400  # the key does not outlive the run by more than a day


async def test_a_shut_gate_fails_after_its_timeout_naming_the_setting(redis_client):
    with pytest.raises(StartGateTimeout, match="train.start_gate_timeout_s"):
        await asyncio.wait_for(wait_start_gate(redis_client, KEY, "never", 0.3, asyncio.Event(), poll_s=0.05), 5)


async def test_a_stop_ends_the_wait(redis_client):
    stop = asyncio.Event()
    waiter = asyncio.create_task(wait_start_gate(redis_client, KEY, "never", 30, stop, poll_s=0.05))
    await asyncio.sleep(0.1)
    stop.set()
    assert await asyncio.wait_for(waiter, 5) is False
