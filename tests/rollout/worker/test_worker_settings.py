"""The worker's narrow settings (services/rollout/worker/settings.py): the service hands its worker a ``WorkerRun``
(the run's Redis, name and key, and the worker section), not its whole ``RolloutSettings``, and the loop reads of
the section only what ``WorkerSection`` names. The section's model stands above the worker (it holds the agents'
sections), so these checks hold the two together."""

from __future__ import annotations

import ast
import dataclasses
import typing
from pathlib import Path

from services.rollout.settings import RolloutSettings, WorkerSettings
from services.rollout.worker.settings import WorkerRun, WorkerSection

LOOP = Path(__file__).resolve().parents[3] / "services" / "rollout" / "worker" / "loop.py"


def section_members() -> dict[str, object]:
    """WorkerSection's members and the type each returns."""
    return {name: typing.get_type_hints(member.fget)["return"]
            for name, member in vars(WorkerSection).items() if isinstance(member, property)}


def settings_uses(tree: ast.AST) -> dict[str, dict[str, list[int]]]:
    """What a module reads of ``self.settings`` / ``settings`` and of ``self.cfg`` / ``cfg`` (the worker section),
    with the lines."""
    out: dict[str, dict[str, list[int]]] = {"settings": {}, "cfg": {}}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        v = node.value
        if isinstance(v, ast.Attribute) and v.attr in out and isinstance(v.value, ast.Name) and v.value.id == "self":
            out[v.attr].setdefault(node.attr, []).append(node.lineno)
        elif isinstance(v, ast.Name) and v.id in out:
            out[v.id].setdefault(node.attr, []).append(node.lineno)
    return out


def test_the_worker_loop_reads_nothing_of_its_settings_beyond_the_narrow_ones():
    used = settings_uses(ast.parse(LOOP.read_text()))
    assert {"run_name", "worker"} <= set(used["settings"]) and {"concurrency", "sampling"} <= set(used["cfg"])
    beyond = {k: v for k, v in used["settings"].items() if k not in {f.name for f in dataclasses.fields(WorkerRun)}}
    assert not beyond, f"the worker reads service settings past WorkerRun: {beyond}"
    beyond = {k: v for k, v in used["cfg"].items() if k not in section_members()}
    assert not beyond, f"the worker reads its section past WorkerSection (add it there, typed): {beyond}"


def test_the_check_sees_a_read_past_the_narrow_settings():
    tree = ast.parse("class W:\n    def f(self, settings):\n        return self.settings.engine.kind, self.cfg.agent, "
                     "settings.model\n")
    assert settings_uses(tree) == {"settings": {"engine": [3], "model": [3]}, "cfg": {"agent": [3]}}


def test_the_worker_section_is_the_settings_models_fields_with_their_types():
    fields = WorkerSettings.model_fields
    members = section_members()
    assert len(members) == 14  # staleness, claim time, backlog: the run-wide section's (WorkerRun.run)
    drift = {name: (t, fields[name].annotation if name in fields else "no such field") for name, t in members.items()
             if name not in fields or fields[name].annotation != t}
    assert not drift, f"WorkerSection and WorkerSettings disagree: {drift}"
    assert isinstance(WorkerSettings(), WorkerSection)


def test_what_the_service_hands_its_worker(tiny_model_dir):
    """The run's three and the section, taken from the service's settings; the rest of them is not there."""
    s = RolloutSettings(model=str(tiny_model_dir), run_name="r1", redis_url="redis://127.0.0.1:1/0", run_key="k" * 32,
                        worker={"enabled": True, "reward_url": "http://127.0.0.1:1"}, run={"max_staleness": 3})
    run = WorkerRun(redis_url=s.redis_url, run_name=s.run_name, run_key=s.run_key, worker=s.worker, run=s.run)
    assert (run.redis_url, run.run_name, run.worker) == ("redis://127.0.0.1:1/0", "r1", s.worker)
    assert run.run.max_staleness == 3  # the run-wide bounds (shared/run_settings.py)
    assert not hasattr(run, "model") and not hasattr(run, "engine")
