"""The interface every scorer kind implements, and how items become text."""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Sequence

from services.reward.metrics import RewardMetrics
from shared.reward_api import Prompt, ScoreItem


class Scorer(ABC):
    """Scores a batch of items: one finite float per item, in order, or an exception.

    ``score`` raises ``ScorerFailure`` (or any exception, which the service wraps) when it cannot; it
    never substitutes a default value. ``InvalidItem`` means the client sent an item this scorer cannot
    score (a 422, not retried).
    """

    kind: str
    """Shown in logs, metrics and /info; a subclass that does not set it is shown as the kind it was configured as."""

    def __init__(self, config, metrics: RewardMetrics):
        self.config = config
        self.name: str = config.name
        if not getattr(self, "kind", None):
            self.kind = config.kind
        self.metrics = metrics

    @property
    def where(self) -> str:
        """The scorer as every error a user sees names it: ``reward scorer 'name' (kind)``; a remote one adds
        its URL (:class:`~services.reward.scorers.http_remote.HttpScorer`)."""
        return f"reward scorer {self.name!r} ({self.kind})"

    def endpoint_limit(self) -> tuple[str, int] | None:
        """``(endpoint, calls in flight at most)`` for a scorer whose calls to a remote endpoint are limited per
        endpoint: the reward service gives the scorers of one endpoint one shared gate, at the smallest of their
        limits (:meth:`share_endpoint_gate`). None (the default): no such limit."""
        return None

    endpoint_gate: asyncio.Semaphore | None = None
    """The gate shared by the scorers of this scorer's endpoint (set by :meth:`share_endpoint_gate`): a scorer with
    an endpoint limit holds it around each call to the endpoint."""

    def share_endpoint_gate(self, gate: asyncio.Semaphore, limit: int) -> None:
        """Limit calls to :meth:`endpoint_limit`'s endpoint by ``gate`` (``limit`` in flight), shared with the
        other scorers that call it: kept as :attr:`endpoint_gate`. Called before :meth:`start`, only on scorers
        with an endpoint limit; one whose client keeps its own gate extends this to hand it over."""
        self.endpoint_gate = gate

    async def start(self) -> None:
        """Load models, open clients. Called once before the first ``score``."""

    async def close(self) -> None:
        """Release what ``start`` acquired."""

    async def check(self) -> None:
        """Raise if this scorer cannot currently score (used by GET /health)."""

    @abstractmethod
    async def score(self, items: Sequence[ScoreItem]) -> list[float]:
        """One value per item, in order."""


def render_prompt(prompt: Prompt) -> str:
    """Prompt as text: strings unchanged, chat messages in ChatML with the assistant turn opened."""
    if isinstance(prompt, str):
        return prompt
    turns = "".join(f"<|im_start|>{m.role}\n{m.content}<|im_end|>\n" for m in prompt)
    return turns + "<|im_start|>assistant\n"


def strip_tokens(text: str, tokens: Sequence[str], *, head: bool = True, tail: bool = True) -> str:
    """``text`` without any run of ``tokens`` at its start (``head``) and end (``tail``). By index, so linear in
    the text: re-slicing once per token, or a regex like ``(<pad>|</s>)+$``, is quadratic in a run of them."""
    tokens = [t for t in tokens if t]
    start, end = 0, len(text)
    changed = True
    while changed and tokens:
        changed = False
        for t in tokens:  # a run of one token in a tight loop: one call per token, not one per token kind
            while head and end - start >= len(t) and text.startswith(t, start, end):
                start, changed = start + len(t), True
            while tail and end - start >= len(t) and text.endswith(t, start, end):
                end, changed = end - len(t), True
    return text[start:end]


def query_text(item: ScoreItem) -> str:
    """OpenRLHF's `query`: prompt text followed by the response."""
    return render_prompt(item.prompt) + item.response
