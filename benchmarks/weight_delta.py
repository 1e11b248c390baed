"""Delta rounds: how much of a bf16 model changes per RL step, and what a delta round saves over a full one.

One run, gloo on CPU, 3 processes (this one trains and publishes; 2 receivers, each a WeightSidecar with the
hf sink around a bare copy of the model). The model: a Qwen2-shaped causal LM built locally from a config
(random init, >= 100M parameters), trained for real: fp32 master weights, torch's AdamW (as the learner's
trainer steps them), a next-token loss on random tokens, a few steps at lr 1e-6 and a few at 1e-5; each
version is published as bf16 (the wire dtype). Per step:

- the fraction of wire values (bf16 units) that changed since the version every receiver confirmed;
- the delta round's bytes / the version's full bytes, and which position codec won (the bytes every codec
  would have taken, summed over buckets, are printed too: the encoding was chosen from these);
- publish time of the delta round / a full round of the same weights (both to both receivers, timed back to
  back: the full round is forced by marking the receivers not level, as a refused patch would);
- what ``delta: auto`` (the default) chose for the same weights and its publish time: a third publisher, of its own
  run, with 2 receivers of its own, publishes each version after the pair above; it chooses from its own rounds only
  (its first round full, its second a delta probe, then the kind it measured faster; ``--probe-every``). Skipped
  with ``--no-auto``.

Receivers check every round against the learner's digests, so a wrong patch would show as a refused round.

    .venv/bin/python benchmarks/weight_delta.py [--steps 3] [--layers 8] [--hidden 768] [--bucket-mb 64]
    .venv/bin/python benchmarks/weight_delta.py --cpu-breakdown   # CPU time of each step, one process

Each round's line also gives the CPU seconds the three processes spent on it (psutil: on a loaded machine wall
times mostly say how loaded it was) and each receiver's phases.

Then a LoRA run (issue 38 part 2): the same model in bf16 with a rank-``--lora-rank`` adapter on every linear
layer of its blocks, trained by AdamW (lr 1e-4) for ``--steps`` steps; each version is published twice, by two
publishers of two runs: as an adapter round to 2 fresh receivers that load adapters (the hf sink merges each
version's adapter into its pristine base), and as a merged full round to 2 receivers with ``weights.adapters:
off``: the merged round first, the adapter round right after it, then the adapter receivers' background merges are
waited for (``merge``: the round confirms once the version is served hooked; each merge's time and when both were
swapped in are printed) so that no round shares the CPU with them. The last line compares the two rounds (median
over the steps): bytes on the wire and publish time, both end to end (the merged round includes merging the adapter
on the learner, as a LoRA learner's publish does).
``--lora-only`` skips the delta part, ``--no-lora`` the LoRA run; ``--adapter-apply unmerged`` has the adapter receivers serve unmerged.

Every process this script starts is killed when it ends.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("OMP_NUM_THREADS", "1")

from benchmarks.weight_sync import ModuleEngine, reap

RUN = "bench-delta"
AUTO_RUN = "bench-delta-auto"  # the delta: auto publisher's run (its own receivers)


def config(args):
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.ffn,
                       num_hidden_layers=args.layers, num_attention_heads=12, num_key_value_heads=4,
                       max_position_embeddings=512, tie_word_embeddings=False)


def build(args, dtype):
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config(args), dtype=dtype)


async def receiver(args) -> None:
    import redis.asyncio as aioredis
    import torch

    from services.rollout.weights.settings import SidecarSettings
    from services.rollout.weights.sidecar import WeightSidecar

    torch.set_num_threads(1)
    model = build(args, torch.bfloat16)
    r = aioredis.from_url(args.redis)
    sidecar = WeightSidecar(ModuleEngine(model), r, args.run, SidecarSettings(join_timeout_s=0, adapters=args.adapters,
                                                                         adapter_apply=args.adapter_apply),
                            name=f"recv{args.index}")
    await sidecar.start()
    parent = os.getppid()
    seen = merged = None
    while os.getppid() == parent and not await r.exists(f"{args.run}:quit"):
        last = sidecar.last_update
        if last is not None and last.round != seen:  # the round's phases on this receiver, for the driver
            seen = last.round
            await r.hset(f"{args.run}:phases:{args.index}", str(last.version), json.dumps(last.phases))
        # hf, merge: the background merge swapped in (a sink that merges inside the round, or unmerged: at once)
        done = getattr(sidecar.sink, "adapter_merged", None) if args.adapter_apply == "merge" else None
        if done is None and last is not None and (args.adapter_apply != "merge"
                                                  or not hasattr(sidecar.sink, "adapter_merged")):
            done = (last.version, last.phases.get("apply", 0.0))
        if done is not None and done != merged:
            merged = done
            await r.hset(f"{args.run}:merged:{args.index}", str(done[0]), str(done[1]))
        await asyncio.sleep(0.05)
    await sidecar.stop()
    await r.aclose()


def start_receivers(tmp: Path, redis_url: str, run: str = RUN, adapters: str = "auto") -> list[subprocess.Popen]:
    procs = []
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    for i in range(2):
        with open(tmp / f"{run}-recv{i}.log", "wb") as log:
            procs.append(subprocess.Popen([sys.executable, __file__, *sys.argv[1:], "--role", "receiver", "--redis",
                                           redis_url, "--index", str(i), "--run", run, "--adapters", adapters],
                                          env=env, stdout=log, stderr=log, start_new_session=True))
    return procs


def wire(model) -> dict:
    """The version as published: every tensor in bf16 (fp32 master weights stay with the trainer)."""
    import torch

    return {n: t.detach().to(torch.bfloat16) for n, t in model.state_dict().items()}


async def driver(args) -> None:
    import redis.asyncio as aioredis
    import torch

    from services.learner.weights import WeightPublisher
    from shared.redis_server import EmbeddedRedis
    from shared.weight_sync import WeightSyncSettings
    from shared.weight_sync.registry import ReplicaRegistry

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    tmp = Path(tempfile.mkdtemp(prefix="weight-delta-"))
    server = EmbeddedRedis(data_dir=tmp / "redis").start()
    procs: list[subprocess.Popen] = []
    try:
        r = aioredis.from_url(server.url)
        if args.lora_only:
            print(await lora_rounds(args, tmp, server.url, r, procs))
            return
        procs += start_receivers(tmp, server.url)
        if args.auto:
            procs += start_receivers(tmp, server.url, AUTO_RUN)
        model = build(args, torch.float32)
        n_params = sum(p.numel() for p in model.parameters())
        print(f"model: Qwen2-shaped, {n_params / 1e6:.1f}M parameters, published as bf16 "
              f"({n_params * 2 / 1e6:.0f} MB); 2 receivers over gloo; buckets {args.bucket_mb} MiB")
        deadline = time.monotonic() + 600
        for run in [RUN] + ([AUTO_RUN] if args.auto else []):
            while len(await ReplicaRegistry(r, run).alive()) < 2:
                if time.monotonic() > deadline:
                    raise TimeoutError("the receivers did not register")
                await asyncio.sleep(0.5)
        global IDLE_CPU
        c0 = cpu_seconds(procs)
        await asyncio.sleep(2.0)
        IDLE_CPU = (cpu_seconds(procs) - c0) / 2.0
        settings = WeightSyncSettings(bucket_bytes=args.bucket_mb << 20, delta="on", collective_timeout_s=600,
                                      load_timeout_s=600, init_timeout_s=120)
        gen = torch.Generator().manual_seed(1)
        auto_settings = settings.model_copy(update={"delta": "auto", "delta_probe_every": args.probe_every})
        async with WeightPublisher(r, RUN, settings) as pub, WeightPublisher(r, AUTO_RUN, auto_settings) as auto:
            await pub.publish(wire(model))  # v1: full, forms the group and the base
            assert len(pub.last_report.loaded) == 2, pub.last_report
            if args.auto:
                await auto.publish(wire(model))  # its v1: full (measured), forms its group
                assert len(auto.last_report.loaded) == 2, auto.last_report
            summary: dict[float, list[tuple[float, float]]] = {}
            chosen: dict[float, list[tuple[str, float, float]]] = {}  # auto: kind, time / full's, time / on's
            for lr in args.lrs:
                opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
                for step in range(args.steps):
                    ids = torch.randint(0, args.vocab, (args.batch, args.seq), generator=gen)
                    t0 = time.perf_counter()
                    loss = model(input_ids=ids, labels=ids).loss
                    loss_value = float(loss.detach())
                    loss.backward()
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                    train_s = time.perf_counter() - t0
                    weights = wire(model)
                    cpu0 = cpu_seconds(procs)
                    await pub.publish(weights)
                    d = pub.last_report
                    assert set(d.round_bytes) == {"delta"} and len(d.loaded) == 2, d
                    await asyncio.sleep(0.2)  # the receivers' pollers note the round's phases
                    cpu1 = cpu_seconds(procs)
                    # the same weights again, whole: the receivers marked not level (as after a refused patch)
                    pub.delta.suspect.update(d.loaded)
                    await pub.publish(weights)
                    f = pub.last_report
                    base_s = pub.delta.last_advance_s  # the full round's copy into the base: delta: off skips it
                    await asyncio.sleep(0.2)
                    cpu2 = cpu_seconds(procs)
                    cpu_d, cpu_f = cpu1 - cpu0 - 0.2 * IDLE_CPU, cpu2 - cpu1 - 0.2 * IDLE_CPU
                    recv = await replica_phases(r, d.version)
                    assert set(f.round_bytes) == {"full"} and len(f.loaded) == 2, f
                    bytes_ratio = d.round_bytes["delta"] / f.round_bytes["full"]
                    time_ratio = d.seconds / (f.seconds - base_s)  # against a full round of delta: off
                    summary.setdefault(lr, []).append((bytes_ratio, time_ratio))
                    codec = pub.delta.last_codecs  # of the delta round's plan
                    print(f"lr {lr:g} step {step + 1}: loss {loss_value:.3f} (train {train_s:.1f}s), changed "
                          f"{d.changed_fraction:.4f} of the wire values; delta {d.round_bytes['delta'] / 1e6:.2f} MB "
                          f"/ full {f.round_bytes['full'] / 1e6:.1f} MB = {bytes_ratio:.4f}; publish "
                          f"{d.seconds:.3f}s / {f.seconds - base_s:.3f}s = {time_ratio:.2f} (full round "
                          f"{f.seconds:.3f}s less its copy into the base {base_s:.3f}s, which delta: off does not "
                          f"make); positions by codec (MB): "
                          + " ".join(f"{c} {v / 1e6:.2f}" for c, v in codec["sizes"].items())
                          + f"; chosen {codec['chosen']}; delta phases (ms): "
                          + " ".join(f"{k} {v * 1e3:.0f}" for k, v in d.phases.items())
                          + "; full phases (ms): " + " ".join(f"{k} {v * 1e3:.0f}" for k, v in f.phases.items())
                          + f"; replica phases (ms): {recv}; CPU seconds (learner + receivers) delta "
                          f"{cpu_d:.2f} / full {cpu_f:.2f}")
                    if args.auto:
                        await auto.publish(weights)
                        a = auto.last_report
                        assert len(a.loaded) == 2 and len(a.round_bytes) == 1, a
                        kind = next(iter(a.round_bytes))
                        # against the on publisher's delta round, and its full round as delta: off would make it
                        chosen.setdefault(lr, []).append((kind, a.seconds / (f.seconds - base_s),
                                                          a.seconds / d.seconds))
                        est = {k: "-" if a.delta_choice[f"{k}_s"] is None else f"{a.delta_choice[f'{k}_s']:.3f}s"
                               for k in ("full", "delta")}
                        print(f"lr {lr:g} step {step + 1} auto: chose {kind} ({a.delta_choice['reason']}; estimates "
                              f"full {est['full']}, delta {est['delta']}), publish "
                              f"{a.seconds:.3f}s = {chosen[lr][-1][1]:.2f}x full, {chosen[lr][-1][2]:.2f}x on; "
                              f"copy into its base {auto.delta.last_advance_s * 1e3:.0f} ms")
        for lr, rows in summary.items():
            print(f"lr {lr:g}: median bytes {statistics.median(b for b, _ in rows):.4f}x full, median publish "
                  f"time {statistics.median(t for _, t in rows):.2f}x full over {len(rows)} steps")
        lo = min(summary)
        rows = summary[lo]
        print(f"delta at lr {lo:g}: bytes {statistics.median(b for b, _ in rows):.3f}x full, publish time "
              f"{statistics.median(t for _, t in rows):.2f}x full")
        for lr, picks in chosen.items():
            print(f"auto at lr {lr:g}: chose {' '.join(k for k, _, _ in picks)}; publish time median "
                  f"{statistics.median(x for _, x, _ in picks):.2f}x full, {statistics.median(x for _, _, x in picks):.2f}x on")
        await r.set(f"{RUN}:quit", "1")
        await r.set(f"{AUTO_RUN}:quit", "1")
        del model, opt
        if args.lora:
            print(await lora_rounds(args, tmp, server.url, r, procs))
    finally:
        await r.aclose()
        reap(procs)
        server.stop()


IDLE_CPU = 0.0  # CPU seconds a second the three processes use between rounds (pollers), measured at start


def cpu_seconds(procs: list[subprocess.Popen]) -> float:
    """User + system CPU seconds of this process (every thread) and the receivers so far: what a round costs the
    machine, whatever else runs on it (wall times on a loaded machine mostly say how loaded it was)."""
    import psutil

    total = 0.0
    for p in [psutil.Process()] + [psutil.Process(x.pid) for x in procs]:
        t = p.cpu_times()
        total += t.user + t.system
    return total


async def replica_phases(r, version: int, run: str = RUN) -> str:
    """Each receiver's phases of the round that brought ``version`` (written by its poller)."""
    import json

    out = []
    for i in range(2):
        raw = await r.hget(f"{run}:phases:{i}", str(version))
        if raw:
            ph = json.loads(raw)
            out.append(" ".join(f"{k} {v * 1e3:.0f}" for k, v in ph.items()))
    return " | ".join(out) or "n/a"


def cpu_breakdown(args) -> None:
    """``--cpu-breakdown``: where a delta round's CPU goes, step by step, against a full round's steps: one process,
    one thread, CPU time (``time.thread_time``, the median of 5), the same model and one real AdamW step at the
    first ``--lrs`` (no network, no other process: each side's own work)."""
    import torch

    from services.learner.weights import packing
    from services.rollout.weights.loader import read_bucket
    from shared.weight_sync import delta as D
    from shared.weight_sync.digest import digest
    from shared.weight_sync.wire import DTYPES, plan_buckets

    torch.set_num_threads(1)
    model = build(args, torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lrs[0], weight_decay=0.0)
    old = wire(model)
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), generator=torch.Generator().manual_seed(1))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    new_w = wire(model)
    buckets = plan_buckets(packing.specs(list(old.items())), args.bucket_mb << 20)
    base = [packing.pack_bucket(b, old, out=torch.empty(b.nbytes, dtype=torch.uint8)) for b in buckets]
    new = [torch.empty(b.nbytes, dtype=torch.uint8) for b in buckets]
    stage = [torch.zeros(b.nbytes, dtype=torch.uint8) for b in buckets]
    replica = build(args, torch.bfloat16)
    replica.load_state_dict(old)
    targets = dict(replica.state_dict(keep_vars=True))
    units = [D.unit_size([DTYPES[e.dtype] for e in b.tensors], b.nbytes) for b in buckets]
    rows: list[tuple[str, float]] = []

    def cpu(label, fn):
        times = []
        for _ in range(5):
            t0 = time.thread_time()
            out = fn()
            times.append(time.thread_time() - t0)
        rows.append((label, statistics.median(times)))
        return out

    cpu("learner: pack the version (full rounds too)", lambda: [packing.pack_bucket(b, new_w, out=o)
                                                                for b, o in zip(buckets, new)])
    cpu("learner: digest it, xxh3 (full rounds too)", lambda: [digest(o, "xxh3_64") for o in new])
    cpu("learner: compare with the base (positions, values)", lambda: [D.diff(n, b, u)
                                                                      for n, b, u in zip(new, base, units)])
    patches = cpu("learner: build the patches (compare + encode)", lambda: [D.make_patch(n, b, u) for n, b, u
                                                                          in zip(new, base, units)])
    scratch = [b.clone() for b in base]
    cpu("learner: advance the base (scatter)", lambda: [D.apply_diff(s, p) for s, p in zip(scratch, patches)])
    cpu("learner, full round with delta on: copy into the base", lambda: [s.copy_(n) for s, n in zip(scratch, new)])
    cpu("replica: its current bytes into staging", lambda: [read_bucket(targets, b, s) for b, s in zip(buckets, stage)])
    cpu("replica: decode the patches", lambda: [D.read_patch(p.data, s.numel()) for p, s in zip(patches, stage)])

    def rebuild():
        for b, s, p in zip(buckets, stage, patches):
            read_bucket(targets, b, s)
            D.apply_patch(s, p.data)

    cpu("replica: current bytes + decode + scatter", rebuild)
    assert all(torch.equal(s, n) for s, n in zip(stage, new)), "a rebuilt bucket differs"
    cpu("replica: digest, xxh3 (full rounds too)", lambda: [digest(s, "xxh3_64") for s in stage])
    changed = sum(p.changed for p in patches if p is not None) / sum(b.nbytes // u for b, u in zip(buckets, units))
    print(f"{sum(b.nbytes for b in buckets) / 1e6:.0f} MB in {len(buckets)} buckets, lr {args.lrs[0]:g}: "
          f"{changed:.4f} of the units changed; CPU ms (one thread, median of 5):")
    for label, sec in rows:
        print(f"  {label:58s} {sec * 1e3:7.1f}")


async def lora_rounds(args, tmp: Path, redis_url: str, r, procs: list) -> str:
    """The LoRA run (module docstring); returns the last line."""
    import torch

    from services.learner.settings import LoraSettings
    from services.learner.training.models import adapter_weights, apply_lora
    from services.learner.weights import WeightPublisher
    from shared.weight_sync import WeightSyncSettings
    from shared.weight_sync.registry import ReplicaRegistry

    runs = {"adapter": f"{RUN}-lora", "merged": f"{RUN}-merged"}
    procs += start_receivers(tmp, redis_url, runs["adapter"], "on")
    procs += start_receivers(tmp, redis_url, runs["merged"], "off")
    base = build(args, torch.bfloat16)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    actor = apply_lora(base, LoraSettings(rank=args.lora_rank, alpha=2 * args.lora_rank, target_modules=targets))
    deadline = time.monotonic() + 600
    for run in runs.values():
        while len(await ReplicaRegistry(r, run).alive()) < 2:
            if time.monotonic() > deadline:
                raise TimeoutError("the receivers did not register")
            await asyncio.sleep(0.5)
    settings = WeightSyncSettings(bucket_bytes=args.bucket_mb << 20, collective_timeout_s=600, load_timeout_s=600,
                                  init_timeout_s=120, delta="off")
    opt = torch.optim.AdamW([p for p in actor.parameters() if p.requires_grad], lr=1e-4, weight_decay=0.0)
    gen = torch.Generator().manual_seed(2)
    rows: list[tuple[float, float]] = []
    async with WeightPublisher(r, runs["adapter"], settings) as lora_pub, \
            WeightPublisher(r, runs["merged"], settings) as merged_pub:
        for step in range(args.steps + 1):  # the first version forms the groups: not counted
            ids = torch.randint(0, args.vocab, (args.batch, args.seq), generator=gen)
            loss = actor(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            # the merged round first, then the adapter round back to back (both warm: a round after an idle gap is
            # slower, 0.59-0.97 s against 0.31-0.44 s for the merged one here), then the adapter receivers' background
            # merges are waited for (merge mode), so that they share the CPU with neither round
            await merged_pub.publish(adapter_weights(actor))  # its replicas load no adapters: merged, whole
            m = merged_pub.last_report
            assert set(m.round_bytes) == {"full"} and len(m.loaded) == 2, m
            await lora_pub.publish(adapter_weights(actor))
            a = lora_pub.last_report
            assert set(a.round_bytes) == {"adapter"} and len(a.loaded) == 2, a
            t_conf = time.perf_counter()
            merges = await merged_on_receivers(r, runs["adapter"], a.version)
            settle_s = time.perf_counter() - t_conf  # (after confirming: served hooked meanwhile)
            await asyncio.sleep(0.1)  # the receivers' pollers note the round's phases
            recv = await replica_phases(r, a.version, runs["adapter"])
            if step == 0:
                continue
            rows.append((a.round_bytes["adapter"] / m.round_bytes["full"], a.seconds / m.seconds))
            print(f"lora step {step}: loss {float(loss.detach()):.3f}; adapter round {a.round_bytes['adapter'] / 1e6:.2f} "
                  f"MB in {a.seconds:.3f}s, merged round {m.round_bytes['full'] / 1e6:.1f} MB in {m.seconds:.2f}s; "
                  "adapter phases (ms): " + " ".join(f"{k} {v * 1e3:.0f}" for k, v in a.phases.items())
                  + f"; its receivers' phases (ms): {recv}"
                  + (f"; receivers' background merge (ms): {' / '.join(f'{x * 1e3:.0f}' for x in merges)}, all "
                     f"swapped in {settle_s * 1e3:.0f} ms after the round confirmed"
                     if args.adapter_apply == "merge" else ""))
    for run in runs.values():
        await r.set(f"{run}:quit", "1")
    return (f"lora rank {args.lora_rank}: bytes {statistics.median(b for b, _ in rows):.3f}x merged, publish time "
            f"{statistics.median(t for _, t in rows):.2f}x merged")


async def merged_on_receivers(r, run: str, version: int, timeout: float = 60.0) -> list[float]:
    """Wait until both adapter receivers swapped in their background merge of ``version`` (merge mode: the round
    confirms before it), so that it does not share the CPU with the next rounds; their merge seconds (a tree that
    merges inside the round, or unmerged: at once, its apply phase)."""
    deadline = time.monotonic() + timeout
    while True:
        got = [await r.hget(f"{run}:merged:{i}", str(version)) for i in range(2)]
        if all(g is not None for g in got):
            return [float(g) for g in got]
        if time.monotonic() > deadline:
            raise TimeoutError(f"the adapter receivers did not merge version {version} in {timeout:.0f}s")
        await asyncio.sleep(0.01)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--role", default="driver", choices=["driver", "receiver"])
    ap.add_argument("--redis")
    ap.add_argument("--index", type=int, default=0)
    ap.add_argument("--steps", type=int, default=3, help="training steps (and delta rounds) per learning rate")
    ap.add_argument("--lrs", type=float, nargs="+", default=[1e-6, 1e-5])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--ffn", type=int, default=2048)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--bucket-mb", type=int, default=64)
    ap.add_argument("--no-auto", dest="auto", action="store_false",
                    help="skip the delta: auto publisher (and its 2 receivers)")
    ap.add_argument("--probe-every", type=int, default=20, help="the auto publisher's delta_probe_every")
    ap.add_argument("--lora-rank", type=int, default=16)
    ap.add_argument("--lora-only", action="store_true", help="only the LoRA run")
    ap.add_argument("--no-lora", dest="lora", action="store_false", help="skip the LoRA run")
    ap.add_argument("--run", default=RUN)
    ap.add_argument("--adapters", default="auto")
    ap.add_argument("--adapter-apply", default="merge", choices=["merge", "unmerged"],
                    help="how the adapter receivers apply a version (weights.adapter_apply)")
    ap.add_argument("--cpu-breakdown", action="store_true",
                    help="only: CPU time of each step of a delta round and of a full round, in this process")
    args = ap.parse_args()
    if args.cpu_breakdown:
        cpu_breakdown(args)
        return
    asyncio.run(receiver(args) if args.role == "receiver" else driver(args))


if __name__ == "__main__":
    main()
