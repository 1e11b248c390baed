"""LoRA adapter rounds in one process: a real publisher, real weight sidecars (hf sink, receiver, gloo group, Redis)
around real hf engines with the tiny model, and a learner-side peft model. Over several versions each replica's
logprobs equal the learner's (LoRA applied), for both ways the hf engine applies an adapter; an adapter round
carries a small fraction of the merged model's bytes; the merged replica keeps a pristine base (no drift); a
replica that cannot load adapters gets merged full rounds, with the same logprobs.
(Remote engines' adapter API: test_adapter_remote.py.)"""

from __future__ import annotations

import logging

import torch

from services.learner.settings import LoraSettings
from services.learner.training.models import adapter_weights, apply_lora, merged_state_dict
from services.learner.weights import WeightPublisher
from services.rollout.engines.types import SamplingParams, SequenceRequest
from services.rollout.weights.settings import SidecarSettings
from services.rollout.weights.sidecar import WeightSidecar
from shared.weight_sync import WeightSyncSettings
from tests.rollout.engines.conftest import make_engine
from tests.weight_sync.conftest import wait_alive

FAST = {"init_timeout_s": 20, "collective_timeout_s": 10, "regroup_timeout_s": 5, "load_timeout_s": 20,
        "catch_up_poll_s": 0.1, "bucket_bytes": 1 << 20}
PROMPT = (1, 40, 50, 60)


def learner(model_dir) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    return apply_lora(base, LoraSettings(rank=4, alpha=8, target_modules=["q_proj", "v_proj", "down_proj"]))


def train_step(actor: torch.nn.Module, step: int) -> None:
    """Move the adapter (peft starts lora_B at zero: the first version already differs from the base)."""
    g = torch.Generator().manual_seed(100 + step)
    with torch.no_grad():
        for name, p in actor.named_parameters():
            if "lora_" in name:
                p.add_(torch.randn(p.shape, generator=g) * 0.3)


async def start_replica(redis, run: str, model_dir, name: str, **weights) -> WeightSidecar:
    engine = make_engine(model_dir)
    await engine.start()
    sc = WeightSidecar(engine, redis, run, SidecarSettings(join_timeout_s=0, heartbeat_s=0.2, heartbeat_ttl_s=10.0,
                                                           **weights), name=name)
    await sc.start()
    return sc


async def stop(reps: list[WeightSidecar]) -> None:
    for sc in reps:
        await sc.stop()
        await sc.engine.stop()


async def assert_logprobs_match(actor: torch.nn.Module, sc: WeightSidecar, version: int) -> None:
    """The replica generates at its version; the learner's peft model (LoRA applied, unmerged) scores the same
    tokens teacher-forced: equal within the usual tolerance."""
    params = SamplingParams(max_new_tokens=12, ignore_eos=True, temperature=1.0, seed=version)
    out = await sc.engine.generate(SequenceRequest(rid=f"{sc.name}-{version}", prompt_ids=PROMPT, params=params))
    assert out.weight_version == version and len(out.output_ids) == 12
    ids = list(PROMPT) + out.output_ids
    with torch.no_grad():
        logp = torch.log_softmax(actor(torch.tensor([ids])).logits.float(), dim=-1)[0]
    positions = torch.arange(len(PROMPT) - 1, len(ids) - 1)
    want = logp[positions, torch.tensor(out.output_ids)]
    torch.testing.assert_close(torch.tensor(out.logprobs), want, atol=2e-3, rtol=0)


async def test_adapter_rounds_match_the_learner_and_carry_a_fraction_of_the_bytes(
        redis_client, tiny_model_dir, threads):
    run = "adapter-inproc"
    actor = learner(tiny_model_dir)
    actor.eval()
    merged = await start_replica(redis_client, run, tiny_model_dir, "merged", adapter_apply="merge")
    hooked = await start_replica(redis_client, run, tiny_model_dir, "unmerged", adapter_apply="unmerged")
    reps = [merged, hooked]
    base = {k: v.clone() for k, v in merged.engine.model.state_dict().items()}
    try:
        async with WeightPublisher(redis_client, run, WeightSyncSettings(**FAST)) as pub:
            await wait_alive(pub, 2)
            for step in range(4):
                train_step(actor, step)
                v = await pub.publish(adapter_weights(actor))
                r = pub.last_report
                assert set(r.round_bytes) == {"adapter"} and sorted(r.loaded) == sorted(s.replica_id for s in reps), r
                for sc in reps:
                    assert sc.weight_version == v
                    await assert_logprobs_match(actor, sc, v)
            adapter_bytes = r.round_bytes["adapter"]
            # each version is base + its own adapter: the merged replica equals the learner's merge bit for bit,
            # and every tensor the adapter leaves alone is the base it loaded
            want = merged_state_dict(actor)
            await merged.sink.settled()  # served at once, merged in the background: swapped in by now
            have = merged.engine.model.state_dict()
            for name, t in want.items():
                assert torch.equal(have[name], t), name
            # the unmerged replica's weights are the base, untouched
            for name, t in hooked.engine.model.state_dict().items():
                assert torch.equal(t, base[name]), name
            merged_bytes = sum(t.numel() * t.element_size() for t in want.values())
            assert adapter_bytes < 0.05 * merged_bytes, (adapter_bytes, merged_bytes)
    finally:
        await stop(reps)


async def test_a_replica_that_cannot_load_adapters_gets_merged_full_rounds(
        redis_client, tiny_model_dir, threads, caplog):
    run = "adapter-merged"
    actor = learner(tiny_model_dir)
    actor.eval()
    caplog.set_level(logging.INFO)
    plain = await start_replica(redis_client, run, tiny_model_dir, "plain", adapters="off")
    assert sum("does not load LoRA adapter rounds" in r.getMessage() for r in caplog.records) == 1
    reps = [plain]
    try:
        async with WeightPublisher(redis_client, run, WeightSyncSettings(**FAST)) as pub:
            await wait_alive(pub, 1)
            for step in range(2):
                train_step(actor, step)
                v = await pub.publish(adapter_weights(actor))
                r = pub.last_report
                # the merged model (a full round, or with delta auto a delta round against the last merged version)
                assert "adapter" not in r.round_bytes and r.loaded == [plain.replica_id] and not r.errors, r
                await assert_logprobs_match(actor, plain, v)
            said = [r for r in caplog.records if "cannot load LoRA adapters" in r.getMessage()]
            assert len(said) == 1, [r.getMessage() for r in said]  # once, not per publish
            # an adapter-capable replica joining it: the fleet stays on merged rounds while the plain one is live
            lora = await start_replica(redis_client, run, tiny_model_dir, "lora")
            reps.append(lora)
            await wait_alive(pub, 2)
            train_step(actor, 9)
            v = await pub.publish(adapter_weights(actor))
            assert set(pub.last_report.round_bytes) == {"full"} and len(pub.last_report.loaded) == 2
            await assert_logprobs_match(actor, lora, v)
    finally:
        await stop(reps)


async def test_adapter_rounds_return_when_the_replica_that_cannot_load_them_leaves(
        redis_client, tiny_model_dir, threads):
    # a mixed fleet: adapter rounds, then merged full rounds while a replica that cannot load adapters is live, then
    # adapter rounds again once it left (the merged full rounds used to cost the others their base: the next
    # adapter round was refused and the fleet stayed on merged rounds for good)
    run = "adapter-mixed"
    actor = learner(tiny_model_dir)
    actor.eval()
    merged = await start_replica(redis_client, run, tiny_model_dir, "merged", adapter_apply="merge")
    hooked = await start_replica(redis_client, run, tiny_model_dir, "unmerged", adapter_apply="unmerged")
    reps = [merged, hooked]
    base = {k: v.clone() for k, v in merged.engine.model.state_dict().items()}
    try:
        async with WeightPublisher(redis_client, run, WeightSyncSettings(**FAST)) as pub:
            await wait_alive(pub, 2)
            train_step(actor, 0)
            await pub.publish(adapter_weights(actor))
            assert set(pub.last_report.round_bytes) == {"adapter"}
            plain = await start_replica(redis_client, run, tiny_model_dir, "plain", adapters="off")
            await wait_alive(pub, 3)
            # a late joiner from merged rounds on: pristine when its first merged round comes
            late = await start_replica(redis_client, run, tiny_model_dir, "late", adapter_apply="merge")
            reps.append(late)
            await wait_alive(pub, 4)
            for step in (1, 2):
                train_step(actor, step)
                v = await pub.publish(adapter_weights(actor))
                r = pub.last_report  # merged: full, or with delta auto a delta round against the last merged version
                assert "adapter" not in r.round_bytes and len(r.loaded) == 4 and not r.errors, r
                for sc in reps:
                    await assert_logprobs_match(actor, sc, v)
            await stop([plain])
            await wait_alive(pub, 3)
            for step in (3, 4):
                train_step(actor, step)
                v = await pub.publish(adapter_weights(actor))
                r = pub.last_report
                assert set(r.round_bytes) == {"adapter"} and sorted(r.loaded) == sorted(s.replica_id for s in reps), r
                for sc in reps:
                    assert sc.weight_version == v
                    await assert_logprobs_match(actor, sc, v)
            want = merged_state_dict(actor)
            for sc in (merged, late):  # base + this version's adapter, bit for bit, as the learner merges it
                await sc.sink.settled()
                have = sc.engine.model.state_dict()
                for name, t in want.items():
                    assert torch.equal(have[name], t), (sc.name, name)
            for name, t in hooked.engine.model.state_dict().items():  # the base again (the hooks add the adapter)
                assert torch.equal(t, base[name]), name
    finally:
        await stop(reps)
