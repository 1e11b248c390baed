"""A bug's 500 is JSON in the error envelope and the client's keep-alive connection survives it.

Issue 17 #5: Starlette answered the 500 and re-raised, uvicorn then dropped the connection, and the client's
next request on it failed (``httpx.ReadError``). The reward and learner apps run in-process under a real
uvicorn server (real sockets), with a test-only route that raises; the rollout's is tested over its own
process in tests/rollout/test_health_and_errors.py.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Request

from shared.ports import free_port
from shared.service_kit.internal_errors import InternalErrorGuard


@contextlib.contextmanager
def serving(app: FastAPI) -> Iterator[str]:
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="critical"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{server.config.port}"
    finally:
        server.should_exit = True
        thread.join(10)


INTERNAL_ERROR = {"error": {"message": "internal error: RuntimeError", "type": "internal_error", "code": 500},
                  "detail": "internal error: RuntimeError"}


def add_faulty_routes(app: FastAPI) -> None:
    async def raise_bug():
        raise RuntimeError("a bug in a route")

    async def connection(request: Request) -> dict:
        return {"client_port": request.client.port}

    app.add_api_route("/test/raise", raise_bug, methods=["GET"])
    app.add_api_route("/test/connection", connection, methods=["GET"])


def assert_500_keeps_the_connection(url: str, body: dict) -> None:
    with httpx.Client(base_url=url, timeout=10) as c:
        port = c.get("/test/connection").json()["client_port"]
        r = c.get("/test/raise")
        assert r.status_code == 500 and r.json() == body
        again = c.get("/test/connection")  # before the fix: httpx.ReadError, the server had closed it
        assert again.status_code == 200 and again.json()["client_port"] == port


def reward_app() -> FastAPI:
    from services.reward.app import create_app
    from services.reward.settings import RewardSettings

    settings = RewardSettings(scorers=[{"name": "len", "kind": "rule", "check": {"type": "length", "max_length": 5}}])
    return create_app(settings)


class _StubLearner:
    """What the learner app's lifespan and /health need; no training."""

    registry = None

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def health(self):
        return True, {"phase": "running"}


def learner_app() -> FastAPI:
    from services.learner.app import create_app
    from services.learner.settings import LearnerSettings

    settings = LearnerSettings.model_construct(control_token=None)
    return create_app(settings, service=_StubLearner())


@pytest.mark.parametrize("make_app", [reward_app, learner_app], ids=["reward", "learner"])
def test_a_500_keeps_the_connection(make_app):
    app = make_app()
    add_faulty_routes(app)
    with serving(app) as url:
        assert_500_keeps_the_connection(url, INTERNAL_ERROR)
        assert httpx.get(f"{url}/health", timeout=10).status_code == 200


def test_the_guard_renders_the_envelope_and_leaves_a_started_response_alone():
    app = FastAPI()
    app.add_middleware(InternalErrorGuard)
    add_faulty_routes(app)

    async def half_sent():
        from fastapi.responses import StreamingResponse

        async def body():
            yield b"partial"
            raise RuntimeError("failed mid-stream")

        return StreamingResponse(body())

    app.add_api_route("/test/half", half_sent, methods=["GET"])
    with serving(app) as url:
        assert_500_keeps_the_connection(url, INTERNAL_ERROR)
        # a cut body must not look complete: the connection closes
        with httpx.Client(base_url=url, timeout=10) as c, pytest.raises(httpx.RemoteProtocolError):
            c.get("/test/half")
