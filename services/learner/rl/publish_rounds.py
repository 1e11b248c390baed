"""The actor's weights out to the rollout fleet, one round at a time, over the :class:`WeightPublisher`.

When: every ``publish.every`` steps, sooner while replicas wait for a version the publisher could not serve them,
and at the next step after a round that failed. A round that fails (staging, writing or a transport:
``PublishFailed``; or Redis not answering) fails that round, not the run: it is counted and logged, and the fleet
keeps the version it has. Only ``strict`` rounds (start-up and the run's last publish) let a Redis error through,
so the runner waits Redis out and publishes again.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from services.learner.counters import Counters
from services.learner.weights.transport import PublishFailed
from shared.redis_errors import REDIS_UNAVAILABLE, raise_if_refused

log = logging.getLogger(__name__)


def publish_due(step: int, every: int, waiting: list[str]) -> bool:
    """Publish after this step? Every ``every`` steps, and sooner while replicas wait for a version the
    publisher could not serve them (they joined late: see ``WeightPublisher.replicas_waiting``)."""
    return step % every == 0 or bool(waiting)


class Versioned(Protocol):
    """Where the rounds keep the version last published (``RunState.weight_version``, saved in checkpoints)."""

    weight_version: int


class PublishRounds:
    """Publishes through ``publisher`` (a ``WeightPublisher``); the version published goes to ``state``."""

    def __init__(self, publisher: Any, state: Versioned, counters: Counters) -> None:
        self.publisher = publisher
        self.state = state
        self.counters = counters
        self.failed = False  # the last round failed: the next step publishes again
        self.published_step = -1  # the trainer step whose weights the fleet was last given (-1: none yet)

    def due(self, step: int, every: int) -> bool:
        return publish_due(step, every, self.publisher.replicas_waiting) or self.failed

    async def publish(self, weights: Any, step: int, strict: bool = False) -> bool:
        """Publish ``weights`` (of trainer step ``step``) as a new version; False when the round failed."""
        try:
            self.state.weight_version = await self.publisher.publish(weights)
        except PublishFailed as exc:  # staging, writing or a transport failed: this round, never the learner
            self._failed()
            log.warning("publishing step %d failed (%s); the fleet keeps version %d, the next step publishes again",
                        step, exc, self.state.weight_version)
            return False
        except REDIS_UNAVAILABLE as exc:
            raise_if_refused(exc)
            if strict:
                raise
            self._failed()
            log.warning("publishing step %d failed on Redis (%s: %s); the fleet keeps version %d, the next "
                        "step publishes again", step, type(exc).__name__, exc, self.state.weight_version)
            return False
        self.failed = False
        self.published_step = step
        return True

    def _failed(self) -> None:
        self.failed = True
        self.counters.add("publishes_failed")
