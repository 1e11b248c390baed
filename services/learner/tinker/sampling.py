"""The Tinker API's sampling: sampling sessions (each on a sampler checkpoint or the base model), samples run on
the rollout fleet when one is set and holds the weights, else in the learner (one ordered worker thread), and
the long-poll of finished samples (``retrieve_futures``)."""

from __future__ import annotations

import asyncio
import logging
import uuid
from pathlib import Path
from typing import Any

from services.learner.tinker import api
from services.learner.tinker.errors import BadRequest, Full, NotFound
from services.learner.tinker.futures import CompletionLog, FutureStore, OrderedWorker
from services.learner.tinker.settings import TinkerSettings
from services.learner.tinker.wire import encode_sample_response

log = logging.getLogger(__name__)


def stop_lists(stop: str | list[str] | list[int] | None) -> tuple[tuple[int, ...] | None, tuple[str, ...]]:
    """A sample request's ``stop`` (validated: a string, a list of strings or a list of token ids) as (stop token
    ids, stop strings): ids None unless ``stop`` is a list of them (``[]``: ``()``, nothing stops but max_tokens)."""
    ids = [x for x in stop if isinstance(x, int)] if isinstance(stop, list) else []
    stop_tokens = tuple(ids) if isinstance(stop, list) and len(ids) == len(stop) else None
    stop_strings = (stop,) if isinstance(stop, str) else \
        tuple(x for x in stop if isinstance(x, str)) if isinstance(stop, list) and stop_tokens is None else ()
    return stop_tokens, stop_strings


class Sampling:
    def __init__(self, settings: TinkerSettings, futures: FutureStore) -> None:
        self.settings = settings
        self.futures = futures
        self.sessions: dict[str, Path] = {}  # sampling session -> the weights it samples from
        self.paths: dict[str, str | None] = {}  # sampling session -> its tinker:// sampler path
        self.session_versions: dict[str, int | None] = {}  # sampling session -> its weights' version
        self.path_versions: dict[str, int] = {}  # sampler path -> the weight version published for it
        self.clones: dict[str, int] = {}  # join_sampling_session: the last client_counter given per session
        self.completions = CompletionLog()  # retrieve_futures: finished samples per sampling session and clone
        self._poll_keys: dict[str, tuple[str, int]] = {}  # sample request -> its poll target
        self.polls = 0  # retrieve_futures calls answered
        self.samples_in_learner = 0
        self.samplers: Any = None  # sampler.SamplerCache, from start()
        self.worker: OrderedWorker | None = None
        self.rollout: Any = None  # rollout.RolloutSampling when rollout_urls are set (sampling on the fleet)
        self._tasks: set[asyncio.Task] = set()
        futures.listener = self._settled

    async def start(self) -> None:
        from services.learner.tinker.sampler import SamplerCache

        s = self.settings
        self.samplers = SamplerCache(s.samplers_cached, s.device, s.dtype)
        self.worker = OrderedWorker("sampler", self.futures, s.seq_gap_timeout_s)
        if s.rollout_urls:
            from services.learner.tinker.rollout import RolloutSampling

            self.rollout = RolloutSampling(s)
            await self.rollout.start()

    async def stop(self) -> None:
        if self.worker is not None:
            await self.worker.close()
        if self.rollout is not None:
            await self.rollout.stop()

    def drop_session(self, session: str) -> list[str]:
        """The (client) session ended: its sampling sessions go."""
        dropped = []
        for sid in [s for s in self.sessions if s.startswith(f"{session}:")]:
            del self.sessions[sid]
            self.paths.pop(sid, None)
            self.clones.pop(sid, None)
            self.completions.drop(sid)
            self.session_versions.pop(sid, None)
            dropped.append(sid)
        return dropped

    def forget(self, request_id: str) -> None:
        self._poll_keys.pop(request_id, None)

    def add_session(self, session: str, seq_id: int, where: Path, path: str | None, version: int | None) -> str:
        sid = f"{session}:sample:{seq_id}:{uuid.uuid4().hex[:8]}"
        self.sessions[sid] = where
        self.paths[sid] = path
        self.session_versions[sid] = version
        return sid

    def create_session(self, req: api.CreateSamplingSession, where: Path) -> str:
        version = self.path_versions.get(req.model_path) if req.model_path else 0
        return self.add_session(req.session_id, req.sampling_session_seq_id, where, req.model_path, version)

    def get_sampler(self, sampler_id: str) -> dict:
        if sampler_id not in self.sessions:
            raise NotFound(f"sampler {sampler_id!r} is unknown")
        return {"sampler_id": sampler_id, "base_model": self.settings.public_name(),
                "model_path": self.paths.get(sampler_id)}

    def join(self, sampling_session_id: str) -> int:
        if sampling_session_id not in self.sessions:
            raise NotFound(f"sampling session {sampling_session_id!r} is unknown")
        self.clones[sampling_session_id] = self.clones.get(sampling_session_id, 0) + 1
        return self.clones[sampling_session_id]

    async def retrieve_futures(self, req: api.RetrieveFutures) -> dict:
        sid = req.target.sampling_session_id
        if sid not in self.sessions:
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

    def sample(self, req: api.Sample, where: Path, version: int | None) -> tuple[str, list[str]]:
        """Queue ``req`` on the weights in ``where`` (published to the fleet as ``version``, None: not on it)."""
        from services.learner.tinker.sampler import SampleCall

        s = self.settings
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
        stop_tokens, stop_strings = stop_lists(p.stop)
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
        assert self.worker is not None, "start() first"

        def job() -> bytes:
            if not where.is_dir():
                raise Full(f"the sampler's weights ({where.name}) are gone: the rollout fleet serves newer "
                           "weights and this server keeps only the last few ephemeral sampler checkpoints; save "
                           "weights for the sampler again")
            self.samples_in_learner += 1
            seqs, prompt_lp = self.samplers.get(where).sample(call)
            return encode_sample_response(seqs, prompt_lp)

        self.worker.submit(request_id, None, job)

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

    def status(self) -> dict:
        where = self.rollout.status() if self.rollout is not None else {"sampler": "learner"}
        return {**where, "samples_in_learner": self.samples_in_learner, "retrieve_futures_polls": self.polls,
                "joined_clones": sum(self.clones.values())}
