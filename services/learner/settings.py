"""Settings of the learner service (env prefix ``FLEETRL_LEARNER_``; YAML/TOML via ``--config``).

Nested sections: ``model``, ``optim``, ``train``, ``algorithm`` (discriminated on ``name``),
``backend`` (discriminated on ``name``), ``data``, ``rollout``, ``queue``, ``weight_sync``,
``checkpoint``, ``observability``. Environment overrides use ``__`` between levels, e.g.
``FLEETRL_LEARNER_OPTIM__ACTOR_LR=1e-5``. Torch-free: the CLI parses these before importing torch.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from services.learner.algorithms.algorithm_settings import AlgorithmSettings, GRPOSettings, runs_fleet
from services.learner.watches.pool_signal import PoolSignalSettings
from shared.run_settings import RunSettings, move_legacy
from shared.schemas import SamplingOverrides
from shared.settings import ServiceSettings, service_config
from shared.weight_sync.settings import WeightSyncSettings


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LoraSettings(_Section):
    """LoRA adapters on the actor through peft (the critic and reference stay full models)."""

    rank: int = Field(default=8, ge=1, le=1024, description="Adapter rank r.")
    alpha: int = Field(default=16, ge=1, description="LoRA alpha (scale = alpha / r).")
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0, description="Dropout on the adapter input.")
    target_modules: list[str] | str = Field(default="all-linear", description="Modules to adapt (peft syntax).")


class ModelSettings(_Section):
    """Which checkpoints to load (local Hugging Face directories)."""

    actor: str = Field(description="Policy: a local HF causal-LM directory (the rollout fleet starts from the same).")
    reference: str | None = Field(default=None, description="Frozen reference for KL; default: the actor's directory.")
    critic: str | None = Field(
        default=None,
        description="Critic init (PPO): a causal-LM dir (random value head) or a reward-model dir (its head is reused); "
        "default: the actor's directory.",
    )
    tokenizer: str | None = Field(default=None, description="Tokenizer directory; default: the actor's directory.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto", description="auto: bf16 mixed precision on CUDA (fp32 master weights, bf16 compute, fp32 "
        "gradient reduction; the rollout engine's dtype auto), fp32 on CPU. float32 / bfloat16 / float16: parameters "
        "stored and trained in that dtype, with no fp32 master copy.")
    device: str = Field(default="auto", description="'auto' (cuda if available, else cpu), 'cpu', 'cuda', 'cuda:1'.")
    gradient_checkpointing: bool = Field(default=False, description="Recompute activations in backward.")
    lora: LoraSettings | None = Field(default=None, description="Train LoRA adapters instead of all actor weights.")


class OptimSettings(_Section):
    """AdamW with separate actor / critic learning rates and a warmup + decay schedule."""

    actor_lr: float = Field(default=1e-6, gt=0.0, description="Actor learning rate.")
    critic_lr: float = Field(default=9e-6, gt=0.0, description="Critic learning rate (OpenRLHF: higher than the actor's).")
    weight_decay: float = Field(default=0.0, ge=0.0, description="AdamW weight decay.")
    betas: tuple[float, float] = Field(default=(0.9, 0.95), description="AdamW betas.")
    eps: float = Field(default=1e-8, gt=0.0, description="AdamW epsilon.")
    schedule: Literal["cosine", "linear", "constant"] = Field(
        default="cosine", description="LR shape after warmup: cosine or a straight line down to min_lr_ratio, or "
        "constant (Hugging Face's default: linear with min_lr_ratio 0, warmup_ratio 0).")
    warmup_ratio: float = Field(default=0.03, ge=0.0, lt=1.0, description="Warmup as a fraction of total optimizer steps.")
    min_lr_ratio: float = Field(default=0.1, ge=0.0, le=1.0, description="Where cosine / linear end, as a fraction "
                                                                        "of the peak LR.")
    max_grad_norm: float | None = Field(default=1.0, gt=0.0, description="Clip the global grad norm; null disables.")
    total_steps: int | None = Field(
        default=None, ge=1, description="Optimizer steps the schedule spans; default: derived from dataset size and epochs."
    )


class TrainSettings(_Section):
    """Batch shapes and the step loop."""

    groups_per_step: int = Field(default=8, ge=1, description="Complete prompt groups per learner step (RL).")
    mini_batch_size: int | None = Field(
        default=None, ge=1, description="Samples per optimizer step (RL); default: the whole step batch."
    )
    micro_batch_size: int = Field(default=4, ge=1, description="Samples per forward/backward (gradient accumulation); "
                                                            "with micro_batch_tokens, the most rows of one pass.")
    micro_batch_tokens: int | None = Field(
        default=None, ge=1, description="Cut each mini-batch into passes by a token budget instead of a sample "
        "count: rows sorted by length, each pass's rows x longest row within the budget (verl's dynamic batch "
        "size), so long and short samples do not pay for each other's padding.")
    freeze_actor_steps: int = Field(default=0, ge=0, description="Learner steps training only the critic (PPO warm-up).")
    max_steps: int | None = Field(default=None, ge=1, description="Stop after this many learner steps.")
    seed: int = Field(default=42, description="Seed of torch / python RNGs (saved and restored in checkpoints).")
    torch_threads: int | None = Field(default=None, ge=1, description="torch.set_num_threads; default: torch's choice.")
    start_gate: str | None = Field(
        default=None, description="Hold the run after loading, before its first publish and step, until Redis key "
        "fleetrl:<run>:learner:start_gate holds this value (phase 'waiting_for_start_gate' in /status). fleetrl run "
        "sets it for a fresh run once its step-0 held-out evaluation is done, so the learner loads meanwhile.")
    start_gate_timeout_s: float = Field(default=3600.0, gt=0, description="How long the start gate may hold the "
                                        "run before it fails with a message saying so.")


class AutoBackendSettings(_Section):
    """The default: ``torch`` when the learner has one rank, ``fsdp`` (with its defaults) when it has more."""

    name: Literal["auto"] = "auto"


class TorchBackendSettings(_Section):
    """Plain torch: the whole model and its Adam state on every rank, gradients all-reduced (one rank's choice)."""

    name: Literal["torch"] = "torch"


class FSDPBackendSettings(_Section):
    """torch FSDP2 (``fully_shard`` per decoder layer and at the root): each of N ranks holds 1/N of every
    parameter, gradient and Adam state; gloo on CPU, nccl on CUDA. The reference and the critic are sharded too."""

    name: Literal["fsdp"] = "fsdp"
    reshard_after_forward: bool = Field(
        default=True, description="Free each layer's gathered parameters after its forward (ZeRO-3: least "
        "memory); false keeps them until backward (ZeRO-2-like: one all-gather less per layer, more memory).")
    activation_checkpointing: bool = Field(
        default=False, description="Recompute each decoder layer's activations in backward (same as "
        "model.gradient_checkpointing: either turns it on).")
    cpu_offload: bool = Field(
        default=False, description="Keep the sharded parameters, gradients and Adam state in CPU memory "
        "(CPUOffloadPolicy; the optimizer steps on the CPU); for a CUDA learner that does not fit otherwise.")


class DeepSpeedBackendSettings(_Section):
    """DeepSpeed ZeRO-2/3. Needs the ``deepspeed`` package (the ``deepspeed`` extra). Has run on CPU (its CPU
    accelerator over gloo, fp32: two ZeRO-3 ranks train as one torch rank); on CUDA (bf16, offload) it has not run
    yet (docs/learner.md). ``fsdp`` is the sharded backend tested most."""

    name: Literal["deepspeed"] = "deepspeed"
    zero_stage: Literal[2, 3] = Field(default=2, description="ZeRO stage: 2 shards grads+optimizer, 3 also params.")
    adam_offload: bool = Field(default=False, description="Keep Adam states on CPU (DeepSpeedCPUAdam; CUDA only).")
    param_offload: bool = Field(default=False, description="ZeRO-3 only: offload parameters to CPU (CUDA only).")
    bf16: bool | None = Field(default=None, description="bf16 mixed precision; unset: as model.dtype computes "
                              "(bf16 for auto on CUDA and bfloat16; float32 on the CPU, where bf16 is refused).")


BackendSettings = Annotated[AutoBackendSettings | TorchBackendSettings | FSDPBackendSettings | DeepSpeedBackendSettings,
                           Field(discriminator="name")]


class DataSettings(_Section):
    """The prompt set (RL) or prompt/answer pairs (SFT), read from local disk."""

    path: str | None = Field(default=None, description="JSONL, Parquet, or a saved HF dataset directory.")
    split: str = Field(default="train", description="Split of a saved HF DatasetDict.")
    input_key: str = Field(default="input", description="Field holding the prompt (text or chat messages); a dotted "
                           "key names a nested field.")
    label_key: str | None = Field(default="label", description="Field holding the label passed to the reward service "
                                  "(verl's data: reward_model.ground_truth; a dotted key names a nested field).")
    metadata_keys: list[str] = Field(
        default_factory=lambda: ["data_source", "extra_info"], description="Row fields passed as they are, with each "
        "prompt, to the reward function (ScoreItem.metadata; verl's compute_score gets data_source and extra_info "
        "from there) when a row has them.")
    output_key: str = Field(default="output", description="SFT: field holding the answer.")
    chosen_key: str = Field(default="chosen", description="Preference runs (rm, dpo): field holding the preferred "
                            "response (text, or chat messages ending with the assistant's turn).")
    rejected_key: str = Field(default="rejected", description="Preference runs: field holding the other response.")
    eval_path: str | None = Field(default=None, description="Preference runs: held-out pairs (same format and keys "
                                  "as path), whose pairwise accuracy the run measures; fleetrl run sets it from "
                                  "eval.data.")
    apply_chat_template: bool = Field(default=False, description="Render prompts with the tokenizer's chat template.")
    input_template: str | None = Field(default=None, description="Python format string wrapping the prompt, e.g. 'Q: {}\\nA:'.")
    max_samples: int | None = Field(default=None, ge=1, description="Use only the first N rows.")
    shuffle: bool = Field(default=True, description="Shuffle each epoch (seeded by train.seed + epoch).")
    epochs: int = Field(default=1, ge=1, description="Passes over the prompt set.")

    @model_validator(mode="after")
    def _own_metadata_keys(self) -> DataSettings:
        taken = sorted(set(self.metadata_keys) & {"epoch", "index", "attempt"})
        if taken:
            raise ValueError(f"data.metadata_keys: {taken} are the learner's own prompt metadata; pass another field")
        return self


class RolloutRequestSettings(_Section):
    """What the learner asks the rollout fleet for, and how far behind it may run (its staleness bound is
    ``run.max_staleness``, shared with the rollout fleet)."""

    group_size: int = Field(default=4, ge=1, le=1024, description="Samples per prompt (PromptTask.n).")
    sampling: SamplingOverrides = Field(default_factory=SamplingOverrides, description="Per-task sampling settings.")
    window: int = Field(
        default=16, ge=1, description="Prompt groups produced but not yet trained on, at most (bounds staleness)."
    )
    prompt_timeout_s: float = Field(
        default=900.0, gt=0.0, description="Re-issue a prompt whose group is not complete after this long."
    )
    stale_hold_s: float = Field(
        default=0.0, ge=0.0, description="After a group was dropped stale and its prompt re-issued, the learner "
        "holds its steps up to this long for the new group (0: never). Without it, a prompt whose scoring takes "
        "longer than max_staleness steps goes stale on every attempt while faster prompts keep the learner "
        "stepping, and is given up after max_attempts (docs/elastic.md, the drill's slow verifier).",
    )
    stall_warn_s: float = Field(
        default=60.0, gt=0.0, description="Say so (a log warning; /status phase waiting_for_rollout, with why) when "
        "prompts wait and no rollout worker has taken one for this long.",
    )
    dead_letter_retries: int = Field(
        default=2, ge=0, description="Re-issues of a prompt whose task or experiences were dead-lettered before "
        "its dataset position is given up (logged with the reason, counted as prompts_abandoned).",
    )
    max_attempts: int = Field(
        default=50, ge=1, le=10_000, description="Attempts a dataset position gets in all (its first issue and every "
        "re-issue: timeouts, stale groups, dead letters, prompts Redis lost) before it is given up with the reason "
        "(counted as prompts_abandoned), so no position is retried for ever.",
    )


class QueueSettings(_Section):
    """The learner's side of the experience / prompt streams."""

    consumer: str = Field(default="learner-0", min_length=1, description="Consumer name (stable across restarts).")
    consume_count: int = Field(default=64, ge=1, description="Entries per XREADGROUP.")
    block_ms: int = Field(default=500, ge=1, description="How long one read blocks.")
    max_backlog: int = Field(default=4096, ge=1, description="Prompt-stream backlog at which produce() waits.")
    max_deliveries: int = Field(default=5, ge=1, description="Deliveries before an experience is dead-lettered.")
    claim_idle_ms: int = Field(
        default=3_600_000, ge=1000,
        description="Reclaim entries another learner consumer left idle this long (this learner renews its own "
        "held entries every third of it, so they never go idle while it runs).",
    )
    produce_timeout_s: float = Field(default=60.0, gt=0.0, description="Bound on one produce() under backpressure.")
    redis_outage_max_s: float = Field(
        default=3600.0, gt=0.0, description="How long the learner waits for an unreachable Redis (retrying with "
        "backoff, phase 'waiting_for_redis' in /status) before the run fails.",
    )
    dead_letter_maxlen: int = Field(
        default=10_000, ge=100, le=10_000_000,
        description="Each dead-letter stream of the run keeps about its newest N entries (approximate MAXLEN trim).",
    )
    processed_ids_max: int = Field(
        default=1_000_000, ge=10_000,
        description="Most sample ids kept in the processed-ids record (the second line of dedupe: see "
        "docs/security-redis.md); keep it well above rollout.window x rollout.group_size.",
    )
    processed_ids_ttl_s: float = Field(
        default=30 * 86400.0, ge=3600.0,
        description="The processed-ids record expires this long after the run's last commit (an abandoned run's "
        "record does not stay in Redis for ever).",
    )


class PublishSettings(_Section):
    """When new weights go to the rollout fleet (through services.learner.weights' publisher)."""

    every: int = Field(default=1, ge=1, description="Publish weights every N learner steps (and at the end, and "
                                                    "at the next step while replicas that joined late wait).")
    sync: WeightSyncSettings = Field(default_factory=WeightSyncSettings, description="Weight-sync transport settings.")
    in_place: bool = Field(
        default=True,
        description="Lay the actor's weights out the way they are published (one flat buffer per bucket), so a "
                    "publish sends straight from them with no copy. Applies where the optimizer backend leaves "
                    "parameter memory to us (plain torch) and the actor has no LoRA adapters.",
    )


class CheckpointSettings(_Section):
    """Where and how often to checkpoint; experiences are acknowledged only at a checkpoint."""

    dir: str | None = Field(default=None, description="Checkpoint directory; default: <run_dir>/checkpoints.")
    every: int = Field(default=10, ge=1, description="Checkpoint every N learner steps (and at the end / on stop).")
    keep: int = Field(default=2, ge=1, description="Checkpoints kept.")
    resume: bool = Field(default=True, description="Resume from the latest checkpoint in dir if there is one.")
    export_dir: str | None = Field(default=None, description="Write the final actor (HF format, LoRA merged) here.")


class ObservabilitySettings(_Section):
    """Logs and plots of a run (all under run_dir)."""

    metrics_jsonl: bool = Field(default=True, description="Append one JSON line of metrics per step.")
    progress_bar: bool = Field(default=True, description="tqdm progress bar on stderr.")
    plot: bool = Field(default=True, description="Write reward_curve.png at the end (matplotlib, Agg).")
    tensorboard: bool = Field(default=False, description="Write TensorBoard scalars (if tensorboard is installed).")
    wandb_project: str | None = Field(default=None, description="Log to this wandb project (if wandb is installed).")
    run_config: str | None = Field(
        default=None, description="A YAML file recorded as the run's configuration in TensorBoard and wandb (fleetrl "
        "run gives its resolved run spec); unset: these learner settings.")
    log_sample_ids: bool = Field(default=False, description="Include the trained sample ids in each metrics line.")
    log_samples: bool = Field(
        default=False, description="Append every trained sample (ids, label, response text, reward and its "
        "components, weight version, finish reason) to samples.jsonl, one line each, tagged with the step.",
    )
    log_every: int | None = Field(
        default=10, ge=1, description="Every N steps (and at step 1), append `samples_per_log` trained samples (prompt, "
        "completion, reward, length) to samples.jsonl, and to TensorBoard / wandb as a table when those are on; "
        "null: only with log_samples.")
    samples_per_log: int = Field(default=4, ge=1, le=256, description="Samples logged every log_every steps (one "
                                 "per prompt group first).")


class DistributedSettings(_Section):
    """Data-parallel ranks (RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT from the launcher)."""

    backend: Literal["auto", "gloo", "nccl"] = Field(default="auto", description="auto: nccl on CUDA, else gloo.")
    timeout_s: float = Field(default=600.0, gt=0.0, description="Timeout of every collective (process group).")
    heartbeat_s: float = Field(
        default=60.0, gt=0.0, description="Rank 0 pings followers this often while it waits for rollouts "
        "(keep it well under timeout_s).",
    )
    bind_addr: str | None = Field(
        default=None, min_length=1,
        description="Address rank 0's rendezvous store (MASTER_PORT) listens on; unset: MASTER_ADDR, where the "
        "other ranks dial. Unauthenticated: private networks only. Under torchrun its agent hosts the store.",
    )


class LearnerSettings(ServiceSettings):
    """Everything the learner needs; see each section."""

    model_config = service_config("LEARNER")

    port: int = Field(default=8003, ge=0, le=65535, description="HTTP port (0 picks a free one).")
    run_dir: str = Field(default="runs/learner", description="Metrics, plots and (by default) checkpoints go here.")
    model: ModelSettings
    optim: OptimSettings = Field(default_factory=OptimSettings)
    train: TrainSettings = Field(default_factory=TrainSettings)
    algorithm: AlgorithmSettings = Field(default_factory=GRPOSettings)
    backend: BackendSettings = Field(default_factory=AutoBackendSettings,
                                     description="auto (torch on one rank, fsdp on more), torch, fsdp, or deepspeed "
                                     "(ZeRO-2/3; run on CPU only so far: docs/learner.md).")
    data: DataSettings = Field(default_factory=DataSettings)
    rollout: RolloutRequestSettings = Field(default_factory=RolloutRequestSettings)
    queue: QueueSettings = Field(default_factory=QueueSettings)
    publish: PublishSettings = Field(default_factory=PublishSettings)
    checkpoint: CheckpointSettings = Field(default_factory=CheckpointSettings)
    observability: ObservabilitySettings = Field(default_factory=ObservabilitySettings)
    distributed: DistributedSettings = Field(default_factory=DistributedSettings)
    run: RunSettings = Field(default_factory=RunSettings, description="Run-wide settings every service of the run "
                             "shares (shared/run_settings.py); checked at start against the run's record in Redis.")
    pool: PoolSignalSettings = Field(default_factory=PoolSignalSettings,
                                     description="The elastic rollout pool's demand signal (docs/elastic.md).")
    exit_when_done: bool = Field(default=True, description="Exit the process once training has finished.")
    max_body_bytes: int = Field(default=64 * 1024, ge=1024, description="Larger request bodies get 413.")

    @model_validator(mode="before")
    @classmethod
    def _run_wide_renamed(cls, data: Any) -> Any:
        return move_legacy("learner", data, logging.getLogger("services.learner.settings").warning)

    def optional_packages(self) -> dict[str, str]:
        """Import name -> the setting that needs it, of the optional packages these settings need
        (:func:`shared.extras.extras_problem` checks them at start)."""
        needs = {}
        if self.model.lora is not None:
            needs["peft"] = "model.lora (LoRA adapters)"
        if self.backend.name == "deepspeed":
            needs["deepspeed"] = "backend deepspeed"
        return needs

    @model_validator(mode="after")
    def _consistent(self) -> LearnerSettings:
        if self.data.path is None:
            raise ValueError("data.path is required: a JSONL/Parquet prompt set or a saved HF dataset directory")
        name = self.algorithm.name
        if name in ("grpo", "rloo", "online_dpo") and self.rollout.group_size < 2:
            raise ValueError(f"{name} compares samples within a group: set rollout.group_size >= 2")
        fleet = runs_fleet(self.algorithm)
        if fleet and self.rollout.window < self.train.groups_per_step:
            raise ValueError(f"rollout.window ({self.rollout.window}) must be >= train.groups_per_step "
                             f"({self.train.groups_per_step}), or a step can never fill")
        if self.train.freeze_actor_steps and name != "ppo":
            raise ValueError("train.freeze_actor_steps warms up a critic: it only applies to algorithm.name=ppo")
        if self.backend.name == "fsdp" and self.model.lora is not None:
            raise ValueError("model.lora with backend fsdp is not supported (LoRA adapters are small: use backend "
                             "torch, or auto, which picks it for LoRA)")
        if self.distributed.heartbeat_s >= self.distributed.timeout_s:
            raise ValueError("distributed.heartbeat_s must be below distributed.timeout_s")
        if fleet:
            self._sampling_fits_correction()
        return self

    def _sampling_fits_correction(self) -> None:
        """The learner scores samples with the full (tempered) softmax; top-p / top-k / min-p sampling draws from a
        truncated one, so the engine's logprobs and the learner's differ by design and an importance-sampling
        correction between them would be biased. Refuse the combination rather than train on it silently."""
        s = self.rollout.sampling
        truncated = (s.top_p is not None and s.top_p < 1.0) or (s.top_k is not None and s.top_k > 0)
        if truncated and self.algorithm.correction.kind != "none":
            raise ValueError(
                f"rollout.sampling truncates the distribution (top_p={s.top_p}, top_k={s.top_k}) while "
                f"algorithm.correction is {self.algorithm.correction.kind!r}: the learner's logprobs are of the full "
                "distribution, so the correction would be biased. Sample with top_p: 1 and top_k: -1, or set "
                "algorithm.correction: {kind: none}")

    @property
    def checkpoint_dir(self) -> Path:
        return Path(self.checkpoint.dir) if self.checkpoint.dir else Path(self.run_dir) / "checkpoints"
