"""A LiteRT (TensorFlow Lite) runner for the built-in MediaPipe models on the CPU."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np


@contextmanager
def _native_stderr_silenced() -> Iterator[None]:
    """Silence C-level writes to stderr (fd 2) inside the block.

    LiteRT's C++ core prints "INFO: Created TensorFlow Lite XNNPACK delegate" for every interpreter and
    ignores TF_CPP_MIN_LOG_LEVEL; that line would break the CLI's promise of one-line errors. Failures
    still surface as Python exceptions.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


class LiteRTRunner:
    """Runs one `.tflite` model. Context manager; `run` checks the feed against the model's input."""

    def __init__(self, model_path: str | Path, *, num_threads: int = 1) -> None:
        # Imported here so that importing the engines package never requires LiteRT.
        from ai_edge_litert.interpreter import Interpreter

        self.path = Path(model_path)
        with _native_stderr_silenced():
            self._interp: Any = Interpreter(model_path=str(self.path), num_threads=num_threads)
            self._interp.allocate_tensors()
        self._input = self._interp.get_input_details()[0]
        self._outputs = self._interp.get_output_details()
        self.input_shape: tuple[int, ...] = tuple(int(s) for s in self._input["shape"])
        self.input_dtype = np.dtype(self._input["dtype"])

    def run(self, x: np.ndarray) -> list[np.ndarray]:
        """Run one inference; returns the outputs in the model's declared order, as copies."""
        if tuple(x.shape) != self.input_shape or x.dtype != self.input_dtype:
            raise ValueError(
                f"{self.path.name}: input must be {self.input_dtype} {self.input_shape}, "
                f"got {x.dtype} {tuple(x.shape)}")
        self._interp.set_tensor(self._input["index"], x)
        self._interp.invoke()
        # get_tensor copies; the interpreter reuses its buffers on the next invoke.
        return [self._interp.get_tensor(o["index"]) for o in self._outputs]

    def close(self) -> None:
        self._interp = None

    def __enter__(self) -> "LiteRTRunner":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
