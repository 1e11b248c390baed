"""How the hf engine should apply a LoRA adapter round: merged into its base weights, or served unmerged (hooks that
add the adapter's output at every forward). Generation speed of both on the tiny model (``deploy/local/tiny_model``),
and the time to apply one version.

The engine (real ``HFEngine``, CPU, ``--threads`` torch threads) generates ``--batch`` sequences of ``--tokens``
tokens each (ignore_eos) at base + a rank-``--rank`` adapter on every linear layer of the blocks, three times per
mode, alternating; the median tokens/s per mode is printed, then the apply time (median of 5 applications).

    .venv/bin/python benchmarks/lora_apply.py [--batch 8] [--tokens 64] [--rank 16] [--threads 1]
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


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    asyncio.run(main(ap.parse_args()))
