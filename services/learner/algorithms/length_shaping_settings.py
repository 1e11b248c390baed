"""Typed settings of what happens to samples that ran out of tokens (``algorithm.overlong``), torch-free; the
tensor functions are in :mod:`.length_shaping`."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Overlong(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class OverlongNone(_Overlong):
    """Truncated samples train like any other."""

    kind: Literal["none"] = "none"


class OverlongMask(_Overlong):
    """Samples cut by the length limit (finish reason ``length``) leave the loss (DAPO overlong filtering)."""

    kind: Literal["mask"] = "mask"


class OverlongSoftPenalty(_Overlong):
    """DAPO's soft overlong punishment added to the reward: 0 up to ``budget - buffer`` tokens, then linearly
    down to -1 at ``budget``, -1 beyond; times ``coef``."""

    kind: Literal["soft_penalty"] = "soft_penalty"
    budget: int = Field(ge=1, description="The length limit (the generation budget, max_new_tokens).")
    buffer: int = Field(ge=1, description="Tokens before the budget over which the penalty grows from 0 to -1.")
    coef: float = Field(default=1.0, gt=0.0, description="Scale of the penalty.")

    @model_validator(mode="after")
    def _fits(self):
        if self.buffer > self.budget:
            raise ValueError(f"buffer ({self.buffer}) cannot exceed budget ({self.budget})")
        return self


OverlongSettings = Annotated[OverlongNone | OverlongMask | OverlongSoftPenalty, Field(discriminator="kind")]
