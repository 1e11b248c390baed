"""Whether an engine can load published weights, and how, is the engine's own declaration
(``Engine.weight_sink``): every engine kind names a sink that loads and is a ``WeightSink``; an engine that
names none cannot be given a sidecar; a wrong path fails when the sidecar is built, naming it."""

from __future__ import annotations

import pytest

from services.rollout.engines.base import Engine, engine_class
from services.rollout.engines.settings import ENGINES
from services.rollout.weights.settings import SidecarSettings
from services.rollout.weights.sinks import WeightSink, create_sink, sink_class
from shared.service_kit.loader import LoadError


@pytest.mark.parametrize(("kind", "sink"), [("hf", "HFSink"), ("sglang", "SGLangSink"), ("vllm", "VLLMSink")])
def test_each_engine_names_its_sink(kind, sink):
    cls = engine_class(kind)
    assert issubclass(cls, Engine) and cls.kind == kind
    got = sink_class(cls)
    assert issubclass(got, WeightSink) and got.__name__ == sink


def test_every_registered_engine_can_load_weights():
    assert sorted(ENGINES.kinds()) == ["hf", "sglang", "vllm"]
    for kind in ENGINES.kinds():
        assert issubclass(sink_class(engine_class(kind)), WeightSink), kind


def test_an_engine_without_a_sink_cannot_get_one():
    class Frozen:
        kind, weight_sink = "frozen", None

    assert Engine.weight_sink is None  # the base class promises nothing
    with pytest.raises(TypeError, match="'frozen' engine cannot load weights"):
        create_sink(Frozen(), SidecarSettings())


@pytest.mark.parametrize(("path", "problem"), [
    ("services.rollout.weights.sinks.hf:NoSuchSink", "has no attribute 'NoSuchSink'"),
    ("services.rollout.engines.base:Engine", "not a subclass of WeightSink"),
])
def test_a_wrong_sink_path_is_refused_naming_it(path, problem):
    class Odd:
        kind, weight_sink = "odd", path

    with pytest.raises(LoadError, match=problem) as err:
        sink_class(Odd())
    assert path in str(err.value) and "'odd' engine" in str(err.value)
