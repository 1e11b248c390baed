"""The worker's narrow interface to the replica it runs on (``Replica`` for its rollout functions, ``WorkerReplica``
for the loop): the rollout service is one, an adapter over the service's HTTP API another, and the worker reaches
nothing of the service beyond it."""

from __future__ import annotations

import ast
from pathlib import Path

import httpx
import pytest
from transformers import AutoTokenizer

from deploy.local.evaluate_agent import HttpReplica
from services.rollout.app import create_app
from services.rollout.engines.types import SamplingParams
from services.rollout.errors import RequestError
from services.rollout.service import RolloutService
from services.rollout.settings import RolloutSettings
from services.rollout.worker.contract import Replica, RolloutContext
from services.rollout.worker.loop import WorkerReplica
from services.rollout.worker.single_turn import single_turn
from shared.reward_api import ScoreResponse
from shared.schemas import PromptTask
from tests.rollout.agents.scripted_engine import ScriptedEngine

WORKER = Path(__file__).resolve().parents[3] / "services" / "rollout" / "worker"


class Rewards:
    """The reward client's interface: 1.0 for a response that says four, else 0."""

    async def score(self, items):
        return ScoreResponse(scores=[float("four" in i.response) for i in items], components=[{}] * len(items))


def members(*protocols: type) -> set[str]:
    return {name for p in protocols for name in vars(p) if not name.startswith("_")}


def replica_uses(tree: ast.AST) -> dict[str, list[int]]:
    """What is read of ``self.replica`` / ``self._replica`` / ``replica`` in a module, with the lines."""
    out: dict[str, list[int]] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        v = node.value
        held = (isinstance(v, ast.Attribute) and v.attr in ("replica", "_replica")
                and isinstance(v.value, ast.Name) and v.value.id == "self")
        if held or (isinstance(v, ast.Name) and v.id == "replica"):
            out.setdefault(node.attr, []).append(node.lineno)
    return out


def test_the_worker_uses_nothing_of_the_replica_but_its_interface():
    allowed = members(Replica, WorkerReplica)
    assert allowed == {"tokenizer", "model_name", "context_length", "sessions", "encode", "apply_chat_template",
                       "check_sequence", "generate", "off_loop", "weight_version"}
    used: dict[str, list[str]] = {}
    for path in sorted(WORKER.glob("*.py")):
        for name, lines in replica_uses(ast.parse(path.read_text())).items():
            used.setdefault(name, []).extend(f"{path.name}:{n}" for n in lines)
    assert {"generate", "check_sequence", "weight_version"} <= set(used)  # the walk sees the worker's uses
    beyond = {name: where for name, where in used.items() if name not in allowed}
    assert not beyond, f"the worker reaches past its Replica interface: {beyond}"


def test_the_check_sees_a_reach_past_the_interface():
    tree = ast.parse("class W:\n    def f(self):\n        return self.replica.engine.queue_depth\n")
    assert replica_uses(tree) == {"engine": [3]}


async def test_the_service_is_the_replica_its_worker_runs_on(tiny_model_dir):
    settings = RolloutSettings(model=str(tiny_model_dir), served_model_name="tiny", limits={"max_stop_strings": 1})
    svc = RolloutService(settings, engine=ScriptedEngine(str(tiny_model_dir), lambda p: "x", context_length=64))
    await svc.start()
    try:
        assert isinstance(svc, WorkerReplica)
        assert (svc.model_name, svc.context_length, svc.weight_version) == ("tiny", 64, svc.engine.weight_version)
        assert svc.check_sequence([1, 2], SamplingParams(max_new_tokens=8)) == 8
        with pytest.raises(RequestError, match="limits.max_stop_strings"):
            svc.check_sequence([1, 2], SamplingParams(max_new_tokens=8, stop=("a", "b")))
        with pytest.raises(RequestError, match="context length"):
            svc.check_sequence([1] * 60, SamplingParams(max_new_tokens=8))
    finally:
        await svc.stop()


async def test_a_replica_over_http_runs_the_workers_own_rollout_function(tiny_model_dir):
    """``HttpReplica`` (held-out evaluation) is the interface over ``/generate``, and nothing more."""
    settings = RolloutSettings(model=str(tiny_model_dir), served_model_name="tiny")
    engine = ScriptedEngine(str(tiny_model_dir), lambda prompt: "four")
    app = create_app(settings, service=RolloutService(settings, engine=engine))
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    async with (app.router.lifespan_context(app),
                httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://rollout") as http):
        replica = HttpReplica("http://rollout", http, tokenizer, (await http.get("/model_info")).json())
        assert isinstance(replica, Replica) and replica.model_name == "tiny" and replica.sessions is None
        ctx = RolloutContext(PromptTask(id="t", prompt="2 + 2?", n=2), SamplingParams(max_new_tokens=8),
                             settings.worker, replica, Rewards())
        group = await single_turn(ctx)
    assert engine.calls == 2 and [t.reward for t in group] == [1.0, 1.0]
    assert all(t.response_ids and t.response_text.startswith("four") for t in group)
