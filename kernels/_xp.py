"""Pick NumPy or CuPy from the arrays an op is given, and validate arguments the same way everywhere."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np


def get_xp(*arrays: Any) -> ModuleType:
    """Return `cupy` if any argument is a CuPy array, else `numpy`.

    CuPy is imported lazily: the CPU path must work where CuPy is not installed.
    """
    for a in arrays:
        if type(a).__module__.startswith("cupy"):
            import cupy

            return cupy
    return np


def check_array(name: str, a: Any, *, ndim: int | None = None, dtype: Any = None,
                shape: tuple[int | None, ...] | None = None) -> None:
    """Raise ValueError naming `name` when `a` has the wrong rank, dtype or shape."""
    if not hasattr(a, "shape") or not hasattr(a, "dtype"):
        raise ValueError(f"{name} must be an array, got {type(a).__name__}")
    if ndim is not None and a.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(a.shape)}")
    if dtype is not None and a.dtype != np.dtype(dtype):
        raise ValueError(f"{name} must be {np.dtype(dtype).name}, got {a.dtype}")
    if shape is not None:
        if len(shape) != a.ndim or any(s is not None and s != d for s, d in zip(shape, a.shape)):
            want = "x".join("?" if s is None else str(s) for s in shape)
            raise ValueError(f"{name} must have shape {want}, got {tuple(a.shape)}")


def on_gpu(**arrays: Any) -> bool:
    """True when all given arrays are CuPy arrays, False when none is; a ValueError naming the odd
    one out when they are mixed (a host array passed where the others live on the GPU)."""
    on = {name: type(a).__module__.startswith("cupy") for name, a in arrays.items()}
    if any(on.values()) and not all(on.values()):
        host = next(name for name, g in on.items() if not g)
        gpu = next(name for name, g in on.items() if g)
        raise ValueError(f"{host} must be a CuPy array on the GPU like {gpu}, got "
                         f"{type(arrays[host]).__name__}")
    return any(on.values())
