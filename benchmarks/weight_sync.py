"""Weight-sync benchmark: bucketed publish vs one raw broadcast vs the per-parameter pattern.

One run, gloo on CPU, 3 processes (this one publishes; 2 receivers), a mixture-of-experts-shaped
checkpoint (>= 2,000 tensors, >= 200 MB). Measures, each until both receivers hold the bytes:

1. ``WeightPublisher.publish`` end to end (pack + checksum + announce + broadcast + receivers verify and
   load into their model + report), steady state (the group formed by a warm-up publish), and the first
   publish (group formation included);
2. the floor: one ``dist.broadcast`` of a flat buffer of the same bytes in an already formed group of the
   same 3 processes (buffers allocated and touched beforehand on every rank, as the kept staging buffers
   of (1) are). (1) and (2) alternate, so that both see the same load on a shared machine;
   (2b), with digests on: the same broadcast plus the integrity work a publish does (the root digests
   the buffer while it is on the wire, each receiver digests what it received), so that (1)/(2b) is
   the protocol's own overhead;
3. the per-parameter pattern of peers: per tensor one control request to each receiver (name, dtype,
   shape, over Redis, acknowledged) and one broadcast of that tensor.

It also prints where (1) spends its time (the median of ``PublishReport.phases`` and of the receivers'
``last_update.phases``), and what listing the tensors costs from a module vs a state dict built per publish.

    .venv/bin/python benchmarks/weight_sync.py [--bucket-mb N] [--no-checksum] [--scattered [--retain copy|none]]
                                               [--layers 11] [--experts 64] [--repeat 5]

Defaults are the product's: WeightSyncSettings' bucket size (256 MiB: this 212 MB checkpoint is one bucket),
digests on, weights laid out in place as the learner does. ``--bucket-mb 32`` shows a many-bucket pipeline.

Every process this script starts is killed when it ends, whether the run succeeded or not.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

os.environ.setdefault("OMP_NUM_THREADS", "1")

BENCH = "fleetrl:bench:weights"


def moe_shapes(layers: int, experts: int, hidden: int, ffn: int, vocab: int) -> list[tuple[str, tuple[int, ...]]]:
    shapes = [("model.embed_tokens.weight", (vocab, hidden))]
    for i in range(layers):
        p = f"model.layers.{i}"
        shapes += [(f"{p}.input_layernorm.weight", (hidden,)), (f"{p}.post_attention_layernorm.weight", (hidden,))]
        shapes += [(f"{p}.self_attn.{n}_proj.weight", (hidden, hidden)) for n in "qkvo"]
        shapes.append((f"{p}.mlp.gate.weight", (experts, hidden)))
        for e in range(experts):
            q = f"{p}.mlp.experts.{e}"
            shapes += [(f"{q}.gate_proj.weight", (ffn, hidden)), (f"{q}.up_proj.weight", (ffn, hidden)),
                       (f"{q}.down_proj.weight", (hidden, ffn))]
    shapes += [("model.norm.weight", (hidden,)), ("lm_head.weight", (vocab, hidden))]
    return shapes


def build_module(shapes, fill: str):
    import torch

    root = torch.nn.Module()
    gen = torch.Generator().manual_seed(0)
    for name, shape in shapes:
        *path, leaf = name.split(".")
        mod = root
        for part in path:
            if not hasattr(mod, part):
                mod.add_module(part, torch.nn.Module())
            mod = getattr(mod, part)
        t = torch.zeros(shape, dtype=torch.bfloat16) if fill == "zeros" else \
            torch.randn(shape, generator=gen).to(torch.bfloat16)
        mod.register_parameter(leaf, torch.nn.Parameter(t, requires_grad=False))
    return root


class ModuleEngine:
    """The parts of an engine the hf sink uses, around a bare module (no generation in this benchmark)."""

    kind, weight_sink = "hf", "services.rollout.weights.sinks.hf:HFSink"

    def __init__(self, model) -> None:
        self.model, self.weight_version, self.paused = model, 0, False

    def set_weight_version(self, v: int) -> None:
        self.weight_version = v

    async def pause(self, mode: str = "wait", timeout: float | None = None) -> None:
        self.paused = True

    async def resume(self) -> None:
        self.paused = False


# ---- receiver process --------------------------------------------------------------------------------
async def receiver(args) -> None:
    import redis.asyncio as aioredis
    import torch

    from services.rollout.weights.settings import SidecarSettings
    from services.rollout.weights.sidecar import WeightSidecar
    from shared.weight_sync.group import CollectiveGroup

    torch.set_num_threads(1)
    shapes = moe_shapes(args.layers, args.experts, args.hidden, args.ffn, args.vocab)
    model = build_module(shapes, "zeros")
    r = aioredis.from_url(args.redis)
    sidecar = WeightSidecar(ModuleEngine(model), r, "bench", SidecarSettings(join_timeout_s=0,
                                                                   keep_staging=not args.free_staging),
                            name=f"recv{args.index}")
    await sidecar.start()
    me = f"{BENCH}:ctl:{args.index}"
    params = dict(model.named_parameters())
    parent = os.getppid()

    async def pop() -> dict:
        while (item := await r.blpop([me], timeout=1)) is None:
            if os.getppid() != parent:  # the driver is gone: do not linger
                return {"op": "quit"}
        return json.loads(item[1])

    while True:
        cmd = await pop()
        if cmd["op"] == "quit":
            break
        if cmd["op"] == "phases":
            await r.rpush(f"{BENCH}:ack", json.dumps({"i": args.index, **(sidecar.last_update.phases if sidecar.last_update else {})}))
        elif cmd["op"] == "checksum":
            total = sum(float(p.float().sum()) for p in params.values())
            await r.rpush(f"{BENCH}:ack", json.dumps({"i": args.index, "sum": total,
                                                       "version": sidecar.weight_version}))
        elif cmd["op"] == "raw-open":
            g = await asyncio.to_thread(CollectiveGroup.open, backend="gloo", master_addr="127.0.0.1",
                                        master_port=cmd["port"], rank=args.index + 1, world_size=3,
                                        group_name=cmd["group"], init_timeout_s=60, collective_timeout_s=600,
                                        gloo_addr="127.0.0.1")  # where a publish's gloo sockets are
            buf = torch.zeros(cmd["nbytes"], dtype=torch.uint8)
        elif cmd["op"] == "raw":
            work = g.broadcast(buf)
            await r.rpush(f"{BENCH}:ready", json.dumps({"i": args.index, "ready": True}))
            await asyncio.to_thread(g.wait, work)
            if cmd.get("digest"):
                from shared.weight_sync.digest import digest

                await asyncio.to_thread(digest, buf, cmd["digest"])
            await r.rpush(f"{BENCH}:ack", json.dumps({"i": args.index, "done": time.time()}))
        elif cmd["op"] == "per-param":
            del buf
            # per-parameter pattern in the same group: one control request, then one broadcast, per tensor
            while True:
                msg = await pop()
                if msg["op"] == "end":
                    break
                from shared.weight_sync.tensors import torch_dtype

                t = torch.empty(msg["shape"], dtype=torch_dtype(msg["dtype"]))
                await asyncio.to_thread(broadcast_and_wait, g, t)
                with torch.no_grad():
                    params[msg["name"]].copy_(t)
                await r.rpush(f"{BENCH}:ack", "1")
            await r.rpush(f"{BENCH}:ack", json.dumps({"i": args.index, "done": time.time()}))
            g.close()
    await sidecar.stop()
    await r.aclose()


# ---- driver ------------------------------------------------------------------------------------------
def broadcast_and_wait(group, tensor) -> None:
    group.wait(group.broadcast(tensor))


def start_receivers(tmp: Path, redis_url: str) -> list[subprocess.Popen]:
    """The two receiver processes (each in a session of its own, so that :func:`reap` can kill all of it)."""
    procs = []
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    for i in range(2):
        with open(tmp / f"recv{i}.log", "wb") as log:  # the child holds its own copy of the descriptor
            procs.append(subprocess.Popen([sys.executable, __file__, "--role", "receiver", "--redis", redis_url,
                                           "--index", str(i), *sys.argv[1:]], env=env, stdout=log, stderr=log,
                                          start_new_session=True))
    return procs


async def acks(r, n: int, timeout: float = 600, queue: str = "ack") -> list[dict]:
    out = []
    for _ in range(n):
        item = await r.blpop([f"{BENCH}:{queue}"], timeout=timeout)
        if item is None:
            raise TimeoutError("a receiver did not answer")
        out.append(json.loads(item[1]))
    return out


async def driver(args) -> None:
    import redis.asyncio as aioredis
    import torch

    from services.learner.weights import WeightPublisher
    from services.learner.weights import packing as T
    from shared.redis_server import EmbeddedRedis
    from shared.weight_sync import WeightSyncSettings, net
    from shared.weight_sync.group import CollectiveGroup
    from shared.weight_sync.registry import ReplicaRegistry
    from shared.weight_sync.tensors import dtype_name

    torch.set_num_threads(1)
    tmp = Path(tempfile.mkdtemp(prefix="ws-bench-"))
    server = EmbeddedRedis(data_dir=tmp / "redis").start()
    r = aioredis.from_url(server.url)
    shapes = moe_shapes(args.layers, args.experts, args.hidden, args.ffn, args.vocab)
    model = build_module(shapes, "random")
    named = list(model.named_parameters())
    total = sum(p.numel() * p.element_size() for _, p in named)
    print(f"model: {len(named)} tensors, {total / 1e6:.1f} MB (bf16, MoE-shaped: {args.layers} layers x "
          f"{args.experts} experts)")
    procs = start_receivers(tmp, server.url)
    pub = None
    try:
        reg = ReplicaRegistry(r, "bench")
        deadline = time.monotonic() + 120
        while len(await reg.alive()) < 2:
            if time.monotonic() > deadline:
                raise TimeoutError(f"receivers did not register; see {tmp}")
            await asyncio.sleep(0.2)
        bucket_bytes = (args.bucket_mb << 20) if args.bucket_mb else WeightSyncSettings().bucket_bytes
        settings = WeightSyncSettings(bucket_bytes=bucket_bytes, checksum=not args.no_checksum,
                                      checksum_algo=args.checksum_algo, retain=args.retain)
        pub = WeightPublisher(r, "bench", settings)
        if not args.scattered:
            pub.flatten(model)
            named = list(model.named_parameters())

        t = time.perf_counter()
        await pub.publish(model)
        first = time.perf_counter() - t
        assert sorted(pub.last_report.loaded) == sorted(i.replica_id for i in await reg.alive()), pub.last_report

        # the raw group of (2) and (3), formed untimed
        # bound before the receivers hear of it, as a publish does (a member that finds nothing listening
        # gives up at once: the round's publisher is gone)
        listener = net.listen("127.0.0.1")
        port, group = listener.getsockname()[1], "bench-raw"
        for i in range(2):
            await r.rpush(f"{BENCH}:ctl:{i}", json.dumps({"op": "raw-open", "port": port, "group": group,
                                                          "nbytes": total}))
        g = await asyncio.to_thread(CollectiveGroup.open, backend="gloo", master_addr="127.0.0.1",
                                    master_port=port, listener=listener, rank=0, world_size=3, group_name=group,
                                    init_timeout_s=60, collective_timeout_s=600, gloo_addr="127.0.0.1")
        flat = torch.zeros(total, dtype=torch.uint8)
        flat.copy_(torch.cat([p.detach().reshape(-1).view(torch.uint8) for _, p in named]))

        algo = settings.digest_algo if settings.checksum else None

        async def raw_once(digest_algo: str | None = None) -> float:
            """One broadcast of the flat buffer; with ``digest_algo``, every rank also digests it as a publish
            does (the root while its broadcast is under way, the receivers once theirs completed)."""
            from shared.weight_sync.digest import digest

            for i in range(2):
                await r.rpush(f"{BENCH}:ctl:{i}", json.dumps({"op": "raw", "digest": digest_algo}))
            await acks(r, 2, queue="ready")
            t0 = time.time()
            work = g.broadcast(flat)
            if digest_algo:
                await asyncio.to_thread(digest, flat, digest_algo)
            await asyncio.to_thread(g.wait, work)
            return max(a["done"] for a in await acks(r, 2)) - t0

        steady, raws, phases, recv_phases = [], [], [], []
        raws_digest: list[float] = []
        for _ in range(args.repeat):  # (1) and (2) alternate
            raws.append(await raw_once())
            if algo:
                raws_digest.append(await raw_once(algo))
            with torch.no_grad():
                for _, p in named[:5]:
                    p.add_(1)
            t = time.perf_counter()
            v = await pub.publish(model)
            steady.append(time.perf_counter() - t)
            rep = pub.last_report
            assert len(rep.loaded) == 2 and not rep.dropped and not rep.refused, rep
            phases.append(rep.phases)
            for i in range(2):
                await r.rpush(f"{BENCH}:ctl:{i}", json.dumps({"op": "phases"}))
            recv_phases.extend(await acks(r, 2))
        # the receivers hold exactly the published weights
        expect = sum(float(p.float().sum()) for _, p in named)
        for i in range(2):
            await r.rpush(f"{BENCH}:ctl:{i}", json.dumps({"op": "checksum"}))
        for a in await acks(r, 2):
            assert a["version"] == v and abs(a["sum"] - expect) < 1e-3 * max(1.0, abs(expect)), (a, expect)

        raw_s = min(raws)

        for i in range(2):
            await r.rpush(f"{BENCH}:ctl:{i}", json.dumps({"op": "per-param"}))
        t0 = time.time()
        for name, p in named:
            msg = json.dumps({"op": "param", "name": name, "dtype": dtype_name(p.dtype), "shape": list(p.shape)})
            for i in range(2):
                await r.rpush(f"{BENCH}:ctl:{i}", msg)
            await asyncio.to_thread(broadcast_and_wait, g, p.data)
            for _ in range(2):
                await r.blpop([f"{BENCH}:ack"], timeout=600)
        for i in range(2):
            await r.rpush(f"{BENCH}:ctl:{i}", json.dumps({"op": "end"}))
        per_param_s = max(a["done"] for a in await acks(r, 2)) - t0
        g.close()

        bucketed_s = min(steady)
        mbs = lambda s: total / 1e6 / s
        nb = len(pub.outbox.manifest.buckets)
        print(f"bucket size: {bucket_bytes >> 20} MiB ({nb} bucket{'s' if nb != 1 else ''}), checksum: "
              f"{'off' if args.no_checksum else settings.digest_algo}, "
              f"receive buffers: {'per update' if args.free_staging else 'kept (default)'}, publisher sends "
              + (f"packed copies (--scattered, retain {args.retain}: "
                 f"{'reused pool buffers' if pub.outbox.pooling else 'a host copy kept per bucket'})"
                 if args.scattered else "from the weights in place (flatten, default)"))
        print(f"(1) bucketed publish, end to end:   {bucketed_s:7.3f} s  {mbs(bucketed_s):7.1f} MB/s  "
              f"(best of {len(steady)}: {', '.join(f'{s:.3f}' for s in steady)}; first publish incl. group "
              f"formation {first:.3f} s)")
        print(f"(2) one raw broadcast (floor):      {raw_s:7.3f} s  {mbs(raw_s):7.1f} MB/s  "
              f"(best of {len(raws)}: {', '.join(f'{s:.3f}' for s in raws)})")
        if algo:
            rd = min(raws_digest)
            print(f"(2b) raw broadcast + {algo} digests: {rd:7.3f} s  {mbs(rd):7.1f} MB/s  (best of {len(raws_digest)}; "
                  f"the floor with the integrity work a publish does: each rank digests the bytes once)")
        print(f"(3) per-parameter RPC + broadcast:  {per_param_s:7.3f} s  {mbs(per_param_s):7.1f} MB/s  "
              f"({len(named)} control round trips)")
        print(f"ratio (1)/(2) bandwidth: {raw_s / bucketed_s:.2f}  (target >= 0.9; best vs best)")
        pairs = [rs / bs for rs, bs in zip(raws, steady)]
        print(f"ratio per alternating pair: {', '.join(f'{x:.2f}' for x in pairs)}  (median "
              f"{sorted(pairs)[len(pairs) // 2]:.2f})")
        if algo:
            pairs_d = [rd / bs for rd, bs in zip(raws_digest, steady)]
            print(f"ratio (1)/(2b) per pair: {', '.join(f'{x:.2f}' for x in pairs_d)}  (median "
                  f"{sorted(pairs_d)[len(pairs_d) // 2]:.2f}; the protocol's own overhead, digests counted on both sides)")
        print(f"speed-up (1) vs (3):     {per_param_s / bucketed_s:.1f}x  (target >= 5x)")
        print(f"listing the tensors per publish: a module (cached walk, what the learner passes) "
              f"{list_ms(lambda: T.named_tensors(model, pub._walk)):.1f} ms, a state dict built each time "
              f"{list_ms(lambda: T.named_tensors(model.state_dict())):.1f} ms (medians of 15)")
        print(f"where (1) goes, median ms: publisher {median_phases(phases)}; receivers "
              f"{median_phases(recv_phases, skip={'i'})}")
    finally:
        try:
            for i in range(2):
                await r.rpush(f"{BENCH}:ctl:{i}", json.dumps({"op": "quit"}))
            if pub is not None:
                await pub.close()
        finally:
            reap(procs)
            await r.aclose()
            server.stop()


def list_ms(fn, n: int = 15) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return sorted(times)[n // 2] * 1e3


def median_phases(runs: list[dict], skip: frozenset | set = frozenset()) -> str:
    names = [k for k in dict.fromkeys(k for run in runs for k in run) if k not in skip]
    med = {k: sorted(run.get(k, 0.0) for run in runs)[len(runs) // 2] for k in names}
    return " ".join(f"{k} {v * 1e3:.1f}" for k, v in med.items())


def reap(procs: list[subprocess.Popen], grace_s: float = 10.0) -> None:
    """Let the receivers quit, then kill whatever is left (their whole process groups)."""
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(timeout=10)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--role", default="driver", choices=["driver", "receiver"])
    ap.add_argument("--redis")
    ap.add_argument("--index", type=int, default=0)
    ap.add_argument("--bucket-mb", type=int, default=0, help="bucket size (default: WeightSyncSettings' own)")
    ap.add_argument("--no-checksum", action="store_true")
    ap.add_argument("--checksum-algo", default="auto", choices=["auto", "xxh3_64", "wsum64", "crc32"])
    ap.add_argument("--free-staging", action="store_true", help="receivers free their receive buffers after each update")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--retain", default="auto", choices=["auto", "copy", "none"],
                    help="WeightSyncSettings.retain, for --scattered weights (auto: copy with gloo)")
    ap.add_argument("--scattered", action="store_true",
                    help="leave the weights where they are (publish packs each bucket: one copy) instead of laying "
                         "them out flat first as the learner does (WeightPublisher.flatten: publish sends from them)")
    ap.add_argument("--layers", type=int, default=11)
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--ffn", type=int, default=160)
    ap.add_argument("--vocab", type=int, default=32000)
    args = ap.parse_args()
    asyncio.run(receiver(args) if args.role == "receiver" else driver(args))


if __name__ == "__main__":
    main()
