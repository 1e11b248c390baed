"""When the learner publishes, and what a failed round costs (services/learner/rl/publish_rounds.py). A whole run's
publishes, over the real WeightPublisher, are in test_rl_runner.py."""

import pytest
from prometheus_client import CollectorRegistry
from redis.exceptions import ConnectionError as RedisConnectionError

from services.learner.counters import Counters
from services.learner.observability import MetricsSink
from services.learner.rl.publish_rounds import PublishRounds, publish_due
from services.learner.run_state import RunState
from services.learner.settings import ObservabilitySettings
from services.learner.weights.transport import PublishFailed


def test_publish_is_due_every_n_steps_and_sooner_while_replicas_wait():
    assert [s for s in range(1, 11) if publish_due(s, 5, [])] == [5, 10]
    assert publish_due(3, 5, ["late-replica"])  # a replica that joined late is not left on old weights
    assert all(publish_due(s, 1, []) for s in range(1, 4))


class Outcomes:
    """Stands in for the transport end of the publisher: each publish takes the next outcome (a version, or an
    exception to raise)."""

    def __init__(self, *outcomes) -> None:
        self.outcomes = list(outcomes)
        self.replicas_waiting: list[str] = []

    async def publish(self, weights) -> int:
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


def rounds(tmp_path, *outcomes) -> PublishRounds:
    sink = MetricsSink(ObservabilitySettings(progress_bar=False), tmp_path, CollectorRegistry())
    state = RunState()
    return PublishRounds(Outcomes(*outcomes), state, Counters(state, sink))


async def test_a_failed_round_fails_only_itself_and_the_next_step_publishes_again(tmp_path):
    r = rounds(tmp_path, 1, PublishFailed("staging failed"), RedisConnectionError("down"), 2)
    assert await r.publish({}, step=1) and r.state.weight_version == 1 and r.published_step == 1
    assert not r.due(2, every=5)
    assert not await r.publish({}, step=2)  # the transport failed
    assert r.due(3, every=5) and r.state.weight_version == 1 and r.published_step == 1
    assert not await r.publish({}, step=3)  # Redis did not answer: this round only
    assert r.state.counters["publishes_failed"] == 2
    assert await r.publish({}, step=4) and not r.due(5 + 1, every=5) and r.state.weight_version == 2


async def test_a_strict_round_lets_a_redis_outage_through_to_be_waited_out(tmp_path):
    r = rounds(tmp_path, RedisConnectionError("down"))
    with pytest.raises(RedisConnectionError):
        await r.publish({}, step=0, strict=True)
    assert r.published_step == -1 and r.state.counters.get("publishes_failed", 0) == 0 and not r.failed
