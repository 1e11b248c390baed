"""TinkerService: the one object behind the Tinker routes — sessions, training models (each on its own ordered
worker thread), sampler checkpoints and sampling (one worker thread), and the futures the client polls."""

from __future__ import annotations

import asyncio
import logging
import re
import shutil
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from services.learner.tinker import api
from services.learner.tinker.errors import BadRequest, Full, NotFound
from services.learner.tinker.futures import CompletionLog, FutureStore, OrderedWorker
from services.learner.tinker.settings import TinkerSettings
from services.learner.tinker.wire import (
    ForwardBackwardCall,
    encode_forward_backward_output,
    encode_sample_response,
)
from shared.service_kit.errors import ServiceError

log = logging.getLogger(__name__)

NAME = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
MODEL_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,300}$")
KINDS = ("weights", "sampler_weights")
FINISHED_KEPT = 10_000  # ended session ids remembered, so that a repeated finish is answered the same


@dataclass
class ModelSlot:
    spec: Any  # trainer.ModelSpec
    worker: OrderedWorker
    model: Any = None  # trainer.TinkerModel once loaded
    ephemeral: list[Path] = field(default_factory=list)


class TinkerService:
    def __init__(self, settings: TinkerSettings) -> None:
        self.settings = settings
        self.run_dir = Path(settings.run_dir)
        self.futures = FutureStore(settings.future_ttl_s)
        self.sessions: dict[str, float] = {}
        self.finished: dict[str, None] = {}  # the last FINISHED_KEPT ended sessions, oldest first
        self.models: dict[str, ModelSlot] = {}
        self.sampling_sessions: dict[str, Path] = {}
        self.sampler_paths: dict[str, str | None] = {}
        self.sampler_worker: OrderedWorker | None = None
        self.samplers = None
        self.started = time.time()
        self.rollout = None  # RolloutSampling when rollout_urls are set (sampling on the rollout fleet)
        self.path_versions: dict[str, int] = {}  # sampler path -> the weight version published for it
        self.session_versions: dict[str, int | None] = {}  # sampling session -> its weights' version
        self.samples_in_learner = 0
        self.loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task] = set()
        self.completions = CompletionLog()  # retrieve_futures: finished samples per sampling session and clone
        self._poll_keys: dict[str, tuple[str, int]] = {}  # sample request -> its poll target
        self.polls = 0  # retrieve_futures calls answered
        self.clones: dict[str, int] = {}  # join_sampling_session: the last client_counter given per session
        self.futures.listener = self._settled

    async def start(self) -> None:
        if self.settings.torch_threads:
            import torch

            torch.set_num_threads(self.settings.torch_threads)
        from services.learner.tinker.sampler import SamplerCache

        self.samplers = SamplerCache(self.settings.samplers_cached, self.settings.device, self.settings.dtype)
        self.sampler_worker = OrderedWorker("sampler", self.futures, self.settings.seq_gap_timeout_s)
        self.loop = asyncio.get_running_loop()
        if self.settings.rollout_urls:
            from services.learner.tinker.rollout import RolloutSampling

            self.rollout = RolloutSampling(self.settings)
            await self.rollout.start()
        (self.run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)

    async def stop(self) -> None:
        for slot in self.models.values():
            await slot.worker.close()
        if self.sampler_worker is not None:
            await self.sampler_worker.close()
        if self.rollout is not None:
            await self.rollout.stop()

    # ---- sessions -----------------------------------------------------------------------------------
    def client_config(self) -> dict:
        poller = self.settings.sample_poller
        return {"pjwt_auth_enabled": False, "credential_default_source": "api_key", "parallel_fwdbwd_chunks": False,
                "proto_compress_fwdbwd": False, "fwdbwd_max_chunk_len": self.settings.max_datums,
                "use_pyqwest_transport": False, "sample_use_retrieve_futures": poller,
                "custom_loss_server_side": False, "sample_join_sampling_session": poller}

    def dynamic_config(self) -> dict:
        return {"refresh_interval_sec": 300, "sample_cancel_enabled": True, "sample_cancel_max_batch_size": 64}

    def cancel(self, request_id: str) -> None:
        """cancel_future: the request is dropped; one not started does not run (one running runs to its end)."""
        self.futures.forget(request_id)
        self._poll_keys.pop(request_id, None)

    def unload_model(self, model_id: str) -> None:
        slot = self.models.pop(model_id, None)
        if slot is None:
            raise NotFound(f"model {model_id!r} is unknown")
        slot.worker.close_nowait()
        slot.worker.executor.shutdown(wait=False, cancel_futures=True)
        log.info("model %s unloaded", model_id)

    def join_sampling_session(self, sampling_session_id: str) -> int:
        if sampling_session_id not in self.sampling_sessions:
            raise NotFound(f"sampling session {sampling_session_id!r} is unknown")
        self.clones[sampling_session_id] = self.clones.get(sampling_session_id, 0) + 1
        return self.clones[sampling_session_id]

    async def retrieve_futures(self, req: api.RetrieveFutures) -> dict:
        sid = req.target.sampling_session_id
        if sid not in self.sampling_sessions:
            raise NotFound(f"sampling session {sid!r} is unknown")
        for rid in req.retrieved_request_ids:
            self.futures.forget(rid)
        wait = self.settings.long_poll_s if req.timeout is None else min(req.timeout, self.settings.long_poll_s)
        self.polls += 1
        completions, cursor = await self.completions.read((sid, req.target.cloned_sampler_id), req.prev_cursor, wait)
        return {"completions": completions, "cursor": cursor}

    def _settled(self, request_id: str, entry: Any) -> None:
        key = self._poll_keys.pop(request_id, None)
        if key is not None:
            self.completions.add(key, request_id, entry)

    def create_session(self) -> str:
        session_id = f"fleetrl-{uuid.uuid4().hex[:16]}"
        self.sessions[session_id] = time.monotonic()
        return session_id

    def heartbeat(self, session_id: str) -> None:
        if session_id not in self.sessions:
            raise NotFound(f"session {session_id!r} is unknown (the server restarted?); create a new ServiceClient")
        self.sessions[session_id] = time.monotonic()

    def finish_session(self, session_id: str, status: str, detail: str | None) -> None:
        """``ServiceClient.close(status)``: end the session now. The first finish wins; finishing it again is a
        no-op, so a client that retries its close is answered the same."""
        if session_id in self.finished:
            return
        if session_id not in self.sessions:
            raise NotFound(f"session {session_id!r} is unknown (the server restarted?)")
        self._end_session(session_id, f"finished by its client ({status}{': ' + detail if detail else ''})")

    def _reap(self) -> None:
        """End the sessions whose client stopped beating: drop their models and sampling sessions."""
        now = time.monotonic()
        for session in [s for s, seen in self.sessions.items() if now - seen > self.settings.session_timeout_s]:
            self._end_session(session, f"no heartbeat for {self.settings.session_timeout_s:.0f}s")

    def _end_session(self, session: str, why: str) -> None:
        del self.sessions[session]
        self.finished[session] = None
        while len(self.finished) > FINISHED_KEPT:
            self.finished.pop(next(iter(self.finished)))
        dropped = []
        for model_id in [m for m in self.models if m.startswith(f"{session}:")]:
            slot = self.models.pop(model_id)
            if slot.worker.running is None and not slot.worker.queued():
                slot.worker.executor.shutdown(wait=False)
                slot.worker.close_nowait()
            dropped.append(model_id)
        for sid in [s for s in self.sampling_sessions if s.startswith(f"{session}:")]:
            del self.sampling_sessions[sid]
            self.sampler_paths.pop(sid, None)
            self.clones.pop(sid, None)
            self.completions.drop(sid)
            self.session_versions.pop(sid, None)
            dropped.append(sid)
        log.info("session %s ended (%s): dropped %s", session, why, ", ".join(dropped) or "nothing")

    def capabilities(self) -> dict:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(self.settings.base_model)
        return {"supported_models": [{"model_name": self.settings.public_name(), "trainable": True,
                                      "sampleable": True,
                                      "max_context_length": getattr(config, "max_position_embeddings", None)}]}

    # ---- models -------------------------------------------------------------------------------------
    def _session(self, session_id: str) -> None:
        if session_id not in self.sessions:
            raise NotFound(f"session {session_id!r} is unknown; create a session first")

    def _base(self, base_model: str) -> None:
        names = self.settings.served_names()
        if base_model not in names and str(Path(base_model).resolve()) not in names:
            raise BadRequest(f"base_model {base_model!r} is not served here; this server trains "
                             f"{self.settings.public_name()!r} (see get_server_capabilities)")

    def _slot(self, model_id: str) -> ModelSlot:
        slot = self.models.get(model_id)
        if slot is None:
            raise NotFound(f"model {model_id!r} is unknown; create it with create_lora_training_client")
        return slot

    def _new_slot(self, model_id: str, spec: Any) -> ModelSlot:
        if model_id in self.models:
            raise BadRequest(f"model {model_id!r} exists already (model_seq_id reused)")
        if len(self.models) >= self.settings.max_models:
            self._reap()
        if len(self.models) >= self.settings.max_models:
            raise Full(f"this server holds {self.settings.max_models} training models (max_models); "
                       "end another session's models first")
        slot = ModelSlot(spec=spec, worker=OrderedWorker(model_id, self.futures, self.settings.seq_gap_timeout_s))
        self.models[model_id] = slot
        return slot

    def _build(self, spec: Any) -> Any:
        from services.learner.tinker.trainer import TinkerModel

        s = self.settings
        return TinkerModel(spec, s.base_model, device=s.device, dtype=s.dtype, lora_alpha=s.lora_alpha,
                           micro_batch_size=s.micro_batch_size)

    def create_model(self, req: api.CreateModel) -> tuple[str, str]:
        from services.learner.tinker.trainer import ModelSpec

        self._session(req.session_id)
        self._base(req.base_model)
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
        slot = self._new_slot(model_id, spec)

        def job() -> dict:
            try:
                slot.model = self._build(spec)
            except BaseException:
                self.models.pop(model_id, None)
                raise
            return {"model_id": model_id, "type": "create_model"}

        request_id = self.futures.create()
        slot.worker.submit(request_id, 0, job)
        return request_id, model_id

    def get_info(self, model_id: str) -> dict:
        slot = self._slot(model_id)
        s = self.settings
        return {"type": "get_info", "model_id": model_id, "is_lora": slot.spec.lora_rank is not None,
                "lora_rank": slot.spec.lora_rank, "model_name": s.public_name(),
                "model_data": {"arch": "causal-lm", "model_name": s.public_name(),
                               "tokenizer_id": str(Path(s.base_model).resolve())}}

    def _run(self, model_id: str, seq_id: int | None, fn) -> str:
        slot = self._slot(model_id)
        request_id = self.futures.create()

        def job():
            if slot.model is None:
                raise BadRequest(f"model {model_id!r} failed to load; create it again")
            return fn(slot)

        slot.worker.submit(request_id, seq_id, job)
        return request_id

    @contextmanager
    def _door(self, model_id: str | None, seq_id: int | None):
        """Checks before a request is queued: one refused (4xx) still uses its seq_id on a known model."""
        try:
            yield
        except ServiceError:
            slot = self.models.get(model_id or "")
            if slot is not None:
                slot.worker.skip(seq_id)
            raise

    def forward_backward(self, call: ForwardBackwardCall) -> str:
        with self._door(call.model_id, call.seq_id):
            self._check_forward_backward(call)

        def fn(slot: ModelSlot) -> bytes:
            outputs, metrics = slot.model.forward_backward(call.data, call.loss_fn, call.loss_fn_config,
                                                           call.forward_only)
            return encode_forward_backward_output(outputs, metrics)

        return self._run(call.model_id, call.seq_id, fn)

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
        return self._run(req.model_id, req.seq_id,
                         lambda slot: {"type": "optim_step", "metrics": slot.model.optim_step(step)})

    # ---- checkpoints --------------------------------------------------------------------------------
    def _dir(self, model_id: str, kind: str, name: str) -> Path:
        return self.run_dir / "checkpoints" / model_id.replace(":", "_") / kind / name

    def _resolve(self, path: str, kind: str) -> Path:
        """``tinker://<model_id>/<kind>/<name>`` -> the checkpoint directory (which must exist)."""
        if not path.startswith("tinker://"):
            raise BadRequest(f"path {path!r}: expected tinker://<model_id>/{kind}/<name>")
        parts = path.removeprefix("tinker://").split("/")
        if len(parts) != 3 or parts[1] != kind or not MODEL_ID.match(parts[0]) or not NAME.match(parts[2]) \
                or parts[2] in (".", ".."):
            raise BadRequest(f"path {path!r}: expected tinker://<model_id>/{kind}/<name>")
        out = self._dir(parts[0], kind, parts[2])
        if not out.is_dir():
            raise NotFound(f"path {path!r}: no such checkpoint on this server")
        return out

    def _name(self, name: str | None) -> str:
        if name is None or not NAME.match(name) or name in (".", ".."):
            raise BadRequest(f"checkpoint name {name!r}: use 1-128 of A-Z a-z 0-9 _ . -")
        return name

    def save_state(self, req: api.SaveWeights) -> str:
        with self._door(req.model_id, req.seq_id):
            name = self._name(req.path if req.path is not None else f"state-{req.seq_id}")
            out = self._dir(req.model_id, "weights", name)
            if out.exists():
                raise BadRequest(f"checkpoint {name!r} exists already for this model; pick another name")

        def fn(slot: ModelSlot) -> dict:
            slot.model.save_state(out)
            return {"type": "save_weights", "path": f"tinker://{req.model_id}/weights/{name}"}

        return self._run(req.model_id, req.seq_id, fn)

    def load_state(self, req: api.LoadWeights) -> tuple[str, str]:
        from services.learner.tinker.trainer import read_spec

        with self._door(req.model_id, req.seq_id):
            src = self._resolve(req.path, "weights")
        if req.model_id is not None:  # onto an existing model
            def fn(slot: ModelSlot) -> dict:
                slot.model.load_state(src, req.optimizer)
                return {"type": "load_weights", "path": req.path, "model_id": req.model_id}

            return self._run(req.model_id, req.seq_id, fn), req.model_id
        if req.session_id is None or req.model_seq_id is None:
            raise BadRequest("load_weights: give model_id and seq_id, or session_id and model_seq_id")
        self._session(req.session_id)
        spec = read_spec(src)
        model_id = f"{req.session_id}:train:{req.model_seq_id}"
        slot = self._new_slot(model_id, spec)

        def job() -> dict:
            try:
                slot.model = self._build(spec)
                slot.model.load_state(src, req.optimizer)
            except BaseException:
                self.models.pop(model_id, None)
                raise
            return {"type": "load_weights", "path": req.path, "model_id": model_id}

        request_id = self.futures.create()
        slot.worker.submit(request_id, 0, job)
        return request_id, model_id

    def weights_info(self, tinker_path: str) -> dict:
        """What a save_state checkpoint was made from (the cookbook reads it before resuming)."""
        from services.learner.tinker.trainer import read_spec

        spec = read_spec(self._resolve(tinker_path, "weights"))
        return {"base_model": self.settings.public_name(), "is_lora": spec.lora_rank is not None,
                "lora_rank": spec.lora_rank, "train_unembed": spec.train_unembed, "train_mlp": spec.train_mlp,
                "train_attn": spec.train_attn}

    def save_for_sampler(self, req: api.SaveWeights) -> str:
        named = req.path is not None
        with self._door(req.model_id, req.seq_id):
            name = self._name(req.path if named else f"ephemeral-{req.seq_id}-{uuid.uuid4().hex[:8]}")
            out = self._dir(req.model_id, "sampler_weights", name)
            if named and out.exists():
                raise BadRequest(f"sampler checkpoint {name!r} exists already for this model; pick another name")
            if not named and req.sampling_session_seq_id is None:
                raise BadRequest("save_weights_for_sampler: give a path (name) or a sampling_session_seq_id")

        def fn(slot: ModelSlot) -> dict:
            slot.model.export_for_sampler(out, self.settings.base_model)
            version = self._publish_for_sampler(slot, f"tinker://{req.model_id}/sampler_weights/{name}")
            reply: dict = {"type": "save_weights_for_sampler", "path": f"tinker://{req.model_id}/sampler_weights/{name}"}
            if not named:
                session = req.model_id.split(":train:")[0]
                sid = f"{session}:sample:{req.sampling_session_seq_id}:{uuid.uuid4().hex[:8]}"
                self.sampling_sessions[sid] = out
                self.sampler_paths[sid] = reply["path"]
                self.session_versions[sid] = version
                reply["sampling_session_id"] = sid
                slot.ephemeral.append(out)
                while len(slot.ephemeral) > 2 * self.settings.samplers_cached:
                    shutil.rmtree(slot.ephemeral.pop(0), ignore_errors=True)
            return reply

        return self._run(req.model_id, req.seq_id, fn)

    def _publish_for_sampler(self, slot: ModelSlot, path: str) -> int | None:
        """On the model's worker thread: publish its weights (LoRA merged) to the rollout fleet and wait for the
        round, so the next training step cannot change them under the publish. None: no fleet, or it failed
        (then this sampler's samples run in the learner, from the checkpoint just written)."""
        if self.rollout is None:
            return None
        from services.learner.tinker.rollout import RolloutUnavailable
        from services.learner.training.models import merged_state_dict

        weights = merged_state_dict(slot.model.model)
        done = asyncio.run_coroutine_threadsafe(self.rollout.publish(weights), self.loop)
        try:
            version = done.result(timeout=self._publish_timeout())
        except (RolloutUnavailable, TimeoutError) as exc:
            done.cancel()
            log.warning("%s: %s; its samples run in the learner", path, exc)
            return None
        self.path_versions[path] = version
        return version

    def _publish_timeout(self) -> float:
        w = self.settings.weight_sync
        return w.init_timeout_s + w.max_attempts * (w.collective_timeout_s + w.load_timeout_s) + 60.0

    # ---- sampling -----------------------------------------------------------------------------------
    def _sampler_dir(self, model_path: str | None, base_model: str | None) -> Path:
        if model_path:
            return self._resolve(model_path, "sampler_weights")
        if base_model:
            self._base(base_model)
            return Path(self.settings.base_model)
        raise BadRequest("give model_path or base_model")

    def create_sampling_session(self, req: api.CreateSamplingSession) -> str:
        self._session(req.session_id)
        where = self._sampler_dir(req.model_path, req.base_model)
        sid = f"{req.session_id}:sample:{req.sampling_session_seq_id}:{uuid.uuid4().hex[:8]}"
        self.sampling_sessions[sid] = where
        self.sampler_paths[sid] = req.model_path
        self.session_versions[sid] = self.path_versions.get(req.model_path) if req.model_path else 0
        return sid

    def get_sampler(self, sampler_id: str) -> dict:
        if sampler_id not in self.sampling_sessions:
            raise NotFound(f"sampler {sampler_id!r} is unknown")
        return {"sampler_id": sampler_id, "base_model": self.settings.public_name(),
                "model_path": self.sampler_paths.get(sampler_id)}

    def sample(self, req: api.Sample) -> tuple[str, list[str]]:
        from services.learner.tinker.sampler import SampleCall

        s = self.settings
        if req.sampling_session_id is not None:
            where = self.sampling_sessions.get(req.sampling_session_id)
            if where is None:
                raise NotFound(f"sampling session {req.sampling_session_id!r} is unknown")
            version = self.session_versions.get(req.sampling_session_id)
        else:
            where = self._sampler_dir(req.model_path, req.base_model)
            version = self.path_versions.get(req.model_path) if req.model_path else 0
        for name in ("topk_prompt_logprobs", "topk_sample_logprobs", "prompt_alt_tokens_k"):
            if getattr(req, name):
                raise BadRequest(f"{name} is not served yet")
        if req.target_prompt_logprobs is not None or req.prompt_logprobs_last_n is not None:
            raise BadRequest("target_prompt_logprobs / prompt_logprobs_last_n are not served yet")
        if req.num_samples > s.max_num_samples:
            raise BadRequest(f"num_samples {req.num_samples} is above max_num_samples {s.max_num_samples}")
        p = req.sampling_params
        max_tokens = p.max_tokens if p.max_tokens is not None else min(256, s.max_sample_tokens)
        if max_tokens > s.max_sample_tokens:
            raise BadRequest(f"max_tokens {max_tokens} is above max_sample_tokens {s.max_sample_tokens}")
        stop = p.stop
        stop_tokens = tuple(stop) if isinstance(stop, list) and all(isinstance(x, int) for x in stop) else None
        stop_strings = (stop,) if isinstance(stop, str) else \
            tuple(stop) if isinstance(stop, list) and stop_tokens is None else ()
        if stop_tokens is None and isinstance(stop, list) and not stop:
            stop_tokens = ()
        call = SampleCall(prompt=[t for c in req.prompt.chunks for t in c.tokens], num_samples=req.num_samples,
                          max_tokens=max_tokens, temperature=p.temperature, top_k=p.top_k, top_p=p.top_p,
                          seed=p.seed, stop_tokens=stop_tokens, stop_strings=stop_strings,
                          prompt_logprobs=bool(req.prompt_logprobs))
        request_id = self.futures.create()
        if req.sampling_session_id is not None and req.seq_id is not None:
            self._poll_keys[request_id] = (req.sampling_session_id, req.seq_id // 1_000_000_000)
        if self.rollout is not None and version is not None:
            task = asyncio.get_running_loop().create_task(self._sample_on_rollout(request_id, call, version, where))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:
            self._sample_in_learner(request_id, call, where)
        return request_id, [f"{request_id}-{i}" for i in range(req.num_samples)]

    def _sample_in_learner(self, request_id: str, call: Any, where: Path) -> None:
        def job() -> bytes:
            if not where.is_dir():
                raise Full(f"the sampler's weights ({where.name}) are gone: the rollout fleet serves newer "
                           "weights and this server keeps only the last few ephemeral sampler checkpoints; save "
                           "weights for the sampler again")
            self.samples_in_learner += 1
            seqs, prompt_lp = self.samplers.get(where).sample(call)
            return encode_sample_response(seqs, prompt_lp)

        self.sampler_worker.submit(request_id, None, job)

    async def _sample_on_rollout(self, request_id: str, call: Any, version: int, where: Path) -> None:
        from services.learner.tinker.rollout import NoScore, Superseded

        try:
            seqs, prompt_lp = await self.rollout.sample(call, version)
        except (Superseded, NoScore) as exc:  # the fleet moved on (these weights are on disk here), or no /score
            log.info("sample %s: %s; sampled in the learner from %s", request_id, exc, where)
            self._sample_in_learner(request_id, call, where)
            return
        except Exception as exc:  # noqa: BLE001 - recorded on the future (a 4xx as the user's, else the server's)
            err = exc

            def fail() -> bytes:
                raise err

            self.futures.settle(request_id, fail)
            return
        body = encode_sample_response(seqs, prompt_lp)
        self.futures.settle(request_id, lambda: body)

    # ---- futures / status ---------------------------------------------------------------------------
    async def retrieve(self, request_id: str):
        return await self.futures.retrieve(request_id, self.settings.long_poll_s)

    def status(self) -> dict:
        sampling = self.rollout.status() if self.rollout is not None else {"sampler": "learner"}
        return {"sessions": len(self.sessions), "models": sorted(self.models), "pending": self.futures.pending(),
                "sampling_sessions": len(self.sampling_sessions), "uptime_s": round(time.time() - self.started, 1),
                "sampling": {**sampling, "samples_in_learner": self.samples_in_learner,
                             "retrieve_futures_polls": self.polls, "joined_clones": sum(self.clones.values())}}


async def run_blocking(fn, *args):
    """Parsing a large body off the event loop."""
    return await asyncio.to_thread(fn, *args)
