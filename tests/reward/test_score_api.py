"""The HTTP surface over real processes: /score weighting and components, /get_reward as OpenRLHF calls
it, /scorers, /health, /metrics, and bad input -> 4xx with the reason."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.reward.conftest import metric_value

RULES = {
    "max_body_bytes": 64 * 1024,
    "max_items": 100,
    "scorers": [
        {"name": "math", "kind": "rule", "weight": 1.0, "check": {"type": "math"}},
        {"name": "boxed", "kind": "rule", "weight": 0.5, "check": {"type": "format", "pattern": r"\\boxed\{.+\}"}},
        {"name": "length", "kind": "rule", "weight": 2.0, "check": {"type": "length", "max_length": 20}},
    ],
}


@pytest.fixture(scope="module")
def svc(reward_service):
    return reward_service(RULES, name="rules")


def test_weighted_sum_and_components_in_item_order(svc):
    items = [
        {"prompt": "2+2?", "response": r"\boxed{4}", "label": "4"},                       # 1 + 0.5 + 0
        {"prompt": "half?", "response": "0.50", "label": "1/2"},                          # 1 + 0 + 0
        {"prompt": [{"role": "user", "content": "3*3?"}], "response": "it is 8", "label": 9},  # 0 + 0 + 0
        {"prompt": "long", "response": "x" * 30 + r" \boxed{7}", "label": "7", "metadata": {"k": 1}},
    ]
    r = httpx.post(f"{svc.url}/score", json={"items": items}, timeout=30)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["errors"] == []
    assert body["components"][0] == {"math": 1.0, "boxed": 1.0, "length": 0.0}
    assert body["components"][1] == {"math": 1.0, "boxed": 0.0, "length": 0.0}
    assert body["components"][2] == {"math": 0.0, "boxed": 0.0, "length": 0.0}
    long_len = len("x" * 30 + r" \boxed{7}")
    length_value = -min(1.0, (long_len - 20) / 20)
    assert body["components"][3] == pytest.approx({"math": 1.0, "boxed": 1.0, "length": length_value})
    assert body["scores"] == pytest.approx([1.5, 1.0, 0.0, 1.5 + 2.0 * length_value])


def test_get_reward_as_openrlhf_sends_it(svc):
    # What OpenRLHF's trainer sends with --reward.remote_url: decoded sequences (specials included).
    prompts = ["<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n", "Q: 1/4 as a decimal? A:"]
    responses = [r"\boxed{4}<|im_end|>", " 0.25</s>"]
    payload = {"query": ["<pad><pad>" + p + r for p, r in zip(prompts, responses)], "prompts": prompts,
               "labels": ["4", "0.250"]}
    r = httpx.post(f"{svc.url}/get_reward", json=payload, timeout=30)
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"rewards", "scores", "extra_logs"}
    assert body["rewards"] == pytest.approx([1.5, 1.0])
    assert body["scores"] == body["rewards"]
    assert body["extra_logs"] == {"math": [1.0, 1.0], "boxed": [1.0, 0.0], "length": [0.0, 0.0]}


def test_openrlhf_own_remote_reward_client(svc):
    """OpenRLHF 0.11.2's own client code (``SingleTurnAgentExecutor._fetch_rewards_via_http``, what its trainer
    runs with ``remote_rm_url``; installed with --no-deps by the Makefile), sharding a batch over two endpoints."""
    import asyncio

    from openrlhf.utils.agent import SingleTurnAgentExecutor

    executor = SingleTurnAgentExecutor([f"{svc.url}/get_reward", f"{svc.url}/get_reward"])
    prompts = ["Q: 2+2? A:", "Q: 1/4 as a decimal? A:", "Q: 3*3? A:"]
    responses = [r" \boxed{4}", " 0.25", " 8"]
    shards = asyncio.run(executor._fetch_rewards_via_http([p + r for p, r in zip(prompts, responses)], prompts,
                                                          ["4", "0.250", "9"]))
    rewards = [x for shard in shards for x in shard["rewards"]]
    assert rewards == pytest.approx([1.5, 1.0, 0.0]) and len(shards) == 2


def test_get_reward_query_only(svc):
    r = httpx.post(f"{svc.url}/get_reward", json={"query": [r"... so \boxed{3}"], "labels": [3]}, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["rewards"] == pytest.approx([1.5])


def test_scorers_health_metrics(svc):
    listed = httpx.get(f"{svc.url}/scorers", timeout=10).json()["scorers"]
    assert [(s["name"], s["kind"], s["weight"]) for s in listed] == [
        ("math", "rule", 1.0), ("boxed", "rule", 0.5), ("length", "rule", 2.0)]
    health = httpx.get(f"{svc.url}/health", timeout=10)
    assert health.status_code == 200 and health.json()["scorers"] == {"math": "ok", "boxed": "ok", "length": "ok"}
    httpx.post(f"{svc.url}/score", json={"items": [{"prompt": "p", "response": "1", "label": 1}] * 3}, timeout=30)
    text = httpx.get(f"{svc.url}/metrics", timeout=10).text
    assert metric_value(text, "fleetrl_reward_scorer_items_total", scorer="math") >= 3
    assert metric_value(text, "fleetrl_reward_scorer_latency_seconds_count", scorer="length") >= 1


@pytest.mark.parametrize(
    ("path", "body", "status", "reason"),
    [
        ("/score", {"items": [{"prompt": "p"}]}, 400, "items.0.response: Field required"),
        ("/score", {"items": [{"prompt": "p", "response": 5}]}, 400, "items.0.response"),
        ("/score", {"items": []}, 400, "items: List should have at least 1 item"),
        ("/score", {"items": [{"prompt": "p", "response": "r", "colour": 1}]}, 400, "items.0.colour"),
        ("/score", {"items": [{"prompt": [{"role": "nobody", "content": "x"}], "response": "r"}]}, 400, "role"),
        ("/score", {"items": "nope"}, 400, "items"),
        ("/score", {}, 400, "items: Field required"),
        ("/score", {"items": [{"prompt": "p", "response": "r"}]}, 422, "needs a `label`"),
        ("/score", {"items": [{"prompt": "p", "response": "r", "label": 1}] * 101}, 413, "limit is 100"),
        ("/get_reward", {"prompts": ["a"]}, 400, "query: Field required"),
        ("/get_reward", {"query": ["ab", "cd"], "prompts": ["a"]}, 400, "`prompts` has 1 entries but `query` has 2"),
        ("/get_reward", {"query": ["ab"], "labels": [1, 2]}, 400, "`labels` has 2 entries"),
        ("/get_reward", {"query": ["hello"], "prompts": ["xyz"], "labels": [1]}, 422, "does not contain prompts[0]"),
        ("/get_reward", {"query": "hello"}, 400, "query"),
    ],
)
def test_bad_input_is_a_4xx_with_the_reason(svc, path, body, status, reason):
    r = httpx.post(f"{svc.url}{path}", json=body, timeout=30)
    assert r.status_code == status, r.text
    assert reason in json.dumps(r.json()["detail"]).replace("\\\\", "\\").replace('\\"', '"') or reason in r.text


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/score", {"items": [{"prompt": "\ud800 p", "response": "1", "label": 1}]}, "items.0.prompt"),
        ("/score", {"items": [{"prompt": [{"role": "user", "content": "x\udfff"}], "response": "1", "label": 1}]},
         "items.0.prompt"),
        ("/score", {"items": [{"prompt": "p", "response": "1 \ud800", "label": 1}]}, "items.0.response"),
        ("/score", {"items": [{"prompt": "p", "response": "1", "label": "\ud800"}]}, "items.0.label"),
        ("/score", {"items": [{"prompt": "p", "response": "1", "label": 1, "metadata": {"k": "\udc00"}}]},
         "items.0.metadata"),
        ("/get_reward", {"query": ["fine", "x \ud800"]}, "query"),
        ("/get_reward", {"query": ["ab"], "prompts": ["\ud800"]}, "prompts"),
        ("/get_reward", {"query": ["ab"], "labels": ["\ud800"]}, "labels"),
    ],
)
def test_text_that_is_not_utf8_is_a_4xx_naming_the_field(svc, path, body, field):
    """A lone surrogate (JSON ``"\\ud800"``) cannot reach a tokenizer or a remote scorer: refused at the door."""
    with httpx.Client(base_url=svc.url, timeout=30) as c:
        r = c.post(path, content=json.dumps(body).encode(), headers={"content-type": "application/json"})
        assert r.status_code == 400, r.text
        assert any(d.startswith(f"{field}:") and "not valid UTF-8" in d for d in r.json()["detail"].split("; ")), r.text
        ok = c.post("/score", json={"items": [{"prompt": "p", "response": "1 \U0001F600", "label": 1}]})
        assert ok.status_code == 200 and ok.json()["scores"] == [1.0]  # valid non-BMP text is fine, same connection


def test_an_unknown_field_named_by_a_lone_surrogate_is_a_4xx(svc):
    body = {"items": [{"prompt": "p", "response": "1", "label": 1, "\ud800": 2}]}
    r = httpx.post(f"{svc.url}/score", content=json.dumps(body).encode(), headers={"content-type": "application/json"},
                   timeout=30)
    assert r.status_code == 400 and r.json()["detail"].startswith("items.0: holds text that is not valid UTF-8"), r.text


def test_malformed_json_and_huge_body(svc):
    r = httpx.post(f"{svc.url}/score", content=b'{"items": [', headers={"content-type": "application/json"}, timeout=10)
    assert r.status_code == 400 and "JSON" in r.text
    big = {"items": [{"prompt": "p", "response": "x" * 100_000, "label": 1}]}
    r = httpx.post(f"{svc.url}/score", json=big, timeout=10)
    assert r.status_code == 413 and "max_body_bytes" in r.json()["detail"]

    def chunks():  # no Content-Length: the limit is enforced while reading
        yield b'{"items": [{"prompt": "p", "response": "'
        for _ in range(10):
            yield b"y" * 10_000
        yield b'", "label": 1}]}'

    r = httpx.post(f"{svc.url}/score", content=chunks(), headers={"content-type": "application/json"}, timeout=10)
    assert r.status_code == 413
    # the service still answers afterwards
    ok = httpx.post(f"{svc.url}/score", json={"items": [{"prompt": "p", "response": "1", "label": 1}]}, timeout=10)
    assert ok.status_code == 200 and ok.json()["scores"] == [1.0]
