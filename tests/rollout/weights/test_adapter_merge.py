"""The hf replica's adapter merge (``weights.adapter_apply: merge``, services/rollout/weights/adapters.py).

The merge writes into reused buffers, bit for bit the plain formula (``base + delta_weight(...)`` rounded once to
the weight's dtype) for every dtype mix; a version is served at once with its adapter hooked on and merged in the
background, then swapped in between two decode steps: logprobs equal the plain merge's (within the usual
tolerance) before and after the swap, also for a sequence generating across it; a second version arriving mid-merge
ends on the second version exactly; a full round mid-merge leaves exactly that round's weights."""

from __future__ import annotations

import asyncio
import copy
import threading

import pytest
import torch

import services.rollout.weights.adapters as adapters_mod
from services.rollout.engines.types import SamplingParams, SequenceRequest
from services.rollout.weights.adapters import MergeScratch, ModuleAdapters, delta_weight, merge_into
from services.rollout.weights.settings import SidecarSettings
from services.rollout.weights.sinks.hf import HFSink
from shared.weight_sync.wire import AdapterInfo, Manifest
from tests.rollout.engines.conftest import make_engine

PROMPT = [1, 40, 50, 60, 70]


def plain(base: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scaling: float, fan_in_fan_out: bool,
          dtype: torch.dtype) -> torch.Tensor:
    """The merge as the learner's merge and the replica computed it before: fresh tensors, one rounding."""
    return (base + delta_weight(a, b, scaling, fan_in_fan_out)).to(dtype)


@pytest.mark.parametrize(("weight", "adapter", "scaling", "fan_in_fan_out"), [
    (torch.bfloat16, torch.bfloat16, 2.0, False),
    (torch.bfloat16, torch.bfloat16, 1.37, False),   # not a power of two: scaling after the cast to bf16 matters
    (torch.bfloat16, torch.bfloat16, 0.7, True),
    (torch.float16, torch.float16, 1.37, False),
    (torch.float32, torch.float32, 1.37, False),
    (torch.bfloat16, torch.float32, 1.37, False),    # the add in fp32, then one cast to bf16
    (torch.float32, torch.bfloat16, 0.5, True),
])
def test_the_merge_into_reused_buffers_is_bit_equal_to_the_plain_formula(weight, adapter, scaling, fan_in_fan_out):
    g = torch.Generator().manual_seed(0)
    scratch = MergeScratch()
    for out_f, in_f, rank in [(96, 64, 8), (48, 160, 4), (96, 64, 8)]:  # scratch grown, then reused smaller
        shape = (in_f, out_f) if fan_in_fan_out else (out_f, in_f)
        base = torch.randn(shape, generator=g).to(weight)
        a = (torch.randn(rank, in_f, generator=g) * 0.3).to(adapter)
        b = (torch.randn(out_f, rank, generator=g) * 0.3).to(adapter)
        out = torch.full(shape, float("nan"), dtype=weight)
        merge_into(out, base, a, b, scaling, fan_in_fan_out, scratch)
        want = plain(base, a, b, scaling, fan_in_fan_out, weight)
        assert out.dtype == want.dtype and torch.equal(out, want)


def stack(dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.Linear(96, 64), torch.nn.Linear(64, 32)).to(dtype)


def version(model: torch.nn.Module, names: list[str], seed: int, rank: int = 4, scaling: float = 1.37):
    g = torch.Generator().manual_seed(seed)
    dtype = next(model.parameters()).dtype
    tensors, modules = {}, []
    for name in names:
        w = model.get_submodule(name).weight
        tensors[f"{name}.lora_A"] = (torch.randn(rank, w.shape[1], generator=g) * 0.3).to(dtype)
        tensors[f"{name}.lora_B"] = (torch.randn(w.shape[0], rank, generator=g) * 0.3).to(dtype)
        modules.append({"name": name, "scaling": scaling})
    return AdapterInfo(rank=rank, alpha=rank * scaling, modules=modules), tensors


def assert_is(model, base: dict, info: AdapterInfo, tensors: dict) -> None:
    """Every weight is base + this version's adapter (plain formula), bit for bit; the rest the base."""
    adapted = {m.name: m for m in info.modules}
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear):
            m = adapted.get(name)
            want = base[name] if m is None else plain(base[name], tensors[f"{name}.lora_A"],
                                                      tensors[f"{name}.lora_B"], m.scaling, False, base[name].dtype)
            assert torch.equal(mod.weight, want), name


def test_versions_apply_from_the_base_and_a_superseded_ticket_does_nothing():
    model = stack(torch.bfloat16)
    base = {n: m.weight.detach().clone() for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    ad = ModuleAdapters(model, "merge")
    for seed, names in [(1, ["0", "1"]), (2, ["1", "2"]), (3, ["0", "1", "2"])]:  # no drift; a dropped module is base
        info, tensors = version(model, names, seed)
        ad.apply(info, tensors)
        assert ad.merged and not ad.hooks
        assert_is(model, base, info, tensors)
    # staged twice before any merge: the first ticket's merge and swap do nothing, the second ends exactly on v5
    v4, v5 = version(model, ["0", "2"], 4), version(model, ["1"], 5)
    t4 = ad.stage(*v4)
    t5 = ad.stage(*v5)
    assert not ad.merge(t4) and not ad.swap(t4)
    assert ad.hooks.keys() == {"1"}  # v5 served hooked: every weight is its base
    for name in ("0", "1", "2"):
        assert torch.equal(model.get_submodule(name).weight, base[name])
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(9)).to(torch.bfloat16)
    hooked = model(x)
    assert ad.merge(t5) and ad.swap(t5) and ad.merged
    assert_is(model, base, *v5)
    torch.testing.assert_close(model(x), hooked, atol=0.1, rtol=0.02)  # the same function (bf16 rounding apart)
    ad.clear()
    assert not ad.hooks and not ad.swap(t5)


# ---- the hf sink: served at once, merged in the background, swapped in between decode steps --------------------
def hold_merge(monkeypatch) -> tuple[threading.Event, threading.Event]:
    """The next background merge stops after its first module until ``go`` is set (``started`` says it got there):
    a version can then arrive, or a full round, while a merge is under way."""
    started, go = threading.Event(), threading.Event()
    real = adapters_mod.merge_into

    def held(*args, **kwargs):
        real(*args, **kwargs)
        if not started.is_set():
            started.set()
            assert go.wait(30), "the test never let the merge go on"

    monkeypatch.setattr(adapters_mod, "merge_into", held)
    return started, go


def adapted(model) -> list[str]:
    return [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and ".layers." in n]


def reference(base_model, info: AdapterInfo | None, tensors: dict, state: dict | None = None):
    """A separate model: the base with each adapted weight set to the plain merge (or ``state`` whole)."""
    model = copy.deepcopy(base_model)
    with torch.no_grad():
        if state is not None:
            model.load_state_dict(state)
        for m in info.modules if info is not None else ():
            w = model.get_submodule(m.name).weight
            w.copy_(plain(w.clone(), tensors[f"{m.name}.lora_A"], tensors[f"{m.name}.lora_B"], m.scaling, False,
                          w.dtype))
    return model


def teacher_forced(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids])).logits.float(), dim=-1)[0]
    return logp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]


async def assert_serves(engine, ref) -> None:
    got = await engine.prompt_logprobs(PROMPT, 1)
    torch.testing.assert_close(torch.tensor(got), teacher_forced(ref, PROMPT), atol=2e-3, rtol=0)


def adapter_manifest(v: int, info: AdapterInfo) -> Manifest:
    return Manifest(version=v, bucket_bytes=1 << 20, total_bytes=0, buckets=(), adapter=info)


@pytest.fixture()
async def replica(tiny_model_dir):
    engine = make_engine(tiny_model_dir)
    await engine.start()
    sink = HFSink(engine, SidecarSettings())  # adapter_apply: merge, the default
    base_model = copy.deepcopy(engine.model)
    yield engine, sink, base_model
    await sink.close()
    await engine.stop()


async def test_a_version_is_served_at_once_and_its_merge_swapped_in_between_decode_steps(replica, monkeypatch):
    engine, sink, base_model = replica
    started, go = hold_merge(monkeypatch)
    info, tensors = version(engine.model, adapted(engine.model), 1)
    ref = reference(base_model, info, tensors)
    await sink.apply_adapter(adapter_manifest(1, info), tensors)
    assert engine.weight_version == 1  # confirmed before the merge: served hooked
    assert await asyncio.to_thread(started.wait, 30)
    await assert_serves(engine, ref)
    # a sequence that generates across the swap: every token from version 1, each logprob the plain merge's
    params = SamplingParams(max_new_tokens=160, ignore_eos=True, temperature=1.0, seed=3)
    gen = asyncio.ensure_future(engine.generate(SequenceRequest(rid="across", prompt_ids=tuple(PROMPT),
                                                                params=params)))
    while engine._decode.steps < 5:  # it is decoding (hooked)
        await asyncio.sleep(0.005)
    go.set()
    await sink.settled()
    assert sink.adapter_merged is not None and sink.adapter_merged[0] == 1
    assert not gen.done()  # swapped in while it decodes
    out = await gen
    assert out.weight_version == 1 and len(out.output_ids) == 160
    want = teacher_forced(ref, PROMPT + out.output_ids)[len(PROMPT) - 1:]
    torch.testing.assert_close(torch.tensor(out.logprobs), want, atol=2e-3, rtol=0)
    await assert_serves(engine, ref)
    base = dict(base_model.named_parameters())
    for m in info.modules:  # merged now: each weight is the plain merge, bit for bit
        w = engine.model.get_submodule(m.name).weight
        assert torch.equal(w, plain(base[f"{m.name}.weight"], tensors[f"{m.name}.lora_A"],
                                    tensors[f"{m.name}.lora_B"], m.scaling, False, w.dtype)), m.name


async def test_a_second_version_arriving_mid_merge_ends_on_the_second_exactly(replica, monkeypatch):
    engine, sink, base_model = replica
    names = adapted(engine.model)
    started, go = hold_merge(monkeypatch)
    v1, v2 = version(engine.model, names, 1), version(engine.model, names[1:], 2)
    await sink.apply_adapter(adapter_manifest(1, v1[0]), v1[1])
    assert await asyncio.to_thread(started.wait, 30)  # version 1's merge holds after its first module
    await sink.apply_adapter(adapter_manifest(2, v2[0]), v2[1])
    ref2 = reference(base_model, *v2)
    await assert_serves(engine, ref2)  # version 2 at once, hooked, nothing of version 1
    go.set()
    await sink.settled()
    assert engine.weight_version == 2
    await assert_serves(engine, ref2)
    for name, t in ref2.state_dict().items():  # base + version 2's adapter, bit for bit; the rest the base
        assert torch.equal(engine.model.state_dict()[name], t), name


@pytest.mark.parametrize("merged_round", [False, True])
async def test_a_full_round_mid_merge_leaves_exactly_its_weights(replica, monkeypatch, merged_round):
    from services.learner.weights import packing
    from shared.weight_sync.wire import plan_buckets

    engine, sink, base_model = replica
    names = adapted(engine.model)
    started, go = hold_merge(monkeypatch)
    v1, v3 = version(engine.model, names, 1), version(engine.model, names, 3)
    await sink.apply_adapter(adapter_manifest(1, v1[0]), v1[1])
    assert await asyncio.to_thread(started.wait, 30)
    # the full round: a LoRA learner's merged round (base + version 1's adapter, naming it), or other weights
    if merged_round:
        state = reference(base_model, *v1).state_dict()
    else:
        g = torch.Generator().manual_seed(7)
        moved: dict[int, torch.Tensor] = {}  # per storage: tied weights stay tied
        state = {k: moved.setdefault(t.data_ptr(), t + 0.01 * torch.randn(t.shape, generator=g))
                 for k, t in base_model.state_dict().items()}
    named = [(k, t.detach().contiguous()) for k, t in state.items()]
    buckets = plan_buckets(packing.specs(named), 1 << 20)
    manifest = Manifest(version=2, bucket_bytes=1 << 20, total_bytes=sum(b.nbytes for b in buckets),
                        buckets=tuple(buckets), merged_adapter=v1[0] if merged_round else None)
    buffers = [packing.pack_bucket(b, dict(named)) for b in buckets]
    await sink.load_buckets(manifest, buffers)
    go.set()
    await sink.settled()
    assert engine.weight_version == 2
    for name, t in state.items():  # that round's weights exactly: the merge under way left nothing
        assert torch.equal(engine.model.state_dict()[name], t), name
    await assert_serves(engine, reference(base_model, None, {}, state))
    if not merged_round:
        return
    # the replica kept its base through the merged round: the next adapter version is base + its adapter exactly
    await sink.apply_adapter(adapter_manifest(3, v3[0]), v3[1])
    await sink.settled()
    for name, t in reference(base_model, *v3).state_dict().items():
        assert torch.equal(engine.model.state_dict()[name], t), name
    # the merged round again, into the same buffers (the loader's copy plan is reused): its weights exactly, though
    # the adapter rounds re-pointed the adapted weights in between
    for b, buf in zip(buckets, buffers):
        packing.pack_bucket(b, dict(named), out=buf)
    await sink.load_buckets(manifest.model_copy(update={"version": 4}), buffers)
    for name, t in state.items():
        assert torch.equal(engine.model.state_dict()[name], t), name


async def test_between_steps_runs_at_the_next_step_boundary_while_a_batch_decodes(replica):
    """The swap's turn comes at the next step boundary, not once generation stops (a plain lock is not fair: the
    decode loop would take it back at once, step after step)."""
    engine, _, _ = replica
    params = SamplingParams(max_new_tokens=400, ignore_eos=True, temperature=1.0, seed=5)
    gen = asyncio.ensure_future(engine.generate_many([SequenceRequest(rid=f"long-{i}", prompt_ids=tuple(PROMPT),
                                                                      params=params) for i in range(4)]))
    while engine._decode.steps < 5:
        await asyncio.sleep(0.005)
    for _ in range(20):
        before = engine._decode.steps
        inside = await engine.between_steps(lambda: engine._decode.steps)
        assert inside - before <= 2  # the step under way, at most one more
    assert not gen.done()
    outs = await gen
    assert all(len(o.output_ids) == 400 for o in outs)
