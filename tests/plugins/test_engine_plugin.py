"""A third-party engine: registered with its settings model, configured as ``engine: {kind: ...}`` in the
rollout settings, and serving /generate through the rollout service (its engine creation and routes)."""

from __future__ import annotations

import warnings
from collections.abc import AsyncIterator
from typing import Literal

import pytest
from fastapi.testclient import TestClient
from pydantic import Field

from services.rollout.engines.base import Engine
from services.rollout.engines.settings import ENGINES, EngineSettingsBase
from services.rollout.engines.types import Finish, SequenceDelta, SequenceRequest
from services.rollout.settings import RolloutSettings
from shared.settings import SettingsError, load_settings


class RepeatSettings(EngineSettingsBase):
    """An engine that answers every prompt with one token, repeated."""

    kind: Literal["repeat_test"] = "repeat_test"
    token: int = Field(default=7, ge=0, description="The token it repeats.")


class RepeatEngine(Engine):
    kind = "repeat_test"
    settings: RepeatSettings

    async def _start(self) -> None: ...

    async def _stop(self) -> None: ...

    async def _probe(self) -> bool:
        return True

    async def _stream(self, request: SequenceRequest) -> AsyncIterator[SequenceDelta]:
        n = request.params.max_new_tokens
        yield SequenceDelta([self.settings.token] * n, [-0.5] * n, "", Finish("length", length=n))

    async def abort(self, rid: str) -> None: ...

    async def _abort_all(self) -> None: ...


@pytest.fixture
def repeat_engine():
    ENGINES.register("repeat_test", RepeatSettings, RepeatEngine)
    yield
    ENGINES.unregister("repeat_test")


def test_an_unregistered_engine_kind_is_a_settings_error_naming_the_known_ones(tiny_model_dir):
    with pytest.raises(SettingsError, match=r"unknown engine kind 'repeat_test'; known: 'hf', 'sglang', 'vllm'"):
        load_settings(RolloutSettings, model=str(tiny_model_dir), engine={"kind": "repeat_test"})


def test_a_registered_engine_is_configured_and_generates_through_the_rollout_service(tiny_model_dir, repeat_engine):
    from services.rollout.app import create_app

    with pytest.raises(SettingsError, match=r"engine.token: Input should be greater than or equal to 0"):
        load_settings(RolloutSettings, model=str(tiny_model_dir), engine={"kind": "repeat_test", "token": -1})
    settings = load_settings(RolloutSettings, model=str(tiny_model_dir), engine={"kind": "repeat_test", "token": 42})
    assert isinstance(settings.engine, RepeatSettings)
    with TestClient(create_app(settings)) as client:
        out = client.post("/generate", json={"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 3},
                                             "return_logprob": True})
        assert out.status_code == 200, out.text
        body = out.json()
        assert body["output_ids"] == [42, 42, 42]
        assert [lp for lp, _, _ in body["meta_info"]["output_token_logprobs"]] == [-0.5] * 3
        assert client.get("/health").status_code == 200


def test_register_engine_is_a_deprecated_alias_of_engines_register_that_warns_once(monkeypatch):
    from services.rollout.engines import base

    monkeypatch.setattr(base, "_register_engine_warned", False)
    try:
        with pytest.warns(DeprecationWarning, match=r"use services.rollout.engines.settings.ENGINES.register"):
            base.register_engine("repeat_test", RepeatSettings, RepeatEngine)
        assert ENGINES.load("repeat_test") is RepeatEngine
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the second call is silent
            base.register_engine("repeat_test", RepeatSettings, RepeatEngine, replace=True)
    finally:
        ENGINES.unregister("repeat_test")
