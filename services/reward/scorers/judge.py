"""``judge``: an LLM judge as a scorer, behind any OpenAI-compatible chat endpoint.

Modes (``MODES``): ``pointwise`` asks once per (prompt, response, label); ``group`` asks once per group with all
its responses (per-response scores, or a ranking turned into rewards 1.0 .. 0.0); ``pairwise`` asks once per pair
of a group's distinct responses, and a response's reward is its win rate. A group is what the rollout worker
sends in one ``/score`` call: items with the same prompt and label (or the same ``metadata[group_key]``).

Work is done once: identical judgments in a batch are merged, a judgment in flight is shared by the requests that
need it, and finished judgments are kept in an LRU (and Redis) under a hash of everything that decides them
(:mod:`judge_cache`). A judgment finishes even if the request that started it gave up, so a retried or re-issued
request finds it cached.

Failures are never a score: a reply the parser cannot read is asked again (``max_retries``), then the scorer
fails and its ``on_error`` policy applies; a spent budget fails naming the setting. Request text is data inside
the operator's template (:mod:`judge_template`): it cannot change the template, the endpoint or the parser.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import regex

from services.reward.errors import InvalidItem, ScorerFailure, ScorerUnavailable
from services.reward.scorers.base import Scorer
from services.reward.scorers.judge_cache import Judgment, JudgmentCache, judgment_key
from services.reward.scorers.judge_client import JudgeClient
from services.reward.scorers.judge_parsers import (
    READERS,
    Unreadable,
    bounded,
    ranking_rewards,
    win_rates,
)
from services.reward.scorers.judge_template import label_text, numbered_responses, parse_template
from shared.reward_api import Prompt, ScoreItem

OFF_LOOP_CHARS = 8192
"""A reply longer than this is parsed in a thread, not on the event loop."""
EXTRACT_TIMEOUT_S = 1.0
"""``response_extract`` that cannot finish on a response within this (catastrophic backtracking): the judge sees
the whole response."""


@dataclass(frozen=True)
class Judged:
    """One item as the judge sees it."""

    prompt: str
    response: str
    label: str
    group: str  # items with the same group are judged together in group and pairwise modes


def prompt_text(prompt: Prompt) -> str:
    """A prompt as the judge reads it: text as it is, chat messages as ``role: content`` lines."""
    if isinstance(prompt, str):
        return prompt
    return "\n".join(f"{m.role}: {m.content}" for m in prompt)


class JudgeScorer(Scorer):
    kind = "judge"

    def __init__(self, config, metrics):
        super().__init__(config, metrics)
        self.template = parse_template(config.template)
        self.reader = READERS[config.parser.type]
        self.client = JudgeClient(config, metrics)
        self.cache = JudgmentCache(config.cache)
        self._extract = regex.compile(config.response_extract) if config.response_extract else None
        self._identity = json.dumps({
            "url": config.url, "model": config.model, "system": config.system, "template": config.template,
            "sampling": config.sampling.model_dump(mode="json"), "parser": config.parser.model_dump(mode="json"),
            "mode": config.mode, "group_output": config.group_output, "swap": config.swap,
            "extract": config.response_extract, "max_chars": config.max_response_chars}, sort_keys=True)
        self._in_flight: dict[str, asyncio.Task] = {}

    def endpoint_limit(self) -> tuple[str, int]:
        return self.client.endpoint, self.config.max_concurrency

    def share_endpoint_gate(self, gate: asyncio.Semaphore, limit: int) -> None:
        super().share_endpoint_gate(gate, limit)
        self.client.share_gate(gate, limit)  # the client holds it around each call

    async def start(self) -> None:
        await self.client.start()
        await self.cache.start()

    async def close(self) -> None:
        for task in list(self._in_flight.values()):
            task.cancel()
        await asyncio.gather(*self._in_flight.values(), return_exceptions=True)
        await self.client.close()
        await self.cache.close()

    async def check(self) -> None:
        problem = self.client.problem()
        if problem is not None:
            raise ScorerUnavailable(problem)

    def call_timeout(self, n_items: int) -> float:
        c = self.config
        calls = n_items * (c.max_group_size * (2 if c.swap else 1) if c.mode == "pairwise" else 1)
        waves = math.ceil(calls / self.client.limit)  # the endpoint's limit, shared with its other scorers
        return c.timeout_s * (c.max_retries + 1) * waves + 1.0

    async def score(self, items: Sequence[ScoreItem]) -> list[float]:
        judged = await asyncio.to_thread(lambda: [self._judged_view(it) for it in items])  # regex, hashing: bounded
        return await MODES[self.config.mode](self, judged)

    # --- what the judge sees -----------------------------------------------------------------------------

    def _judged_view(self, item: ScoreItem) -> Judged:
        response = item.response
        if self._extract is not None:
            last = None
            try:
                for last in self._extract.finditer(response, timeout=EXTRACT_TIMEOUT_S):
                    pass
            except TimeoutError:
                last = None
            if last is not None:
                response = last.group(1) if self._extract.groups else last.group(0)
        response = response[: self.config.max_response_chars]
        prompt, label = prompt_text(item.prompt), label_text(item.label)
        if self.config.group_by == "metadata":
            if self.config.group_key not in item.metadata:
                raise InvalidItem(f"group_by: metadata needs metadata[{self.config.group_key!r}] (the group id) on "
                                  "every item; this item has none")
            group = json.dumps(["m", item.metadata[self.config.group_key]], sort_keys=True, default=str)
        else:
            group = json.dumps(["p", prompt, label])
        return Judged(prompt, response, label, group)

    def _messages(self, values: dict[str, str]) -> list[dict[str, str]]:
        system = [{"role": "system", "content": self.config.system}] if self.config.system else []
        return [*system, {"role": "user", "content": self.template.render(values)}]

    # --- one judgment, asked again while unreadable; shared while in flight; kept when done -----------------

    async def ask(self, values: dict[str, str], read: Callable[[str], Judgment]) -> Judgment:
        messages = self._messages(values)
        tries = self.config.max_retries + 1
        last: Unreadable | None = None
        for _ in range(tries):
            text = bounded(await self.client.chat(messages))
            try:
                return await asyncio.to_thread(read, text) if len(text) > OFF_LOOP_CHARS else read(text)
            except Unreadable as exc:
                self.metrics.judge_unreadable.labels(self.name).inc()
                last = exc
        raise ScorerFailure(f"the judge's reply could not be read in {tries} call(s) (max_retries is "
                            f"{self.config.max_retries}; parser {self.config.parser.type}): {last}", retryable=False)

    async def judgment(self, key: str, make: Callable[[], Awaitable[Judgment]]) -> Judgment:
        """The judgment under ``key``: from a call in flight, the cache, or ``make()`` (then cached)."""
        dedup = self.config.dedup
        if dedup and key in self._in_flight:
            self.metrics.judge_dedup_saved.labels(self.name).inc()
            return await asyncio.shield(self._in_flight[key])
        if self.cache.enabled:
            cached = await self.cache.get(key)
            self.metrics.judge_cache.labels(self.name, "miss" if cached is None else "hit").inc()
            if cached is not None:
                return cached
            if dedup and key in self._in_flight:  # started while we looked in Redis
                self.metrics.judge_dedup_saved.labels(self.name).inc()
                return await asyncio.shield(self._in_flight[key])

        async def make_and_keep() -> Judgment:
            value = await make()
            await self.cache.put(key, value)
            return value

        task = asyncio.create_task(make_and_keep())
        task.add_done_callback(_retrieve)
        if dedup:
            self._in_flight[key] = task
            task.add_done_callback(lambda _t: self._in_flight.pop(key, None))
        return await asyncio.shield(task)  # finishes (and is cached) even if this request gives up

    def key(self, *parts) -> str:
        return judgment_key(self._identity, *parts)

    def distinct(self, keys: list[str]) -> list[str]:
        """``keys`` once each, in order (all of them when dedup is off); counts what merging saved."""
        if not self.config.dedup:
            return keys
        unique = list(dict.fromkeys(keys))
        if len(unique) < len(keys):
            self.metrics.judge_dedup_saved.labels(self.name).inc(len(keys) - len(unique))
        return unique


def _retrieve(task: asyncio.Task) -> None:
    if not task.cancelled():
        task.exception()  # read, so a judgment nobody waits for any more is not logged as never retrieved


# --- modes ------------------------------------------------------------------------------------------------------


def one_value(judgment: Judgment) -> float:
    """A pointwise or pairwise judgment (one number; a list here is a reader's or cache's bug)."""
    if isinstance(judgment, list):
        raise TypeError(f"a judgment of {len(judgment)} values where one was expected")
    return float(judgment)


def many_values(judgment: Judgment) -> list[float]:
    """A group judgment (one value per response; one number here is a reader's or cache's bug)."""
    if not isinstance(judgment, list):
        raise TypeError(f"a judgment of one value ({judgment!r}) where one per response was expected")
    return judgment


async def pointwise(scorer: JudgeScorer, items: list[Judged]) -> list[float]:
    parser = scorer.config.parser
    read = lambda text: scorer.reader.one(parser, text)
    keys = [scorer.key("one", j.prompt, j.response, j.label) for j in items]
    first: dict[str, Judged] = {}
    for k, j in zip(keys, items):
        first.setdefault(k, j)
    targets = scorer.distinct(keys)  # each key once with dedup, every item's own call without
    jobs = [j for j in items] if len(targets) == len(keys) else [first[k] for k in targets]

    def asker(j: Judged) -> Callable[[], Awaitable[Judgment]]:
        return lambda: scorer.ask({"prompt": j.prompt, "response": j.response, "label": j.label}, read)

    values = await asyncio.gather(*(scorer.judgment(k, asker(j)) for k, j in zip(targets, jobs)))
    if len(targets) == len(keys):
        return [one_value(v) for v in values]
    by_key = dict(zip(targets, values))
    return [one_value(by_key[k]) for k in keys]


def groups_of(scorer: JudgeScorer, items: list[Judged]) -> list[list[int]]:
    """Item indices per group (first-seen order), split into parts of at most ``max_group_size``."""
    by_group: dict[str, list[int]] = {}
    for i, j in enumerate(items):
        by_group.setdefault(j.group, []).append(i)
    size = scorer.config.max_group_size
    return [idx[s:s + size] for idx in by_group.values() for s in range(0, len(idx), size)]


def _distinct_responses(scorer: JudgeScorer, items: list[Judged], idx: list[int]) -> tuple[list[str], list[int]]:
    """The responses the judge sees for a group (duplicates merged when dedup is on) and, per item, its place."""
    if not scorer.config.dedup:
        return [items[i].response for i in idx], list(range(len(idx)))
    seen: dict[str, int] = {}
    places = [seen.setdefault(items[i].response, len(seen)) for i in idx]
    if len(seen) < len(idx):
        scorer.metrics.judge_dedup_saved.labels(scorer.name).inc(len(idx) - len(seen))
    return list(seen), places


async def group(scorer: JudgeScorer, items: list[Judged]) -> list[float]:
    config = scorer.config
    ranking = config.group_output == "ranking"

    async def one_group(idx: list[int]) -> list[tuple[int, float]]:
        head = items[idx[0]]
        responses, places = _distinct_responses(scorer, items, idx)
        n = len(responses)

        def read(text: str) -> list[float]:
            values = scorer.reader.many(config.parser, text, n, ranking)
            return ranking_rewards(values, n) if ranking else values

        values = {"prompt": head.prompt, "label": head.label, "responses": numbered_responses(responses), "n": str(n)}
        key = scorer.key("group", head.prompt, head.label, responses)
        scores = await scorer.judgment(key, lambda: scorer.ask(values, read))
        return [(i, float(many_values(scores)[p])) for i, p in zip(idx, places)]

    parts = await asyncio.gather(*(one_group(idx) for idx in groups_of(scorer, items)))
    out = [0.0] * len(items)
    for part in parts:
        for i, v in part:
            out[i] = v
    return out


async def pairwise(scorer: JudgeScorer, items: list[Judged]) -> list[float]:
    config = scorer.config
    parser = config.parser.model_copy(update={"normalize": True}) if hasattr(config.parser, "normalize") \
        else config.parser  # a preference is a chance: [min, max] -> [0, 1]
    read = lambda text: scorer.reader.one(parser, text)

    async def prefer(head: Judged, a: str, b: str) -> float:
        """Chance that ``a`` is better than ``b`` (both orders asked when ``swap``)."""
        def ask(x: str, y: str) -> Awaitable[Judgment]:
            values = {"prompt": head.prompt, "label": head.label, "response_a": x, "response_b": y}
            return scorer.judgment(scorer.key("pair", head.prompt, head.label, x, y),
                                   lambda: scorer.ask(values, read))
        if not config.swap:
            return one_value(await ask(a, b))
        ab, ba = await asyncio.gather(ask(a, b), ask(b, a))
        return (one_value(ab) + 1.0 - one_value(ba)) / 2.0

    async def one_group(idx: list[int]) -> list[tuple[int, float]]:
        head = items[idx[0]]
        responses, places = _distinct_responses(scorer, items, idx)
        pairs = [(i, j) for i in range(len(responses)) for j in range(i + 1, len(responses))]
        chances = await asyncio.gather(*(prefer(head, responses[i], responses[j]) for i, j in pairs))
        rates = win_rates(len(responses), dict(zip(pairs, chances)))
        return [(i, rates[p]) for i, p in zip(idx, places)]

    parts = await asyncio.gather(*(one_group(idx) for idx in groups_of(scorer, items)))
    out = [0.0] * len(items)
    for part in parts:
        for i, v in part:
            out[i] = v
    return out


#: mode -> how a batch is judged
MODES: dict[str, Callable[[JudgeScorer, list[Judged]], Awaitable[list[float]]]] = {
    "pointwise": pointwise, "group": group, "pairwise": pairwise,
}
