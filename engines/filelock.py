"""An exclusive lock file shared between processes (downloads and engine builds into one cache)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def exclusive(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive flock on `lock_path` for the block.

    Two processes filling the same cache entry (two streams starting together) would otherwise append
    to one `.part` file or build one engine twice. Windows has no flock: there the block runs
    unlocked, and the callers' atomic renames and checksums still keep the cache consistent.
    """
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(lock_path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
