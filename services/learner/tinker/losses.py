"""Tinker's loss functions as pure functions over one datum's tensors, registered by name.

Each takes the trainer's log-probabilities of the target tokens (``[T]``, with grad), the datum's loss inputs
(``[T]`` tensors) and the request's ``loss_fn_config``, and returns the datum's loss, summed over tokens as
Tinker defines it (the client divides by whatever it wants through ``weights`` / ``advantages``):

- ``cross_entropy``: ``-(weights * logp).sum()`` (weights default to ones);
- ``importance_sampling``: ``-(exp(logp - sampling_logp) * advantages).sum()``;
- ``ppo``: ``-min(r * A, clip(r, clip_low_threshold, clip_high_threshold) * A).sum()``, thresholds 0.8 / 1.2;
- ``cispo``: ``-(sg(clip(r, low, high)) * logp * A).sum()``, thresholds 0.8 / 1.2;
- ``dro``: ``-(logp * A - beta / 2 * (logp - sampling_logp) ** 2).sum()``, ``beta`` (default 0.05).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from services.learner.tinker.errors import BadRequest

Config = Mapping[str, float | str]


@dataclass(frozen=True)
class LossFn:
    fn: Callable[[torch.Tensor, dict[str, torch.Tensor], Config], torch.Tensor]
    required: tuple[str, ...]
    optional: tuple[str, ...] = ()
    config_keys: tuple[str, ...] = ()


def _num(config: Config, key: str, default: float) -> float:
    value = config.get(key, default)
    if isinstance(value, str):
        raise BadRequest(f"loss_fn_config[{key!r}] must be a number, got {value!r}")
    return float(value)


def cross_entropy(logp: torch.Tensor, inputs: dict[str, torch.Tensor], config: Config) -> torch.Tensor:
    weights = inputs.get("weights")
    return -(logp * (weights if weights is not None else 1.0)).sum()


def importance_sampling(logp: torch.Tensor, inputs: dict[str, torch.Tensor], config: Config) -> torch.Tensor:
    ratio = torch.exp(logp - inputs["logprobs"])
    return -(ratio * inputs["advantages"]).sum()


def _ratio_bounds(config: Config) -> tuple[float, float]:
    low, high = _num(config, "clip_low_threshold", 0.8), _num(config, "clip_high_threshold", 1.2)
    if not 0.0 <= low <= 1.0 <= high:
        raise BadRequest(f"loss_fn_config: need 0 <= clip_low_threshold <= 1 <= clip_high_threshold, got {low}, {high}")
    return low, high


def ppo(logp: torch.Tensor, inputs: dict[str, torch.Tensor], config: Config) -> torch.Tensor:
    low, high = _ratio_bounds(config)
    ratio = torch.exp(logp - inputs["logprobs"])
    adv = inputs["advantages"]
    return -torch.minimum(ratio * adv, ratio.clamp(low, high) * adv).sum()


def cispo(logp: torch.Tensor, inputs: dict[str, torch.Tensor], config: Config) -> torch.Tensor:
    low, high = _ratio_bounds(config)
    ratio = torch.exp(logp - inputs["logprobs"]).clamp(low, high).detach()
    return -(ratio * logp * inputs["advantages"]).sum()


def dro(logp: torch.Tensor, inputs: dict[str, torch.Tensor], config: Config) -> torch.Tensor:
    beta = _num(config, "beta", 0.05)
    return -(logp * inputs["advantages"] - 0.5 * beta * (logp - inputs["logprobs"]) ** 2).sum()


_RL = ("target_tokens", "logprobs", "advantages")
LOSSES: dict[str, LossFn] = {
    "cross_entropy": LossFn(cross_entropy, ("target_tokens",), ("weights",)),
    "importance_sampling": LossFn(importance_sampling, _RL),
    "ppo": LossFn(ppo, _RL, config_keys=("clip_low_threshold", "clip_high_threshold")),
    "cispo": LossFn(cispo, _RL, config_keys=("clip_low_threshold", "clip_high_threshold")),
    "dro": LossFn(dro, _RL, config_keys=("beta",)),
}


def lookup(name: str, config: Config) -> LossFn:
    """The registered loss ``name``; an unknown name or config key is a 400 that lists what is served."""
    loss = LOSSES.get(name)
    if loss is None:
        raise BadRequest(f"loss_fn {name!r} is not served; served: {', '.join(sorted(LOSSES))} "
                         "(forward_backward_custom runs on the client over cross_entropy)")
    unknown = set(config) - set(loss.config_keys)
    if unknown:
        raise BadRequest(f"loss_fn_config keys {sorted(unknown)} mean nothing to {name!r} "
                         f"(it reads {list(loss.config_keys) or 'none'})")
    return loss
