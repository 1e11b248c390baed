"""Retries of /score are bounded (issue 26): a reward service that always answers 503 (or 429) no longer pins a
worker slot forever with its lease renewed. After ``worker.reward_max_attempts`` tries or ``reward_max_retry_s``
the group fails with the reason, the prompt is dead-lettered (here after one delivery), its lease is released and
the worker's slot is free."""

from __future__ import annotations

import asyncio
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from services.rollout.reward_client import RewardClient, RewardUnavailable
from services.rollout.service import RolloutService
from services.rollout.settings import RolloutSettings
from shared import keys
from shared.experience_queue import StreamQueue
from shared.reward_api import ScoreItem
from shared.schemas import PromptTask


@pytest.fixture()
def always_down():
    """An HTTP server whose every POST answers 503 (a reward service that never recovers); counts the calls."""
    calls = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("content-length", 0)))
            calls.append(time.monotonic())
            body = b'{"detail": "scorer down"}'
            self.send_response(503)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", calls
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(("attempts", "total_s", "said"), [(3, 60.0, "after 3 tries"), (1000, 1.0, "tries over")])
async def test_the_client_gives_up_at_its_limits_with_the_reason(always_down, attempts, total_s, said):
    url, calls = always_down
    client = RewardClient(url, timeout_s=5, backoff_max_s=0.2, max_attempts=attempts, max_retry_s=total_s)
    t0 = time.monotonic()
    try:
        with pytest.raises(RewardUnavailable, match=f"{said}.*worker.reward_max_attempts.*answered 503") as err:
            await client.score([ScoreItem(prompt="p", response="r")])
    finally:
        await client.aclose()
    assert time.monotonic() - t0 < total_s + 5
    assert len(calls) >= 2 and (attempts != 3 or len(calls) == 3)
    assert "scorer down" in str(err.value)


async def test_the_worker_dead_letters_the_group_and_frees_its_slot(always_down, redis_server, redis_client,
                                                                   tiny_model_dir):
    url, calls = always_down
    run = "reward-limits"
    settings = RolloutSettings(
        model=str(tiny_model_dir), redis_url=redis_server.url, run_name=run, weight_sidecar=False,
        engine={"kind": "hf", "device": "cpu", "torch_threads": 1, "max_wait_ms": 2},
        worker={"enabled": True, "reward_url": url, "poll_interval_s": 0.1, "prompts_max_deliveries": 1,
                "reward_backoff_max_s": 0.2, "reward_max_attempts": 4, "concurrency": 1,
                "sampling": {"max_new_tokens": 3}})
    svc = RolloutService(settings)
    await svc.start()
    try:
        await StreamQueue(redis_client, keys.prompts_stream(run), "rollout", PromptTask).produce(
            [PromptTask(id="unscorable", prompt="q", n=2)])
        dead = keys.dead_letter_stream(keys.prompts_stream(run))
        deadline = time.monotonic() + 60
        while not await redis_client.xlen(dead) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        (entry,) = await redis_client.xrange(dead)
        error = entry[1][b"error"].decode()
        assert "did not score after 4 tries" in error and "worker.reward_max_attempts" in error, error
        assert len(calls) == 4
        worker = svc.worker
        assert worker is not None
        deadline = time.monotonic() + 10
        while (worker._groups or worker.lease.held) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert not worker._groups and not worker.lease.held  # the slot is free, the lease no longer renewed
    finally:
        await svc.stop()
