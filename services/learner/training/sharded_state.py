"""Sharded training state with ``torch.distributed.checkpoint`` (DCP): every rank writes its own shards, and any
number of ranks reads them back (2 -> 1, 1 -> 2, ...), the optimizer state with them.

A checkpoint's ``trainer/`` directory (see ``TrainerBase.save``) then holds:

- ``state/``: the DCP checkpoint of every engine's model and optimizer tensors (``actor.model.<fqn>``,
  ``actor.optim.state.<fqn>.exp_avg`` ...; ``critic.*`` likewise), as safetensors files, one per rank
  (``shard-0000R-...``), each tensor's offsets in the file's own header: no pickle is written or read.
  ``get_state_dict`` / ``set_state_dict`` give the same keys for a plain module, a replicated (data-parallel)
  one and an FSDP2 (DTensor) one, so the layout does not depend on the backend or the number of ranks. Tensors
  are read back into the live parameters (this rank's shard of them) and staged to the host by DCP's writer.
  Frozen parameters (a LoRA base) are not written: the base comes from ``model.actor``, as at the start.
- ``state.json`` (rank 0): per engine, what is not a tensor: the LR scheduler's state, the optimizer's
  param-group settings (lr, betas ...) and its step count; plus the world size that wrote it and the learner's
  model settings (what ``fleetrl export`` builds the model from).

Backends that keep their own optimizer partitions (DeepSpeed) are not DCP-able (:func:`supports`): they keep
writing their own format. Every function here is collective where a process group exists: call it on every rank.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

STATE_DIR = "state"
META_FILE = "state.json"
FORMAT = 1


def _options(strict: bool = True):
    """Trainable tensors only. Loading is not strict about the frozen ones (a LoRA base), which the learner loaded
    from ``model.actor``; every trainable tensor is in the DCP state dict, which DCP fills or fails."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(ignore_frozen_params=True, strict=strict)


def supports(engine: Any) -> bool:
    """True for engines whose model and optimizer are plain torch objects (``TrainEngine.dcp_checkpoints``: the
    ``torch`` and ``fsdp`` backends)."""
    return bool(engine.dcp_checkpoints)


def is_sharded_checkpoint(trainer_dir: Path) -> bool:
    """A ``trainer/`` directory written by :func:`save` (older checkpoints hold full HF weights instead)."""
    return (Path(trainer_dir) / META_FILE).is_file() and (Path(trainer_dir) / STATE_DIR).is_dir()


def _tensors(engines: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, list[dict]], dict[str, dict[str, str]]]:
    """The DCP state dict (tensors only, the engines' own), each engine's param groups (FQN form) and its tied
    names (:func:`_tied`)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    state: dict[str, Any] = {}
    groups: dict[str, list[dict]] = {}
    aliases: dict[str, dict[str, str]] = {}
    for name, engine in engines.items():
        model_sd, optim_sd = get_state_dict(engine.model, engine.optimizer, options=_options())
        aliases[name] = _tied(model_sd)
        for alias in aliases[name]:
            del model_sd[alias]  # one tensor under two names (tied embeddings): stored once
        state[name] = {"model": model_sd, "optim": {"state": optim_sd["state"]}}
        param_groups = optim_sd["param_groups"]
        assert isinstance(param_groups, list)  # (torch's OptimizerStateType types every entry alike)
        groups[name] = param_groups
    return state, groups, aliases


def _tied(model_sd: Mapping[str, Any]) -> dict[str, str]:
    """``{alias: first name}`` for entries that hold the same storage as an earlier one (tied weights)."""
    first: dict[tuple[int | torch.SymInt, tuple, str], str] = {}
    out: dict[str, str] = {}
    for key, value in model_sd.items():
        local = value.to_local() if hasattr(value, "to_local") else value
        if not isinstance(local, torch.Tensor) or local.numel() == 0:
            continue
        ident = (local.untyped_storage().data_ptr() + local.storage_offset() * local.element_size(),
                 tuple(local.shape), str(local.dtype))
        if ident in first:
            out[key] = first[ident]
        else:
            first[ident] = key
    return out


def _plain(value: Any) -> Any:
    """JSON form of a param group's / scheduler's settings (tuples as lists; nothing else is expected)."""
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, torch.Tensor):
        return value.item()
    return value


def save(engines: Mapping[str, Any], out_dir: Path, model_settings: dict[str, Any] | None = None) -> None:
    """Write every engine's shards of this rank under ``out_dir/state``; rank 0 also writes ``state.json``."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageWriter

    out_dir = Path(out_dir)
    state, groups, _aliases = _tensors(engines)
    dcp.save(state, storage_writer=HuggingFaceStorageWriter(str(out_dir / STATE_DIR), save_distributed=True),
             no_dist=_world() == 1)
    if _rank() != 0:
        return
    meta: dict[str, Any] = {"format": FORMAT, "world_size": _world(), "model": model_settings, "engines": {}}
    for name, engine in engines.items():
        meta["engines"][name] = {
            "scheduler": {k: _plain(v) for k, v in engine.scheduler.state_dict().items()},
            "param_groups": [{k: _plain(v) for k, v in g.items() if k != "params"} for g in groups[name]],
            "optimizer_steps": int(engine.optimizer_steps),
        }
    (out_dir / META_FILE).write_text(json.dumps(meta, indent=1))


def load(engines: Mapping[str, Any], in_dir: Path) -> dict[str, Any]:
    """Read ``save``'s shards into the live engines (any number of ranks), then their schedulers, param-group
    settings and step counts. Returns ``state.json``."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageReader
    from torch.distributed.checkpoint.state_dict import set_state_dict

    in_dir = Path(in_dir)
    meta = json.loads((in_dir / META_FILE).read_text())
    if meta.get("format") != FORMAT:
        raise ValueError(f"{in_dir / META_FILE}: checkpoint format {meta.get('format')!r}, this learner reads {FORMAT}")
    missing = sorted(set(engines) - set(meta["engines"]))
    if missing:
        raise ValueError(f"{in_dir}: the checkpoint has no state for {', '.join(missing)} (it holds "
                         f"{', '.join(sorted(meta['engines']))})")
    state, groups, aliases = _tensors(engines)  # the live tensors (optimizer state initialised): DCP reads into them
    dcp.load(state, storage_reader=HuggingFaceStorageReader(str(in_dir / STATE_DIR)), no_dist=_world() == 1)
    for name, engine in engines.items():
        saved = meta["engines"][name]
        if len(saved["param_groups"]) != len(groups[name]):
            raise ValueError(f"{in_dir}: {name} has {len(saved['param_groups'])} optimizer param groups in the "
                             f"checkpoint and {len(groups[name])} here")
        param_groups = [{**g, **{k: tuple(v) if isinstance(v, list) else v for k, v in s.items()}}
                        for g, s in zip(groups[name], saved["param_groups"])]
        model_sd = state[name]["model"]
        model_sd.update({alias: model_sd[first] for alias, first in aliases[name].items()})
        set_state_dict(engine.model, engine.optimizer, model_state_dict=model_sd,
                       optim_state_dict={"state": state[name]["optim"]["state"], "param_groups": param_groups},
                       options=_options(strict=False))
        engine.scheduler.load_state_dict(saved["scheduler"])
        engine.set_optimizer_steps(int(saved["optimizer_steps"]))
    return meta


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _world() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
