"""How the hf engine should apply a LoRA adapter round: merged into its base weights, or served unmerged (hooks that
add the adapter's output at every forward). Generation speed of both on the tiny model (``deploy/local/tiny_model``),
and the time to apply one version.

The engine (real ``HFEngine``, CPU, ``--threads`` torch threads) generates ``--batch`` sequences of ``--tokens``
tokens each (ignore_eos) at base + a rank-``--rank`` adapter on every linear layer of the blocks, three times per
mode, alternating; the median tokens/s per mode is printed, then the apply time (median of 5 applications).

    .venv/bin/python benchmarks/lora_apply.py [--batch 8] [--tokens 64] [--rank 16] [--threads 1]

``--merge-profile``: where a merge's time goes, one thread, on the adapted shapes of ``benchmarks/weight_delta.py``'s
model (8 blocks, hidden 768, ffn 2048, 4 KV heads: 56 bf16 weights, 50.3M values, rank 16): each operation of the
plain formula (fresh tensors) timed alone, the plain merge, and :func:`merge_into` (the same operations into reused
buffers; checked bit-equal), median of 3.

``--background``: a version served at once and merged beside generation (``adapter_apply: merge`` through the real
hf sink and engine) on a larger Llama-shaped model (``--hidden 768 --layers 8``, bf16, byte vocabulary: 75.5M
adapted values): the round's apply time (until the version is served), the background merge, and tokens/s of one
batch that generates while the merge runs and after the swap, against the same batch fully merged and fully hooked.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


async def main(args) -> None:
    import torch

    from deploy.local.tiny_model import build_tiny_causal_lm
    from services.rollout.engines.hf.engine import HFEngine
    from services.rollout.engines.settings import HFEngineSettings
    from services.rollout.engines.types import SamplingParams, SequenceRequest
    from services.rollout.weights.adapters import ModuleAdapters
    from shared.weight_sync.wire import AdapterInfo

    model_dir = build_tiny_causal_lm(Path(tempfile.mkdtemp(prefix="lora-apply-")))
    engines, adapters = {}, {}
    for mode in ("merge", "unmerged"):
        eng = HFEngine(HFEngineSettings(device="cpu", torch_threads=args.threads, max_batch_size=args.batch,
                                        max_wait_ms=1), str(model_dir))
        await eng.start()
        engines[mode] = eng
    model = engines["merge"].model
    g = torch.Generator().manual_seed(0)
    modules, tensors = [], {}
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Linear) and ".layers." in name:
            modules.append({"name": name, "scaling": 2.0})
            tensors[f"{name}.lora_A"] = torch.randn(args.rank, m.in_features, generator=g) * 0.05
            tensors[f"{name}.lora_B"] = torch.randn(m.out_features, args.rank, generator=g) * 0.05
    info = AdapterInfo(rank=args.rank, alpha=2.0 * args.rank, modules=modules)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"tiny model: {n_params / 1e6:.2f}M parameters, {len(modules)} adapted linear layers, rank {args.rank}; "
          f"{args.batch} sequences x {args.tokens} tokens, {args.threads} torch thread(s)")
    apply_s: dict[str, list[float]] = {}
    for mode, eng in engines.items():
        adapters[mode] = ModuleAdapters(eng.model, mode)
        for _ in range(5):
            t0 = time.perf_counter()
            adapters[mode].apply(info, tensors)
            apply_s.setdefault(mode, []).append(time.perf_counter() - t0)
    rates: dict[str, list[float]] = {}
    params = SamplingParams(max_new_tokens=args.tokens, ignore_eos=True, seed=1)
    for rep in range(3):
        for mode, eng in engines.items():
            reqs = [SequenceRequest(rid=f"{mode}-{rep}-{i}", prompt_ids=(1, 40 + i, 50, 60), params=params)
                    for i in range(args.batch)]
            t0 = time.perf_counter()
            outs = await eng.generate_many(reqs)
            dt = time.perf_counter() - t0
            rates.setdefault(mode, []).append(sum(len(o.output_ids) for o in outs) / dt)
    for mode in engines:
        print(f"{mode}: {statistics.median(rates[mode]):.0f} tokens/s (runs: "
              + ", ".join(f"{r:.0f}" for r in rates[mode])
              + f"); apply one version {statistics.median(apply_s[mode]) * 1e3:.2f} ms")
    m, u = statistics.median(rates["merge"]), statistics.median(rates["unmerged"])
    print(f"generation: merged {m / u:.2f}x unmerged")
    for eng in engines.values():
        await eng.stop()


def merge_profile(args) -> None:
    import torch

    from services.rollout.weights.adapters import MergeScratch, delta_weight, merge_into

    torch.set_num_threads(args.threads)
    hidden, ffn, kv = 768, 2048, 256
    shapes = [(hidden, hidden), (kv, hidden), (kv, hidden), (hidden, hidden), (ffn, hidden), (ffn, hidden),
              (hidden, ffn)] * 8
    g = torch.Generator().manual_seed(0)
    base = [torch.randn(o, i, generator=g).to(torch.bfloat16) for o, i in shapes]
    out = [b.clone() for b in base]
    a_s = [(torch.randn(args.rank, i, generator=g) * 0.05).to(torch.bfloat16) for _, i in shapes]
    b_s = [(torch.randn(o, args.rank, generator=g) * 0.05).to(torch.bfloat16) for o, _ in shapes]
    s = 2.0
    rows = []

    def timed(label, fn, reps: int = 5):
        wall, cpu = [], []
        for _ in range(reps):
            t0, c0 = time.perf_counter(), time.thread_time()
            fn()
            wall.append(time.perf_counter() - t0)
            cpu.append(time.thread_time() - c0)
        rows.append((label, statistics.median(wall), statistics.median(cpu)))

    wide = [b.float() @ a.float() for a, b in zip(a_s, b_s)]
    narrow = [w.to(torch.bfloat16) for w in wide]
    timed("matmul in fp32, fresh output", lambda: [b.float() @ a.float() for a, b in zip(a_s, b_s)])
    timed("  the same into a reused buffer (out=)", lambda: [torch.mm(b.float(), a.float(), out=w)
                                                           for a, b, w in zip(a_s, b_s, wide)])
    timed("cast to bf16, fresh (.to)", lambda: [w.to(torch.bfloat16) for w in wide])
    timed("  the same into a reused buffer (copy_)", lambda: [n.copy_(w) for n, w in zip(narrow, wide)])
    timed("scaling, fresh (* s)", lambda: [n * s for n in narrow])
    timed("  the same in place (mul_)", lambda: [n.mul_(1.0) for n in narrow])
    timed("add, fresh (base + delta)", lambda: [b + n for b, n in zip(base, narrow)])
    timed("  the same into the weight (add out=)", lambda: [torch.add(b, n, out=o) for b, n, o in zip(base, narrow, out)])
    timed("copy_ into the weight", lambda: [o.copy_(b) for o, b in zip(out, base)])

    def plain():
        for o, b, a, bb in zip(out, base, a_s, b_s):
            o.copy_((b + delta_weight(a, bb, s, False)).to(o.dtype))

    scratch = MergeScratch()

    def fast():
        for o, b, a, bb in zip(out, base, a_s, b_s):
            merge_into(o, b, a, bb, s, False, scratch)

    plain()
    want = [o.clone() for o in out]
    fast()
    assert all(torch.equal(o, w) for o, w in zip(out, want)), "merge_into differs from the plain merge"
    for _ in range(args.merge_reps):  # alternated: a busy machine slows both alike
        timed("plain merge (before), warm heap", plain, 1)
        timed("merge_into (reused buffers)", fast, 1)
    trim = _malloc_trim()
    if trim is not None:  # the heap given back to the system first, as between two rounds of a replica
        for _ in range(args.merge_reps):
            trim(0)
            timed("plain merge (before), after malloc_trim", plain, 1)
            trim(0)
            timed("merge_into, after malloc_trim", fast, 1)
    by_label: dict[str, list[tuple[float, float]]] = {}
    for label, wall_s, cpu_s in rows:
        by_label.setdefault(label, []).append((wall_s, cpu_s))
    print(f"{len(shapes)} weights, {sum(o * i for o, i in shapes) / 1e6:.1f}M values, rank {args.rank}, "
          f"{args.threads} torch thread(s); ms, wall / CPU of this thread (median of 5; the two merges alternated "
          f"{args.merge_reps} times; merge_into bit-equal to the plain merge):")
    for label, got in by_label.items():
        print(f"  {label:45s} {statistics.median(w for w, _ in got) * 1e3:7.1f} / "
              f"{statistics.median(c for _, c in got) * 1e3:7.1f}")


def _malloc_trim():
    """glibc's ``malloc_trim`` (None elsewhere)."""
    import ctypes
    import ctypes.util

    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


async def background(args) -> None:
    import torch

    from deploy.local.tiny_model import build_tiny_causal_lm
    from services.rollout.engines.hf.engine import HFEngine
    from services.rollout.engines.settings import HFEngineSettings
    from services.rollout.engines.types import SamplingParams, SequenceRequest
    from services.rollout.weights.adapters import ModuleAdapters
    from services.rollout.weights.settings import SidecarSettings
    from services.rollout.weights.sinks.hf import HFSink
    from shared.weight_sync.wire import AdapterInfo, Manifest

    model_dir = build_tiny_causal_lm(Path(tempfile.mkdtemp(prefix="lora-apply-bg-")), hidden_size=args.hidden,
                                     layers=args.layers, heads=12)
    settings = HFEngineSettings(device="cpu", dtype="bfloat16", torch_threads=args.threads,
                                max_batch_size=args.batch, max_wait_ms=1)
    eng = HFEngine(settings, str(model_dir))
    await eng.start()
    sink = HFSink(eng, SidecarSettings())
    names = [n for n, m in eng.model.named_modules() if isinstance(m, torch.nn.Linear) and ".layers." in n]

    def version(seed: int):
        g = torch.Generator().manual_seed(seed)
        tensors = {}
        for n in names:
            w = eng.model.get_submodule(n).weight
            tensors[f"{n}.lora_A"] = (torch.randn(args.rank, w.shape[1], generator=g) * 0.05).to(w.dtype)
            tensors[f"{n}.lora_B"] = (torch.randn(w.shape[0], args.rank, generator=g) * 0.05).to(w.dtype)
        info = AdapterInfo(rank=args.rank, alpha=2.0 * args.rank,
                           modules=[{"name": n, "scaling": 2.0} for n in names])
        return Manifest(version=seed, bucket_bytes=1, total_bytes=0, buckets=(), adapter=info), tensors

    adapted = sum(eng.model.get_submodule(n).weight.numel() for n in names)
    print(f"Llama-shaped, hidden {args.hidden}, {args.layers} layers, bf16: {adapted / 1e6:.1f}M adapted values in "
          f"{len(names)} weights, rank {args.rank}; {args.batch} sequences x {args.tokens} tokens, {args.threads} "
          "torch thread(s)")
    params = SamplingParams(max_new_tokens=args.tokens, ignore_eos=True, seed=1)
    rid = iter(range(1_000_000))

    async def batch_rate(eng=eng) -> float:
        reqs = [SequenceRequest(rid=f"r{next(rid)}", prompt_ids=(1, 40 + i, 50, 60), params=params)
                for i in range(args.batch)]
        t0 = time.perf_counter()
        outs = await eng.generate_many(reqs)
        return sum(len(o.output_ids) for o in outs) / (time.perf_counter() - t0)

    m1, t1 = version(1)
    await sink.apply_adapter(m1, t1)  # the first round: base copies
    await sink.settled()
    merged_rate = [await batch_rate() for _ in range(2)]
    applied, during, after, merge_s, confirm_s = [], [], [], [], []

    async def sample_steps(steps: list[tuple[float, int]], done: asyncio.Event) -> None:
        while not done.is_set():
            steps.append((time.perf_counter(), eng._decode.steps))
            await asyncio.sleep(0.002)

    for v in range(2, 2 + args.versions):
        m, t = version(v)
        steps: list[tuple[float, int]] = []
        done = asyncio.Event()
        t0 = time.perf_counter()
        await sink.apply_adapter(m, t)
        confirm_s.append(time.perf_counter() - t0)
        sampler = asyncio.ensure_future(sample_steps(steps, done))
        gen = asyncio.ensure_future(batch_rate())
        await sink.settled()
        swapped_at = time.perf_counter()
        await gen
        done.set()
        await sampler
        assert sink.adapter_merged is not None and sink.adapter_merged[0] == v
        merge_s.append(sink.adapter_merged[1])
        applied.append(swapped_at - t0)
        before = [x for x in steps if x[0] <= swapped_at]
        later = [x for x in steps if x[0] >= swapped_at]
        for part, out in ((before, during), (later, after)):
            if len(part) > 1 and part[-1][0] > part[0][0]:
                out.append((part[-1][1] - part[0][1]) * args.batch / (part[-1][0] - part[0][0]))
    await eng.stop()
    hooked_eng = HFEngine(settings, str(model_dir))  # the last version hooked on the base (unmerged), alone
    await hooked_eng.start()
    assert m.adapter is not None
    ModuleAdapters(hooked_eng.model, "unmerged").apply(m.adapter, t)
    hooked_rate = [await batch_rate(hooked_eng) for _ in range(2)]
    await hooked_eng.stop()
    med = statistics.median
    print(f"served (apply_adapter returned, the round confirms): {', '.join(f'{x * 1e3:.1f}' for x in confirm_s)} ms")
    print(f"background merge: {', '.join(f'{x * 1e3:.0f}' for x in merge_s)} ms; swapped in "
          f"{', '.join(f'{x * 1e3:.0f}' for x in applied)} ms after the round began")
    print(f"tokens/s: merged {med(merged_rate):.0f}, hooked {med(hooked_rate):.0f}; while merging (hooked, the merge "
          f"beside) {', '.join(f'{x:.0f}' for x in during) or 'n/a'}; after the swap {', '.join(f'{x:.0f}' for x in after)}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--merge-profile", action="store_true", help="only: where a merge's time goes (one process)")
    ap.add_argument("--background", action="store_true", help="only: a version served at once, merged beside "
                                                               "generation, on a larger model")
    ap.add_argument("--merge-reps", type=int, default=9, help="--merge-profile: alternations of the two merges")
    ap.add_argument("--hidden", type=int, default=768, help="--background: the model's width")
    ap.add_argument("--layers", type=int, default=8, help="--background: its blocks")
    ap.add_argument("--versions", type=int, default=3, help="--background: versions applied while generating")
    cli = ap.parse_args()
    if cli.merge_profile:
        merge_profile(cli)
    elif cli.background:
        asyncio.run(background(cli))
    else:
        asyncio.run(main(cli))
