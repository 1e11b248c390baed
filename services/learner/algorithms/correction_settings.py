"""Typed settings of the off-policy correction (``algorithm.correction``), torch-free, and the correction
plug-in point (:data:`CORRECTIONS`): each ``kind`` maps to its settings class and its function in
:mod:`.corrections`, called ``fn(learner_lp, engine_lp, mask, **fields)`` with the settings' fields;
``custom`` names a function of your own by import path. Defaults follow the papers
that introduced each (TIS: Yao et al. 2025, cap 2; MIS: "When Speed Kills Stability", [0.5, 2];
IcePop: Ring-1T, [0.5, 5]).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from shared.plugins import IN_SETTINGS, PluginPoint


class CorrectionSettingsBase(BaseModel):
    """What every correction's settings are (subclass it for your own correction)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class NoCorrection(CorrectionSettingsBase):
    """No importance weighting between the engine's and the learner's log-probabilities."""

    kind: Literal["none"] = "none"


class TISCorrection(CorrectionSettingsBase):
    """Token-level truncated IS: ``w = min(exp(learner_lp - engine_lp), cap)``."""

    kind: Literal["tis"] = "tis"
    cap: float = Field(default=2.0, gt=0.0, description="Upper bound C of the per-token weight.")


class _Band(CorrectionSettingsBase):
    low: float = Field(default=0.5, gt=0.0, description="Ratios below this are rejected.")
    high: float = Field(default=2.0, gt=0.0, description="Ratios above this are rejected.")

    @model_validator(mode="after")
    def _ordered(self):
        if self.low >= self.high:
            raise ValueError(f"low ({self.low}) must be below high ({self.high})")
        return self


class MISCorrection(_Band):
    """Masked IS: tokens, or whole sequences (product of token ratios), outside ``[low, high]`` leave the loss."""

    kind: Literal["mis"] = "mis"
    level: Literal["token", "sequence"] = Field(default="token", description="Reject single tokens or whole sequences.")


class GeoSeqCorrection(CorrectionSettingsBase):
    """Sequence-level IS with the geometric-mean ratio, truncated at ``cap``; optional rejection band."""

    kind: Literal["geo_seq"] = "geo_seq"
    cap: float = Field(default=2.0, gt=0.0, description="Upper bound of the sequence weight.")
    low: float | None = Field(default=None, gt=0.0, description="Reject sequences whose geometric ratio is below.")
    high: float | None = Field(default=None, gt=0.0, description="Reject sequences whose geometric ratio is above.")


class IcePopCorrection(CorrectionSettingsBase):
    """IcePop: tokens whose ratio is outside ``[alpha, beta]`` leave the loss; the rest keep ``w = ratio``."""

    kind: Literal["icepop"] = "icepop"
    alpha: float = Field(default=0.5, gt=0.0, description="Lower bound of the kept ratio band.")
    beta: float = Field(default=5.0, gt=0.0, description="Upper bound of the kept ratio band.")

    @model_validator(mode="after")
    def _ordered(self):
        if self.alpha >= self.beta:
            raise ValueError(f"alpha ({self.alpha}) must be below beta ({self.beta})")
        return self


class CustomCorrection(CorrectionSettingsBase):
    """Your own correction, by import path: ``fn(learner_lp, engine_lp, mask, **kwargs) -> Correction``
    (``services.learner.algorithms.corrections.Correction``)."""

    kind: Literal["custom"] = "custom"
    path: str = Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$", description="`package.module:function`.")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Extra keyword arguments for every call.")


#: corrections by ``kind``: settings model -> ``fn(learner_lp, engine_lp, mask, **fields) -> Correction``
#: (import paths: torch loads only in the learner). ``custom`` names its function in its settings; register
#: your own with ``CORRECTIONS.register("mine", MySettings, "package.module:my_correction")`` (docs/plugins.md).
CORRECTIONS: PluginPoint[Any] = PluginPoint(
    "correction", where="learner: algorithm.correction.kind", doc="Off-policy corrections between engine and "
    "learner log-probabilities (services/learner/algorithms/corrections.py).", settings_base=CorrectionSettingsBase,
    base="services.learner.algorithms.corrections:CorrectionFunction")
CORRECTIONS.register("none", NoCorrection, "services.learner.algorithms.corrections:no_correction")
CORRECTIONS.register("tis", TISCorrection, "services.learner.algorithms.corrections:truncated_is")
CORRECTIONS.register("mis", MISCorrection, "services.learner.algorithms.corrections:masked_is")
CORRECTIONS.register("geo_seq", GeoSeqCorrection, "services.learner.algorithms.corrections:geometric_sequence_is")
CORRECTIONS.register("icepop", IcePopCorrection, "services.learner.algorithms.corrections:icepop")
CORRECTIONS.register("custom", CustomCorrection, IN_SETTINGS)

#: a settings field holding one correction's settings
CorrectionSettings = CORRECTIONS.settings_type("CorrectionSettings")
