"""Files that hold secrets (service configs carry the control-plane token): readable by this user only."""

from __future__ import annotations

import os
from pathlib import Path


def private_dir(path: Path) -> Path:
    """Create ``path`` (and its parents) if needed and make it 0700: only this user can list or enter it."""
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o700)
    return path


def write_private(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` with mode 0600. A new file is created with that mode (never readable by
    others, not even for a moment); an existing one is tightened before its contents are replaced."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(text)
    return path
