"""Whether a ``model`` setting can load: a local Hugging Face directory (with its ``config.json``) or a model hub
id (``org/name``). Anything else is a directory that is not there, refused at once with where it was looked for:
a bare ``sft-modle`` used to go to the hub, which on a machine without one waited ~60 s for its retries before an
``OSError`` about huggingface.co. Torch-free: the settings of the rollout and reward services call it."""

from __future__ import annotations

from pathlib import Path


def looks_like_hub_id(name: str) -> bool:
    """``org/name`` (one slash, not a relative path): a model hub id, not a local directory."""
    return name.count("/") == 1 and not name.startswith((".", "~", "/"))


def model_dir_problem(value: str) -> str | None:
    """Why ``value`` cannot be a model to load, or None (a local checkpoint directory, or a hub id)."""
    path = Path(value).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            return f"model {value!r}: no Hugging Face checkpoint there (config.json missing)"
        return None
    if looks_like_hub_id(value):
        return None
    where = path if path.is_absolute() else f"{path.resolve()} (a relative path is relative to the current " \
                                           f"directory, {Path.cwd()})"
    return f"model {value!r}: no model directory at {where}; a model hub id is written org/name"
