"""What the RL and SFT trainers share: device, tokenizer, the actor engine, save / restore."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import torch

from services.learner.settings import LearnerSettings
from services.learner.training.backends import (
    TrainEngine,
    build_engine,
    prepare_frozen_model,
    resolve_backend,
)
from services.learner.training.models import (
    load_actor,
    load_tokenizer,
    merged_state_dict,
    resolve_device,
    save_actor_export,
)
from services.learner.training.precision import resolve_precision
from services.learner.training.rng import load_rng, save_rng, seed_everything

log = logging.getLogger(__name__)


class TrainerBase:
    """Owns the actor. ``resume_dir`` (a checkpoint's ``trainer/`` directory) restores an exact state;
    ``local_rank`` picks this rank's GPU for a bare ``cuda`` device."""

    def __init__(self, settings: LearnerSettings, total_optimizer_steps: int, samples_per_step: int,
                 resume_dir: Path | None = None, local_rank: int = 0) -> None:
        self.settings = settings
        self.device = resolve_device(settings.model.device, local_rank)
        self.precision = resolve_precision(settings.model.dtype, self.device)
        self.backend = resolve_backend(settings.backend, lora=settings.model.lora is not None)
        if settings.train.torch_threads:
            torch.set_num_threads(settings.train.torch_threads)
        seed_everything(settings.train.seed)
        self.tokenizer = load_tokenizer(settings.model)
        self.pad_id = int(self.tokenizer.pad_token_id)
        self.global_step = 0
        self.total_optimizer_steps = max(1, total_optimizer_steps)
        micro = settings.train.micro_batch_size
        self.accumulation = max(1, math.ceil(samples_per_step / micro))
        self.actor = self._build_actor(resume_dir)
        p = self.precision
        log.info("learner backend %s on %s: parameters in %s, compute in %s", self.backend.name, self.device,
                 p.storage, p.compute or p.storage)

    # ---- construction -----------------------------------------------------------------------------
    def _build_actor(self, resume_dir: Path | None) -> TrainEngine:
        m = self.settings.model
        if resume_dir is None:
            model = load_actor(m, self.device)
        elif m.lora is not None:  # base weights from the original directory, adapters from the checkpoint
            model = load_actor(m, self.device, adapter_dir=str(resume_dir / "actor"))
        else:
            model = load_actor(m.model_copy(update={"actor": str(resume_dir / "actor")}), self.device)
        return self._engine(model, self.settings.optim.actor_lr)

    def _engine(self, model: torch.nn.Module, lr: float) -> TrainEngine:
        return build_engine(self.backend, model, lr, self.settings.optim, self.total_optimizer_steps,
                            self.accumulation, precision=self.precision)

    def _frozen(self, model: torch.nn.Module) -> torch.nn.Module:
        """A forward-only model (the reference) placed as the actor is: sharded under fsdp."""
        return prepare_frozen_model(self.backend, model, precision=self.precision)

    # ---- state ------------------------------------------------------------------------------------
    def extra_state(self) -> dict:
        return {}

    def load_extra_state(self, state: dict) -> None:
        pass

    def save(self, out_dir: Path) -> None:
        """Write the complete training state into ``out_dir`` (a fresh directory)."""
        out_dir.mkdir(parents=True, exist_ok=True)
        actor_dir = out_dir / "actor"
        self.actor.model.save_pretrained(actor_dir, state_dict=self.actor.full_state_dict(), safe_serialization=True)
        self.tokenizer.save_pretrained(actor_dir)
        self.actor.save_state(out_dir / "actor_optim")
        self._save_more(out_dir)
        save_rng(out_dir / "rng.pt")
        (out_dir / "trainer.json").write_text(json.dumps({"global_step": self.global_step, **self.extra_state()}))

    def _save_more(self, out_dir: Path) -> None:
        pass

    def save_follower(self, out_dir: Path) -> None:
        """A follower rank's part of :meth:`save` (rank 0 writes the rest). Replicated backends: nothing;
        sharded ones (DeepSpeed) join the gathers and write their own optimizer / parameter shards."""
        if not self.actor.sharded:
            return
        self.actor.full_state_dict()
        self.actor.save_state(out_dir / "actor_optim")
        critic = getattr(self, "critic", None)
        if critic is not None:
            critic.full_state_dict()
            critic.save_state(out_dir / "critic_optim")

    def restore(self, in_dir: Path) -> None:
        """Load optimizer, scheduler, RNG and counters saved by :meth:`save` (weights were loaded at build)."""
        self.actor.load_state(in_dir / "actor_optim")
        self._restore_more(in_dir)
        load_rng(in_dir / "rng.pt")
        state = json.loads((in_dir / "trainer.json").read_text())
        self.global_step = int(state["global_step"])
        self.load_extra_state(state)

    def _restore_more(self, in_dir: Path) -> None:
        pass

    def limits(self) -> tuple[int, int | None]:
        """(vocabulary size, longest sequence) this model accepts."""
        config = self.actor.model.config
        return int(config.vocab_size), getattr(config, "max_position_embeddings", None)

    # ---- weights out ------------------------------------------------------------------------------
    def policy_weights(self) -> dict[str, torch.Tensor] | torch.nn.Module:
        """Actor weights under the base model's parameter names for the weight sync: the actor module itself
        where it holds them as they are (the publisher lists a module's tensors from a walk it keeps between
        publishes: ~10x cheaper than building a state dict every time), else a state dict with LoRA merged
        in, gathered where the backend partitions parameters; under FSDP a :class:`ShardedWeights` that the
        publisher gathers bucket by bucket (every rank takes part: call this on every rank)."""
        model = self.actor.model
        if self.actor.lockstep:
            from services.learner.weights.shards import ShardedWeights

            return ShardedWeights(model)
        if not hasattr(model, "merge_and_unload") and not self.actor.partitions_parameters:
            return model
        return self.actor.gathered(lambda: merged_state_dict(model))

    def export(self, out_dir: Path) -> None:
        """A plain HF checkpoint of the actor in ``out_dir``; where the backend shards parameters, gathered from
        every rank (collective: the other ranks call :meth:`export_follower`)."""
        state = self.actor.full_state_dict() if self.actor.partitions_parameters else None
        save_actor_export(self.actor.model, self.tokenizer, out_dir, state_dict=state)

    def export_follower(self) -> None:
        """A follower rank's part of :meth:`export`: the gather, where parameters are sharded."""
        if self.actor.partitions_parameters:
            self.actor.full_state_dict()
