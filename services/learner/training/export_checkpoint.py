"""A checkpoint's policy as a plain Hugging Face directory (``fleetrl export``, and a sharded learner's final
export): the rollout service and ``fleetrl eval`` load it as is.

One process, no process group: DCP reads every rank's shards of a sharded checkpoint (any number of ranks wrote
them) into one full model on the CPU. The model is built from the checkpoint's own ``actor/config.json`` without
initialising its weights (every trainable tensor comes from the shards); a LoRA run's model is the learner's
(``model.actor`` plus adapters, from the settings recorded in ``state.json``), its adapters merged on export.
An older checkpoint (full HF weights in ``actor/``) is copied as it is.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from services.learner.checkpoint import MARKER, latest_in
from services.learner.training.sharded_state import META_FILE, STATE_DIR, is_sharded_checkpoint

if TYPE_CHECKING:
    from services.learner.training.models import HFModel


class ExportError(ValueError):
    """The directory holds no checkpoint this can export; the message says what was looked for."""


def find_trainer_dir(path: Path) -> Path:
    """The ``trainer/`` directory of the newest complete checkpoint under ``path``: a run dir (``fleetrl run``'s,
    with ``learner/checkpoints``), a learner's run dir (``checkpoints``), a checkpoints root, one ``step-*``
    checkpoint, or a ``trainer/`` directory itself."""
    path = Path(path)
    if (path / "trainer.json").is_file():
        return path
    if (path / MARKER).is_file() and (path / "trainer").is_dir():
        return path / "trainer"
    for root in (path / "learner" / "checkpoints", path / "checkpoints", path):
        latest = latest_in(root) if root.is_dir() else None
        if latest is not None:
            return latest / "trainer"
    raise ExportError(f"{path}: no complete checkpoint found (looked for learner/checkpoints/, checkpoints/ and "
                      "step-*/ directories with a COMPLETE marker)")


def export_checkpoint(trainer_dir: Path, out_dir: Path) -> Path:
    """Write the policy of ``trainer_dir`` as a Hugging Face directory ``out_dir`` (weights and tokenizer)."""
    trainer_dir, out_dir = Path(trainer_dir), Path(out_dir)
    actor_dir = trainer_dir / "actor"
    if not is_sharded_checkpoint(trainer_dir):
        if not any(actor_dir.glob("*.safetensors")) or (actor_dir / "adapter_config.json").is_file():
            raise ExportError(f"{trainer_dir}: no full model weights in actor/ (an older LoRA checkpoint holds only "
                              "adapters; its run's checkpoint.export_dir holds the merged model)")
        shutil.copytree(actor_dir, out_dir, dirs_exist_ok=True)
        return out_dir
    from transformers import AutoTokenizer

    meta = json.loads((trainer_dir / META_FILE).read_text())
    tokenizer = AutoTokenizer.from_pretrained(str(actor_dir))
    model = _actor(actor_dir, meta.get("model") or {})
    _load_actor_shards(model, trainer_dir / STATE_DIR)
    from services.learner.training.models import save_actor_export

    save_actor_export(model, tokenizer, out_dir)
    return out_dir


def _actor(actor_dir: Path, model_settings: dict) -> HFModel:
    """The model the shards are read into, on the CPU."""
    if model_settings.get("lora"):
        from services.learner.settings import ModelSettings
        from services.learner.training.models import load_actor

        settings = ModelSettings(**{**model_settings, "device": "cpu", "gradient_checkpointing": False})
        return load_actor(settings, torch.device("cpu"))
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(actor_dir))
    with torch.device("meta"):  # no initialisation: every weight is read from the shards
        model = AutoModelForCausalLM.from_config(config)
    return model.to_empty(device="cpu")


def _load_actor_shards(model: HFModel, state_dir: Path) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    reader = HuggingFaceStorageReader(str(state_dir))
    stored = {k.removeprefix("actor.model."): v for k, v in reader.read_metadata().state_dict_metadata.items()
              if k.startswith("actor.model.")}
    dtypes = {m.properties.dtype for m in stored.values() if isinstance(m, TensorStorageMetadata)}  # (all are)
    if len(dtypes) == 1:  # the checkpoint's dtype wins (training may run in another than the config's)
        model.to(dtypes.pop())  # type: ignore[arg-type]  # transformers' stub: .to wrapped without dtype
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    own = model.state_dict()
    names: dict[int, set[str]] = {}  # a tied weight is stored under one of its names only
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), set()).add(name)
    missing = [k for k, p in model.named_parameters(remove_duplicate=False)
               if p.requires_grad and not names[id(p)] & stored.keys()]
    if missing:
        raise ExportError(f"{state_dir}: the checkpoint has no {missing[0]} (and {len(missing) - 1} more) for this "
                          "model")
    dcp.load({"actor": {"model": {k: own[k] for k in stored if k in own}}}, storage_reader=reader, no_dist=True)
    if hasattr(model, "tie_weights"):
        model.tie_weights()
