"""Unsharp mask restricted to a box of the frame, in place: the last touch after a paste-back.

    out = clip(rint(x + amount * (x - G(x))), 0, 255)      per channel, float32 arithmetic

G is a separable Gaussian blur with `mask.gaussian_kernel(radius)` taps (radius = sigma in pixels,
ceil(3 sigma) taps either side). It reads the pixels around the box from the frame itself and
replicates only at the frame's border, so the result inside the box is exactly that of sharpening the
whole frame and cropping, and nothing outside the box is written.

`sharpen_ref` is the NumPy (or any `xp`) reference. The CUDA twin in `cuda/sharpen.cu` runs two
kernels: a horizontal pass into a float32 scratch buffer covering the box plus `r` rows above and
below (clipped to the frame), then a vertical pass that combines and writes back. Both perform the same
float32 operations in the same order as the reference (accumulators start at 0, taps in ascending
order, no FMA contraction), so they agree bit for bit.
"""

from __future__ import annotations

import functools
import math
import numbers
from typing import Any

import numpy as np

from ._xp import check_array, get_xp, on_gpu
from .mask import gaussian_kernel

Box = tuple[int, int, int, int]




def _check_real(name: str, v: Any, *, minimum: float | None = None, positive: bool = False) -> float:
    """A finite real number (bools are refused), optionally >= minimum or > 0."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real) or not math.isfinite(v):
        raise ValueError(f"{name} must be a finite number, got {v!r}")
    if positive and not v > 0:
        raise ValueError(f"{name} must be > 0, got {v!r}")
    if minimum is not None and v < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {v!r}")
    return float(v)


@functools.lru_cache(maxsize=64)
def _device_taps(sigma: float, device_id: int) -> Any:
    """`gaussian_kernel(sigma)` uploaded once per device (a few dozen bytes, cached: no per-call
    host-to-device copy). The values are the reference's float32 taps, bit for bit."""
    import cupy

    with cupy.cuda.Device(device_id):
        return cupy.asarray(gaussian_kernel(sigma))


def _check_frame(frame: Any) -> None:
    check_array("frame", frame, ndim=3, dtype=np.uint8)
    if frame.shape[2] != 3 or frame.shape[0] < 1 or frame.shape[1] < 1:
        raise ValueError(f"frame must have shape HxWx3 (RGB) with H, W >= 1, got {tuple(frame.shape)}")


def _check_sharpen(frame: Any, box: Any, amount: Any, radius: Any) -> tuple[Box, np.float32, float]:
    """Validate; return the box clipped to the frame (possibly empty), amount as float32, radius."""
    _check_frame(frame)
    try:
        vals = tuple(box)
    except TypeError:
        raise ValueError(f"box must be four integers (x0, y0, x1, y1), got {box!r}") from None
    if len(vals) != 4 or any(isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Integral)
                             for v in vals):
        raise ValueError(f"box must be four integers (x0, y0, x1, y1), got {box!r}")
    x0, y0, x1, y1 = (int(v) for v in vals)
    if x1 < x0 or y1 < y0:
        raise ValueError(f"box must have x0 <= x1 and y0 <= y1, got {box!r}")
    a = _check_real("amount", amount)
    r = _check_real("radius", radius, positive=True)
    h, w = frame.shape[:2]
    cx0, cx1 = min(max(x0, 0), w), min(max(x1, 0), w)
    cy0, cy1 = min(max(y0, 0), h), min(max(y1, 0), h)
    return (cx0, cy0, cx1, cy1), np.float32(a), r


def sharpen_ref(frame: Any, box: Any, *, amount: float = 0.5, radius: float = 1.0) -> Box:
    """Reference of `sharpen`, written against `xp`; same arguments and result."""
    (x0, y0, x1, y1), amount32, radius = _check_sharpen(frame, box, amount, radius)
    if x1 <= x0 or y1 <= y0:
        return (x0, y0, x1, y1)
    xp = get_xp(frame)
    h, w = frame.shape[:2]
    k = gaussian_kernel(radius)
    r = (k.size - 1) // 2
    bw, bh = x1 - x0, y1 - y0
    cols = xp.clip(xp.arange(x0 - r, x1 + r), 0, w - 1)
    rows = xp.clip(xp.arange(y0 - r, y1 + r), 0, h - 1)
    src = frame[rows][:, cols].astype(xp.float32)            # (bh + 2r, bw + 2r, 3)
    horiz = xp.zeros((bh + 2 * r, bw, 3), dtype=xp.float32)
    for i in range(k.size):
        horiz += k[i] * src[:, i:i + bw]
    blur = xp.zeros((bh, bw, 3), dtype=xp.float32)
    for i in range(k.size):
        blur += k[i] * horiz[i:i + bh]
    x = frame[y0:y1, x0:x1].astype(xp.float32)
    v = x + amount32 * (x - blur)
    frame[y0:y1, x0:x1] = xp.clip(xp.rint(v), 0, 255).astype(xp.uint8)
    return (x0, y0, x1, y1)


def sharpen(frame: Any, box: Any, *, amount: float = 0.5, radius: float = 1.0) -> Box:
    """Unsharp-mask `frame` in place inside `box`; return the box clipped to the frame.

    frame:  (H, W, 3) uint8 RGB, modified in place (only inside the clipped box).
    box:    (x0, y0, x1, y1) integers, x1 and y1 exclusive; clipped to the frame, may end up empty.
    amount: strength (finite; 0 leaves the frame unchanged, negative values blur).
    radius: the Gaussian's sigma in pixels (> 0); the blur reads ceil(3 radius) pixels either side.

    A CuPy `frame` (C-contiguous, current device) runs the two kernels of `cuda/sharpen.cu` on the
    current stream, with a float32 scratch buffer of (box height + 2r) x box width x 3 from CuPy's
    memory pool; a NumPy `frame` runs `sharpen_ref`. The two agree bit for bit.
    """
    clipped, amount32, radius = _check_sharpen(frame, box, amount, radius)
    if not on_gpu(frame=frame):
        return sharpen_ref(frame, box, amount=amount, radius=radius)
    return _sharpen_cuda(frame, clipped, amount32, radius)


def _sharpen_cuda(frame: Any, box: Box, amount32: np.float32, radius: float) -> Box:
    import cupy

    from .cuda_loader import grid, kernel, require_cupy

    require_cupy("frame", frame)
    x0, y0, x1, y1 = box
    if x1 <= x0 or y1 <= y0:
        return box
    h, w = frame.shape[:2]
    taps = _device_taps(radius, cupy.cuda.runtime.getDevice())
    r = (int(taps.size) - 1) // 2
    bw, bh = x1 - x0, y1 - y0
    sy0, sy1 = max(y0 - r, 0), min(y1 + r, h)               # frame rows the vertical pass reads
    scratch = cupy.empty((sy1 - sy0, bw, 3), dtype=cupy.float32)
    n_h = (sy1 - sy0) * bw
    kernel("sharpen.cu", "sharpen_h_u8")(
        grid(n_h), (256,), (frame, np.int32(h), np.int32(w), np.int32(x0), np.int32(bw),
                            np.int32(sy0), np.int32(sy1 - sy0), taps, np.int32(r), scratch))
    n_v = bh * bw
    kernel("sharpen.cu", "sharpen_v_u8")(
        grid(n_v), (256,), (frame, np.int32(h), np.int32(w), np.int32(x0), np.int32(y0),
                            np.int32(bw), np.int32(bh), np.int32(sy0), taps, np.int32(r), scratch,
                            amount32))
    return box
