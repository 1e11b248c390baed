"""The contract of every plug-in point (``shared.plugins.POINTS``): each has a base, every kind registered on it
loads and satisfies that base (with its settings' fields, where the base takes them), so a kind registered
tomorrow is checked here without this file changing; and a plug-in of the wrong shape is refused when it loads,
in one line naming the point, the kind and what is missing."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Literal

import pytest
from pydantic import BaseModel, ConfigDict

from deploy.plugins_doc import points
from services.learner.algorithms.algorithm_settings import ALGORITHMS
from services.learner.algorithms.correction_settings import CORRECTIONS, CorrectionSettingsBase
from services.learner.algorithms.policy_loss_settings import POLICY_LOSSES, PolicyLossSettingsBase
from services.rollout.agents.environments import ENVIRONMENTS
from services.rollout.worker.functions import ROLLOUT_FUNCTIONS
from shared.plugins import IN_SETTINGS, POINTS
from shared.service_kit.loader import LoadError, mismatch

ALL_POINTS = points()  # imports every module that creates a point
KINDS = [(p.name, kind) for p in ALL_POINTS for kind in p.kinds() if p.entry(kind).impl != IN_SETTINGS]


@pytest.mark.parametrize("name", sorted(p.name for p in ALL_POINTS))
def test_every_point_has_a_base_type(name):
    base = POINTS[name].base()
    assert isinstance(base, type)
    assert not getattr(base, "_is_protocol", False) or getattr(base, "_is_runtime_protocol", False), name


@pytest.mark.parametrize(("name", "kind"), KINDS)
def test_every_registered_kind_loads_and_satisfies_its_point_s_base(name, kind):
    point = POINTS[name]
    impl = point.load(kind)
    model = point.settings_model(kind)
    fields = None if model is None else [f for f in model.model_fields if f != point.tag]
    assert mismatch(impl, point.base(), keywords=fields) is None
    if model is not None and point.settings_base is not None:
        assert issubclass(model, point.settings_base)


@pytest.mark.parametrize("kind", ALGORITHMS.kinds())
def test_every_algorithm_names_a_runner_the_learner_service_can_start(kind):
    from services.learner.algorithms.rl_algorithms import runner_class
    from services.learner.runner import runner_problem

    cls = runner_class(SimpleNamespace(name=kind))
    assert runner_problem(cls) is None


# ---- plug-ins of the wrong shape, refused when they load -----------------------------------------------------
class NoStepEnv:
    """An environment class that forgot step."""

    def __init__(self, turns: int = 1) -> None: ...

    async def reset(self, task: Any) -> Any: ...

    async def close(self) -> None: ...


class TurnsArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    turns: int = 1
    colour: str = "red"


def sync_rollout(ctx: Any) -> list:
    return []


class CapSettings(CorrectionSettingsBase):
    kind: Literal["cap_contract"] = "cap_contract"
    cap: float = 2.0


def correction_without_cap(learner_lp: Any, engine_lp: Any, mask: Any) -> Any: ...


class ScaleSettings(PolicyLossSettingsBase):
    kind: Literal["scale_contract"] = "scale_contract"
    scale: float = 1.0


def loss_of_two_inputs(x: Any, y: Any, scale: float = 1.0) -> Any: ...


@pytest.mark.parametrize(("point", "kind", "settings", "impl", "problem"), [
    (ENVIRONMENTS, "nostep_contract", None, NoStepEnv,
     r"environment 'nostep_contract': class NoStepEnv does not make an Environment \(its instances lack: step\)"),
    (ENVIRONMENTS, "args_contract", TurnsArgs, f"{__name__}:NoStepEnv",
     (r"environment 'args_contract' '.*:NoStepEnv': class NoStepEnv\(turns: int = 1\) cannot be called as "
     r"EnvironmentFactory \(turns=, colour=\): got an unexpected keyword argument 'colour'")),
    (ROLLOUT_FUNCTIONS, "sync_contract", None, sync_rollout,
     r"rollout function 'sync_contract': function sync_rollout must be async: a RolloutFunction is awaited"),
    (CORRECTIONS, "cap_contract", CapSettings, correction_without_cap,
     (r"correction 'cap_contract': function correction_without_cap\(.*\) cannot be called as CorrectionFunction "
     r"\(learner_lp, engine_lp, mask, cap=\)")),
    (POLICY_LOSSES, "scale_contract", ScaleSettings, loss_of_two_inputs,
     r"policy loss 'scale_contract': function loss_of_two_inputs\(.*\) cannot be called as PolicyLoss \(x, scale=\)"),
])
def test_a_plug_in_of_the_wrong_shape_is_refused_when_it_loads_in_one_line(registered, point, kind, settings, impl,
                                                                           problem):
    registered(point, kind, settings, impl)
    with pytest.raises(LoadError, match=problem) as err:
        point.load(kind)
    assert "\n" not in str(err.value)
