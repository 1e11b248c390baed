"""What the service pipeline costs per RL step, against the single-process floor doing the same work.

The demo-sized task (sort-digits, tiny model, 8 prompts x 8 samples, 4 new tokens, GRPO), measured in one run,
rounds alternating floor / sync / async:

- **floor**: one process, no services — the same hf engine generating in process, the same exact-answer reward,
  the same ``RLTrainer`` step, the new weights copied into the engine in place. Per step: generate, score,
  train, sync.
- **sync**: the fleet through ``fleetrl run`` (embedded Redis, reward, rollout with worker and weight sidecar,
  learner), staleness 0 and window = groups per step: generation and training alternate.
- **async**: the same with staleness 1 and a window of two steps.

For the fleet, per step from the learner's metrics.jsonl (steps after the first ``--skip`` ones): wall seconds,
the training step, the wait for experiences, the weight publish, and the rest (bookkeeping, commit). Printed:
each mode's s/step with its phase shares, and the **services' own overhead in sync mode** = the learner's wait
per step minus the floor's in-process generation + scoring per step, as a share of the floor's s/step
(target <= 25 %), and async s/step against the floor (target: faster).

    .venv/bin/python benchmarks/pipeline_overhead.py [--steps 40] [--rounds 2] [--skip 5]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

GROUPS, GROUP_SIZE, NEW_TOKENS = 8, 8, 4
RECIPE = REPO / "examples" / "sort-digits"


def learner_settings(run: Path, model: Path):
    from services.learner.settings import LearnerSettings

    return LearnerSettings(
        model={"actor": str(model), "device": "cpu"}, data={"path": str(run / "data" / "train.jsonl")},
        run_dir=str(run / "floor-learner"), algorithm={"name": "grpo"},
        optim={"actor_lr": 5e-4, "schedule": "constant", "warmup_ratio": 0.0},
        train={"groups_per_step": GROUPS, "micro_batch_size": 64, "torch_threads": 1, "seed": 0},
        rollout={"group_size": GROUP_SIZE, "sampling": {"max_new_tokens": NEW_TOKENS, "temperature": 1.0}},
    )


async def floor(run: Path, model: Path, steps: int, skip: int) -> dict:
    """The same work in one process: per step (s), and its generation + scoring part (s)."""
    from services.learner.training.rl_trainer import RLTrainer
    from services.rollout.engines.hf.engine import HFEngine
    from services.rollout.engines.settings import HFEngineSettings
    from services.rollout.engines.types import SamplingParams, SequenceRequest
    from shared.schemas import Experience, sample_id

    rows = [json.loads(x) for x in (run / "data" / "train.jsonl").read_text().splitlines()]
    engine = HFEngine(HFEngineSettings(device="cpu", max_batch_size=256, torch_threads=1), str(model))
    await engine.start()
    trainer = RLTrainer(learner_settings(run, model), total_steps=steps + 1)
    params = SamplingParams(max_new_tokens=NEW_TOKENS, temperature=1.0)
    walls, gens = [], []
    try:
        for step in range(steps):
            t0 = time.perf_counter()
            batch = rows[step * GROUPS:(step + 1) * GROUPS]
            reqs, meta = [], []
            for g, row in enumerate(batch):
                ids = tuple(engine.tokenizer(row["input"], add_special_tokens=True)["input_ids"])
                for i in range(GROUP_SIZE):
                    reqs.append(SequenceRequest(rid=f"s{step}-{g}-{i}", prompt_ids=ids, params=params))
                    meta.append((g, i, row["label"]))
            outs = await engine.generate_many(reqs)
            exps = [Experience(
                id=sample_id(f"s{step}-{g}", i), prompt_id=f"s{step}-{g}", group_id=f"s{step}-{g}",
                group_size=GROUP_SIZE, index=i, prompt_token_ids=list(out.prompt_ids),
                response_token_ids=out.output_ids, response_logprobs=out.logprobs, finish_reason=out.finish.type,
                reward=float(out.text.strip() == label), weight_version=out.weight_version)
                for (g, i, label), out in zip(meta, outs)]
            t1 = time.perf_counter()
            await asyncio.to_thread(trainer.train_step, exps)
            await engine.pause("wait")
            weights = trainer.policy_weights()
            state = weights.state_dict() if hasattr(weights, "state_dict") else weights
            engine.model.load_state_dict(state)  # in place: the engine's parameters take the new values
            engine.set_weight_version(step + 1)
            await engine.resume()
            if step >= skip:
                walls.append(time.perf_counter() - t0)
                gens.append(t1 - t0)
    finally:
        await engine.stop()
    return {"s_per_step": statistics.median(walls), "generate_score_s": statistics.median(gens)}


def fleet(run: Path, mode: str, steps: int, skip: int) -> dict:
    from deploy.run.display import make_display
    from deploy.run.launch import run_spec
    from deploy.run.load import load_spec

    staleness, window = {"sync": (0, GROUPS), "async": (1, 2 * GROUPS)}[mode]
    name = f"{run.name}-{mode}-{time.monotonic_ns()}"
    out = run / name
    sets = [f"run_name={name}", f"run_dir={out}", "model=base-model", "export=null", "eval.data=null",
            f"train.max_steps={steps}", f"train.groups_per_step={GROUPS}", f"sampling.group_size={GROUP_SIZE}",
            f"sampling.max_new_tokens={NEW_TOKENS}", f"staleness={staleness}", f"window={window}",
            "services.learner.observability.log_samples=true"]
    spec = load_spec(run / "fleetrl.yaml", sets)
    if run_spec(spec, run / "fleetrl.yaml", make_display(False)) != 0:
        raise SystemExit(f"{mode}: the fleet run failed; logs under {out / 'logs'}")
    rows = [json.loads(x) for x in (out / "learner" / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "step" in r and "time" in r]
    timed = rows[skip:]
    gaps = [b["time"] - a["time"] for a, b in itertools.pairwise(timed)]
    pick = timed[1:]
    med = statistics.median
    # the trace of each step from its samples: prompt issued -> last sample generated and scored (the rollout
    # side: worker pickup, generation, /score) -> training starts (push, consume, admission)
    samples: dict[int, list[dict]] = {}
    for line in (out / "learner" / "samples.jsonl").read_text().splitlines():
        x = json.loads(line)
        samples.setdefault(x["step"], []).append(x)
    rollout_s, queue_s = [], []
    for r in pick:
        xs = samples.get(r["step"], [])
        if not xs:
            continue
        issued, generated = min(x["created_at"] for x in xs), max(x["generated_at"] for x in xs)
        train_start = r["time"] - r["step_time_s"] - r.get("publish_s", 0.0)
        rollout_s.append(generated - issued)
        queue_s.append(train_start - generated)
    return {"s_per_step": med(gaps), "train_s": med(r["step_time_s"] for r in pick),
            "wait_s": med(r["wait_time_s"] for r in pick), "publish_s": med(r.get("publish_s", 0.0) for r in pick),
            "issue_to_scored_s": med(rollout_s), "scored_to_train_s": med(queue_s)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--skip", type=int, default=5, help="first steps not timed (start-up)")
    args = ap.parse_args()
    from deploy.local.sort_task import prepare_run

    with tempfile.TemporaryDirectory(prefix="fleetrl-overhead-") as tmp:
        run = Path(tmp) / "run"
        _, _, model = prepare_run(run, seed=0, heldout=50, hidden_size=128, layers=2)
        shutil.copy(RECIPE / "fleetrl.yaml", run / "fleetrl.yaml")
        results: dict[str, list[dict]] = {"floor": [], "sync": [], "async": []}
        for r in range(args.rounds):
            print(f"[overhead] round {r + 1}/{args.rounds}: floor", flush=True)
            results["floor"].append(asyncio.run(floor(run, model, args.steps, args.skip)))
            for mode in ("sync", "async"):
                print(f"[overhead] round {r + 1}/{args.rounds}: {mode} fleet", flush=True)
                results[mode].append(fleet(run, mode, args.steps, args.skip))
        print()
        med = statistics.median
        f_step = med(x["s_per_step"] for x in results["floor"])
        f_gen = med(x["generate_score_s"] for x in results["floor"])
        print(f"task: {GROUPS} prompts x {GROUP_SIZE} samples x {NEW_TOKENS} new tokens, GRPO, tiny model; "
              f"{args.steps} steps per run, first {args.skip} not timed, {args.rounds} rounds (medians)")
        print(f"floor (one process)  : {f_step:.3f} s/step   of which generate + score {f_gen:.3f} s "
              f"({f_gen / f_step:.0%})")
        for mode in ("sync", "async"):
            xs = results[mode]
            step, train, wait, pub = (med(x[k] for x in xs) for k in ("s_per_step", "train_s", "wait_s", "publish_s"))
            rest = max(step - train - wait - pub, 0.0)
            print(f"{mode:<5} (services)     : {step:.3f} s/step   train {train / step:.0%}, wait for experiences "
                  f"{wait / step:.0%}, publish {pub / step:.0%}, rest {rest / step:.0%}   ({step / f_step:.2f}x the floor)")
            scored, queued = (med(x[k] for x in xs) for k in ("issue_to_scored_s", "scored_to_train_s"))
            print(f"      trace of a step: prompts issued -> last sample scored {scored * 1000:.0f} ms (in process: "
                  f"{f_gen * 1000:.0f} ms), last sample scored -> training starts {queued * 1000:.0f} ms")
        sync_wait = med(x["wait_s"] for x in results["sync"])
        overhead = sync_wait - f_gen
        print(f"services' own overhead in sync mode: {overhead * 1000:.0f} ms/step = {overhead / f_step:.0%} of the "
              f"floor's step (learner's wait {sync_wait * 1000:.0f} ms - in-process generate + score "
              f"{f_gen * 1000:.0f} ms; target <= 25%)")
        a_step = med(x["s_per_step"] for x in results["async"])
        print(f"async vs floor: {a_step:.3f} vs {f_step:.3f} s/step = {f_step / a_step:.2f}x the floor's speed "
              "(target > 1)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
