"""verifiers' training client (``verifiers.v1.clients.TrainClient``, unmodified) drives the rollout service's
``/inference/v1/generate`` the way it drives vLLM: it renders the chat to ids itself, reads ``max_model_len``
from ``GET /v1/models``, sends ``X-Session-ID``; the session records exactly what it got back.

verifiers (0.4, which pins ``openai<3``) is in the dev extra, so ``make test`` runs this; a whole verifiers
environment with a tool through a session is test_verifiers_tool_env.py.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.rollout.routes.conftest import AUTH
from tests.rollout.routes.test_sessions_openai import create, finish, pushed

vf_clients = pytest.importorskip("verifiers.v1.clients", reason="verifiers is in the dev extra (make install)")
renderers_configs = pytest.importorskip("renderers.configs", reason="renderers comes with verifiers (dev extra)")


async def _turn(url: str, model_dir: str, sid: str, messages: list[dict], logprobs: int | None):
    from verifiers.v1.dialects.chat import ChatDialect
    from verifiers.v1.types import SamplingConfig

    cfg = vf_clients.TrainClientConfig(base_url=f"{url}/v1", renderer=renderers_configs.DefaultRendererConfig(),
                                       renderer_model_name=model_dir, headers=AUTH)
    client = vf_clients.TrainClient(cfg)
    try:
        sampling = SamplingConfig(max_tokens=6, temperature=1.0, **({"logprobs": logprobs} if logprobs else {}))
        return await client.get_response(ChatDialect(), {"model": "tiny", "messages": messages}, sampling,
                                         session_id=sid)
    finally:
        await client.close()


@pytest.mark.parametrize("logprobs", [None, 3])
def test_verifiers_train_client_generates_and_the_session_records_it(session_rollout, redis_server, logprobs):
    url = session_rollout.url
    sid = create(url, session_id=f"vf-trace-{logprobs}", prompt_id=f"vf-task-{logprobs}")
    messages = [{"role": "system", "content": "answer"}, {"role": "user", "content": "2+2?"}]
    resp = asyncio.run(_turn(url, str(session_rollout.model_dir), sid, messages, logprobs))
    tokens = resp.tokens
    assert len(tokens.completion_ids) == len(tokens.completion_logprobs) >= 1
    assert resp.finish_reason in ("stop", "length")
    state = httpx.get(f"{url}/sessions/{sid}", headers=AUTH, timeout=10).json()
    assert state["calls"] == 1
    finish(url, sid, reward=1.0)
    exp = pushed(redis_server.url)[f"vf-task-{logprobs}#0"]
    assert list(exp.prompt_token_ids) == list(tokens.prompt_ids)
    assert list(exp.response_token_ids) == list(tokens.completion_ids)
    assert list(exp.response_logprobs) == pytest.approx(list(tokens.completion_logprobs), abs=1e-5)
