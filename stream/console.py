"""The consoles every command writes to, and the one rule for user errors at the top of a CLI."""

from __future__ import annotations

import sys

import typer
from rich.console import Console
from rich.text import Text

from .errors import USER_ERRORS
from .redact import redact_text

err = Console(stderr=True, highlight=False)
"""Progress, prompts and errors."""
out = Console(highlight=False)
"""Results."""


def run_app(app: typer.Typer) -> None:
    """Run a Typer app; user errors become one line on stderr and a non-zero exit.

    Click (inside Typer) already turns usage errors into a message and exit code 2; what reaches
    here is our own user errors, which bad input raises from deep inside a job.
    """
    try:
        app()
    except USER_ERRORS as e:
        # Text, not markup: paths and values may contain "[...]", which Rich would read as style tags.
        # Errors quote the URLs they failed on: shown without stream keys or tokens.
        err.print(Text("error: ", style="bold red") + Text(redact_text(str(e))), soft_wrap=True)
        sys.exit(getattr(e, "exit_code", 2))
