"""Learner memory per rank and tokens/s: 1 rank ``torch``, 2 ranks ``torch`` (replicated), 2 ranks ``fsdp``.

One run, one model, the same GRPO step batches for each setup (real :class:`RLTrainer` ranks, gloo on CPU, each
rank its own process). Per rank it reports:

- **state**: bytes of parameters + gradients + AdamW state this rank holds, counted as the sum of the distinct
  tensor storages the model and optimizer hold, taken at the optimizer's step (where all three exist; FSDP's
  are the local shards of each DTensor);
- **peak**: the most tensor memory the rank held during one profiled learner step: what the model, its buffers
  and the optimizer state held when the step began (storage sums) plus the highest running total of the CPU
  allocator's allocations minus frees inside the step, from torch's profiler with ``profile_memory`` (every
  allocation of the step: activations, FSDP's gathered layers and reduce-scatter buffers, gradients, Adam's
  temporaries). ``tracemalloc`` would see none of these (torch allocates outside Python's allocator) and RSS
  mixes in the interpreter, libraries and freed-but-kept pages, so neither is used;
- **tokens/s**: real tokens of the whole step batch (all ranks) per second of rank 0's ``train_step``,
  median over the timed steps (unprofiled).

Not counted: start-up. Every rank loads the whole checkpoint before FSDP shards it (one full fp32 copy per rank,
freed at once); building on the meta device and loading shards would avoid that.

    .venv/bin/python benchmarks/learner_memory.py [--hidden 256] [--layers 4] [--steps 3] [--threads 1]
        [--groups 4] [--micro 4] [--response 112] [--gradient-checkpointing] [--setups torch:1,fsdp:2] [--breakdown]

Last line: ``fsdp 2 ranks / torch 1 rank, peak memory per rank: 0.NNx`` (target <= 0.6; parameters +
gradients + Adam alone would give 0.5).
"""

from __future__ import annotations

import argparse
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

SETUPS = [("torch", 1), ("torch", 2), ("fsdp", 1), ("fsdp", 2)]
GROUP = 4


def _free_port() -> int:
    from shared.ports import free_port

    return free_port()


# ---- one rank ---------------------------------------------------------------------------------------------
def _storages(tensors) -> int:
    """Bytes of the distinct storages behind ``tensors`` (a DTensor's: its local shard's)."""
    from torch.distributed.tensor import DTensor

    seen: dict[int, int] = {}
    for t in tensors:
        if t is None:
            continue
        t = t.to_local() if isinstance(t, DTensor) else t
        st = t.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


def _held(trainer) -> int:
    """Parameters, buffers, gradients and optimizer state of the actor engine (storage sums)."""
    engine = trainer.actor
    model = engine.model
    opt = engine.optimizer
    tensors = [*model.parameters(), *model.buffers(), *(p.grad for p in model.parameters())]
    tensors += [v for st in opt.state.values() for v in st.values() if hasattr(v, "untyped_storage")]
    return _storages(tensors)


def _label(node) -> str:
    """Where an allocation was made: the innermost Python frames (our code, FSDP's, torch's) above it."""
    from torch._C._profiler import _EventType

    frames, ops = [], []
    n = node.parent
    while n is not None and len(frames) < 3:
        if n.tag == _EventType.PyCall:
            name = n.name.split("/")[-1]
            if not name.startswith(("module.py", "_contextlib.py", "profiler.py", "<built-in")):
                frames.append(name)
        elif n.tag == _EventType.TorchOp and not ops:
            ops.append(n.name)
        n = n.parent
    return " < ".join(ops + frames)


def _profiled_peak(fn, breakdown: bool = False) -> tuple[int, list[tuple[str, int, int]]]:
    """The highest running total of CPU allocations minus frees while ``fn`` runs (torch's profiler), and with
    ``breakdown`` what was live at that moment: (where it was allocated, bytes, count), largest first."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, with_stack=breakdown) as prof:
        fn()
    allocs: list[tuple[int, int, int, object]] = []

    def walk(nodes) -> None:
        for n in nodes:
            if n.tag == _EventType.Allocation and str(n.extra_fields.device) == "cpu":
                allocs.append((n.start_time_ns, n.extra_fields.alloc_size, n.extra_fields.ptr, n))
            walk(n.children)

    walk(prof.profiler.kineto_results.experimental_event_tree())
    allocs.sort(key=lambda a: a[0])
    running = peak = 0
    live: dict[int, tuple[int, object]] = {}
    at_peak: dict[int, tuple[int, object]] = {}
    for _, size, ptr, node in allocs:
        running += size
        if breakdown:
            if size > 0:
                live[ptr] = (size, node)
            else:
                live.pop(ptr, None)
        if running > peak:
            peak = running
            if breakdown:
                at_peak = dict(live)
    groups: dict[str, list[int]] = {}
    for ptr, (size, node) in at_peak.items():
        g = groups.setdefault(_label(node) + (" [no free seen in the step]" if ptr in live else ""), [0, 0])
        g[0] += size
        g[1] += 1
    return peak, sorted(((k, v[0], v[1]) for k, v in groups.items()), key=lambda x: -x[1])


def rank_main(spec_path: str) -> None:
    import torch
    import torch.distributed as dist

    from services.learner.distributed.channel import shard_groups
    from services.learner.distributed.env import RankInfo, init_process_group, leave_process_group
    from services.learner.settings import LearnerSettings
    from services.learner.training.rl_trainer import RLTrainer
    from tests.learner.helpers import group

    spec = json.loads(Path(spec_path).read_text())
    info = RankInfo.from_env()
    device = spec["device"]
    cuda = device == "cuda"
    if cuda:
        torch.cuda.set_device(info.local_rank)
    init_process_group(info, "auto", 600.0, device)
    if spec["backend"] == "fsdp" and not dist.is_initialized():  # fsdp on one rank: a group of one
        dist.init_process_group("nccl" if cuda else "gloo", store=dist.HashStore(), rank=0, world_size=1)
    run_dir = Path(spec["out"]) / f"rank{info.rank}"
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "prompts.jsonl").write_text('{"input": "x", "label": 0}\n')
    s = LearnerSettings(
        model={"actor": spec["model"], "device": device, "gradient_checkpointing": spec["checkpointing"]}, data={"path": str(run_dir / "prompts.jsonl")},
        run_dir=str(run_dir), algorithm={"name": "grpo"}, rollout={"group_size": GROUP},
        optim={"actor_lr": 1e-5, "warmup_ratio": 0.0, "schedule": "constant"},
        train={"groups_per_step": spec["groups"], "micro_batch_size": spec["micro"], "torch_threads": spec["threads"]},
        backend={"name": spec["backend"]},
    )
    steps = spec["steps"] + 2  # one warm-up, the timed ones, one profiled
    trainer = RLTrainer(s, total_steps=steps)
    state_at_step: list[int] = []
    trainer.actor.optimizer.register_step_pre_hook(lambda *_: state_at_step.append(_held(trainer)))
    gen = torch.Generator().manual_seed(0)

    def batch(step: int):
        out = []
        for g in range(spec["groups"]):
            prompt = [1] + torch.randint(5, 200, (spec["prompt"] - 1,), generator=gen).tolist()
            responses = [torch.randint(5, 200, (spec["response"],), generator=gen).tolist() for _ in range(GROUP)]
            out += group(f"b{step}-{g}", responses, [float(i % 2) for i in range(GROUP)], prompt=prompt)
        return out

    def step(n: int) -> tuple[float, int]:
        exps = batch(n)
        groups = [exps[i:i + GROUP] for i in range(0, len(exps), GROUP)]
        mine = shard_groups(groups, info.world_size)[info.rank]
        t0 = time.perf_counter()
        trainer.train_step(mine, batch_scores=[e.reward for e in exps], batch_samples=len(exps))
        tokens = sum(len(e.prompt_token_ids) + len(e.response_token_ids) for e in exps)
        return time.perf_counter() - t0, tokens

    step(0)
    times = []
    for n in range(spec["steps"]):
        dt, tokens = step(n + 1)
        times.append(dt)
    base = _held(trainer)
    if cuda:  # the caching allocator counts every byte itself: its peak above what the step began with
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
        step(spec["steps"] + 1)
        torch.cuda.synchronize()
        grown, live = torch.cuda.max_memory_allocated() - start, []
    else:
        grown, live = _profiled_peak(lambda: step(spec["steps"] + 1), spec["breakdown"])
    peak = base + grown
    p = trainer.precision
    result = {"rank": info.rank, "state": state_at_step[-1], "peak": peak, "held_at_start": base, "live_at_peak": live,
              "tokens_per_s": tokens / statistics.median(times), "step_s": statistics.median(times),
              "precision": f"{str(p.storage).removeprefix('torch.')}"
                           + (f" master, {str(p.compute).removeprefix('torch.')} compute" if p.mixed else "")}
    (Path(spec["out"]) / f"result{info.rank}.json").write_text(json.dumps(result))
    if info.multi:
        dist.barrier()
    leave_process_group()
    if dist.is_initialized():
        dist.destroy_process_group()


# ---- the run ----------------------------------------------------------------------------------------------
def run_setup(backend: str, world: int, model: Path, tmp: Path, args) -> list[dict]:
    out = tmp / f"{backend}-{world}"
    out.mkdir()
    spec = {"out": str(out), "model": str(model), "backend": backend, "steps": args.steps, "threads": args.threads,
            "groups": args.groups, "micro": args.micro, "prompt": args.prompt, "response": args.response,
            "checkpointing": args.gradient_checkpointing, "breakdown": args.breakdown, "device": args.device}
    spec_path = out / "spec.json"
    spec_path.write_text(json.dumps(spec))
    port = _free_port()
    procs = []
    for r in range(world):
        env = {**os.environ, "RANK": str(r), "WORLD_SIZE": str(world), "LOCAL_RANK": str(r),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": str(args.threads),
               "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(REPO)}
        log = open(out / f"rank{r}.log", "wb")  # noqa: SIM115 - the child holds it
        procs.append(subprocess.Popen([sys.executable, __file__, "--rank-worker", str(spec_path)], env=env,
                                      stdout=log, stderr=subprocess.STDOUT))
    codes = [p.wait(timeout=1800) for p in procs]
    if any(codes):
        tail = "\n".join((out / f"rank{r}.log").read_text()[-2000:] for r in range(world))
        raise SystemExit(f"{backend} x{world} failed ({codes}):\n{tail}")
    return [json.loads((out / f"result{r}.json").read_text()) for r in range(world)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rank-worker", help=argparse.SUPPRESS)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3, help="timed steps per setup (after one warm-up)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    ap.add_argument("--groups", type=int, default=4, help="groups of 4 samples per step")
    ap.add_argument("--micro", type=int, default=4, help="micro_batch_size")
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--response", type=int, default=112)
    ap.add_argument("--gradient-checkpointing", action="store_true",
                    help="model.gradient_checkpointing in every setup (activations recomputed per layer)")
    ap.add_argument("--setups", default=None,
                    help="which of torch:1, torch:2, fsdp:1, fsdp:2 to run (the ratios need torch:1); default "
                    "torch:1,torch:2,fsdp:2 on CPU, torch:1,fsdp:1 on one GPU (and the 2-rank ones on two)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="cuda: one GPU a rank (nccl), model.dtype auto = bf16 compute over fp32 master weights "
                    "(fsdp: MixedPrecisionPolicy, torch: autocast); peak from torch.cuda.max_memory_allocated; MFU")
    ap.add_argument("--breakdown", action="store_true",
                    help="per rank, what the step had allocated at its peak, by where it was allocated (slower)")
    args = ap.parse_args()
    if args.rank_worker:
        rank_main(args.rank_worker)
        return
    import torch

    gpus = torch.cuda.device_count() if args.device == "cuda" else 0
    if args.device == "cuda" and not gpus:
        raise SystemExit("error: --device cuda needs a CUDA GPU (torch.cuda.is_available() is False)")
    if args.setups is None:
        args.setups = "torch:1,fsdp:1" + (",torch:2,fsdp:2" if gpus >= 2 else "") if gpus else "torch:1,torch:2,fsdp:2"
    device_name = torch.cuda.get_device_name(0) if gpus else "cpu"

    from deploy.local.tiny_model import build_tiny_causal_lm

    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_causal_lm(Path(tmp) / "model", hidden_size=args.hidden, layers=args.layers,
                                     heads=max(1, args.hidden // 64), max_positions=args.prompt + args.response + 8)
        params = sum(t.numel() for t in __import__("safetensors.torch", fromlist=["load_file"])
                     .load_file(str(model / "model.safetensors")).values())
        print(f"model: hidden {args.hidden}, {args.layers} layers, {params / 1e6:.2f} M parameters "
              f"({params * 4 / 2**20:.1f} MiB fp32); batch {args.groups} x {GROUP} samples of "
              f"{args.prompt} + {args.response} tokens, micro-batches of {args.micro}, gradient checkpointing "
              f"{'on' if args.gradient_checkpointing else 'off'}; torch {torch.__version__}, {args.threads} thread(s) per rank; "
              f"device {device_name}")
        from deploy.gpu.flops import mfu, peak_flops

        with_mfu = peak_flops(device_name) is not None and (gpus or os.environ.get("FLEETRL_PEAK_TFLOPS"))
        print(f"{'setup':<16}{'rank':>5}{'state MiB':>12}{'peak MiB':>11}{'tokens/s':>11}"
              + (f"{'MFU':>8}" if with_mfu else "") + "  precision")
        peaks = {}
        for backend, world in [x for x in SETUPS if f"{x[0]}:{x[1]}" in args.setups.split(",")]:
            results = run_setup(backend, world, model, Path(tmp), args)
            for r in results:
                util = mfu(params, r["tokens_per_s"], world, device_name) if with_mfu and r["rank"] == 0 else None
                print(f"{f'{backend} x{world}':<16}{r['rank']:>5}{r['state'] / 2**20:>12.2f}{r['peak'] / 2**20:>11.2f}"
                      f"{r['tokens_per_s'] if r['rank'] == 0 else float('nan'):>11.0f}"
                      + ((f"{util:>8.1%}" if util is not None else f"{'':>8}") if with_mfu else "")
                      + f"  {r['precision']}")
                if args.breakdown:
                    print(f"    held when the step began {r['held_at_start'] / 2**20:.2f} MiB; allocated in the "
                          f"step and live at its peak:")
                    for where, size, count in r["live_at_peak"][:12]:
                        print(f"    {size / 2**20:9.2f} MiB {count:>5} x  {where}")
            peaks[(backend, world)] = max(r["peak"] for r in results)
        base = peaks.get(("torch", 1))
        for backend, world in (("torch", 2), ("fsdp", 1), ("fsdp", 2)):
            if base and (backend, world) in peaks:
                print(f"{backend} {world} rank{'s' if world > 1 else ''} / torch 1 rank, peak memory per rank: "
                      f"{peaks[(backend, world)] / base:.2f}x")


if __name__ == "__main__":
    main()
