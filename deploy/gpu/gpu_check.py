"""``make gpu-check``: everything FleetRL does on a GPU host, in one command, with its figures written to
``benchmarks/RESULTS-gpu.md``.

Stages (``GPU_CHECK_STAGES``, comma-separated; default all):

- ``tests``: the ``gpu`` tests that fit the GPUs present (two-GPU tests skip with the reason on one);
- ``recipe``: a locally built ~0.4B Llama-shaped model (hidden 1024, 24 layers, bf16), an SFT warm-up, then
  GRPO on sort-digits through ``fleetrl run``, the learner and the hf engine on one GPU (weights by CUDA IPC),
  with no setting beyond the engine's device (the learner on its default ``model.dtype: auto``: bf16 compute over
  fp32 master weights); its learner MFU; s/step and its split, publish time against a device-to-device
  copy of the same bytes, GPU busy share and each process's peak GPU memory (sampled with nvidia-smi);
- ``engine``: the hf engine's generation throughput through the rollout service against plain
  ``model.generate`` in one process, same model, batch and lengths;
- ``deepspeed``: the ``gpu`` tests of the ``deepspeed`` backend (ZeRO-2 and ZeRO-3 in bf16 on one GPU,
  ZeRO-3's gather for publishing; ``tests/learner/training/test_deepspeed.py``), last and with a bound of its
  own: DeepSpeed has run on CPU only, and its offloaded Adam JIT-compiles an op on first use;
- ``learner``: ``benchmarks/learner_memory.py --device cuda`` on the recipe's model shape: the ``fsdp`` backend
  (FSDP2 over a group of one, ``MixedPrecisionPolicy`` bf16 compute / fp32 reduce over fp32 master weights) and
  the ``torch`` backend (autocast) on one GPU (and on two ranks where there are two GPUs), same GRPO batches:
  state and peak memory per rank, learner tokens/s and MFU (``deploy/gpu/flops.py``).

It stops everything it started (``fleetrl run`` stops its own services; the engine stage's service is
stopped in a ``finally``). Needs: CUDA torch, transformers, and the wheelhouse (``make wheelhouse``) installed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OUT = Path(os.environ.get("GPU_CHECK_DIR", REPO / "runs" / "gpu-check"))
RESULTS = Path(os.environ.get("GPU_CHECK_RESULTS", REPO / "benchmarks" / "RESULTS-gpu.md"))
STAGES = [s for s in os.environ.get("GPU_CHECK_STAGES", "tests,learner,recipe,engine,deepspeed").split(",") if s]
DEEPSPEED_TESTS = ["tests/learner/training/test_deepspeed.py"]
GPU_TESTS = ["tests/weight_sync/test_gpu_transports.py", "tests/learner/weights/test_outbox.py",
             "tests/weight_sync/test_nccl.py", "tests/weight_sync/test_digest.py"]
HIDDEN, LAYERS = int(os.environ.get("GPU_CHECK_HIDDEN", "1024")), int(os.environ.get("GPU_CHECK_LAYERS", "24"))
SFT_STEPS, RL_STEPS = int(os.environ.get("GPU_CHECK_SFT_STEPS", "150")), int(os.environ.get("GPU_CHECK_RL_STEPS", "40"))

lines: list[str] = []


def say(text: str = "") -> None:
    print(text, flush=True)
    lines.append(text)


def sh(cmd: list[str], timeout: float, log: Path | None = None, env: dict | None = None) -> tuple[int, str]:
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, check=False, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                           env={**os.environ, **(env or {})})
        code, text = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as exc:
        code, text = 124, f"{exc.stdout or ''}{exc.stderr or ''}\n(timed out after {timeout:.0f}s)"
    if log is not None:
        log.write_text(text)
    print(f"$ {' '.join(cmd)}  -> {code} in {time.monotonic() - t0:.1f}s", flush=True)
    return code, text


class GpuSampler:
    """nvidia-smi every 0.5 s: GPU busy share, and each compute process's peak memory (by its service)."""

    def __init__(self) -> None:
        self.util: list[float] = []
        self.peak: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> GpuSampler:  # noqa: PYI034
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    @staticmethod
    def _who(pid: str) -> str:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            return f"pid {pid}"
        m = re.search(r"services\.(learner|rollout|reward)", cmd)
        return m.group(1) if m else f"pid {pid} ({cmd[:40]})"

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            try:
                u = subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"],
                                   check=False, capture_output=True, text=True, timeout=5).stdout.split()
                if u:
                    self.util.append(float(u[0]))
                apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                                       "--format=csv,noheader,nounits"], check=False, capture_output=True, text=True,
                                      timeout=5).stdout
                for row in apps.strip().splitlines():
                    pid, mem = [x.strip() for x in row.split(",")]
                    who = self._who(pid)
                    self.peak[who] = max(self.peak.get(who, 0.0), float(mem))
            except Exception:  # noqa: BLE001, S110 - sampling is best effort
                pass


def _gpu_tests(title: str, files: list[str], per_test_s: int, budget_s: int, log: str) -> bool:
    """The ``gpu`` tests of ``files`` within ``budget_s`` (each within ``per_test_s``): the summary's last lines."""
    code, text = sh([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                     "-o", "addopts=", f"--timeout={per_test_s}", *files], budget_s, OUT / log)
    tail = [ln for ln in text.strip().splitlines() if ln.strip()][-12:]
    say(f"## {title}")
    say(f"`{sys.executable} -m pytest -q -m gpu {' '.join(files)}` (exit {code})")
    say("```")
    for ln in tail:
        say(ln)
    say("```")
    return code == 0


def stage_tests() -> bool:
    return _gpu_tests("gpu tests", GPU_TESTS, 240, 420, "gpu-tests.log")


def stage_deepspeed() -> bool:
    return _gpu_tests("deepspeed on the GPU", DEEPSPEED_TESTS, 200, 240, "gpu-deepspeed.log")


def write_specs(d: Path) -> None:
    (d / "sft.yaml").write_text(f"""run_name: gpu-sft
run_dir: runs/gpu-sft
model: base-model
data: {{path: data/train.jsonl, input_key: input, output_key: output}}
algorithm: {{name: sft, batch_size: 64, max_steps: {SFT_STEPS}}}
optim: {{actor_lr: 3.0e-4, schedule: cosine, warmup_ratio: 0.05}}
train: {{seed: 0, micro_batch_size: 64}}
checkpoint_every: 100000
export: sft-model
services:
  learner: {{model: {{dtype: bfloat16}}, observability: {{plot: false}}}}
""")
    (d / "grpo.yaml").write_text(f"""run_name: gpu-grpo
run_dir: runs/gpu-grpo
model: sft-model
data: {{path: data/train.jsonl, input_key: input, label_key: label, epochs: 10}}
reward:
  scorers:
    - {{name: exact, kind: rule, weight: 1.0, check: {{type: exact}}}}
algorithm:
  name: grpo
  policy_loss: {{kind: ppo, eps_low: 0.2, eps_high: 0.28}}
  correction: {{kind: tis, cap: 2.0}}
optim: {{actor_lr: 1.0e-5, schedule: constant, warmup_ratio: 0.0}}
train: {{groups_per_step: 16, micro_batch_size: 64, max_steps: {RL_STEPS}, seed: 0}}
sampling: {{group_size: 8, max_new_tokens: 8, temperature: 1.0}}
staleness: 1
checkpoint_every: 100000
eval: {{data: data/heldout.jsonl, every: {max(RL_STEPS // 2, 1)}, max_samples: 100}}
services:
  rollout:
    engine: {{kind: hf, max_batch_size: 256}}
    worker: {{concurrency: 32}}
  learner: {{model: {{dtype: auto}}}}
""")


def _metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "learner" / "metrics.jsonl"
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()] if path.exists() else []


def _params(model_dir: Path) -> int:
    """Parameters in a Hugging Face directory's safetensors files (from their headers)."""
    from math import prod

    from safetensors import safe_open

    total = 0
    for path in model_dir.glob("*.safetensors"):
        with safe_open(str(path), "pt") as f:
            total += sum(prod(f.get_slice(k).get_shape()) for k in f.keys())  # noqa: SIM118 - not iterable
    return total


def _publish_lines(run_dir: Path) -> list[tuple[float, str]]:
    found = []
    for log in run_dir.rglob("*.log"):
        for m in re.finditer(r"published version \d+ \(([\d.]+) MB, \d+ buckets\) in ([\d.]+)s \(([^)]*)\)",
                             log.read_text(errors="replace")):
            found.append((float(m.group(2)), m.group(3), float(m.group(1))))
    return found


def d2d_copy_s(nbytes: int) -> float:
    import torch

    a = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    times = []
    for _ in range(12):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        b.copy_(a)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[2:])


def stage_recipe() -> bool:
    d = OUT / "recipe"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    say("## recipe: SFT warm-up then GRPO on one GPU (learner and hf engine colocated)")
    code, text = sh([sys.executable, "-m", "deploy.local.sort_task", str(d), "--hidden-size", str(HIDDEN),
                     "--layers", str(LAYERS)], 300, OUT / "prepare.log")
    if code:
        say(f"preparing the task failed (exit {code}): {text[-500:]}")
        return False
    write_specs(d)
    fleetrl = [sys.executable, "-m", "deploy.cli", "run"]
    t0 = time.monotonic()
    code, text = sh([*fleetrl, str(d / "sft.yaml")], 400, OUT / "sft.log")
    sft_s = time.monotonic() - t0
    if code:
        say(f"SFT failed (exit {code}): {text[-1500:]}")
        return False
    sft = _metrics(d / "runs" / "gpu-sft")
    say(f"SFT: {SFT_STEPS} steps in {sft_s:.0f}s from launch (`fleetrl run sft.yaml`), loss "
        f"{sft[0].get('sft_loss', '?') if sft else '?'} -> {sft[-1].get('sft_loss', '?') if sft else '?'}")
    t0 = time.monotonic()
    with GpuSampler() as gpu:
        code, text = sh([*fleetrl, str(d / "grpo.yaml"), "--set", "services.rollout.engine.device=cuda"], 480,
                        OUT / "grpo.log")
    grpo_s = time.monotonic() - t0
    run_dir = d / "runs" / "gpu-grpo"
    rows = [r for r in _metrics(run_dir) if "step" in r]
    say(f"GRPO: `fleetrl run grpo.yaml --set services.rollout.engine.device=cuda` exit {code} in {grpo_s:.0f}s, "
        f"{len(rows)} steps logged")
    if code or len(rows) < 4:
        say("```")
        say(text[-2500:])
        say("```")
        return False
    steady = rows[2:]
    span = steady[-1]["time"] - steady[0]["time"]
    per_step = span / max(len(steady) - 1, 1)

    def mean(key: str) -> float:
        vals = [float(r[key]) for r in steady if isinstance(r.get(key), (int, float))]
        return sum(vals) / len(vals) if vals else float("nan")

    train, publish, wait = mean("step_time_s"), mean("publish_s"), mean("wait_time_s")
    other = per_step - train - publish - wait
    say("")
    say("| s/step (steady, from step 3) | learner update | publish | learner waiting (generation) | other |")
    say("|---|---|---|---|---|")
    say(f"| {per_step:.3f} | {train:.3f} ({train / per_step:.0%}) | {publish:.3f} ({publish / per_step:.0%}) | "
        f"{wait:.3f} ({wait / per_step:.0%}) | {other:.3f} |")
    params = _params(d / "sft-model")
    if params:
        say("")
        import torch

        say(learner_mfu(steady, params, torch.cuda.get_device_name(0)))
    rewards = [r.get("reward_mean") for r in rows if r.get("reward_mean") is not None]
    if rewards:
        say(f"\ntrain reward {rewards[0]:.2f} -> {rewards[-1]:.2f} over {len(rows)} steps")
    summary = run_dir / "summary.json"
    if summary.exists():
        s = json.loads(summary.read_text())
        say(f"held-out (summary.json): {json.dumps(s.get('heldout', s.get('eval', '')))[:300]}")
    pubs = _publish_lines(run_dir)
    if pubs:
        secs = sorted(p[0] for p in pubs[1:]) or [pubs[0][0]]
        med = statistics.median(secs)
        mb = pubs[-1][2]
        copy = d2d_copy_s(int(mb * 1e6))
        say(f"\npublish: median {med * 1e3:.1f} ms for {mb:.0f} MB over {len(pubs)} publishes "
            f"(last phases: {pubs[-1][1]}); a device-to-device copy of the same bytes: {copy * 1e3:.2f} ms; "
            f"publish speed / raw copy speed = {copy / med:.2f}")
        say(f"publish share of the GRPO step: {med / per_step:.1%}")
    if gpu.util:
        say(f"GPU busy (nvidia-smi utilization, {len(gpu.util)} samples over the GRPO run): "
            f"{sum(gpu.util) / len(gpu.util):.0f}%")
    if gpu.peak:
        say("peak GPU memory per process: " + ", ".join(f"{k} {v / 1024:.1f} GiB" for k, v in sorted(gpu.peak.items())))
    return True


def learner_command() -> list[str]:
    """The learner stage's command: the recipe's model shape, GRPO batches of 16 groups x 4 samples of 128
    tokens, micro-batches of 16, three timed steps a setup."""
    return [sys.executable, str(REPO / "benchmarks" / "learner_memory.py"), "--device", "cuda", "--hidden", str(HIDDEN),
            "--layers", str(LAYERS), "--groups", "16", "--micro", "16", "--prompt", "16", "--response", "112",
            "--steps", "3"]


def stage_learner() -> bool:
    say("## learner: fsdp (bf16 MixedPrecisionPolicy) and torch (autocast) on the GPU, memory, tokens/s, MFU")
    cmd = learner_command()
    code, text = sh(cmd, 900, OUT / "learner.log")
    say(f"`{' '.join(['python', *cmd[1:]])}` (exit {code})")
    say("```")
    say("\n".join(ln for ln in text.strip().splitlines() if "Writing model shards" not in ln)[-2500:])
    say("```")
    return code == 0


def learner_mfu(rows: list[dict], params: int, device_name: str) -> str:
    """The recipe's learner MFU: its tokens over its update time (``tokens`` / ``step_time_s`` per step)."""
    from deploy.gpu.flops import mfu

    tokens = sum(float(r.get("tokens", 0)) for r in rows)
    seconds = sum(float(r.get("step_time_s", 0)) for r in rows)
    if not tokens or not seconds:
        return "learner MFU: no tokens / step_time_s in the metrics"
    util = mfu(params, tokens / seconds, 1, device_name)
    rate = f"{tokens / seconds:,.0f} tokens/s over the update time"
    return (f"learner MFU {util:.1%} ({rate}, 6 x {params / 1e6:.0f} M params a token)" if util is not None
            else f"learner MFU: unknown peak for this GPU (set FLEETRL_PEAK_TFLOPS); {rate}")


def stage_engine() -> bool:
    say("## hf engine throughput: rollout service /generate vs model.generate in one process")
    model = OUT / "recipe" / "sft-model"
    if not model.exists():
        model = OUT / "recipe" / "base-model"
    if not model.exists():
        say("no model (run the recipe stage first)")
        return False
    code, text = sh([sys.executable, "-m", "deploy.gpu.engine_bench", str(model)], 300, OUT / "engine.log")
    say("```")
    say(text.strip()[-1500:])
    say("```")
    return code == 0


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    import torch

    if not torch.cuda.is_available():
        print("error: make gpu-check needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name(0)
    say("# FleetRL on a GPU (`make gpu-check`)")
    say(f"{torch.cuda.device_count()} x {name}, torch {torch.__version__}, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. Command: `make gpu-check` "
        f"(stages {','.join(STAGES)}).")
    ok = True
    t0 = time.monotonic()
    for stage in STAGES:
        fn = {"tests": stage_tests, "learner": stage_learner, "recipe": stage_recipe, "engine": stage_engine,
              "deepspeed": stage_deepspeed}[stage]
        try:
            ok = fn() and ok
        except Exception as exc:  # noqa: BLE001 - a broken stage is reported, the others still run
            say(f"stage {stage} failed: {type(exc).__name__}: {exc}")
            ok = False
        say("")
    say(f"gpu-check {'passed' if ok else 'FAILED'} in {time.monotonic() - t0:.0f}s")
    RESULTS.write_text("\n".join(lines) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
