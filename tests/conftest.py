"""Fixtures shared by every test: a private Redis server, tiny models, process helpers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from deploy.local.redis_server import EmbeddedRedis

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory) -> EmbeddedRedis:
    """A private redis-server on a free port for the whole session (never the shared :6379)."""
    server = EmbeddedRedis(data_dir=tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture()
async def redis_client(redis_server):
    """An asyncio client on a clean database (FLUSHALL before each test)."""
    client = aioredis.from_url(redis_server.url, socket_timeout=10, socket_connect_timeout=5)
    await client.flushall()
    yield client
    await client.aclose()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A tiny Llama-shaped causal LM with a byte-level tokenizer, in Hugging Face format."""
    from deploy.local.tiny_model import build_tiny_causal_lm

    return build_tiny_causal_lm(tmp_path_factory.mktemp("tiny-lm"))


@pytest.fixture(scope="session")
def tiny_reward_model_dir(tmp_path_factory) -> Path:
    """A tiny sequence-classification reward model in Hugging Face format."""
    from deploy.local.tiny_model import build_tiny_reward_model

    return build_tiny_reward_model(tmp_path_factory.mktemp("tiny-rm"))
