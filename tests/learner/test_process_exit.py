"""A learner that ends by itself (its run done, or ``POST /stop``) exits 0 once it has checkpointed, its log ending
with uvicorn's last line and the embedded Redis it started stopped cleanly (issue 28: it now leaves without the
interpreter's seconds-long teardown of torch and transformers, shared/service_kit/process_exit.py)."""

from __future__ import annotations

import asyncio
import re
import socket

import httpx
import pytest

from tests.learner.test_process import ENV, TOKEN, status, wait_exit, wait_for, write_config
from tests.procs import spawn, stop, wait_http_ok

pytestmark = pytest.mark.process


async def test_a_stopped_learner_exits_0_with_its_last_line_and_its_redis_shut_down(tmp_path, tiny_model_dir,
                                                                                   monkeypatch):
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.delenv("FLEETRL_LEARNER_REDIS_URL", raising=False)
    cfg, url = write_config(tmp_path, tiny_model_dir, None, n_prompts=8)
    log = tmp_path / "learner.log"
    proc = spawn(["-m", "services.learner", "--config", str(cfg)], log, ENV)
    try:
        await asyncio.to_thread(wait_http_ok, f"{url}/health", proc, 90, log)
        await wait_for(lambda: status(url)["phase"] == "running", 60, "running")
        port = int(re.search(r"embedded Redis at redis://:\*\*\*@127\.0\.0\.1:(\d+)/0", log.read_text()).group(1))
        async with httpx.AsyncClient(timeout=10) as http:
            r = await http.post(f"{url}/stop", headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 202, r.text
        assert await wait_exit(proc, 60) == 0, log.read_text()[-3000:]
    finally:
        stop(proc)
    text = log.read_text()
    assert text.rstrip().splitlines()[-1] == f"INFO:     Finished server process [{proc.pid}]", text[-2000:]
    assert (tmp_path / "run" / "checkpoints" / "step-00000000" / "COMPLETE").is_file()  # checkpointed on the way out
    assert "User requested shutdown" in (tmp_path / "run" / "redis" / "redis.log").read_text()  # SHUTDOWN, not a kill
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0, "the embedded Redis outlived the learner"
