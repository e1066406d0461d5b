"""Errors a user can act on.

Every error that bad input can cause is a `SwapStreamError`. The CLI prints its message on one line and
exits non-zero; anything else that escapes is an internal bug and keeps its traceback. Like PyAV, each
error also subclasses the builtin that callers would expect (`ValueError`, `FileNotFoundError`, ...).
"""

from __future__ import annotations

from .engines.errors import EngineUserError, ModelMissingError


class SwapStreamError(Exception):
    """Base class for errors caused by input or environment, with a message naming the fix."""

    exit_code: int = 2


class InputError(SwapStreamError, ValueError):
    """An input file or stream exists but cannot be used (corrupt, wrong kind, no face)."""


class InputNotFoundError(SwapStreamError, FileNotFoundError):
    """An input path does not exist."""


class NoFaceError(InputError):
    """The source image has no detectable face."""


class OutputError(SwapStreamError, OSError):
    """An output cannot be written."""


class ConfigError(SwapStreamError, ValueError):
    """A configuration key or value is invalid."""


class ConsentError(SwapStreamError, PermissionError):
    """A source face has no consent record, or the consent store cannot be used."""


# Errors of the engines layer are user errors too; the CLI catches both families.
USER_ERRORS: tuple[type[Exception], ...] = (SwapStreamError, EngineUserError)

__all__ = ["SwapStreamError", "InputError", "InputNotFoundError", "NoFaceError", "OutputError",
           "ConfigError", "ConsentError", "EngineUserError", "ModelMissingError", "USER_ERRORS"]
