"""Training health: a pure check of a run's recent metrics for the failures that cost users the most time — a
collapse of the reward, of held-out accuracy or of the policy's entropy, or a spike in the engine/trainer
mismatch or the KL — each said with what to try. The learner puts it in ``/status`` (``health``), ``fleetrl
run`` on its display and in ``summary.json``. Torch-free; inputs are the learner's metrics lines
(``metrics.jsonl``: ``step``, ``reward_mean``, ``entropy``, ``kl``, ``mismatch_k3``, ``response_len_mean``,
``truncated_frac``) and held-out points. A collapse that comes with completions blowing up to the length limit
is said as that (a reward hack: babbling for partial credit), not as a learning-rate problem.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from statistics import mean, median

LR_HINT = "the learning rate may be too high (try 1e-5..1e-4 for full fine-tuning, ~10x that with LoRA)"

WINDOW = 5
"""Steps averaged on each side of a comparison (single steps are noisy: a group's reward is a few samples); the
reward, noisiest of all with small groups, is averaged over twice as many."""


@dataclass(frozen=True)
class HealthWarning:
    """One problem: which signal (``reward``, ``heldout``, ``entropy``, ``kl``, ``mismatch``) and the line to show."""

    signal: str
    message: str


def _series(history: Sequence[Mapping[str, object]], key: str) -> list[tuple[int, float]]:
    out = []
    for n, row in enumerate(history):
        value = row.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value):
            step = row.get("step")
            out.append((int(step) if isinstance(step, (int, float)) else n, float(value)))
    return out


FALL_WINDOWS = {"reward_mean": 2 * WINDOW, "entropy": WINDOW}
"""The signals checked for a fall, each with the steps averaged on each side of the comparison."""


@dataclass
class Peaks:
    """The best mean of ``FALL_WINDOWS[key]`` steps each falling-checked signal reached over the whole run, as
    ``(step, mean)``: a slow collapse (entropy 0.56 -> 0.03 over 300 steps) outlasts the recent history the
    learner keeps for the checks. Feed it every metrics line (``add``) and pass it to ``check_health``."""

    best: dict[str, tuple[int, float]] = field(default_factory=dict)
    _tails: dict[str, deque] = field(default_factory=dict, repr=False)

    def add(self, row: Mapping[str, object]) -> None:
        for key, window in FALL_WINDOWS.items():
            for step, value in _series([row], key):
                tail = self._tails.setdefault(key, deque(maxlen=window))
                tail.append(value)
                if len(tail) == window and (key not in self.best or mean(tail) >= self.best[key][1]):
                    at = row.get("step", step)
                    self.best[key] = (at if isinstance(at, int) else step, mean(tail))


def _fell(points: list[tuple[int, float]], *, window: int, min_peak: float, min_drop: float,
          ratio: float, best: tuple[int, float] | None = None) -> tuple[float, float, int] | None:
    """(peak, now, steps since the peak) when the mean of the last ``window`` points fell below ``ratio`` x the
    best earlier mean of ``window`` points (or ``best``, the run's best such mean at a step before them, when
    it is higher) and by at least ``min_drop``; else None."""
    if len(points) < 2 * window:
        return None
    means = [(points[i + window - 1][0], mean(v for _, v in points[i:i + window]))
             for i in range(len(points) - window + 1)]
    now_step, now = means[-1]
    earlier = means[:-window] or means[:1]
    if best is not None and best[0] <= earlier[-1][0]:
        earlier = [best, *earlier]
    peak_step, peak = max(reversed(earlier), key=lambda m: m[1])  # ties: the latest, when the fall began
    if peak >= min_peak and now <= ratio * peak and peak - now >= min_drop:
        return peak, now, now_step - peak_step
    return None


def _spiked(points: list[tuple[int, float]], *, floor: float, factor: float,
            sustained: int = 1) -> tuple[float, float] | None:
    """(latest, median before) when the last ``sustained`` values are each over ``factor`` x the median of the
    ones before them and over ``floor``."""
    if len(points) < WINDOW + sustained:
        return None
    before = median(abs(v) for _, v in points[-(4 * WINDOW) - sustained:-sustained])
    last = [abs(v) for _, v in points[-sustained:]]
    if all(v >= floor and v > factor * max(before, 1e-12) for v in last):
        return last[-1], before
    return None


def length_blowup(history: Sequence[Mapping[str, object]]) -> tuple[float, float, float] | None:
    """(mean length before, now, share of completions at max_new_tokens now) when the mean completion length of
    the last ``WINDOW`` steps is at least twice that of the first ``WINDOW`` and half of them hit the limit."""
    lengths = _series(history, "response_len_mean")
    if len(lengths) < 2 * WINDOW:
        return None
    before, now = mean(v for _, v in lengths[:WINDOW]), mean(v for _, v in lengths[-WINDOW:])
    capped = _series(history, "truncated_frac")[-WINDOW:]
    at_max = mean(v for _, v in capped) if capped else 0.0
    if now >= 2 * max(before, 1.0) and at_max >= 0.5:
        return before, now, at_max
    return None


def _length_hint(blowup: tuple[float, float, float]) -> str:
    before, now, at_max = blowup
    return (f"completions grew {before:.0f} -> {now:.0f} tokens and {at_max:.0%} hit max_new_tokens: the policy may "
            f"be padding its answers for partial credit (read samples.jsonl); penalise length (a `length` rule "
            f"check) or lower sampling.max_new_tokens")


def check_health(history: Sequence[Mapping[str, object]],
                 heldout: Sequence[tuple[int, float]] = (), peaks: Peaks | None = None) -> list[HealthWarning]:
    """The warnings for a run's recent metrics ``history`` (oldest first), its held-out ``(step, accuracy)``
    points and the run's ``peaks`` (when the history is only the recent steps); an empty list when nothing
    looks wrong."""
    out = []
    run_best = peaks.best if peaks is not None else {}
    blowup = length_blowup(history)
    hint = _length_hint(blowup) if blowup else LR_HINT  # what a collapse is blamed on
    if fell := _fell(_series(history, "reward_mean"), window=FALL_WINDOWS["reward_mean"], min_peak=0.2, min_drop=0.15,
                     ratio=0.5, best=run_best.get("reward_mean")):
        peak, now, steps = fell
        out.append(HealthWarning("reward", f"reward fell {peak:.2f} -> {now:.2f} in {steps} steps: {hint}"))
    points = [(int(s), float(a)) for s, a in heldout]
    if len(points) >= 2:
        best_step, best = max(points[:-1], key=lambda p: p[1])
        step, acc = points[-1]
        if best >= 0.1 and acc <= 0.5 * best and best - acc >= 0.1:
            out.append(HealthWarning("heldout", f"held-out accuracy fell {best:.0%} -> {acc:.0%} in {step - best_step} "
                                                f"steps: {hint}"))
    if fell := _fell(_series(history, "entropy"), window=FALL_WINDOWS["entropy"], min_peak=0.05, min_drop=0.02,
                     ratio=0.1, best=run_best.get("entropy")):
        peak, now, steps = fell
        out.append(HealthWarning("entropy", f"entropy fell {peak:.3g} -> {now:.3g} in {steps} steps: the policy is "
                                            f"collapsing onto few answers; {hint}"
                                            + ("" if blowup else ", or raise sampling.temperature")))
    if blowup and not out:
        out.append(HealthWarning("length", _length_hint(blowup)))
    # a mismatch that lasts: one step's spike is the policy moving under staleness >= 1 (the engine sampled with
    # the previous version), seen in make demo at lr 5e-4; a sync or dtype fault stays
    if spike := _spiked(_series(history, "mismatch_k3"), floor=0.05, factor=10.0, sustained=3):
        latest, before = spike
        out.append(HealthWarning("mismatch", f"engine/trainer mismatch spiked to {latest:.3g} ({before:.2g} before): "
                                             "the rollout engine's logprobs left the trainer's; check the engine's "
                                             f"dtype matches the learner's, and {LR_HINT}"))
    if spike := _spiked(_series(history, "kl"), floor=0.05, factor=10.0):
        latest, before = spike
        out.append(HealthWarning("kl", f"KL to the reference spiked to {latest:.3g} ({before:.2g} before): the policy "
                                       f"moved far in one step; {LR_HINT}, or raise the KL coefficient"))
    return out
