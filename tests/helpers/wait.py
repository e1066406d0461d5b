"""Polling until a condition holds, for tests and the tools that drive real servers."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def until(what: str, timeout: float, check: Callable[[], Any], every: float = 0.1,
          fail: type[BaseException] = AssertionError) -> Any:
    """`check()`'s first true value, polled every `every` s; `fail` (a test's AssertionError, a
    tool's SystemExit) naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)
