"""deploy/local/sleep_engine.py: the benchmark's engine answers ``count N`` with N digits then EOS, one token per
``FLEETRL_SLEEP_TOKEN_S``; an abort ends a sequence at once; the rollout extension registers the kind and swaps
the engine the settings built for it."""

import asyncio
import time

from deploy.local import sleep_engine
from services.rollout.engines import engine_class
from services.rollout.engines.settings import HFEngineSettings
from services.rollout.engines.types import SamplingParams, SequenceRequest


def _req(engine, text: str, rid: str, **params) -> SequenceRequest:
    ids = tuple(engine.tokenizer.encode(text, add_special_tokens=False))
    return SequenceRequest(rid=rid, prompt_ids=ids, params=SamplingParams(**params))


def test_answers_count_n_with_n_digits_at_the_set_pace_and_aborts_at_once(tiny_model_dir, monkeypatch):
    monkeypatch.setenv(sleep_engine.TOKEN_S_ENV, "0.02")

    async def go():
        engine = sleep_engine.SleepEngine(HFEngineSettings(device="cpu"), str(tiny_model_dir))
        await engine.start()
        try:
            t0 = time.perf_counter()
            out = await engine.generate(_req(engine, "count 5", "a", max_new_tokens=20))
            took = time.perf_counter() - t0
            assert engine.tokenizer.decode(out.output_ids, skip_special_tokens=True) == "01234"
            assert out.output_ids[-1] == engine.tokenizer.eos_token_id and out.finish.type == "stop"
            assert 6 * 0.02 <= took < 2.0  # 5 digits + EOS, one sleep each
            out = await engine.generate(_req(engine, "count 50", "b", max_new_tokens=3))
            assert len(out.output_ids) == 3 and out.finish.type == "length"
            task = asyncio.ensure_future(engine.generate(_req(engine, "count 500", "c", max_new_tokens=600)))
            await asyncio.sleep(0.1)
            await engine.abort("c")
            out = await asyncio.wait_for(task, 1.0)
            assert out.finish.type == "abort" and len(out.output_ids) < 20
            assert await engine.health_generate()  # the readiness probe: one token, finish length
        finally:
            await engine.stop()

    asyncio.run(go())


def test_the_extension_registers_the_kind_and_swaps_the_engine(tiny_model_dir):
    class Settings:
        engine = HFEngineSettings(device="cpu")
        model = str(tiny_model_dir)

    class Service:
        settings = Settings()
        engine = None

    service = Service()
    router = sleep_engine.install(service)
    assert engine_class("sleep") is sleep_engine.SleepEngine
    assert isinstance(service.engine, sleep_engine.SleepEngine)
    assert [r.path for r in router.routes] == ["/sleep_engine"]
