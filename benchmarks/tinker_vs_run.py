"""The same RL loop through the Tinker API and through ``fleetrl run``'s own loop, back to back in one invocation.

Task, model, start checkpoint and batch are the same for every mode: sort-digits ("sort 3721=" -> "1237",
:mod:`deploy.local.sort_task`), the demo's tiny model after a short supervised warm-up through ``fleetrl run`` (not
timed; :func:`benchmarks.vs_trl.prepare`), 8 prompts x 8 samples x 4 new tokens per step at temperature 1, exact-answer
reward, group-centred advantages, one optimizer step per batch at lr 1e-4, new weights to the sampler every step.

- ``tinker``: ``fleetrl run`` of a ``mode: tinker`` file (the learner's Tinker mode, sampling in the learner); the loop
  is tinker-cookbook's ``rl_loop`` shape written against the ``tinker`` client in this process: sample a group per
  prompt -> reward -> advantages -> ``forward_backward(loss_fn="importance_sampling")`` -> ``optim_step`` ->
  ``save_weights_and_get_sampling_client``. LoRA (``--rank``; the client creates only LoRA models), the tied output
  layer trained in full.
- ``tinker-rollout``: the same, with ``replicas: {rollout: 1}``: the weights go to a rollout replica through the
  weight sidecar each step and the samples come from it.
- ``run``: ``fleetrl run`` of the sort-digits recipe (``examples/sort-digits/fleetrl.yaml``) with staleness 0 (on
  policy, as the Tinker loop is): its own GRPO loop (PPO-clip, TIS), all weights trained, with the reward and
  rollout services.

s/step is from the end of step 1 to the end of the last step (start-up excluded), for every mode. Printed per mode:
s/step, seconds from launch to the end of step 1, the held-out greedy accuracy at the end (``--heldout`` prompts; the
tinker modes through their sampler, ``run`` from its exported checkpoint), and the load average before and after.
The machine is shared: figures are comparable only within one invocation.

    .venv/bin/python benchmarks/tinker_vs_run.py [--steps 40] [--modes tinker,tinker-rollout,run] [--rank 32]
    .venv/bin/python benchmarks/tinker_vs_run.py --quick      # smoke: no warm-up, 3 steps per mode
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import vs_trl  # after the repo is on the path

PROMPTS, SAMPLES, NEW_TOKENS, LR = vs_trl.PROMPTS, vs_trl.SAMPLES, vs_trl.NEW_TOKENS, vs_trl.LR
KEY = "tml-benchmark-tinker-vs-run-0000"
MODES = ("tinker", "tinker-rollout", "run")


def load() -> str:
    return vs_trl.load()


def serve_tinker(root: Path, model: Path, rollout: bool) -> tuple[subprocess.Popen, str]:
    """``fleetrl run`` of a mode: tinker file (with one rollout replica if ``rollout``): the process and its URL."""
    from shared.ports import free_port

    port = free_port()
    spec = {"mode": "tinker", "base_model": str(model), "port": port, "run_dir": str(root / "tinker"),
            "api_key": KEY, "torch_threads": 1, "long_poll_s": 5}
    if rollout:
        spec |= {"replicas": {"rollout": 1},
                 "rollout": {"engine": {"kind": "hf", "device": "cpu", "torch_threads": 1}}}
    root.mkdir(parents=True, exist_ok=True)
    (root / "tinker.yaml").write_text(json.dumps(spec))  # YAML is a superset of JSON
    log = (root / "tinker.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "deploy.cli", "run", str(root / "tinker.yaml")], cwd=REPO,
                            env=vs_trl.env({}), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    import httpx

    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the Tinker server exited ({proc.returncode}); log: {root / 'tinker.log'}")
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.terminate()
    raise SystemExit(f"the Tinker server did not come up in 300 s; log: {root / 'tinker.log'}")


def stop(proc: subprocess.Popen) -> None:
    import signal

    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def tinker_loop(url: str, model: Path, train: list[dict], held: list[dict], args) -> dict:
    """The RL loop against the Tinker API: (launch-relative) end time of every step, final held-out accuracy."""
    os.environ["TINKER_TELEMETRY"] = "0"
    import tinker
    from tinker import types

    service = tinker.ServiceClient(base_url=url, api_key=KEY)
    try:
        return _tinker_steps(service, model, train, held, args, types)
    finally:
        service.close("success").result(timeout=30)  # else its heartbeat thread outlives the server


def _tinker_steps(service, model: Path, train: list[dict], held: list[dict], args, types) -> dict:
    training = service.create_lora_training_client(base_model=str(model), rank=args.rank, seed=0).result()
    tok = training.get_tokenizer()
    sampler = training.save_weights_and_get_sampling_client().result()
    rng = random.Random(0)
    ends = {}
    for step in range(1, args.steps + 1):
        rows = rng.sample(train, PROMPTS)
        prompts = [tok.encode(r["input"], add_special_tokens=False) for r in rows]
        futures = [sampler.sample(types.ModelInput.from_ints(p), SAMPLES,
                                  types.SamplingParams(max_tokens=NEW_TOKENS, temperature=1.0, seed=step * 1000 + i))
                   for i, p in enumerate(prompts)]
        batch = []
        for p, row, fut in zip(prompts, rows, futures, strict=True):
            seqs = fut.result().sequences
            rewards = [1.0 if _answer(tok, s.tokens) == row["label"] else 0.0 for s in seqs]
            mean = sum(rewards) / len(rewards)
            for s, r in zip(seqs, rewards, strict=True):
                ids, n = p + list(s.tokens), len(p) - 1
                batch.append(types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]), loss_fn_inputs={
                    "target_tokens": ids[1:], "logprobs": [0.0] * n + list(s.logprobs),
                    "advantages": [0.0] * n + [r - mean] * len(s.tokens)}))
        training.forward_backward(batch, "importance_sampling")
        training.optim_step(types.AdamParams(learning_rate=LR, beta1=0.9, beta2=0.999, grad_clip_norm=1.0))
        sampler = training.save_weights_and_get_sampling_client().result()
        ends[step] = time.time()
    futures = [sampler.sample(types.ModelInput.from_ints(tok.encode(r["input"], add_special_tokens=False)), 1,
                              types.SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0)) for r in held]
    hits = sum(_answer(tok, f.result().sequences[0].tokens) == r["label"] for f, r in zip(futures, held, strict=True))
    return {"steps": ends, "final_acc": hits / len(held)}


def _answer(tok, tokens) -> str:
    return tok.decode([t for t in tokens if t != tok.eos_token_id], skip_special_tokens=True).strip()


def run_mode(mode: str, root: Path, data: Path, model: Path, train: list[dict], held: list[dict], args) -> dict:
    before = load()
    print(f"[tinker-vs-run] {mode}: {args.steps} steps (load {before})", flush=True)
    launch = time.time()
    if mode == "run":
        ns = argparse.Namespace(steps=args.steps, save_every=args.steps)
        raw = vs_trl.run_fleet("fleet-s0", root / "run" / "run", data, model, 0, ns)
        ckpt = raw["checkpoints"].get(max(raw["checkpoints"], default=0))
        out = {"steps": raw["steps"], "final_acc": vs_trl.accuracy(ckpt, held) if ckpt else None}
        launch = raw["launch"]
    else:
        proc, url = serve_tinker(root / mode, model, rollout=mode == "tinker-rollout")
        try:
            out = tinker_loop(url, model, train, held, args)
            import httpx

            out["sampling"] = httpx.get(f"{url}/status", timeout=10).json()["sampling"]
        finally:
            stop(proc)
    steps = out["steps"]
    first, last = min(steps), max(steps)
    return {"mode": mode, "s_per_step": (steps[last] - steps[first]) / max(last - first, 1),
            "first_step_s": steps[first] - launch, "final_acc": out["final_acc"], "load": f"{before} -> {load()}",
            "sampling": out.get("sampling")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)} (in this order)")
    ap.add_argument("--rank", type=int, default=32, help="LoRA rank of the Tinker modes")
    ap.add_argument("--sft-steps", type=int, default=40, help="supervised warm-up steps through fleetrl run")
    ap.add_argument("--heldout", type=int, default=200)
    ap.add_argument("--run-dir", type=Path, default=None, help="keep everything here (default: a temp dir, removed)")
    ap.add_argument("--quick", action="store_true", help="smoke run: no warm-up, 3 steps per mode, 20 held-out")
    args = ap.parse_args(argv)
    if args.quick:
        args.steps, args.sft_steps, args.heldout = 3, 0, 20
    modes = args.modes.split(",")
    for m in modes:
        if m not in MODES:
            ap.error(f"--modes: unknown mode {m!r}; choose from {', '.join(MODES)}")
    if args.steps < 2:
        ap.error("--steps: at least 2 (s/step is timed from the end of step 1)")
    print(f"[tinker-vs-run] load average {load()} on {os.cpu_count()} cores", flush=True)
    tmp = None
    root = args.run_dir
    if root is None:
        tmp = tempfile.TemporaryDirectory(prefix="fleetrl-tinker-vs-run-")
        root = Path(tmp.name)
    root = root.resolve()
    try:
        print(f"[tinker-vs-run] data, tiny model and a {args.sft_steps}-step SFT warm-up (not timed)", flush=True)
        data, model, held = vs_trl.prepare("sort", 128, root, args.sft_steps, args.heldout)
        train = [json.loads(x) for x in data.read_text().splitlines()]
        start_acc = vs_trl.accuracy(model, held)
        print(f"[tinker-vs-run] start checkpoint: held-out greedy accuracy {start_acc:.1%} ({len(held)} prompts)",
              flush=True)
        results = [run_mode(m, root, data, model, train, held, args) for m in modes]
        print()
        print(f"sort-digits: {PROMPTS} prompts x {SAMPLES} samples x {NEW_TOKENS} new tokens per step, lr {LR}, "
              f"{args.steps} steps; s/step from the end of step 1; start checkpoint {start_acc:.1%} held-out")
        print(f"{'mode':<15} {'s/step':>7} {'->step1':>8} {'final':>6}  load (1/5/15 min, before -> after)")
        for r in results:
            acc = "-" if r["final_acc"] is None else format(r["final_acc"], ".1%")
            print(f"{r['mode']:<15} {r['s_per_step']:>7.3f} {r['first_step_s']:>8.1f} {acc:>6}  {r['load']}")
        for r in results:
            if r["sampling"]:
                s = r["sampling"]
                print(f"  {r['mode']}: sampler {s['sampler']}, samples on rollout {s.get('samples_on_rollout', 0)}, "
                      f"in the learner {s['samples_in_learner']}")
        (root / "tinker_vs_run.json").write_text(json.dumps(results, indent=2, default=str))
    finally:
        if tmp is not None:
            tmp.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
