"""The worker's /score calls made together go as one request (``worker.reward_batch_ms``), each call getting its own
items' scores back; a call the reward service refuses fails alone, the others are scored."""

from __future__ import annotations

import asyncio

import httpx
import pytest
import yaml

from services.rollout.reward_client import RewardClient, RewardRejected
from shared.ports import free_port
from shared.reward_api import ScoreItem
from tests.procs import spawn, starts_processes, stop, wait_http_ok

pytestmark = pytest.mark.process  # a reward service process

CONFIG = {"scorers": [{"name": "exact", "kind": "rule", "check": {"type": "exact", "strip": True}}]}


@pytest.fixture(scope="module")
@starts_processes
def reward_url(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("reward-batching")
    port = free_port()
    cfg = tmp / "reward.yaml"
    cfg.write_text(yaml.safe_dump({**CONFIG, "port": port}))
    proc = spawn(["-m", "services.reward", "--config", str(cfg)], tmp / "reward.log",
                 env={"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"})
    url = f"http://127.0.0.1:{port}"
    wait_http_ok(f"{url}/health", proc, timeout=60, log=tmp / "reward.log")
    yield url
    stop(proc)


def _requests(url: str) -> tuple[float, float]:
    """(/score requests answered 200, items in them) so far, from the reward service's metrics."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    reqs = items = 0.0
    for line in text.splitlines():
        if line.startswith("fleetrl_reward_requests_total{") and 'route="/score"' in line and 'status="200"' in line:
            reqs += float(line.rsplit(" ", 1)[1])
        if line.startswith("fleetrl_reward_request_items_sum{") and 'route="/score"' in line:
            items += float(line.rsplit(" ", 1)[1])
    return reqs, items


def _group(g: int, right: set[int]) -> list[ScoreItem]:
    """Group ``g``'s 4 samples; those in ``right`` answer the label."""
    return [ScoreItem(prompt=f"p{g}", response=f"{g}" if i in right else "x", label=f"{g}") for i in range(4)]


@pytest.mark.parametrize(("batch_s", "requests"), [(0.05, 1), (0.0, 8)])
async def test_calls_made_together_share_one_request_and_get_their_own_scores(reward_url, batch_s, requests):
    client = RewardClient(reward_url, timeout_s=10, backoff_max_s=0.2, batch_s=batch_s)
    before = _requests(reward_url)
    try:
        replies = await asyncio.gather(*(client.score(_group(g, {g % 4})) for g in range(8)))
    finally:
        await client.aclose()
    after = _requests(reward_url)
    assert after[0] - before[0] == requests
    assert after[1] - before[1] == 32
    for g, reply in enumerate(replies):
        assert reply.scores == [1.0 if i == g % 4 else 0.0 for i in range(4)]
        assert [c["exact"] for c in reply.components] == reply.scores


async def test_a_refused_call_fails_alone(reward_url):
    """An exact check without a label is a 422 for the combined request: sent again call by call, only the call
    holding that item is refused."""
    client = RewardClient(reward_url, timeout_s=10, backoff_max_s=0.2, batch_s=0.05)
    bad = [ScoreItem(prompt="p", response="r")]  # no label: the verifier cannot score it
    try:
        replies = await asyncio.gather(client.score(_group(0, {0})), client.score(bad), client.score(_group(1, {2})),
                                       return_exceptions=True)
    finally:
        await client.aclose()
    assert replies[0].scores == [1.0, 0.0, 0.0, 0.0]
    assert isinstance(replies[1], RewardRejected) and "422" in str(replies[1])
    assert replies[2].scores == [0.0, 0.0, 1.0, 0.0]


async def test_a_caller_that_gives_up_leaves_the_others_scored(reward_url):
    client = RewardClient(reward_url, timeout_s=10, backoff_max_s=0.2, batch_s=0.05)
    try:
        gone = asyncio.create_task(client.score(_group(0, {0})))
        kept = asyncio.create_task(client.score(_group(1, {1})))
        await asyncio.sleep(0)
        gone.cancel()
        reply = await kept
    finally:
        await client.aclose()
    assert reply.scores == [0.0, 1.0, 0.0, 0.0]
    assert gone.cancelled()


def test_a_combined_reply_is_cut_back_with_each_calls_own_errors():
    """An item a scorer marked (on_error: mark) is reported to the call that sent it, at its index in that call."""
    from services.rollout.reward_client import _split
    from shared.reward_api import ItemError, ScoreResponse

    whole = ScoreResponse(scores=[1.0, None, 0.0, None], components=[{"a": 1.0}, {"a": None}, {"a": 0.0}, {"a": None}],
                          errors=[ItemError(index=1, scorer="a", error="x"), ItemError(index=3, scorer="a", error="y")])
    first, second = _split(whole, [2, 2])
    assert first.scores == [1.0, None] and [(e.index, e.error) for e in first.errors] == [(1, "x")]
    assert second.scores == [0.0, None] and [(e.index, e.error) for e in second.errors] == [(1, "y")]
