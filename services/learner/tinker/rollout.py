"""Sampling on the rollout fleet: ``save_weights_for_sampler`` publishes the trained weights (LoRA merged in)
through the learner's weight publisher (``services.learner.weights``) to the rollout replicas, and ``asample``
runs on a replica's ``POST /generate`` (token ids in, tokens and logprobs out); prompt logprobs
(``compute_logprobs``) come from its ``POST /score`` (services/rollout/routes/score.py, an extension router).

A sampler is bound to a weight version: a sample runs on a replica only while that replica serves exactly that
version (its ``/model_info`` before, and every output's ``weight_version`` after, must say so). A replica still
behind is waited for (``sampler_wait_s``); the caller falls back to the in-learner sampler for the versions the
fleet has moved past (see ``service.py``)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from typing import TYPE_CHECKING, Any

import httpx

from services.learner.tinker.errors import BadRequest
from services.learner.tinker.wire import SampledOut

if TYPE_CHECKING:
    from redis.asyncio import Redis

    from services.learner.weights import WeightPublisher

log = logging.getLogger(__name__)
SEED_MOD = 2**63 - 1


class Superseded(Exception):
    """Every replica serves a newer version than the sampler's (the fleet holds only the latest)."""


class NoScore(Exception):
    """The replica has no ``/score`` route (its ``extensions`` lack services.rollout.routes.score:scoring, or its
    engine is not hf): prompt logprobs are computed in the learner."""


class RolloutUnavailable(RuntimeError):
    """No replica served the sampler's version in time (or none answered)."""


class RolloutSampling:
    def __init__(self, settings: Any) -> None:
        self.settings = settings
        self.urls = [u.rstrip("/") for u in settings.rollout_urls]
        self._next = itertools.cycle(range(len(self.urls)))
        self.redis: Redis | None = None  # (and publisher, client) from start()
        self.publisher: WeightPublisher | None = None
        self.client: httpx.AsyncClient | None = None
        self.version = 0  # the newest version this server published (0: the base model)
        self.counters = {"samples_on_rollout": 0, "prompt_logprobs_on_rollout": 0, "publishes": 0,
                         "publishes_failed": 0, "rollout_errors": 0}
        self.last_publish: dict | None = None

    async def start(self) -> None:
        import redis.asyncio as aioredis

        from services.learner.weights import WeightPublisher

        s = self.settings
        self.redis = aioredis.from_url(s.redis_url, socket_timeout=30, socket_connect_timeout=10)
        self.publisher = WeightPublisher(self.redis, s.run_name, s.weight_sync)
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(s.rollout_timeout_s, connect=10.0))

    async def stop(self) -> None:
        if self.publisher is not None:
            await self.publisher.close()
        if self.client is not None:
            await self.client.aclose()
        if self.redis is not None:
            await self.redis.aclose()

    async def publish(self, weights: Any) -> int:
        """Publish ``weights`` ({name: tensor}, the base model's names) as the fleet's next version."""
        from services.learner.weights import PublishFailed

        assert self.publisher is not None  # started
        try:
            v = await self.publisher.publish(weights)
        except (PublishFailed, OSError, ConnectionError) as exc:
            self.counters["publishes_failed"] += 1
            raise RolloutUnavailable(f"publishing the sampler weights to the rollout fleet failed: {exc}") from exc
        report = self.publisher.last_report
        assert report is not None  # every publish leaves its report
        self.version = v
        self.counters["publishes"] += 1
        self.last_publish = {"version": v, "seconds": round(report.seconds, 3), "loaded": len(report.loaded),
                             "dropped": len(report.dropped), "refused": len(report.refused)}
        return v

    async def _version_of(self, url: str) -> int | None:
        assert self.client is not None  # started
        try:
            r = await self.client.get(f"{url}/model_info", timeout=10.0)
            r.raise_for_status()
            return int(r.json()["weight_version"])
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            log.warning("rollout replica %s: /model_info failed (%s)", url, exc)
            return None

    async def _replica_for(self, version: int) -> str:
        """A replica that serves ``version`` now: waits for one behind (bounded by ``sampler_wait_s``)."""
        deadline = time.monotonic() + self.settings.sampler_wait_s
        while True:
            seen = {}
            for _ in range(len(self.urls)):
                url = self.urls[next(self._next)]
                seen[url] = await self._version_of(url)
                if seen[url] == version:
                    return url
            if all(v is not None and v > version for v in seen.values()):
                newest = max(v for v in seen.values() if v is not None)
                raise Superseded(f"the rollout fleet serves version {newest}, newer than the sampler's version "
                                 f"{version}")
            if time.monotonic() > deadline:
                raise RolloutUnavailable(
                    f"no rollout replica served weight version {version} within sampler_wait_s "
                    f"{self.settings.sampler_wait_s:g}s (replica versions: {seen}); see the replicas' "
                    "/weights/version and this server's log")
            await asyncio.sleep(0.1)

    async def _score(self, url: str, prompt: list[int], version: int) -> list[float | None]:
        """Prompt logprobs from the replica's ``/score`` (services/rollout/routes/score.py), of ``version``."""
        assert self.client is not None  # started
        try:
            r = await self.client.post(f"{url}/score", json={"input_ids": prompt})
        except httpx.HTTPError as exc:
            self.counters["rollout_errors"] += 1
            raise RolloutUnavailable(f"rollout replica {url}: /score failed ({type(exc).__name__}: {exc})") from exc
        if r.status_code in (404, 405) or (r.status_code == 400 and "hf engine" in r.text):
            raise NoScore(f"rollout replica {url} serves no /score: prompt logprobs are computed in the learner")
        if 400 <= r.status_code < 500 and r.status_code not in (408, 429):
            raise BadRequest(f"the rollout replica refused the prompt logprobs: {_message(r)}")
        if r.status_code != 200:
            self.counters["rollout_errors"] += 1
            raise RolloutUnavailable(f"rollout replica {url}: /score answered {r.status_code}: {_message(r)}")
        body = r.json()
        if int(body["weight_version"]) != version:
            raise RolloutUnavailable(f"rollout replica {url} changed weights during the prompt logprobs (served "
                                     f"{body['weight_version']}, the sampler is version {version}); sample again")
        return body["logprobs"]

    async def sample(self, call: Any, version: int) -> tuple[list[SampledOut], list[float | None] | None]:
        """``call.num_samples`` continuations of ``call.prompt`` (and its prompt logprobs if asked) by a replica
        serving ``version``."""
        url = await self._replica_for(version)
        prompt_lp = await self._score(url, call.prompt, version) if call.prompt_logprobs else None
        sp: dict[str, Any] = {"max_new_tokens": call.max_tokens, "temperature": call.temperature,
                              "top_p": call.top_p, "top_k": call.top_k, "n": call.num_samples}
        if call.seed is not None:
            sp["sampling_seed"] = call.seed % SEED_MOD
        if call.stop_tokens:
            sp["stop_token_ids"] = list(call.stop_tokens)
        if call.stop_strings:
            sp["stop"] = list(call.stop_strings)
            sp["no_stop_trim"] = True
        if call.stop_tokens is not None and not call.stop_tokens and not call.stop_strings:
            sp["ignore_eos"] = True  # stop=[]: only max_tokens ends a sequence
        body = {"input_ids": call.prompt, "sampling_params": sp, "return_logprob": True}
        assert self.client is not None  # started
        try:
            r = await self.client.post(f"{url}/generate", json=body)
        except httpx.HTTPError as exc:
            self.counters["rollout_errors"] += 1
            raise RolloutUnavailable(f"rollout replica {url}: /generate failed ({type(exc).__name__}: {exc})") from exc
        if 400 <= r.status_code < 500 and r.status_code not in (408, 429):
            raise BadRequest(f"the rollout replica refused the sample request: {_message(r)}")
        if r.status_code != 200:
            self.counters["rollout_errors"] += 1
            raise RolloutUnavailable(f"rollout replica {url}: /generate answered {r.status_code}: {_message(r)}")
        items = r.json()
        items = items if isinstance(items, list) else [items]
        out = []
        for item in items:
            meta = item["meta_info"]
            if int(meta["weight_version"]) != version or meta.get("weight_version_spans"):
                raise RolloutUnavailable(f"rollout replica {url} changed weights during the sample (served "
                                         f"{meta['weight_version']}, the sampler is version {version}); sample again")
            finish = meta.get("finish_reason") or {}
            reason = "length" if finish.get("type") == "length" else "stop"
            lps = [float(t[0]) for t in meta["output_token_logprobs"]]
            out.append(SampledOut(list(item["output_ids"]), lps, reason))
        self.counters["samples_on_rollout"] += 1
        if prompt_lp is not None:
            self.counters["prompt_logprobs_on_rollout"] += 1
        return out, prompt_lp

    def status(self) -> dict:
        return {"sampler": "rollout", "rollout_urls": self.urls, "published_version": self.version,
                "last_publish": self.last_publish, **self.counters}


def _message(r: httpx.Response) -> str:
    try:
        body = r.json()
        err = body.get("error") if isinstance(body, dict) else None
        if isinstance(err, dict):
            return str(err.get("message", err))
        return str(body.get("detail", body) if isinstance(body, dict) else body)[:500]
    except ValueError:
        return r.text[:500]
