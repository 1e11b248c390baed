"""The actor's weights out to the rollout fleet, one round at a time, over the :class:`WeightPublisher`.

When: every ``publish.every`` steps, sooner while replicas wait for a version the publisher could not serve them,
and at the next step after a round that failed. A round that fails (staging, writing or a transport:
``PublishFailed``; or Redis not answering) fails that round, not the run: it is counted and logged, and the fleet
keeps the version it has. Only ``strict`` rounds (start-up and the run's last publish) let a Redis error through,
so the runner waits Redis out and publishes again.

**Overlapped rounds** (``publish.overlap``, staleness >= 1 only): :meth:`PublishRounds.publish` returns as soon as
the publisher holds its own copy of the weights, and the round goes on while the next step trains; the round
before always ends first (:meth:`PublishRounds.settle`), so versions go out in order, one at a time. The version
counts as the learner's current one (``RunState.weight_version``, what ``max_staleness`` is measured from) from
the copy on, since the weights being trained have moved past it; a round that fails puts back the version the
fleet has. A checkpoint, the run's last publish and stopping settle the round in flight first.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from services.learner.observability import MetricsSink
from services.learner.queue_watch import REDIS_DOWN
from services.learner.run_state import RunState
from services.learner.weights.transport import PublishFailed

log = logging.getLogger(__name__)


def publish_due(step: int, every: int, waiting: list[str]) -> bool:
    """Publish after this step? Every ``every`` steps, and sooner while replicas wait for a version the
    publisher could not serve them (they joined late: see ``WeightPublisher.replicas_waiting``)."""
    return step % every == 0 or bool(waiting)


class PublishRounds:
    """Publishes through ``publisher`` (a ``WeightPublisher``); the version published goes to ``state``."""

    def __init__(self, publisher: Any, state: RunState, sink: MetricsSink, overlap: bool = False) -> None:
        self.publisher = publisher
        self.state = state
        self.sink = sink
        self.overlap = overlap
        self.failed = False  # the last round failed: the next step publishes again
        self.published_step = -1  # the trainer step whose weights the fleet was last given (-1: none yet)
        self.in_flight: asyncio.Task | None = None  # an overlapped round still going
        self._ended: dict[str, float] = {}  # the step metrics of the last round that published, until taken

    def due(self, step: int, every: int) -> bool:
        return publish_due(step, every, self.publisher.replicas_waiting) or self.failed

    async def publish(self, weights: Any, step: int, strict: bool = False) -> bool:
        """Publish ``weights`` (of trainer step ``step``) as a new version; False when the round failed. Overlapped
        (not ``strict``): True once the round has its copy of the weights and goes on in the background."""
        await self.settle()
        if not self.overlap or strict:
            return await self._round(weights, step, strict)
        detached = asyncio.get_running_loop().create_future()
        landed = (self.state.weight_version, self.published_step)
        self.in_flight = asyncio.create_task(self._round(weights, step, False, detached, landed))
        await asyncio.wait([self.in_flight, detached], return_when=asyncio.FIRST_COMPLETED)
        if self.in_flight.done() and not detached.done():  # it failed before it had its copy
            return await self.settle() or False
        self.state.weight_version = detached.result()
        self.published_step = step
        return True

    def take_metrics(self) -> dict[str, float]:
        """The metrics of the last round that published (``publish_s``, replicas loaded ...), once: an overlapped
        round's go in the line of the step it ended during."""
        out, self._ended = self._ended, {}
        return out

    async def settle(self) -> bool | None:
        """Wait for the overlapped round in flight to end: whether it published (None: none was in flight)."""
        task, self.in_flight = self.in_flight, None
        return None if task is None else await task

    async def abandon(self) -> None:
        """Stop the overlapped round in flight, if any (the run is ending without it)."""
        task, self.in_flight = self.in_flight, None
        if task is not None and not task.done():
            task.cancel()
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)

    async def _round(self, weights: Any, step: int, strict: bool, detached: asyncio.Future | None = None,
                     landed: tuple[int, int] | None = None) -> bool:
        try:
            version = await self.publisher.publish(weights, detached=detached) if detached is not None else \
                await self.publisher.publish(weights)
            self.state.weight_version = version
        except PublishFailed as exc:  # staging, writing or a transport failed: this round, never the learner
            self._failed(landed)
            log.warning("publishing step %d failed (%s); the fleet keeps version %d, the next step publishes again",
                        step, exc, self.state.weight_version)
            return False
        except REDIS_DOWN as exc:
            if strict:
                raise
            self._failed(landed)
            log.warning("publishing step %d failed on Redis (%s: %s); the fleet keeps version %d, the next "
                        "step publishes again", step, type(exc).__name__, exc, self.state.weight_version)
            return False
        self.failed = False
        if self.publisher.last_report is not None:  # Prometheus now; the step metrics with the next step's line
            self._ended = self.sink.observe_publish(self.publisher.last_report)
        self.published_step = step
        return True

    def _failed(self, landed: tuple[int, int] | None) -> None:
        if landed is not None:  # an overlapped round: the fleet keeps the version (and step) it had
            self.state.weight_version, self.published_step = landed
        self.failed = True
        self.state.bump("publishes_failed")
        self.sink.count("publishes_failed")
