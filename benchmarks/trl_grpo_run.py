"""One TRL ``GRPOTrainer`` run for ``benchmarks/vs_trl.py`` (launched as its own process, so that its launch ->
first step counts its imports as ``fleetrl run``'s does).

Writes ``steps.jsonl`` (one line per optimizer step: ``step``, wall ``time`` at the step's end), ``threads.json`` (the
process's torch threads, intra- and inter-op, and the cores it may run on: what it was given) and the policy every
``--save-every`` steps (``checkpoint-N/``, model only) under ``--out``. The hyper-parameters are the benchmark's
(see there); the reward is the exact answer (the completion, stripped, equals the row's label).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def exact_reward(completions: list[str], label: list[str], **_: object) -> list[float]:
    return [float(c.strip() == want) for c, want in zip(completions, label)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--data", type=Path, required=True, help="train.jsonl (input, label)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--save-every", type=int, required=True)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=4)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    rows = [json.loads(x) for x in args.data.read_text().splitlines()]
    data = Dataset.from_list([{"prompt": r["input"], "label": r["label"]} for r in rows])
    args.out.mkdir(parents=True, exist_ok=True)
    log = (args.out / "steps.jsonl").open("w")
    (args.out / "threads.json").write_text(json.dumps({
        "torch_threads": torch.get_num_threads(), "interop_threads": torch.get_num_interop_threads(),
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS")}))

    class StepTimes(TrainerCallback):
        def on_step_end(self, _args, state, _control, **_kw):
            log.write(json.dumps({"step": state.global_step, "time": time.time()}) + "\n")
            log.flush()

    batch = args.prompts * args.samples
    config = GRPOConfig(
        output_dir=str(args.out), use_cpu=True, seed=args.seed, max_steps=args.steps,
        per_device_train_batch_size=batch, gradient_accumulation_steps=1, num_generations=args.samples,
        steps_per_generation=1, num_iterations=1,
        max_completion_length=args.new_tokens, temperature=1.0, top_p=1.0, top_k=0,
        learning_rate=args.lr, lr_scheduler_type="linear", warmup_steps=0, weight_decay=0.0,
        adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, max_grad_norm=1.0,
        epsilon=0.2, epsilon_high=0.2, beta=0.0, loss_type="dapo", scale_rewards="group",
        save_strategy="steps", save_steps=args.save_every, save_only_model=True, save_total_limit=None,
        logging_steps=10**6, report_to="none", disable_tqdm=True, dataloader_num_workers=0,
        bf16=False, fp16=False, log_completions=False, gradient_checkpointing=False,
    )
    trainer = GRPOTrainer(model=str(args.model), reward_funcs=exact_reward, args=config, train_dataset=data,
                          callbacks=[StepTimes()])
    trainer.train()
    log.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
