"""Capture and restore every RNG the training step uses, so a resumed run draws the same numbers."""

from __future__ import annotations

import random
from pathlib import Path
from typing import cast

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def save_rng(path: Path) -> None:
    np_state = cast(tuple, np.random.get_state(legacy=True))  # (name, keys, pos, has_gauss, cached_gaussian)
    state = {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "python": random.getstate(),
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
    }
    torch.save(state, path)


def load_rng(path: Path) -> None:
    # weights_only: our own file of tensors and plain containers
    state = torch.load(path, map_location="cpu", weights_only=True)
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
