"""The run spec's ``plugins``: modules of the operator's (here a file beside the spec) are imported before the
spec's sections are validated, so the spec names their algorithm, loss and scorer; an import failure is one line
naming ``plugins[i]``; every service's derived settings get the same ``plugins`` and ``sys_path``."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from deploy.plugins_doc import points
from deploy.run.load import SpecError, load_spec
from deploy.run.plan import plan
from tests.deploy.run.conftest import tiny_spec

MODULE = '''
from typing import Literal

from pydantic import Field

from services.learner.algorithms.algorithm_settings import ALGORITHMS, RLAlgorithmSettings
from services.learner.algorithms.policy_loss_settings import POLICY_LOSSES, PolicyLossSettingsBase
from services.learner.algorithms.rl_algorithms import Algorithm
from services.reward.scorer_config import SCORERS, ScorerSettingsBase
from services.reward.scorers.base import Scorer


class SignSettings(RLAlgorithmSettings):
    name: Literal["sign_spec"] = "sign_spec"


class SignAlgorithm(Algorithm):
    def shape_scores(self, scores, groups):
        return scores.sign()


class TemperedSettings(PolicyLossSettingsBase):
    kind: Literal["tempered_spec"] = "tempered_spec"
    temperature: float = Field(default=1.0, gt=0)


def tempered_loss(inputs, temperature):
    raise NotImplementedError  # configured, never trained here


class LengthSettings(ScorerSettingsBase):
    kind: Literal["length_spec"] = "length_spec"
    per_char: float = Field(default=-0.25, description="Reward per character of the response.")


class LengthScorer(Scorer):
    async def score(self, items):
        return [self.config.per_char * len(item.response) - 0.125 for item in items]


ALGORITHMS.register("sign_spec", SignSettings, SignAlgorithm)
POLICY_LOSSES.register("tempered_spec", TemperedSettings, tempered_loss)
SCORERS.register("length_spec", LengthSettings, LengthScorer)
'''


@pytest.fixture()
def clean_registries() -> Iterator[None]:
    """Whatever a spec's plugins register (and import, and put on sys.path) is undone after the test."""
    before = {point: set(point.kinds()) for point in points()}
    modules, path = set(sys.modules), list(sys.path)
    yield
    for point, kinds in before.items():
        for kind in set(point.kinds()) - kinds:
            point.unregister(kind)
    for name in set(sys.modules) - modules:
        if name.startswith("spec_plugins_"):
            del sys.modules[name]
    sys.path[:] = path


def plugin_spec(tmp_path: Path, model: Path, module: str, **extra) -> Path:
    (tmp_path / f"{module}.py").write_text(MODULE)
    return tiny_spec(tmp_path, model, plugins=[module],
                     algorithm={"name": "sign_spec", "policy_loss": {"kind": "tempered_spec", "temperature": 2.0}},
                     reward={"scorers": [{"name": "len", "kind": "length_spec", "per_char": -0.5}]}, **extra)


def test_a_spec_names_the_kinds_of_a_module_beside_it_and_every_service_gets_its_plugins(
        tmp_path, tiny_model_dir, clean_registries):
    spec_file = plugin_spec(tmp_path, tiny_model_dir, "spec_plugins_a")
    without = yaml.safe_load(spec_file.read_text())
    del without["plugins"]
    (tmp_path / "without.yaml").write_text(yaml.safe_dump(without))
    with pytest.raises(SpecError, match="unknown algorithm name 'sign_spec'"):
        load_spec(tmp_path / "without.yaml")  # the kinds exist only once the spec's plugins are imported

    spec = load_spec(spec_file)
    assert type(spec.algorithm).__name__ == "SignSettings" and spec.algorithm.policy_loss.temperature == 2.0
    assert type(spec.reward.scorers[0]).__name__ == "LengthSettings" and spec.reward.scorers[0].per_char == -0.5
    assert spec.plugins == ["spec_plugins_a"] and spec.sys_path == [str(tmp_path.resolve())]

    procs = plan(spec, spec_file, "redis://127.0.0.1:1", "t" * 24, "k" * 32, gpus=0)  # validated per service
    assert {p.kind for p in procs} == {"reward", "rollout", "learner"}
    for p in procs:
        assert p.config["plugins"] == ["spec_plugins_a"] and p.config["sys_path"] == [str(tmp_path.resolve())], p.name
    learner = next(p for p in procs if p.kind == "learner")
    assert learner.config["algorithm"]["name"] == "sign_spec"
    assert learner.config["algorithm"]["policy_loss"] == {"kind": "tempered_spec", "temperature": 2.0}
    reward = next(p for p in procs if p.kind == "reward")
    assert reward.config["scorers"][0]["kind"] == "length_spec"


def test_a_service_section_adds_its_own_plugins_after_the_specs(tmp_path, tiny_model_dir, clean_registries):
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "spec_plugins_extra.py").write_text("")
    spec_file = plugin_spec(tmp_path, tiny_model_dir, "spec_plugins_b", sys_path=[".", "lib"])
    raw = yaml.safe_load(spec_file.read_text())
    raw["services"]["rollout"]["plugins"] = ["spec_plugins_extra", "spec_plugins_b"]
    spec_file.write_text(yaml.safe_dump(raw))
    spec = load_spec(spec_file)
    assert spec.sys_path == [str(tmp_path.resolve()), str((tmp_path / "lib").resolve())]
    procs = plan(spec, spec_file, "redis://127.0.0.1:1", "t" * 24, "k" * 32, gpus=0)
    rollout = next(p for p in procs if p.kind == "rollout")
    assert rollout.config["plugins"] == ["spec_plugins_b", "spec_plugins_extra"]
    assert next(p for p in procs if p.kind == "learner").config["plugins"] == ["spec_plugins_b"]


def test_validating_a_spec_never_imports_its_plugins_and_refuses_ones_not_imported(tmp_path, tiny_model_dir,
                                                                                     clean_registries):
    from pydantic import ValidationError

    from deploy.run.spec import RunSpec

    spec_file = plugin_spec(tmp_path, tiny_model_dir, "spec_plugins_e")
    raw = {**yaml.safe_load(spec_file.read_text()), "sys_path": [str(tmp_path)]}
    with pytest.raises(ValidationError) as err:
        RunSpec.model_validate(raw)
    assert "spec_plugins_e" not in sys.modules and str(tmp_path) not in sys.path
    assert ("plugins 'spec_plugins_e' are not imported: load the spec with deploy.run.load.load_spec"
            in str(err.value))
    assert load_spec(spec_file).algorithm.name == "sign_spec"  # the load step imports them, then validates


def test_a_plugin_that_does_not_import_is_one_line_naming_it(tmp_path, tiny_model_dir, clean_registries):
    (tmp_path / "spec_plugins_broken.py").write_text("raise RuntimeError('no licence key')\n")
    spec_file = tiny_spec(tmp_path, tiny_model_dir, plugins=["spec_plugins_c_missing"])
    with pytest.raises(SpecError) as err:
        load_spec(spec_file)
    assert str(err.value) == (f"{spec_file}: plugins[0]: importing 'spec_plugins_c_missing' raised "
                              "ModuleNotFoundError: No module named 'spec_plugins_c_missing'")
    with pytest.raises(SpecError) as err:
        load_spec(spec_file, ["plugins=[json, spec_plugins_broken]"])
    assert str(err.value) == ("--set plugins: plugins[1]: importing 'spec_plugins_broken' raised "
                              "RuntimeError: no licence key")
    with pytest.raises(SpecError) as err:
        load_spec(spec_file, ["sys_path=[nowhere]"])
    assert str(err.value) == f"--set sys_path: sys_path[0]: no directory at {(tmp_path / 'nowhere').resolve()}"
    with pytest.raises(SpecError, match=r"plugins\[0\]: 'not a module' is not a module name"):
        load_spec(spec_file, ["plugins=['not a module']"])


def test_fleetrl_plugins_lists_the_kinds_a_spec_registers(tmp_path, tiny_model_dir, clean_registries):
    from deploy.cli import app

    spec_file = plugin_spec(tmp_path, tiny_model_dir, "spec_plugins_d")
    out = CliRunner().invoke(app, ["plugins", str(spec_file)])
    assert out.exit_code == 0, out.output
    assert "sign_spec  ->  spec_plugins_d:SignAlgorithm" in out.output
    assert "length_spec  ->  spec_plugins_d:LengthScorer" in out.output
    bad = tiny_spec(tmp_path, tiny_model_dir, plugins=["spec_plugins_d_missing"])
    out = CliRunner().invoke(app, ["plugins", str(bad)])
    assert out.exit_code == 2 and "plugins[0]: importing 'spec_plugins_d_missing'" in out.output
