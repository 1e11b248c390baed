"""The rollout-function plug-in contract: what the worker hands a rollout function, and what it gets back.

A rollout function turns one prompt task into its group: ``async def fn(ctx: RolloutContext) ->
list[Trajectory]`` with exactly ``ctx.task.n`` trajectories, in group order. The context gives it
token-in / token-out generation on this replica's engine (:meth:`RolloutContext.generate`: prompt ids in,
:class:`SequenceOutput` s with output ids and logprobs out — nothing is re-tokenised), the tokenizer and chat
template (:meth:`RolloutContext.chat`), the reward service (:meth:`RolloutContext.score`), the replica's
session manager (:attr:`RolloutContext.sessions`, to record an agent program's calls), the task and the
worker's settings.

What the context uses of the replica it runs on is :class:`Replica`, and no more: the rollout service is one
(it runs the worker), ``deploy/local/evaluate_agent.py``'s ``HttpReplica`` another, over a replica's HTTP API.

What goes wrong is said by raising: :class:`PermanentTaskError` (the task itself can never succeed: a prompt
that does not fit, ids outside the vocabulary, an environment or kind the settings do not allow; it is
dead-lettered at once with the reason, its lease acknowledged, never redelivered) or :class:`GroupFailed`
(this delivery cannot be completed now: the prompt is redelivered, then dead-lettered with the reason). Any
other exception is treated as a :class:`GroupFailed`, logged as a bug. Never return a made-up reward for a
sample that could not be scored.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

from services.rollout.chat_tokens import ChatTokens, ChatTokensCache, TemplateNotAppendOnly
from services.rollout.engines.base import EngineError, SequenceRejected
from services.rollout.engines.types import SamplingParams, SequenceOutput, SequenceRequest
from services.rollout.errors import Overloaded, RequestError
from services.rollout.trajectory import Trajectory
from shared.reward_api import ScoreItem, ScoreResponse
from shared.schemas import ChatMessage, PromptTask

if TYPE_CHECKING:
    from services.rollout.reward_client import RewardClient
    from services.rollout.sessions.manager import SessionManager

log = logging.getLogger(__name__)
T = TypeVar("T")
PROMPT_CHARS_PER_TOKEN = 16
"""With ``worker.max_prompt_chars`` unset, a prompt may hold this many characters per token of the context: more than
any tokenizer's tokens hold on average, so a prompt past it cannot fit and is refused without tokenising it."""


class GroupFailed(RuntimeError):
    """This delivery cannot be completed now; it is failed (redelivered later, or dead-lettered)."""


class PermanentTaskError(GroupFailed):
    """The task can never succeed, whichever worker takes it and however often (it fails a bound, names
    something the settings do not allow, its prompt does not tokenise or fit): dead-lettered at its first
    delivery with the reason. A :class:`GroupFailed`, so code that catches that catches this too."""


@runtime_checkable
class Replica(Protocol):
    """What the worker's rollout functions use of the replica they run on (the rollout service is one)."""

    @property
    def tokenizer(self) -> Any: ...

    @property
    def model_name(self) -> str:
        """The name this replica serves the model under (``/v1/models``)."""

    @property
    def context_length(self) -> int: ...

    @property
    def sessions(self) -> SessionManager | None:
        """Its session manager (``sessions.enabled``), else None."""

    def encode(self, text: str) -> list[int]:
        """A text prompt's ids (:class:`RequestError` if it tokenises to nothing)."""

    def apply_chat_template(self, messages: list[dict[str, Any]]) -> list[int]:
        """Chat messages' prompt ids, with the generation prompt (:class:`RequestError` if they do not render)."""

    def check_sequence(self, prompt_ids: Sequence[int], params: SamplingParams) -> int:
        """The ``max_new_tokens`` to generate after ``prompt_ids``; :class:`RequestError` for a sequence this
        replica refuses (ids outside the vocabulary, no room in the context, stops past its limits)."""

    async def generate(self, seqs: list[SequenceRequest]) -> list[SequenceOutput]:
        """The sequences run to their end; :class:`Overloaded` or :class:`EngineError` while it cannot now."""

    async def off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the thread this replica tokenises on: never on the event loop, one call at a time."""


class RolloutContext:
    """Everything a rollout function may use; built by the worker for one prompt task."""

    def __init__(self, task: PromptTask, params: SamplingParams, settings: Any, replica: Replica,
                 rewards: RewardClient, chat_tokens: ChatTokensCache | None = None) -> None:
        self.task = task
        self.params = params  #: the task's sampling: the worker's defaults with the task's overrides
        #: the worker's settings, a ``services.rollout.settings.WorkerSettings`` (not imported here: the settings
        #: stand above the worker, they load rollout functions); ``settings.agent`` for multi-turn rollouts
        self.settings = settings
        self._replica = replica
        self._rewards = rewards
        self._chat_tokens = chat_tokens  # shared by the worker's tasks (each ChatTokens renders the template a few times)

    @property
    def tokenizer(self) -> Any:
        return self._replica.tokenizer

    @property
    def model_name(self) -> str:
        """The name this replica serves the model under (``/v1/models``)."""
        return self._replica.model_name

    @property
    def sessions(self) -> SessionManager | None:
        """This replica's session manager (``sessions.enabled``), else None: record an agent program's
        OpenAI-client calls as trajectories (the ``openai_agent`` rollout function)."""
        return self._replica.sessions

    @property
    def context_length(self) -> int:
        return self._replica.context_length

    @property
    def max_prompt_chars(self) -> int:
        """Characters of a prompt at most (``worker.max_prompt_chars``; unset: 16 x the context length)."""
        limit = getattr(self.settings, "max_prompt_chars", None)
        return limit if limit is not None else PROMPT_CHARS_PER_TOKEN * self.context_length

    def check_prompt_size(self, messages: str | Sequence[ChatMessage | dict] | None = None) -> None:
        """Refuse (:class:`PermanentTaskError`) a prompt that cannot fit, before it is tokenised: text or chat
        messages (default: the task's) past :attr:`max_prompt_chars` characters, ids past the context length."""
        if messages is None and self.task.prompt_token_ids:
            if len(self.task.prompt_token_ids) >= self.context_length:
                raise PermanentTaskError(f"bad prompt task: its prompt has {len(self.task.prompt_token_ids)} token "
                                         f"ids; the context length is {self.context_length}")
            return
        prompt = self.task.prompt if messages is None else messages
        if isinstance(prompt, str):
            chars = len(prompt)
        else:
            chars = sum(len(m.content) if isinstance(m, ChatMessage) else len(str(m.get("content") or ""))
                        for m in prompt or ())
        if chars > self.max_prompt_chars:
            raise PermanentTaskError(f"bad prompt task: its prompt has {chars} characters; this worker takes at most "
                                     f"{self.max_prompt_chars} (worker.max_prompt_chars) before tokenising")

    def prompt(self) -> tuple[list[int], str | list[ChatMessage]]:
        """The task's prompt as ids (given ids are used as they are), and as the reward service sees it.

        Blocking: it tokenises on the caller's thread, so in a rollout function (on the worker's event loop)
        prefer ``await`` :meth:`prompt_async`, which does the same on the replica's tokenizer thread."""
        self.check_prompt_size()
        task, replica = self.task, self._replica
        try:
            if task.prompt_token_ids:
                ids = list(task.prompt_token_ids)
                return ids, replica.tokenizer.decode(ids, skip_special_tokens=False)
            if isinstance(task.prompt, str):
                return replica.encode(task.prompt), task.prompt
            if task.prompt is None:  # PromptTask's validator: ids or a prompt
                raise RequestError("the task has neither prompt_token_ids nor a prompt")
            return replica.apply_chat_template([m.model_dump() for m in task.prompt]), task.prompt
        except RequestError as exc:
            raise PermanentTaskError(f"bad prompt task: {exc}") from exc

    async def prompt_async(self) -> tuple[list[int], str | list[ChatMessage]]:
        """:meth:`prompt`, tokenised off the event loop (the replica's tokenizer thread): however long the task's
        prompt, the service's ``/health`` and requests keep answering. A prompt past the bounds is refused first
        (:meth:`check_prompt_size`), without tokenising it."""
        self.check_prompt_size()
        return await self.off_loop(self.prompt)

    async def off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the replica's tokenizer thread (one call at a time: tokenizers are not thread-safe).
        Tokenise, render a chat template or decode there whatever a task or an environment can make long."""
        return await self._replica.off_loop(fn, *args)

    def chat(self, tools: list[dict] | None = None) -> ChatTokens:
        """Token-in / token-out over the model's chat template (prompt ids, turn endings, message deltas).

        Blocking (a new set of ``tools`` renders the template a few times); its ``prompt`` and ``delta`` tokenise
        on the caller's thread: on the event loop, use :meth:`chat_async` and run them through :meth:`off_loop`."""
        try:
            if self._chat_tokens is not None:
                return self._chat_tokens.get(tools)
            return ChatTokens(self.tokenizer, tools=tools)
        except TemplateNotAppendOnly as exc:
            raise GroupFailed(f"multi-turn rollouts need an append-only chat template: {exc}") from exc

    async def chat_async(self, tools: list[dict] | None = None) -> ChatTokens:
        """:meth:`chat` off the event loop."""
        return await self.off_loop(self.chat, tools)

    def room(self, prompt_ids: Sequence[int], max_new_tokens: int) -> int:
        """``max_new_tokens`` cut to what the context leaves after ``prompt_ids`` (0: no room)."""
        return max(0, min(max_new_tokens, self.context_length - len(prompt_ids)))

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams, n: int = 1) -> list[SequenceOutput]:
        """``n`` samples continuing exactly ``prompt_ids`` on this replica's engine (output ids + logprobs).

        Waits while the engine is over capacity, paused past its wait or down; a sequence the engine can never
        run as asked (bad ids, no room in the context) is :class:`GroupFailed`. Samples aborted by a weight
        switch come back with ``finish.type == "abort"``: the caller decides whether to regenerate them."""
        try:
            max_new = self._replica.check_sequence(prompt_ids, params)  # a task's sampling is bounded as a request's
        except RequestError as exc:
            raise PermanentTaskError(f"bad prompt task: {exc}") from exc
        params = replace(params, max_new_tokens=max_new)
        while True:
            rid = f"w{uuid.uuid4().hex[:12]}"
            seqs = [SequenceRequest(rid=f"{rid}-{j}", prompt_ids=tuple(prompt_ids), params=params) for j in range(n)]
            try:
                return await self._replica.generate(seqs)
            except (Overloaded, EngineError) as exc:  # capacity, pause past its wait, engine down: wait, retry
                log.info("task %s: %s; retrying", self.task.id, exc)
                await asyncio.sleep(self.settings.poll_interval_s)
            except SequenceRejected as exc:  # the task asks for what the engine cannot do: retrying cannot help
                raise PermanentTaskError(f"bad prompt task: {exc}") from exc

    async def score(self, items: list[ScoreItem]) -> ScoreResponse:
        """Scores from the reward service (retried while it is down; a 4xx is :class:`RewardRejected`). A
        reply that could not score every item is :class:`GroupFailed`: no reward is made up."""
        scores = await self._rewards.score(items)
        if any(s is None for s in scores.scores):
            raise GroupFailed(f"the reward service could not score every sample: {scores.errors}")
        return scores


async def each_sample(make: Callable[[int], Coroutine[Any, Any, T]], n: int) -> list[T]:
    """``make(i)`` for the ``n`` samples of a group, run at once; if one fails for good, the others are
    cancelled (their own ``finally`` blocks clean up) and its exception is raised."""
    tasks = [asyncio.create_task(make(i)) for i in range(n)]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@runtime_checkable
class RolloutFunction(Protocol):
    """``async def fn(ctx: RolloutContext) -> list[Trajectory]``: the group of ``ctx.task`` (``task.n`` of them)."""

    async def __call__(self, ctx: RolloutContext) -> list[Trajectory]: ...
