"""The hf engine in-process with the tiny model, for engine tests."""

from __future__ import annotations

import pytest

from services.rollout.engines.hf.engine import HFEngine
from services.rollout.engines.settings import HFEngineSettings


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    """The tiny model itself (no engine), for the batch and cache unit tests."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def make_engine(model_dir, **settings) -> HFEngine:
    base = {"device": "cpu", "torch_threads": 1, "max_batch_size": 16, "max_wait_ms": 1, "health_timeout_s": 5.0}
    return HFEngine(HFEngineSettings(**{**base, **settings}), str(model_dir))


@pytest.fixture()
async def engine(tiny_model_dir):
    eng = make_engine(tiny_model_dir)
    await eng.start()
    yield eng
    await eng.stop()
