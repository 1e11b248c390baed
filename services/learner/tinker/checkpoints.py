"""The Tinker API's checkpoints: ``tinker://<model_id>/weights/<name>`` (training state: weights and optimizer)
and ``tinker://<model_id>/sampler_weights/<name>`` (weights to sample from, published to the rollout fleet when
there is one), as directories under ``<run_dir>/checkpoints``; paths from a client are checked, never trusted."""

from __future__ import annotations

import asyncio
import logging
import re
import shutil
import uuid
from pathlib import Path

from services.learner.tinker import api
from services.learner.tinker.errors import BadRequest, NotFound
from services.learner.tinker.models import ModelSlot, TrainingModels
from services.learner.tinker.sampling import Sampling
from services.learner.tinker.settings import TinkerSettings

log = logging.getLogger(__name__)

NAME = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
MODEL_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,300}$")
KINDS = ("weights", "sampler_weights")


class Checkpoints:
    def __init__(self, settings: TinkerSettings, models: TrainingModels, sampling: Sampling) -> None:
        self.settings = settings
        self.root = Path(settings.run_dir) / "checkpoints"
        self.models = models
        self.sampling = sampling
        self.loop: asyncio.AbstractEventLoop | None = None  # the service's, from start()

    def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.root.mkdir(parents=True, exist_ok=True)

    # ---- paths --------------------------------------------------------------------------------------
    def dir(self, model_id: str, kind: str, name: str) -> Path:
        return self.root / model_id.replace(":", "_") / kind / name

    def resolve(self, path: str, kind: str) -> Path:
        """``tinker://<model_id>/<kind>/<name>`` -> the checkpoint directory (which must exist)."""
        if not path.startswith("tinker://"):
            raise BadRequest(f"path {path!r}: expected tinker://<model_id>/{kind}/<name>")
        parts = path.removeprefix("tinker://").split("/")
        if len(parts) != 3 or parts[1] != kind or not MODEL_ID.match(parts[0]) or not NAME.match(parts[2]) \
                or parts[2] in (".", ".."):
            raise BadRequest(f"path {path!r}: expected tinker://<model_id>/{kind}/<name>")
        out = self.dir(parts[0], kind, parts[2])
        if not out.is_dir():
            raise NotFound(f"path {path!r}: no such checkpoint on this server")
        return out

    @staticmethod
    def name(name: str | None) -> str:
        if name is None or not NAME.match(name) or name in (".", ".."):
            raise BadRequest(f"checkpoint name {name!r}: use 1-128 of A-Z a-z 0-9 _ . -")
        return name

    def sampler_dir(self, model_path: str | None, base_model: str | None) -> Path:
        """What a sampling request samples from: a sampler checkpoint, or the base model."""
        if model_path:
            return self.resolve(model_path, "sampler_weights")
        if base_model:
            self.models.check_base(base_model)
            return Path(self.settings.base_model)
        raise BadRequest("give model_path or base_model")

    # ---- training state ------------------------------------------------------------------------------
    def save_state(self, req: api.SaveWeights) -> str:
        with self.models.door(req.model_id, req.seq_id):
            name = self.name(req.path if req.path is not None else f"state-{req.seq_id}")
            out = self.dir(req.model_id, "weights", name)
            if out.exists():
                raise BadRequest(f"checkpoint {name!r} exists already for this model; pick another name")

        def fn(slot: ModelSlot) -> dict:
            slot.model.save_state(out)
            return {"type": "save_weights", "path": f"tinker://{req.model_id}/weights/{name}"}

        return self.models.run(req.model_id, req.seq_id, fn)

    def load_state(self, req: api.LoadWeights) -> tuple[str, str]:
        from services.learner.tinker.trainer import read_spec

        with self.models.door(req.model_id, req.seq_id):
            src = self.resolve(req.path, "weights")
        if req.model_id is not None:  # onto an existing model
            def fn(slot: ModelSlot) -> dict:
                slot.model.load_state(src, req.optimizer)
                return {"type": "load_weights", "path": req.path, "model_id": req.model_id}

            return self.models.run(req.model_id, req.seq_id, fn), req.model_id
        if req.session_id is None or req.model_seq_id is None:
            raise BadRequest("load_weights: give model_id and seq_id, or session_id and model_seq_id")
        self.models.sessions.require(req.session_id)
        spec = read_spec(src)
        model_id = f"{req.session_id}:train:{req.model_seq_id}"
        reply = {"type": "load_weights", "path": req.path, "model_id": model_id}
        return self.models.load(model_id, spec, lambda model: model.load_state(src, req.optimizer), reply), model_id

    def weights_info(self, tinker_path: str) -> dict:
        """What a save_state checkpoint was made from (the cookbook reads it before resuming)."""
        from services.learner.tinker.trainer import read_spec

        spec = read_spec(self.resolve(tinker_path, "weights"))
        return {"base_model": self.settings.public_name(), "is_lora": spec.lora_rank is not None,
                "lora_rank": spec.lora_rank, "train_unembed": spec.train_unembed, "train_mlp": spec.train_mlp,
                "train_attn": spec.train_attn}

    # ---- weights for the sampler ---------------------------------------------------------------------
    def save_for_sampler(self, req: api.SaveWeights) -> str:
        named = req.path is not None
        with self.models.door(req.model_id, req.seq_id):
            name = self.name(req.path if named else f"ephemeral-{req.seq_id}-{uuid.uuid4().hex[:8]}")
            out = self.dir(req.model_id, "sampler_weights", name)
            if named and out.exists():
                raise BadRequest(f"sampler checkpoint {name!r} exists already for this model; pick another name")
            if not named and req.sampling_session_seq_id is None:
                raise BadRequest("save_weights_for_sampler: give a path (name) or a sampling_session_seq_id")

        def fn(slot: ModelSlot) -> dict:
            slot.model.export_for_sampler(out, self.settings.base_model)
            path = f"tinker://{req.model_id}/sampler_weights/{name}"
            version = self._publish(slot, path)
            reply: dict = {"type": "save_weights_for_sampler", "path": path}
            if not named:
                session = req.model_id.split(":train:")[0]
                assert req.sampling_session_seq_id is not None  # checked at the door
                reply["sampling_session_id"] = self.sampling.add_session(session, req.sampling_session_seq_id, out,
                                                                         path, version)
                slot.ephemeral.append(out)
                while len(slot.ephemeral) > 2 * self.settings.samplers_cached:
                    shutil.rmtree(slot.ephemeral.pop(0), ignore_errors=True)
            return reply

        return self.models.run(req.model_id, req.seq_id, fn)

    def _publish(self, slot: ModelSlot, path: str) -> int | None:
        """On the model's worker thread: publish its weights to the rollout fleet and wait for the round, so the
        next training step cannot change them under the publish: a LoRA model's adapter only (an adapter round;
        the merged model where a replica cannot load adapters, or base weights train too). None: no fleet, or it
        failed (then this sampler's samples run in the learner, from the checkpoint just written)."""
        rollout = self.sampling.rollout
        if rollout is None or self.loop is None:
            return None
        from services.learner.tinker.rollout import RolloutUnavailable
        from services.learner.training.models import adapter_weights, merged_state_dict

        weights = adapter_weights(slot.model.model) or merged_state_dict(slot.model.model)
        done = asyncio.run_coroutine_threadsafe(rollout.publish(weights), self.loop)
        try:
            version = done.result(timeout=self._publish_timeout())
        except (RolloutUnavailable, TimeoutError) as exc:
            done.cancel()
            log.warning("%s: %s; its samples run in the learner", path, exc)
            return None
        self.sampling.path_versions[path] = version
        return version

    def _publish_timeout(self) -> float:
        w = self.settings.weight_sync
        return w.init_timeout_s + w.max_attempts * (w.collective_timeout_s + w.load_timeout_s) + 60.0
