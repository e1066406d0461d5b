"""Errors from the engines layer that a user can act on.

They live here, not in `swapstream.errors`, because imports only go down: `stream` re-exports them and
its CLI treats `EngineUserError` like its own `SwapStreamError`.
"""

from __future__ import annotations


class EngineUserError(Exception):
    """A model or runtime problem the user can fix; the message names the file and the fix."""

    exit_code: int = 2


class ModelMissingError(EngineUserError, FileNotFoundError):
    """A model file is missing or fails its hash check."""
