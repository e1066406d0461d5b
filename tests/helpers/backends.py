"""Swap backends for runtime tests: the real ones, made slower."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from swapstream.runtime.manager import default_backend_factory
from swapstream.runtime.swappers import BackendFactory


class SlowBackend:
    """The real swap backend on a machine whose swap takes `seconds` a frame: the real swap, then the
    rest of the time. The frames are really swapped."""

    def __init__(self, backend: Any, seconds: float) -> None:
        self.backend = backend
        self.seconds = seconds
        self.name, self.max_batch = backend.name, backend.max_batch

    def identity(self, image: np.ndarray) -> Any:
        return self.backend.identity(image)

    def swap(self, items: list[Any]) -> list[int]:
        t0 = time.monotonic()
        n = self.backend.swap(items)
        time.sleep(max(0.0, self.seconds * len(items) - (time.monotonic() - t0)))
        return n

    def close(self) -> None:
        self.backend.close()


def slow_backends(seconds: float) -> BackendFactory:
    """A runtime's backend factory whose backends take `seconds` a frame."""
    return lambda name, config, device: SlowBackend(default_backend_factory(name, config, device), seconds)
