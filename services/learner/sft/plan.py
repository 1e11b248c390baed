"""How many steps an SFT run takes, from the same settings an RL run reads: ``data.epochs`` (passes over the
data) and ``train.max_steps``, with ``algorithm.batch_size`` pairs per step. ``algorithm.epochs`` and
``algorithm.max_steps`` (the SFT algorithm's own, older names) mean the same; setting both names of one thing to
different values is an error naming both.

As in RL (:func:`services.learner.data.epoch_plan`): ``max_steps`` with the passes left unset cycles the data
(each pass reshuffled) until max_steps; with the passes set, they cap the run, and the note says so when that
stops it before max_steps. Pure; the note is logged at start and shown by ``fleetrl run``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from services.learner.data import CYCLE
from services.learner.settings import DataSettings


class SFTPlanError(ValueError):
    """Two settings of one meaning disagree; the message names both."""


@dataclass(frozen=True)
class SFTPlan:
    epochs: int  # passes over the data the run may take (CYCLE: until total_steps)
    total_steps: int
    note: str  # how many steps, and why


T = TypeVar("T")


def _one(name: str, a: tuple[str, T, bool], b: tuple[str, T, bool]) -> tuple[str, T, bool]:
    """The value of the setting that was set, (setting, value, was it set); both set differently: an error."""
    (na, va, sa), (nb, vb, sb) = a, b
    if sa and sb and va != vb:
        # the two are often set in different places (the spec's algorithm.max_steps, a --set train.max_steps=N):
        # "set only X" read as "you set X" to someone who did; say both ways out with the value they asked for
        raise SFTPlanError(f"{na} {va} and {nb} {vb} both set the {name} of an sft run (two names of one setting): "
                           f"keep one: remove {nb} and keep {na} {va}, or set {nb} to {va} instead of {na}")
    return a if sa or not sb else b


def sft_plan(data: DataSettings, sft, train_max_steps: int | None, train_max_steps_set: bool, rows: int) -> SFTPlan:
    """``sft``: the SFT algorithm settings (epochs, max_steps, batch_size; a preference algorithm's, rm or dpo,
    have the same); ``rows``: pairs in the data."""
    name = getattr(sft, "name", "sft")
    ep_name, epochs, epochs_set = _one("passes", ("data.epochs", data.epochs, "epochs" in data.model_fields_set),
                                       ("algorithm.epochs", sft.epochs, "epochs" in sft.model_fields_set))
    ms_name, max_steps, _ = _one("steps", ("train.max_steps", train_max_steps, train_max_steps_set),
                                 ("algorithm.max_steps", sft.max_steps, sft.max_steps is not None))
    bs = sft.batch_size
    per_pass = -(-rows // bs)
    what = f"{rows} pairs / algorithm.batch_size {bs} = {per_pass} steps a pass"
    if max_steps is None:
        total = per_pass * epochs
        return SFTPlan(epochs, total, f"{name}: {total} steps: {ep_name} {epochs} x ({what})")
    if not epochs_set:
        passes = max_steps * bs / rows
        return SFTPlan(CYCLE, max_steps, f"{name}: {max_steps} steps ({ms_name}): {max_steps * bs} pairs from {rows}, "
                       f"{passes:.1f} passes over the data, each reshuffled ({what}); set data.epochs to cap the run "
                       "at whole passes")
    total = min(max_steps, per_pass * epochs)
    if total < max_steps:
        return SFTPlan(epochs, total, f"{name}: {total} steps: {ms_name} {max_steps} is more than the data holds: "
                       f"{ep_name} {epochs} x ({what}), so the run stops at step {total}; raise {ep_name}, or leave it "
                       "unset to cycle the data until max_steps")
    return SFTPlan(epochs, total, f"{name}: {total} steps ({ms_name}; {ep_name} {epochs} x ({what}) would allow "
                   f"{per_pass * epochs})")
