"""What the RL and SFT trainers share: device, tokenizer, the actor engine, save / restore."""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from services.learner.settings import LearnerSettings
from services.learner.training import sharded_state
from services.learner.training.backends import (
    TrainEngine,
    build_engine,
    prepare_frozen_model,
    resolve_backend,
)
from services.learner.training.backends.base import M
from services.learner.training.models import (
    HFModel,
    adapter_weights,
    hf_base,
    is_peft,
    load_actor,
    load_tokenizer,
    merged_state_dict,
    resolve_device,
    save_actor_export,
)
from services.learner.training.precision import resolve_precision
from services.learner.training.rng import load_rng, save_rng, seed_everything

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from services.learner.weights.adapter import AdapterWeights
    from services.learner.weights.shards import ShardedWeights
    from shared.schemas import Experience

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
        log.info("torch threads: %d intra-op, %d inter-op, on %d cores", torch.get_num_threads(),
                 torch.get_num_interop_threads(), len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count())
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
    def _build_actor(self, resume_dir: Path | None) -> TrainEngine[HFModel]:
        m = self.settings.model
        if resume_dir is None or sharded_state.is_sharded_checkpoint(resume_dir):  # shards loaded in restore()
            model = load_actor(m, self.device)
        elif m.lora is not None:  # base weights from the original directory, adapters from the checkpoint
            model = load_actor(m, self.device, adapter_dir=str(resume_dir / "actor"))
        else:
            model = load_actor(m.model_copy(update={"actor": str(resume_dir / "actor")}), self.device)
        return self._engine(model, self.settings.optim.actor_lr)

    def _engine(self, model: M, lr: float) -> TrainEngine[M]:
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

    def batch_scores(self, experiences: Sequence[Experience]) -> list[float]:
        """The scores of a whole step batch as a step on one rank would see them, for the owner of N ranks to
        hand every rank (``train_step``'s ``batch_scores``): the rewards, unless the trainer shapes them."""
        return [float(e.reward) for e in experiences]

    def engines(self) -> dict[str, TrainEngine]:
        """The trainable engines by name (checkpointed together)."""
        return {"actor": self.actor}

    @property
    def sharded_checkpoints(self) -> bool:
        """Checkpoints are DCP shards (:mod:`.sharded_state`), written by every rank, readable on any number of
        ranks; else (DeepSpeed) HF weights from rank 0 plus the backend's own optimizer files."""
        return all(sharded_state.supports(e) for e in self.engines().values())

    def save(self, out_dir: Path) -> None:
        """Write the complete training state into ``out_dir`` (a fresh directory). Collective where the checkpoint
        is sharded: the other ranks call :meth:`save_follower` meanwhile."""
        out_dir.mkdir(parents=True, exist_ok=True)
        actor_dir = out_dir / "actor"
        if self.sharded_checkpoints:  # the model's config and tokenizer beside the shards: what export builds from
            sharded_state.save(self.engines(), out_dir, self.settings.model.model_dump(mode="json"))
            self._base_model(self.actor.model).config.save_pretrained(actor_dir)
        else:
            self.actor.model.save_pretrained(str(actor_dir), state_dict=self.actor.full_state_dict(),
                                             safe_serialization=True)
            self.actor.save_state(out_dir / "actor_optim")
            self._save_more(out_dir)
        self.tokenizer.save_pretrained(actor_dir)
        save_rng(out_dir / "rng.pt")
        (out_dir / "trainer.json").write_text(json.dumps({"global_step": self.global_step, **self.extra_state()}))

    @staticmethod
    def _base_model(model: HFModel) -> PreTrainedModel:
        return hf_base(model) if is_peft(model) else model

    def _save_more(self, out_dir: Path) -> None:
        pass

    def save_follower(self, out_dir: Path) -> None:
        """A follower rank's part of :meth:`save` (rank 0 writes the rest): its DCP shards; DeepSpeed joins the
        gathers and writes its own optimizer / parameter shards."""
        if self.sharded_checkpoints:
            sharded_state.save(self.engines(), out_dir)
            return
        for name, engine in self.engines().items():  # DeepSpeed: the gathers, then this rank's own files
            engine.full_state_dict()
            engine.save_state(out_dir / f"{name}_optim")

    def restore(self, in_dir: Path) -> None:
        """Load optimizer, scheduler, RNG and counters saved by :meth:`save` (a sharded checkpoint's weights too;
        an older full-weights one had its weights loaded at build). Collective for a sharded checkpoint."""
        if sharded_state.is_sharded_checkpoint(in_dir):
            if not self.sharded_checkpoints:
                raise ValueError(f"{in_dir} is a sharded (DCP) checkpoint; backend {self.backend.name} "
                                 "cannot read it: resume with backend torch or fsdp")
            meta = sharded_state.load(self.engines(), in_dir)
            log.info("resumed the sharded checkpoint %s (written by %d rank(s))", in_dir, meta.get("world_size", 1))
        else:
            if self.actor.dcp_checkpoints and self.actor.shards_parameters:
                raise ValueError(f"{in_dir} is an older full-state checkpoint; backend {self.backend.name} reads "
                                 "sharded ones only: resume it once on one rank with backend torch (its next "
                                 "checkpoint is sharded)")
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
    def policy_weights(self) -> dict[str, torch.Tensor] | torch.nn.Module | AdapterWeights | ShardedWeights:
        """Actor weights under the base model's parameter names for the weight sync: the actor module itself
        where it holds them as they are (the publisher lists a module's tensors from a walk it keeps between
        publishes: ~10x cheaper than building a state dict every time); with LoRA the adapter
        (:class:`~services.learner.weights.adapter.AdapterWeights`: an adapter round, or the merged model for a
        fleet with a replica that cannot load adapters), else a state dict with LoRA merged in, gathered where
        the backend partitions parameters; under FSDP a :class:`ShardedWeights` that the publisher gathers bucket
        by bucket (every rank takes part: call this on every rank)."""
        model = self.actor.model
        if self.actor.dtensor_parameters:
            from services.learner.weights.shards import ShardedWeights

            return ShardedWeights(model)
        if not hasattr(model, "merge_and_unload") and not self.actor.shards_parameters:
            return model
        if not self.actor.shards_parameters and (adapter := adapter_weights(model)) is not None:
            return adapter
        return self.actor.gathered(lambda: merged_state_dict(model))

    def export(self, out_dir: Path, checkpoint: Path | None = None) -> None:
        """The policy as a plain HF directory (rank 0 only). Where the backend shards parameters it is read from
        ``checkpoint`` (the run's last checkpoint, written at this step: every rank's shards, read in this
        process; what ``fleetrl export`` does), never gathered from the live ranks."""
        if self.actor.shards_parameters:
            if checkpoint is None:
                raise ValueError(f"backend {self.backend.name} shards the weights over ranks: the export is read "
                                 "from a checkpoint, and none was given (pass a step-* checkpoint, or run "
                                 "fleetrl export RUN_DIR --out DIR)")
            from services.learner.training.export_checkpoint import export_checkpoint

            export_checkpoint(Path(checkpoint) / "trainer", out_dir)
            return
        save_actor_export(self.actor.model, self.tokenizer, out_dir)
