"""The session manager: a component of the rollout service (started with it when ``sessions.enabled``).

It owns the open sessions (:mod:`.store`), records each generation call a session makes (exact prompt ids,
output ids, logprobs, weight version: :mod:`.trajectory`), and on finish turns the session into experiences on
the run's experiences stream (``shared.keys.experiences_stream(run)``), with the reward given or one from the
reward service. A finish that cannot complete (reward service or Redis unavailable) leaves the session open,
so the caller can retry it. Idle sessions expire after ``ttl_s``: dropped and counted, never pushed.

With several replicas, each session is registered in Redis under the URL of the replica holding it
(:mod:`.rl_algorithms`): a replica asked about a session it does not hold finds its owner there (:meth:`locate`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, Literal

import httpx
import redis.asyncio as aioredis
from fastapi import Request
from fastapi.responses import Response
from prometheus_client import CollectorRegistry, Counter, Gauge

from services.rollout.engines.types import SamplingParams, SequenceOutput
from services.rollout.errors import RequestError
from services.rollout.experiences import ExperienceStream
from services.rollout.reward_client import RewardClient, RewardRejected, RewardUnavailable
from services.rollout.sessions.auth import session_key
from services.rollout.sessions.chat import ChatTokensCache
from services.rollout.sessions.registry import (
    ENDED,
    FORWARDED_HEADER,
    OwnerProbe,
    SessionElsewhere,
    SessionRegistry,
    url_of_socket,
)
from services.rollout.sessions.settings import SessionSettings
from services.rollout.sessions.store import (
    ChatTurn,
    Session,
    SessionConflict,
    SessionNotFound,
    SessionStore,
    UnknownSession,
    new_session_id,
)
from services.rollout.sessions.trajectory import (
    Call,
    SamplingMismatch,
    SessionIdentity,
    append,
    check_extension,
    experiences,
)
from shared.experience_queue import BackpressureTimeout
from shared.redis_errors import REDIS_FAILED, REDIS_UNAVAILABLE
from shared.reward_api import ScoreItem
from shared.schemas import Experience
from shared.session_api import SessionCreate, SessionFinish, SessionFinished, SessionInfo
from shared.signing import signer_for

log = logging.getLogger(__name__)


class SessionUnavailable(RequestError):
    """The reward service or Redis did not answer in time: the session stays open, retry the finish."""

    status = 503
    type = "unavailable"
    retry_after = True


class SessionManager:
    def __init__(self, cfg: SessionSettings, *, redis_url: str | None, run_name: str, reward_url: str | None,
                 tokenizer: Any, registry: CollectorRegistry, url: str | None = None, host: str = "127.0.0.1",
                 control_token: str | None = None, run_key: Any = None, reward_token: str | None = None,
                 max_experience_backlog: int = 4096) -> None:
        self.cfg = cfg
        self.max_experience_backlog = max_experience_backlog  # run-wide (run.max_experience_backlog)
        self.control_token = control_token  # session keys derive from it (auth.py)
        self.signer = signer_for(run_key)  # the experiences a finished session pushes are signed as the fleet's
        self.url = url  # what other replicas and clients reach this one at (None until known: port 0)
        self.host = host
        self.redis_url = redis_url
        self.run_name = run_name
        self.reward_url = cfg.reward_url or reward_url
        own = cfg.reward_token.get_secret_value() if cfg.reward_token else None
        self.reward_token = own or (None if cfg.reward_url else reward_token)  # the worker's, for the worker's URL
        self.tokenizer = tokenizer
        self.store = SessionStore(cfg)
        self.chat_tokens = ChatTokensCache(tokenizer)
        self.redis: aioredis.Redis | None = None
        self.rewards: RewardClient | None = None
        self._streams: dict[str, ExperienceStream] = {}  # per run
        self._sweeper: asyncio.Task | None = None
        self.owners: SessionRegistry | None = None
        self.http: httpx.AsyncClient | None = None
        self.probe: OwnerProbe | None = None
        self._announced = False
        r = registry
        self.m_sessions = Counter("fleetrl_rollout_sessions", "Sessions by outcome (created, finished, expired, deleted, "
                                  "rejected).", ["outcome"], registry=r)
        self.m_calls = Counter("fleetrl_rollout_session_calls", "Calls recorded in sessions, by whether they extended "
                               "the session's trajectory.", ["extended"], registry=r)
        self.m_open = Gauge("fleetrl_rollout_sessions_open", "Open sessions.", registry=r)
        self.m_open.set_function(lambda: len(self.store.open))

    # ---- lifecycle ---------------------------------------------------------------------------------
    async def start(self) -> None:
        if not self.redis_url:
            raise RuntimeError("sessions.enabled needs redis_url (finished sessions go to the run's experiences stream)")
        self.redis = aioredis.from_url(self.redis_url, socket_timeout=30, socket_connect_timeout=5)
        self.owners = SessionRegistry(self.redis, self.run_name, self.cfg.ttl_s, self.cfg.sweep_interval_s)
        # a forwarded finish waits for the owner's reward and push (their timeouts) and then some
        self.http = httpx.AsyncClient(timeout=self.cfg.reward_timeout_s + self.cfg.push_timeout_s + 30)
        self.probe = OwnerProbe(self.http)
        if self.url:
            try:
                await self._announce()
            except REDIS_FAILED as exc:  # the first create tries again (and answers 503 if it fails)
                log.warning("session registry: could not announce this replica yet: %s", exc)
        if self.reward_url:
            self.rewards = RewardClient(self.reward_url, self.cfg.reward_timeout_s, backoff_max_s=2.0,
                                        token=self.reward_token)
        self._sweeper = asyncio.create_task(self._sweep(), name="session-sweeper")

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
        if self.rewards is not None:
            await self.rewards.aclose()
        if self.http is not None:
            await self.http.aclose()
        if self.redis is not None:
            if self.owners is not None and self._announced and self.url:
                try:  # its sessions are lost: other replicas now answer their calls 404 at once
                    await self.owners.leave(self.url)
                except REDIS_FAILED as exc:
                    log.warning("could not unregister this replica from the session registry: %s", exc)
            await self.redis.aclose()

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.sweep_interval_s)
            for s in self.store.expired():
                self.m_sessions.labels("expired").inc()
                log.info("session %s expired after %.0fs idle (%d calls dropped)", s.id, self.cfg.ttl_s, s.calls)
                await self._ended(s.id, "expired")
            if self.url and self.owners is not None:
                try:
                    await self.owners.refresh(self.url, [(s.id, self.store.expires_in(s)) for s in self.store.open.values()])
                except REDIS_FAILED as exc:
                    log.warning("session registry: could not refresh this replica's sessions: %s", exc)

    async def _announce(self) -> None:
        assert self.owners is not None and self.url
        await self.owners.beat(self.url)
        self._announced = True

    async def _ended(self, sid: str, how: str) -> None:
        """Tell the registry how the session ended (best effort: a stale owner key still leads here)."""
        if self.owners is None:
            return
        try:
            await self.owners.ended(sid, how)
        except REDIS_FAILED as exc:
            log.warning("session registry: could not record that session %s %s: %s", sid, how, exc)

    def learn_url(self, request: Request) -> None:
        """With ``port: 0`` the replica's URL is known from the first request's socket."""
        if self.url is None:
            self.url = url_of_socket(self.host, request.scope)
            if self.url:
                log.info("session mode: this replica advertises %s (set advertise_url to change it)", self.url)

    # ---- sessions ----------------------------------------------------------------------------------
    async def create(self, body: SessionCreate) -> Session:
        sid = body.session_id or new_session_id()
        prompt_id = body.prompt_id or sid
        who = SessionIdentity(session_id=sid, prompt_id=prompt_id, group_id=body.group_id or prompt_id,
                              group_size=body.group_size, index=body.index, label=body.label, metadata=body.metadata,
                              grant=body.grant)
        try:
            session = self.store.create(who, body.run or self.run_name)
            await self._claim(sid)
        except RequestError:
            self.m_sessions.labels("rejected").inc()
            raise
        self.m_sessions.labels("created").inc()
        return session

    async def _claim(self, sid: str) -> None:
        """Register the session (just created in the store) fleet-wide; undo the creation if that fails."""
        if self.owners is None or not self.url:
            return
        try:
            if not self._announced:
                await self._announce()
            held = await self.owners.claim(sid, self.url)
        except REDIS_FAILED as exc:
            self.store.discard(sid)
            raise SessionUnavailable(f"redis unavailable ({type(exc).__name__}): cannot register session {sid!r} "
                                     "with the fleet; retry") from None
        if held is not None:
            self.store.discard(sid)
            where = f"ended: {held}" if held in ENDED else f"open on the replica at {held}"
            raise SessionConflict(f"session {sid!r} already exists ({where}); pick another id")

    def info(self, session: Session, state: Literal["open", "finished", "deleted"] = "open") -> SessionInfo:
        w = session.who
        return SessionInfo(session_id=session.id, state=state, prompt_id=w.prompt_id, group_id=w.group_id,
                           group_size=w.group_size, index=w.index, run=session.run, calls=session.calls,
                           trajectories=len(session.trajectories), tokens=session.tokens,
                           idle_expires_in_s=self.store.expires_in(session) if state == "open" else 0.0,
                           openai_base_url=f"/sessions/{session.id}/v1", replica_url=self.url,
                           api_key=self.key(session.id))

    def key(self, sid: str) -> str | None:
        """Session ``sid``'s key (its calls' bearer token), or None without a control token."""
        return session_key(self.control_token, sid) if self.control_token else None

    def get(self, sid: str) -> Session:
        """The open session ``sid`` of this replica (see :meth:`locate` for the fleet)."""
        return self.store.get(sid)

    async def locate(self, sid: str, forwarded: bool = False) -> Session:
        """The open session ``sid`` held here; :class:`SessionElsewhere` when another live replica holds it; else
        how it ended (409 finished / deleted, 404 expired) or 404 unknown, as its owner would answer.
        ``forwarded``: the request came from another replica (never sent on again)."""
        if self.store.known(sid) or self.owners is None:
            return self.store.get(sid)
        try:
            owner, alive = await self.owners.lookup(sid)
        except REDIS_FAILED as exc:
            raise SessionUnavailable(f"redis unavailable ({type(exc).__name__}): cannot tell which replica holds "
                                     f"session {sid!r}; retry") from None
        if owner is None:
            return self.store.get(sid)  # 404: unknown
        if owner == "expired":
            raise SessionNotFound(f"session {sid!r} expired after {self.cfg.ttl_s:g}s idle (sessions.ttl_s); its calls "
                                  "were dropped")
        if owner in ENDED:
            raise SessionConflict(f"session {sid!r} is {owner}: no more calls or finishing")
        if owner == self.url:
            raise SessionNotFound(f"session {sid!r} was held by this replica ({owner}) before it restarted: its calls "
                                  "are lost")
        if not alive:
            raise SessionNotFound(f"session {sid!r} was held by the rollout replica at {owner}, which is no longer "
                                  "running: its calls are lost")
        if forwarded:
            raise SessionNotFound(f"session {sid!r} is registered to the replica at {owner}, but this request was "
                                  "forwarded here by another replica; send it to that replica")
        if self.probe is not None and not await self.probe.answers(owner):
            raise SessionNotFound(f"session {sid!r} was held by the rollout replica at {owner}, which does not answer "
                                  "(it stopped or crashed): its calls are lost")
        raise SessionElsewhere(sid, owner)

    async def by_header(self, sid: str | None) -> Session | None:
        """The session an ``X-Session-ID`` header names (see ``sessions.unknown_header_id``)."""
        if not sid:
            return None
        try:
            return await self.locate(sid)
        except UnknownSession:
            if self.cfg.unknown_header_id == "reject":
                raise
        if self.cfg.unknown_header_id == "ignore":
            return None
        return await self.create(SessionCreate(session_id=sid))

    async def delete(self, sid: str) -> SessionInfo:
        session = self.idle(sid, "delete it once the call returned")
        await self._close(sid, "deleted")
        return self.info(session, "deleted")

    def idle(self, sid: str, then: str) -> Session:
        """The open session ``sid``, which has no call in flight (else 409, saying what to do ``then``)."""
        session = self.store.get(sid)
        if session.busy:
            raise SessionConflict(f"session {sid!r} has a call in flight; {then}")
        return session

    async def _close(self, sid: str, how: Literal["finished", "deleted"]) -> None:
        """Close ``sid`` for good: counted, and the fleet's registry told how it ended."""
        self.store.close(sid, how)
        self.m_sessions.labels(how).inc()
        await self._ended(sid, how)

    async def forward(self, request: Request, owner: str) -> Response:
        """Send a lifecycle request on to the replica holding its session and answer what it answers (a redirect
        would do, but HTTP clients drop the bearer token when one leads to another host)."""
        assert self.http is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("authorization", "content-type")}
        headers[FORWARDED_HEADER] = self.url or "unknown"
        try:
            r = await self.http.request(request.method, owner + request.url.path, params=request.query_params,
                                        content=await request.body(), headers=headers)
        except httpx.HTTPError as exc:
            raise SessionUnavailable(f"the rollout replica at {owner}, which holds this session, did not answer "
                                     f"({type(exc).__name__}); retry") from None
        keep = {k: v for k, v in r.headers.items() if k.lower() in ("retry-after", "www-authenticate")}
        keep["X-Session-Replica"] = owner
        return Response(r.content, status_code=r.status_code, media_type=r.headers.get("content-type"), headers=keep)

    @asynccontextmanager
    async def call(self, session: Session) -> AsyncIterator[Session]:
        """Hold ``session`` for one generation call: one at a time (a session is one conversation)."""
        release = self.hold(session)
        try:
            yield session
        finally:
            release()

    def hold(self, session: Session) -> Callable[[], None]:
        """Take ``session`` for one call (409 if it has one in flight, or made ``max_calls``); returns the
        release, which a streamed call runs as soon as its sequence is recorded (safe to run again later)."""
        if session.busy:
            raise SessionConflict(f"session {session.id!r} has a call in flight; a session is one conversation: "
                                  "wait for that call's reply")
        if session.calls >= self.cfg.max_calls:
            raise SessionConflict(f"session {session.id!r} made {session.calls} calls, the limit (sessions.max_calls); "
                                  "finish it")
        if session.tokens >= self.cfg.max_tokens:
            raise SessionConflict(f"session {session.id!r} holds {session.tokens} tokens, the limit "
                                  "(sessions.max_tokens); finish it")
        session.busy = True
        held = [True]

        def release() -> None:
            if held[0]:
                held[0] = False
                session.busy = False
                session.last_used = time.monotonic()

        return release

    def check_sampling(self, session: Session, prompt_ids: list[int], params: SamplingParams) -> None:
        """Refuse (400), before generating, a call that would extend the session's trajectory with another
        sampling distribution."""
        try:
            check_extension(session.trajectories, prompt_ids, params)
        except SamplingMismatch as exc:
            raise RequestError(f"session {session.id!r}: {exc}") from None

    def record(self, session: Session, prompt_ids: list[int], out: SequenceOutput, params: SamplingParams,
               chat: ChatTurn | None = None) -> None:
        """Record one finished call (its output as the engine produced it)."""
        finish = out.finish.type if out.finish is not None else "abort"
        call = Call(list(prompt_ids), list(out.output_ids), list(out.logprobs), finish, out.weight_version, params)
        try:
            extended = append(session.trajectories, call)
        except SamplingMismatch as exc:  # checked before generating; a race cannot reach here
            raise RequestError(f"session {session.id!r}: {exc}") from None
        session.calls += 1
        session.chat = chat
        self.m_calls.labels(str(extended).lower()).inc()

    # ---- finish ------------------------------------------------------------------------------------
    async def finish(self, sid: str, body: SessionFinish) -> SessionFinished:
        session = self.idle(sid, "finish it once the call returned")
        if not session.trajectories:
            raise SessionConflict(f"session {sid!r} has no calls: nothing to train on (delete it instead)")
        session.busy = True
        try:
            texts = [(self._text(t.prompt_ids), self._text(t.response_ids)) for t in session.trajectories]
            rewards, comps = await self._rewards(session, body, texts)
            group = experiences(session.who, session.trajectories, rewards, comps, texts)
            stream = await self._push(session.run, group)
        finally:
            session.busy = False
        await self._close(sid, "finished")
        return SessionFinished(session_id=sid, experience_ids=[e.id for e in group], rewards=rewards, stream=stream)

    async def take(self, sid: str) -> Session:
        """Close session ``sid`` and hand it (its trajectories) to the caller instead of pushing it: the
        ``openai_agent`` rollout function, whose worker pushes the whole group as it pushes any other."""
        session = self.idle(sid, "take it once the call returned")
        await self._close(sid, "finished")
        return session

    def _text(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    async def _rewards(self, session: Session, body: SessionFinish, texts: list[tuple[str, str]]):
        n = len(session.trajectories)
        if body.reward is not None:  # SessionFinish: a reward, or score=true
            return [float(body.reward)] * n, [dict(body.reward_components) for _ in range(n)]
        if self.rewards is None:
            raise RequestError("score=true needs a reward service (sessions.reward_url or worker.reward_url); "
                               "or finish with a reward")
        w = session.who
        items = [ScoreItem(prompt=p, response=r, label=w.label, metadata=w.metadata) for p, r in texts]
        try:
            reply = await asyncio.wait_for(self.rewards.score(items), self.cfg.reward_timeout_s)
        except (asyncio.TimeoutError, TimeoutError):
            raise SessionUnavailable(f"the reward service did not score session {session.id!r} within "
                                     f"{self.cfg.reward_timeout_s:g}s; the session is still open: retry") from None
        except RewardRejected as exc:
            raise RequestError(f"the reward service refused session {session.id!r}: {exc}", status=422) from None
        except RewardUnavailable as exc:
            raise SessionUnavailable(f"session {session.id!r} is still open: {exc}") from None
        if any(s is None for s in reply.scores):
            raise SessionUnavailable(f"the reward service could not score session {session.id!r}: {reply.errors}; "
                                     "the session is still open")
        scored = reply.scored()
        return [s for s, _ in scored], [c for _, c in scored]

    def _stream(self, run: str) -> ExperienceStream:
        out = self._streams.get(run)
        if out is None:
            assert self.redis is not None
            out = self._streams[run] = ExperienceStream(self.redis, run, max_backlog=self.max_experience_backlog,
                                                        signer=self.signer)
        return out

    async def _push(self, run: str, group: list[Experience]) -> str:
        out = self._stream(run)
        try:
            await out.push(group, timeout=self.cfg.push_timeout_s)
        except BackpressureTimeout:
            raise SessionUnavailable(f"the experiences stream of run {run!r} stayed full for "
                                     f"{self.cfg.push_timeout_s:g}s (the learner is behind); retry the finish") from None
        except REDIS_UNAVAILABLE as exc:
            raise SessionUnavailable(f"redis unavailable ({type(exc).__name__}); retry the finish") from None
        return out.stream
