"""Where the engines layer keeps files, and the one file hash it uses."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def cache_dir(env_var: str, name: str) -> Path:
    """`$env_var` when set, else `$XDG_CACHE_HOME/swapstream/<name>` (`~/.cache` by default)."""
    env = os.environ.get(env_var)
    if env:
        return Path(env).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "swapstream" / name


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """SHA-256 of a file's bytes, read in chunks (model files run to hundreds of MB)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()
