"""Bilinear resize of batches of float32 images (the face stack's masks and model inputs).

`resize_bilinear` has one signature for NumPy (the reference, below) and CuPy (`cuda/resize.cu`, one
launch, the same bits)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._xp import check_array, get_xp


def resize_bilinear(x: Any, size: int) -> Any:
    """(N, H, W, C) float32 -> (N, size, size, C), bilinear with half-pixel centres and clamped edges,
    as cv2.resize's INTER_LINEAR (which FaceFusion uses for its masks) samples. Returns `x` itself
    when it is already that size."""
    check_array("x", x, ndim=4, dtype=np.float32)
    if size < 1:
        raise ValueError(f"resize_bilinear: size must be >= 1, got {size}")
    xp = get_xp(x)
    n, h, w, c = x.shape
    if (h, w) == (size, size):
        return x
    if xp is not np:
        return _resize_cuda(x, size)

    def axis(src: int) -> tuple[Any, Any, Any]:
        pos = (np.arange(size, dtype=np.float32) + 0.5) * (src / size) - 0.5
        pos = np.clip(pos, 0, src - 1)
        lo = np.floor(pos).astype(np.int64)
        hi = np.minimum(lo + 1, src - 1)
        return lo, hi, (pos - lo).astype(np.float32)

    y0, y1, fy = axis(h)
    x0, x1, fx = axis(w)
    top = x[:, y0] * (1 - fy)[None, :, None, None] + x[:, y1] * fy[None, :, None, None]
    return top[:, :, x0] * (1 - fx)[None, None, :, None] + top[:, :, x1] * fx[None, None, :, None]


def _resize_cuda(x: Any, size: int) -> Any:
    import cupy

    from .cuda_loader import grid, kernel

    n, h, w, c = x.shape
    src = cupy.ascontiguousarray(x)
    out = cupy.empty((n, size, size, c), cupy.float32)
    total = out.size
    if total:
        # The scales as the reference rounds them: a Python float meeting a float32 array (NEP 50).
        kernel("resize.cu", "resize_bilinear_f32")(
            grid(total), (256,), (src, np.int32(n), np.int32(h), np.int32(w), np.int32(c), np.int32(size),
                                  np.float32(h / size), np.float32(w / size), out))
    return out
