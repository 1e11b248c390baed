"""TinkerService: the one object behind the Tinker routes, a small façade over four parts that each own their
state: :class:`~.sessions.Sessions` (client sessions and heartbeats), :class:`~.models.TrainingModels` (training
models, each on its own ordered worker thread), :class:`~.checkpoints.Checkpoints` (``tinker://`` paths, training
state and sampler weights) and :class:`~.sampling.Sampling` (sampling sessions and samples, on the rollout fleet
or in the learner); plus the futures the client polls."""

from __future__ import annotations

import asyncio
import time

from services.learner.tinker import api
from services.learner.tinker.checkpoints import Checkpoints
from services.learner.tinker.errors import NotFound
from services.learner.tinker.futures import FutureStore
from services.learner.tinker.models import TrainingModels
from services.learner.tinker.sampling import Sampling
from services.learner.tinker.sessions import Sessions
from services.learner.tinker.settings import TinkerSettings
from services.learner.tinker.wire import ForwardBackwardCall


class TinkerService:
    def __init__(self, settings: TinkerSettings) -> None:
        self.settings = settings
        self.futures = FutureStore(settings.future_ttl_s)
        self.sampling = Sampling(settings, self.futures)
        self.sessions = Sessions(settings.session_timeout_s, on_end=self._end_session)
        self.models = TrainingModels(settings, self.futures, self.sessions)
        self.checkpoints = Checkpoints(settings, self.models, self.sampling)
        self.started = time.time()

    def _end_session(self, session: str) -> list[str]:
        return self.models.drop_session(session) + self.sampling.drop_session(session)

    async def start(self) -> None:
        if self.settings.torch_threads:
            import torch

            torch.set_num_threads(self.settings.torch_threads)
        await self.sampling.start()
        self.checkpoints.start()

    async def stop(self) -> None:
        await self.models.stop()
        await self.sampling.stop()

    # ---- the client's configuration --------------------------------------------------------------------
    def client_config(self) -> dict:
        poller = self.settings.sample_poller
        return {"pjwt_auth_enabled": False, "credential_default_source": "api_key", "parallel_fwdbwd_chunks": False,
                "proto_compress_fwdbwd": False, "fwdbwd_max_chunk_len": self.settings.max_datums,
                "use_pyqwest_transport": False, "sample_use_retrieve_futures": poller,
                "custom_loss_server_side": False, "sample_join_sampling_session": poller}

    def dynamic_config(self) -> dict:
        return {"refresh_interval_sec": 300, "sample_cancel_enabled": True, "sample_cancel_max_batch_size": 64}

    def capabilities(self) -> dict:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(self.settings.base_model)
        return {"supported_models": [{"model_name": self.settings.public_name(), "trainable": True,
                                      "sampleable": True,
                                      "max_context_length": getattr(config, "max_position_embeddings", None)}]}

    # ---- sessions ----------------------------------------------------------------------------------------
    def create_session(self) -> str:
        return self.sessions.create()

    def heartbeat(self, session_id: str) -> None:
        self.sessions.heartbeat(session_id)

    def finish_session(self, session_id: str, status: str, detail: str | None) -> None:
        self.sessions.finish(session_id, status, detail)

    # ---- training models ---------------------------------------------------------------------------------
    def create_model(self, req: api.CreateModel) -> tuple[str, str]:
        return self.models.create(req)

    def get_info(self, model_id: str) -> dict:
        return self.models.info(model_id)

    def unload_model(self, model_id: str) -> None:
        self.models.unload(model_id)

    def forward_backward(self, call: ForwardBackwardCall) -> str:
        return self.models.forward_backward(call)

    def optim_step(self, req: api.OptimStep) -> str:
        return self.models.optim_step(req)

    # ---- checkpoints -------------------------------------------------------------------------------------
    def save_state(self, req: api.SaveWeights) -> str:
        return self.checkpoints.save_state(req)

    def load_state(self, req: api.LoadWeights) -> tuple[str, str]:
        return self.checkpoints.load_state(req)

    def weights_info(self, tinker_path: str) -> dict:
        return self.checkpoints.weights_info(tinker_path)

    def save_for_sampler(self, req: api.SaveWeights) -> str:
        return self.checkpoints.save_for_sampler(req)

    # ---- sampling ----------------------------------------------------------------------------------------
    def create_sampling_session(self, req: api.CreateSamplingSession) -> str:
        self.sessions.require(req.session_id)
        return self.sampling.create_session(req, self.checkpoints.sampler_dir(req.model_path, req.base_model))

    def get_sampler(self, sampler_id: str) -> dict:
        return self.sampling.get_sampler(sampler_id)

    def join_sampling_session(self, sampling_session_id: str) -> int:
        return self.sampling.join(sampling_session_id)

    def sample(self, req: api.Sample) -> tuple[str, list[str]]:
        if req.sampling_session_id is not None:
            where = self.sampling.sessions.get(req.sampling_session_id)
            if where is None:
                raise NotFound(f"sampling session {req.sampling_session_id!r} is unknown")
            version = self.sampling.session_versions.get(req.sampling_session_id)
        else:
            where = self.checkpoints.sampler_dir(req.model_path, req.base_model)
            version = self.sampling.path_versions.get(req.model_path) if req.model_path else 0
        return self.sampling.sample(req, where, version)

    async def retrieve_futures(self, req: api.RetrieveFutures) -> dict:
        return await self.sampling.retrieve_futures(req)

    # ---- futures / status --------------------------------------------------------------------------------
    def cancel(self, request_id: str) -> None:
        """cancel_future: the request is dropped; one not started does not run (one running runs to its end)."""
        self.futures.forget(request_id)
        self.sampling.forget(request_id)

    async def retrieve(self, request_id: str):
        return await self.futures.retrieve(request_id, self.settings.long_poll_s)

    def status(self) -> dict:
        return {"sessions": len(self.sessions), "models": sorted(self.models), "pending": self.futures.pending(),
                "sampling_sessions": len(self.sampling.sessions), "uptime_s": round(time.time() - self.started, 1),
                "sampling": self.sampling.status()}


async def run_blocking(fn, *args):
    """Parsing a large body off the event loop."""
    return await asyncio.to_thread(fn, *args)
