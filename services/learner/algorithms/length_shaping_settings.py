"""Typed settings of what happens to samples that ran out of tokens (``algorithm.overlong``), torch-free at import;
the tensor functions are in :mod:`.length_shaping`. Each kind carries its behaviour: the trainer calls
:meth:`~_Overlong.shape_scores` on the rewards and :meth:`~_Overlong.loss_keep` on the loss mask, whatever the kind.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

if TYPE_CHECKING:
    import torch


class _Overlong(BaseModel):
    """What a kind does, by default nothing: scores unchanged, every sample in the loss."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    def shape_scores(self, scores: torch.Tensor, response_lengths: torch.Tensor) -> torch.Tensor:
        """[B] the rewards ``scores`` of responses of ``response_lengths`` tokens, after this kind's shaping."""
        return scores

    def loss_keep(self, truncated: torch.Tensor) -> torch.Tensor:
        """[B] float, 1.0 for the samples that stay in the loss, 0.0 for those this kind takes out (``truncated``:
        [B] bool, cut by the length limit)."""
        import torch

        return torch.ones(truncated.shape, dtype=torch.float32, device=truncated.device)


class OverlongNone(_Overlong):
    """Truncated samples train like any other."""

    kind: Literal["none"] = "none"


class OverlongMask(_Overlong):
    """Samples cut by the length limit (finish reason ``length``) leave the loss (DAPO overlong filtering)."""

    kind: Literal["mask"] = "mask"

    def loss_keep(self, truncated: torch.Tensor) -> torch.Tensor:
        from services.learner.algorithms.length_shaping import keep_unless_truncated

        return keep_unless_truncated(truncated)


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

    def shape_scores(self, scores: torch.Tensor, response_lengths: torch.Tensor) -> torch.Tensor:
        from services.learner.algorithms.length_shaping import soft_overlong_penalty

        return scores + self.coef * soft_overlong_penalty(response_lengths, self.budget, self.buffer)


OverlongSettings = Annotated[OverlongNone | OverlongMask | OverlongSoftPenalty, Field(discriminator="kind")]
