"""The two producers of experiences — the worker (a rollout function's trajectories) and a session's finish (its
calls stitched into trajectories) — write their records through one path. These fixed inputs pin, field for field,
the records each wrote before that path was shared (a regression test: a change to either producer's records shows
here as a field that differs, and must be meant)."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry

from services.rollout.engines.types import Finish, SamplingParams, SequenceOutput
from services.rollout.sessions.manager import SessionManager
from services.rollout.sessions.settings import SessionSettings
from services.rollout.settings import WorkerSettings
from services.rollout.trajectory import TrajectoryBuilder
from services.rollout.worker.loop import RolloutWorker
from services.rollout.worker.settings import WorkerRun
from shared.reward_api import ScoreResponse
from shared.schemas import Experience, PromptTask, SamplingRecord
from shared.session_api import SessionCreate, SessionFinish

NOW = 1_700_000_000.5


def record(e: Experience, opened_at: float | None = None) -> dict:
    """Every field of ``e`` as plain values, and the order of its metadata's keys (the codec keeps it). A session's
    records were created when it was opened (``opened_at``, the real clock): ``created_at`` says "opened" then."""
    out = {name: getattr(e, name) for name in Experience.model_fields}
    if opened_at is not None and out["created_at"] == opened_at:
        out["created_at"] = "opened"
    for name in ("prompt_token_ids", "response_token_ids", "response_logprobs", "action_mask"):
        if out[name] is not None:
            out[name] = [float(x) if name == "response_logprobs" else int(x) for x in out[name]]
    out["sampling"] = e.sampling.model_dump() if e.sampling is not None else None
    out["metadata_order"] = list(e.metadata)
    return out


class Tokenizer:
    def decode(self, ids, skip_special_tokens=False):
        return " ".join(f"t{int(i)}" for i in ids)


class Rewards:
    """The reward service's reply for a session's two trajectories."""

    def __init__(self) -> None:
        self.items: list = []

    async def score(self, items):
        self.items.append(items)
        return ScoreResponse(scores=[1.0, 0.25], components=[{"exact": 1.0}, {"exact": 0.0, "len": 0.5}])


def out(ids, version, finish="stop", logprob=-0.5):
    return SequenceOutput(rid="r", prompt_ids=(), output_ids=list(ids), logprobs=[logprob] * len(ids),
                          finish=Finish(finish), weight_version=version)


async def session_records(monkeypatch, calls, finish: SessionFinish, rewards=None) -> list[dict]:
    monkeypatch.setattr(time, "time", lambda: NOW)
    m = SessionManager(SessionSettings(), redis_url=None, run_name="run", reward_url=None, tokenizer=Tokenizer(),
                       registry=CollectorRegistry())
    m.rewards = rewards
    session = await m.create(SessionCreate(session_id="s-1", prompt_id="p", group_id="g", group_size=4, index=2,
                                           label={"answer": "42"}, metadata={"source": "unit", "trajectory": "mine"},
                                           grant="a" * 40))
    for prompt_ids, output, params in calls:
        m.record(session, prompt_ids, output, params)
    pushed: list[list[Experience]] = []

    async def push(run, group):
        pushed.append(group)
        return f"stream:{run}"

    monkeypatch.setattr(m, "_push", push)
    done = await m.finish("s-1", finish)
    assert done.experience_ids == [e.id for e in pushed[0]] and done.stream == "stream:run"
    return [record(e, session.who.created_at) for e in pushed[0]]


A = SamplingParams(max_new_tokens=4, temperature=0.7, top_p=0.9, top_k=0, min_p=0.05)
B = SamplingParams(max_new_tokens=6, temperature=0.7, top_p=0.9, top_k=0, min_p=0.05)

# two calls continuing one conversation (the weights change between them), then the agent rewrites its history:
# two more calls continue a second trajectory
SESSION_CALLS = [
    ([1, 2, 3], out([4, 5], 2), A),
    ([1, 2, 3, 4, 5, 6, 7], out([8, 9], 3, "length"), B),
    ([1, 2, 10], out([11], 3, logprob=-0.25), A),
    ([1, 2, 10, 11, 12], out([13, 14], 3), A),
]



async def test_a_sessions_records_with_a_rewritten_history(monkeypatch):
    rewards = Rewards()
    group = await session_records(monkeypatch, SESSION_CALLS, SessionFinish(score=True), rewards)
    assert group == SESSION_RECORDS
    (items,) = rewards.items
    assert [(i.prompt, i.response) for i in items] == [("t1 t2 t3", "t4 t5 t6 t7 t8 t9"), ("t1 t2 t10", "t11 t12 t13 t14")]


async def test_a_one_call_sessions_record(monkeypatch):
    group = await session_records(monkeypatch, [([1, 2], out([3], 5), A)],
                                  SessionFinish(reward=0.5, reward_components={"judge": 0.5}))
    assert group == ONE_CALL_RECORDS


class Replica:
    tokenizer = Tokenizer()
    weight_version = 0


def worker_trajectories():
    """A multi-turn trajectory (model, tool, model across a weight switch mid-turn, user, model) and a one-turn one."""
    params = SamplingRecord(temperature=1.0, top_p=1.0, top_k=-1, min_p=0.0, max_tokens=8)
    b = TrajectoryBuilder([1, 2, 3])
    b.model([4, 5], [-0.5, -0.25], 1)
    b.environment([6, 7])
    b.model([8, 9, 10], [-0.1, -0.2, -0.3], 1, version_spans=[(0, 1), (2, 2)])
    b.environment([11])
    b.model([12], [-0.75], 2)
    multi = b.build(finish_reason="stop", reward=1.0, sampling=params, reward_components={"env": 1.0},
                    prompt_text="p", response_text="r", metadata={"turns": 3, "source": "env"})
    one = TrajectoryBuilder([1, 2, 3])
    one.model([20, 21], [-1.0, -2.0], 2)
    single = one.build(finish_reason="length", reward=0.0, sampling=params, prompt_text="p", response_text="q")
    return [multi, single]


async def worker_records(monkeypatch) -> list[Experience]:
    monkeypatch.setattr(time, "time", lambda: NOW)
    worker = RolloutWorker(WorkerRun(redis_url=None, run_name="run", run_key=None, worker=WorkerSettings()),
                           Replica(), CollectorRegistry())  # type: ignore[arg-type]
    worker.rewards = None  # type: ignore[assignment]

    async def rollout(ctx):
        return worker_trajectories()

    worker.rollout_function = rollout
    task = PromptTask(id="task-7", prompt="hi", n=2, label="x", metadata={"source": "task", "k": 1},
                      created_at=NOW - 10, grant="b" * 40)
    return await worker._rollout(task)


async def test_the_workers_records_of_a_multi_turn_group(monkeypatch):
    assert [record(e) for e in await worker_records(monkeypatch)] == WORKER_RECORDS


# ---- the records, as both producers wrote them before they shared one path --------------------------------------
SESSION_RECORDS = [{"id": "p#2",
  "prompt_id": "p",
  "group_id": "g",
  "group_size": 4,
  "index": 2,
  "prompt_token_ids": [1, 2, 3],
  "response_token_ids": [4, 5, 6, 7, 8, 9],
  "response_logprobs": [-0.5, -0.5, 0.0, 0.0, -0.5, -0.5],
  "finish_reason": "length",
  "reward": 1.0,
  "reward_components": {"exact": 1.0},
  "weight_version": 2,
  "prompt_text": "t1 t2 t3",
  "response_text": "t4 t5 t6 t7 t8 t9",
  "label": {"answer": "42"},
  "metadata": {"source": "unit", "trajectory": 0, "session_id": "s-1", "turns": 2, "trajectories": 2},
  "created_at": "opened",
  "generated_at": 1700000000.5,
  "action_mask": [1, 1, 0, 0, 1, 1],
  "version_spans": [(0, 2), (4, 3)],
  "sampling": {"temperature": 0.7, "top_p": 0.9, "top_k": -1, "min_p": 0.05, "max_tokens": 6},
  "grant": "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
  "metadata_order": ["source", "trajectory", "session_id", "turns", "trajectories"]},
 {"id": "p#2~1",
  "prompt_id": "p",
  "group_id": "g",
  "group_size": 4,
  "index": 2,
  "prompt_token_ids": [1, 2, 10],
  "response_token_ids": [11, 12, 13, 14],
  "response_logprobs": [-0.25, 0.0, -0.5, -0.5],
  "finish_reason": "stop",
  "reward": 0.25,
  "reward_components": {"exact": 0.0, "len": 0.5},
  "weight_version": 3,
  "prompt_text": "t1 t2 t10",
  "response_text": "t11 t12 t13 t14",
  "label": {"answer": "42"},
  "metadata": {"source": "unit", "trajectory": 1, "session_id": "s-1", "turns": 2, "trajectories": 2},
  "created_at": "opened",
  "generated_at": 1700000000.5,
  "action_mask": [1, 0, 1, 1],
  "version_spans": None,
  "sampling": {"temperature": 0.7, "top_p": 0.9, "top_k": -1, "min_p": 0.05, "max_tokens": 4},
  "grant": "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
  "metadata_order": ["source", "trajectory", "session_id", "turns", "trajectories"]}]

ONE_CALL_RECORDS = [{"id": "p#2",
  "prompt_id": "p",
  "group_id": "g",
  "group_size": 4,
  "index": 2,
  "prompt_token_ids": [1, 2],
  "response_token_ids": [3],
  "response_logprobs": [-0.5],
  "finish_reason": "stop",
  "reward": 0.5,
  "reward_components": {"judge": 0.5},
  "weight_version": 5,
  "prompt_text": "t1 t2",
  "response_text": "t3",
  "label": {"answer": "42"},
  "metadata": {"source": "unit", "trajectory": 0, "session_id": "s-1", "turns": 1, "trajectories": 1},
  "created_at": "opened",
  "generated_at": 1700000000.5,
  "action_mask": [1],
  "version_spans": None,
  "sampling": {"temperature": 0.7, "top_p": 0.9, "top_k": -1, "min_p": 0.05, "max_tokens": 4},
  "grant": "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
  "metadata_order": ["source", "trajectory", "session_id", "turns", "trajectories"]}]

WORKER_RECORDS = [{"id": "task-7#0",
  "prompt_id": "task-7",
  "group_id": "task-7",
  "group_size": 2,
  "index": 0,
  "prompt_token_ids": [1, 2, 3],
  "response_token_ids": [4, 5, 6, 7, 8, 9, 10, 11, 12],
  "response_logprobs": [-0.5,
                        -0.25,
                        0.0,
                        0.0,
                        -0.10000000149011612,
                        -0.20000000298023224,
                        -0.30000001192092896,
                        0.0,
                        -0.75],
  "finish_reason": "stop",
  "reward": 1.0,
  "reward_components": {"env": 1.0},
  "weight_version": 1,
  "prompt_text": "p",
  "response_text": "r",
  "label": "x",
  "metadata": {"source": "env", "k": 1, "turns": 3},
  "created_at": 1699999990.5,
  "generated_at": 1700000000.5,
  "action_mask": [1, 1, 0, 0, 1, 1, 1, 0, 1],
  "version_spans": [(0, 1), (6, 2)],
  "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "max_tokens": 8},
  "grant": "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb",
  "metadata_order": ["source", "k", "turns"]},
 {"id": "task-7#1",
  "prompt_id": "task-7",
  "group_id": "task-7",
  "group_size": 2,
  "index": 1,
  "prompt_token_ids": [1, 2, 3],
  "response_token_ids": [20, 21],
  "response_logprobs": [-1.0, -2.0],
  "finish_reason": "length",
  "reward": 0.0,
  "reward_components": {},
  "weight_version": 2,
  "prompt_text": "p",
  "response_text": "q",
  "label": "x",
  "metadata": {"source": "task", "k": 1},
  "created_at": 1699999990.5,
  "generated_at": 1700000000.5,
  "action_mask": None,
  "version_spans": [(0, 2)],
  "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "max_tokens": 8},
  "grant": "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb",
  "metadata_order": ["source", "k"]}]
