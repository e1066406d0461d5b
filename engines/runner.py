"""The runner interface shared by every inference backend (ONNX Runtime, PyTorch, TensorRT).

Modelled on Polygraphy: a runner is a context manager built on a template method. The public `infer`
checks the feed against the model's declared inputs (names, ranks, fixed dimensions, dtypes),
times the call, and hands over to the backend's `_infer_impl`. A backend implements only the
`_*_impl` hooks. Bad feeds raise `FeedError` (a ValueError naming the input); a backend's own
failure is a `RunnerError`.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

Dim = int | str | None
"""A fixed size, or a symbolic/unknown one (batch)."""


class FeedError(ValueError):
    """The arrays passed to `infer` do not match the model's inputs."""


class RunnerError(RuntimeError):
    """A backend failed on a valid feed (an internal problem, not the user's input)."""


@dataclass(frozen=True)
class TensorSpec:
    """One model input or output."""

    name: str
    """Tensor name in the model."""
    shape: tuple[Dim, ...]
    """Declared shape; str or None for dimensions that vary (batch)."""
    dtype: np.dtype
    """Element type the model expects or produces."""


def array_module_name(a: Any) -> str:
    """'numpy', 'cupy' or 'torch', for error messages and dispatch."""
    return type(a).__module__.split(".")[0]


class Runner(ABC):
    """Runs one model. Use as a context manager; call `infer` with a dict of named arrays."""

    name: str = "runner"
    """Backend name, for logs ("onnxruntime", "torch", "tensorrt")."""
    wants_device_arrays: bool = False
    """True when feeds must already be on the GPU (TensorRT binds device pointers only)."""

    def __init__(self) -> None:
        self.inputs: list[TensorSpec] = []
        self.outputs: list[TensorSpec] = []
        self.last_infer_seconds: float = 0.0
        """Host wall time of the last `infer` call (for GPU backends: launch, not completion)."""
        self._active = False

    # -- template -------------------------------------------------------------------------------

    def __enter__(self) -> "Runner":
        self.activate()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.deactivate()

    def activate(self) -> None:
        if not self._active:
            self._activate_impl()
            self._active = True

    def deactivate(self) -> None:
        if self._active:
            self._deactivate_impl()
            self._active = False

    def infer(self, feed: dict[str, Any], stream: Any = None) -> dict[str, Any]:
        """Run the model on `feed` (name -> array); returns name -> array.

        Arrays may be NumPy, CuPy or torch tensors as the backend accepts; `stream` is the CUDA stream
        (a CuPy stream) for GPU backends, None for the current one.
        """
        if not self._active:
            raise RunnerError(f"{self.name} runner used outside its `with` block")
        self.check_feed(feed)
        t0 = time.perf_counter()
        out = self._infer_impl(feed, stream)
        self.last_infer_seconds = time.perf_counter() - t0
        if log.isEnabledFor(logging.DEBUG):
            for k, v in out.items():
                log.debug("%s output %s: %s %s on %s", self.name, k, getattr(v, "dtype", "?"),
                          tuple(getattr(v, "shape", ())), array_module_name(v))
        return out

    def check_feed(self, feed: dict[str, Any]) -> None:
        names = {s.name for s in self.inputs}
        missing = names - feed.keys()
        extra = feed.keys() - names
        if missing or extra:
            raise FeedError(f"{self.name}: feed must have inputs {sorted(names)}; missing "
                            f"{sorted(missing)}, unexpected {sorted(extra)}")
        batch = None
        for spec in self.inputs:
            a = feed[spec.name]
            shape = tuple(int(d) for d in a.shape)
            if len(shape) != len(spec.shape):
                raise FeedError(f"{self.name}: input '{spec.name}' must have {len(spec.shape)} "
                                f"dimensions {spec.shape}, got {shape}")
            for want, got in zip(spec.shape, shape):
                if isinstance(want, int) and want > 0 and want != got:
                    raise FeedError(f"{self.name}: input '{spec.name}' must have shape {spec.shape}, "
                                    f"got {shape}")
            if batch is None:
                batch = shape[0]
            elif shape and not isinstance(spec.shape[0], int) and shape[0] != batch:
                raise FeedError(f"{self.name}: inputs disagree on the batch size ({batch} and "
                                f"{shape[0]} for '{spec.name}')")
            got_dtype = np.dtype(str(a.dtype).replace("torch.", ""))
            if got_dtype != spec.dtype:
                raise FeedError(f"{self.name}: input '{spec.name}' must be {spec.dtype.name}, got "
                                f"{got_dtype.name}")

    # -- hooks ------------------------------------------------------------------------------------

    def _activate_impl(self) -> None:
        """Load what the backend needs (sessions, engines, graphs)."""

    def _deactivate_impl(self) -> None:
        """Free it."""

    @abstractmethod
    def _infer_impl(self, feed: dict[str, Any], stream: Any) -> dict[str, Any]:
        """Run on a checked feed."""
