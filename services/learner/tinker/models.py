"""The Tinker API's training models: one slot a model, each with its own ordered worker thread (requests run in
the client's ``seq_id`` order), created, trained (forward/backward, optimizer steps) and unloaded here."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from services.learner.tinker import api
from services.learner.tinker.errors import BadRequest, Full, NotFound
from services.learner.tinker.futures import FutureStore, OrderedWorker
from services.learner.tinker.sessions import Sessions
from services.learner.tinker.settings import TinkerSettings
from services.learner.tinker.wire import ForwardBackwardCall, encode_forward_backward_output
from shared.service_kit.errors import ServiceError

log = logging.getLogger(__name__)


@dataclass
class ModelSlot:
    spec: Any  # trainer.ModelSpec
    worker: OrderedWorker
    model: Any = None  # trainer.TinkerModel once loaded
    ephemeral: list[Path] = field(default_factory=list)


class TrainingModels:
    def __init__(self, settings: TinkerSettings, futures: FutureStore, sessions: Sessions) -> None:
        self.settings = settings
        self.futures = futures
        self.sessions = sessions
        self.slots: dict[str, ModelSlot] = {}

    def __iter__(self) -> Iterator[str]:
        return iter(self.slots)

    async def stop(self) -> None:
        for slot in self.slots.values():
            await slot.worker.close()

    def drop_session(self, session: str) -> list[str]:
        """The session ended: its models go (a busy worker finishes the request it runs, then closes)."""
        dropped = []
        for model_id in [m for m in self.slots if m.startswith(f"{session}:")]:
            slot = self.slots.pop(model_id)
            if slot.worker.running is None and not slot.worker.queued():
                slot.worker.executor.shutdown(wait=False)
                slot.worker.close_nowait()
            dropped.append(model_id)
        return dropped

    def check_base(self, base_model: str) -> None:
        names = self.settings.served_names()
        if base_model not in names and str(Path(base_model).resolve()) not in names:
            raise BadRequest(f"base_model {base_model!r} is not served here; this server trains "
                             f"{self.settings.public_name()!r} (see get_server_capabilities)")

    def slot(self, model_id: str) -> ModelSlot:
        slot = self.slots.get(model_id)
        if slot is None:
            raise NotFound(f"model {model_id!r} is unknown; create it with create_lora_training_client")
        return slot

    def new_slot(self, model_id: str, spec: Any) -> ModelSlot:
        if model_id in self.slots:
            raise BadRequest(f"model {model_id!r} exists already (model_seq_id reused)")
        if len(self.slots) >= self.settings.max_models:
            self.sessions.reap()
        if len(self.slots) >= self.settings.max_models:
            raise Full(f"this server holds {self.settings.max_models} training models (max_models); "
                       "end another session's models first")
        slot = ModelSlot(spec=spec, worker=OrderedWorker(model_id, self.futures, self.settings.seq_gap_timeout_s))
        self.slots[model_id] = slot
        return slot

    def build(self, spec: Any) -> Any:
        from services.learner.tinker.trainer import TinkerModel

        s = self.settings
        return TinkerModel(spec, s.base_model, device=s.device, dtype=s.dtype, lora_alpha=s.lora_alpha,
                           micro_batch_size=s.micro_batch_size)

    def load(self, model_id: str, spec: Any, then: Callable[[Any], None] | None, reply: dict) -> str:
        """Queue the building of a new model (and ``then(model)``, e.g. loading a checkpoint into it) as the first
        request of its slot; a build that fails leaves no slot behind."""
        slot = self.new_slot(model_id, spec)

        def job() -> dict:
            try:
                slot.model = self.build(spec)
                if then is not None:
                    then(slot.model)
            except BaseException:
                self.slots.pop(model_id, None)
                raise
            return reply

        request_id = self.futures.create()
        slot.worker.submit(request_id, 0, job)
        return request_id

    def create(self, req: api.CreateModel) -> tuple[str, str]:
        from services.learner.tinker.trainer import ModelSpec

        self.sessions.require(req.session_id)
        self.check_base(req.base_model)
        if req.optimizer_config and req.optimizer_config.get("type", "adamw") != "adamw":
            raise BadRequest(f"optimizer {req.optimizer_config.get('type')!r} is not served; only adamw")
        lora = req.lora_config
        if lora is not None and lora.rank > self.settings.max_lora_rank:
            raise BadRequest(f"lora rank {lora.rank} is above this server's max_lora_rank {self.settings.max_lora_rank}")
        spec = ModelSpec(base_model=self.settings.base_model, lora_rank=lora.rank if lora else None,
                         train_attn=lora.train_attn if lora else True, train_mlp=lora.train_mlp if lora else True,
                         train_unembed=lora.train_unembed if lora else True,
                         seed=lora.seed if lora and lora.seed is not None else self.settings.seed)
        model_id = f"{req.session_id}:train:{req.model_seq_id}"
        return self.load(model_id, spec, None, {"model_id": model_id, "type": "create_model"}), model_id

    def unload(self, model_id: str) -> None:
        slot = self.slots.pop(model_id, None)
        if slot is None:
            raise NotFound(f"model {model_id!r} is unknown")
        slot.worker.close_nowait()
        slot.worker.executor.shutdown(wait=False, cancel_futures=True)
        log.info("model %s unloaded", model_id)

    def info(self, model_id: str) -> dict:
        slot = self.slot(model_id)
        s = self.settings
        return {"type": "get_info", "model_id": model_id, "is_lora": slot.spec.lora_rank is not None,
                "lora_rank": slot.spec.lora_rank, "model_name": s.public_name(),
                "model_data": {"arch": "causal-lm", "model_name": s.public_name(),
                               "tokenizer_id": str(Path(s.base_model).resolve())}}

    def run(self, model_id: str, seq_id: int | None, fn: Callable[[ModelSlot], Any]) -> str:
        """Queue ``fn(slot)`` on the model's worker at ``seq_id``; returns the future's request id."""
        slot = self.slot(model_id)
        request_id = self.futures.create()

        def job():
            if slot.model is None:
                raise BadRequest(f"model {model_id!r} failed to load; create it again")
            return fn(slot)

        slot.worker.submit(request_id, seq_id, job)
        return request_id

    @contextmanager
    def door(self, model_id: str | None, seq_id: int | None):
        """Checks before a request is queued: one refused (4xx) still uses its seq_id on a known model."""
        try:
            yield
        except ServiceError:
            slot = self.slots.get(model_id or "")
            if slot is not None:
                slot.worker.skip(seq_id)
            raise

    def forward_backward(self, call: ForwardBackwardCall) -> str:
        with self.door(call.model_id, call.seq_id):
            self._check_forward_backward(call)

        def fn(slot: ModelSlot) -> bytes:
            outputs, metrics = slot.model.forward_backward(call.data, call.loss_fn, call.loss_fn_config,
                                                           call.forward_only)
            return encode_forward_backward_output(outputs, metrics)

        return self.run(call.model_id, call.seq_id, fn)

    def _check_forward_backward(self, call: ForwardBackwardCall) -> None:
        from services.learner.tinker.losses import lookup

        if not call.data:
            raise BadRequest("forward_backward: no data")
        if len(call.data) > self.settings.max_datums:
            raise BadRequest(f"{len(call.data)} datums in one request; at most {self.settings.max_datums} "
                             "(max_datums)", status=413)
        lookup(call.loss_fn, call.loss_fn_config)  # a bad loss name is a 400 now, not a failed future

    def optim_step(self, req: api.OptimStep) -> str:
        from services.learner.tinker.trainer import AdamStep

        p = req.adam_params
        step = AdamStep(p.learning_rate, p.beta1, p.beta2, p.eps, p.weight_decay, p.grad_clip_norm)
        return self.run(req.model_id, req.seq_id,
                        lambda slot: {"type": "optim_step", "metrics": slot.model.optim_step(step)})
