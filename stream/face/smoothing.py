"""One Euro filter (Casiez et al., CHI 2012) for landmark arrays.

At rest it low-passes hard, so a still head does not jitter; as the landmarks speed up the cut-off
rises, so fast motion is followed without lag. Speed is measured in face sizes per second, which
makes one set of parameters work for small and large faces alike.
"""

from __future__ import annotations

import math

import numpy as np


def _alpha(cutoff: np.ndarray | float, dt: float) -> np.ndarray | float:
    tau = 1.0 / (2.0 * math.pi * np.asarray(cutoff))
    return 1.0 / (1.0 + tau / dt)


class OneEuroFilter:
    """Filters one array (e.g. (468, 3) landmarks) sampled at increasing times."""

    def __init__(self, min_cutoff: float = 1.0, beta: float = 0.5, d_cutoff: float = 1.0) -> None:
        self.min_cutoff = min_cutoff
        self.beta = beta
        self.d_cutoff = d_cutoff
        self._x: np.ndarray | None = None
        self._dx: np.ndarray | None = None
        self._t = 0.0

    def __call__(self, x: np.ndarray, t: float, scale: float = 1.0) -> np.ndarray:
        """Filtered copy of `x` at time `t` seconds; `scale` is the face size in x's units."""
        x = np.asarray(x, dtype=np.float64)
        if self._x is None or self._dx is None:
            self._x, self._dx, self._t = x.copy(), np.zeros_like(x), t
            return x.astype(np.float32)
        # A repeated or backwards timestamp (some VFR sources) would divide by zero: assume 30 fps.
        dt = t - self._t if t > self._t else 1.0 / 30.0
        dx = (x - self._x) / dt
        self._dx = self._dx + _alpha(self.d_cutoff, dt) * (dx - self._dx)
        cutoff = self.min_cutoff + self.beta * np.abs(self._dx) / max(scale, 1e-6)
        self._x = self._x + _alpha(cutoff, dt) * (x - self._x)
        self._t = t
        return self._x.astype(np.float32)
