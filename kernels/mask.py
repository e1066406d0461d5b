"""Masks: polygon fill, separable Gaussian blur, and the inward feather used by every swapper."""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from ._xp import check_array, get_xp


def fill_polygon(poly: Any, origin: tuple[int, int], out: Any) -> Any:
    """Write 1.0 into `out` (hxw float32) at pixel centres inside the closed polygon, 0.0 elsewhere.

    poly: (K, 2) float32 vertices in frame pixels; origin: frame position of `out[0, 0]`. Uses the
    even-odd rule (crossing number), which is what a scanline fill on the GPU computes too.
    """
    check_array("poly", poly, ndim=2, dtype=np.float32, shape=(None, 2))
    check_array("out", out, ndim=2, dtype=np.float32)
    xp = get_xp(poly, out)
    h, w = out.shape
    p = poly.astype(xp.float64) - xp.asarray(origin, dtype=xp.float64)
    q = xp.roll(p, -1, axis=0)
    ys = xp.arange(h, dtype=xp.float64)[:, None]          # (h, 1)
    xs = xp.arange(w, dtype=xp.float64)[None, :]          # (1, w)
    # Per row, the x positions where each edge crosses the row's centre line: edges are half-open in
    # y, so a vertex exactly on a row is counted once.
    y0, y1 = p[:, 1][None, :], q[:, 1][None, :]
    x0, x1 = p[:, 0][None, :], q[:, 0][None, :]
    crosses = (y0 <= ys) != (y1 <= ys)                      # (h, K)
    dy = xp.where(y1 == y0, 1.0, y1 - y0)
    xcross = x0 + (ys - y0) * (x1 - x0) / dy               # (h, K)
    # Non-crossing edges go to +inf so that they never count as "left of" a pixel.
    xcross = xp.where(crosses, xcross, xp.inf)
    # Count, per pixel, the crossings to its left (odd means inside) with one sorted search: rows
    # are offset by a stride larger than any coordinate so that a single flat searchsorted serves all.
    stride = 4.0 * (w + 2.0 + float(xp.abs(p).max()))
    rows = xp.arange(h, dtype=xp.float64)[:, None] * stride
    keys = xp.sort(xp.where(xp.isfinite(xcross), xcross + rows, xp.inf), axis=None)
    n_left = xp.searchsorted(keys, (xs + rows).ravel(), side="left").reshape(h, w)
    # searchsorted counts crossings of all earlier rows too: subtract each row's own start.
    n_left -= xp.searchsorted(keys, rows.ravel() - stride / 2, side="left")[:, None]
    out[...] = (n_left % 2).astype(xp.float32)
    return out


def gaussian_kernel(sigma: float) -> np.ndarray:
    """Normalised 1-D Gaussian taps, radius ceil(3 sigma): beyond that the weights are < 0.5%."""
    if sigma <= 0:
        return np.ones(1, dtype=np.float32)
    r = max(1, int(math.ceil(3.0 * sigma)))
    t = np.arange(-r, r + 1, dtype=np.float64)
    k = np.exp(-0.5 * (t / sigma) ** 2)
    return (k / k.sum()).astype(np.float32)


def gaussian_blur(src: Any, sigma: float, out: Any, scratch: Any | None = None) -> Any:
    """Separable Gaussian blur of `src` (hxw or hxwxC float32) into `out`, borders replicated.

    `scratch` (same shape, float32) receives the horizontal pass; pass one in to avoid an allocation.
    """
    check_array("src", src, dtype=np.float32)
    check_array("out", out, dtype=np.float32, shape=tuple(src.shape))
    xp = get_xp(src, out)
    if xp is not np and src.ndim in (2, 3):
        return _gaussian_blur_cuda(src, sigma, out, scratch)
    k = gaussian_kernel(sigma)
    r = (k.size - 1) // 2
    if scratch is None:
        scratch = xp.empty_like(src)
    h, w = src.shape[:2]
    idx_x = xp.clip(xp.arange(-r, w + r), 0, w - 1)
    idx_y = xp.clip(xp.arange(-r, h + r), 0, h - 1)
    padded = src[:, idx_x]
    acc = xp.zeros_like(src)
    for i in range(k.size):
        acc += float(k[i]) * padded[:, i:i + w]
    scratch[...] = acc
    padded = scratch[idx_y]
    acc = xp.zeros_like(src)
    for i in range(k.size):
        acc += float(k[i]) * padded[i:i + h]
    out[...] = acc
    return out


def taps_defines(sigma: float, prefix: str = "BLUR") -> dict[str, str]:
    """The blur's taps as compile-time constants for a CUDA source: `<prefix>_RADIUS` and
    `<prefix>_TAPS`, exact hexadecimal literals of the float32 values `gaussian_kernel` gives (the
    same numbers the reference multiplies by)."""
    return dict(_taps_items(float(sigma), prefix))


@functools.lru_cache(maxsize=64)
def _taps_items(sigma: float, prefix: str) -> tuple[tuple[str, str], ...]:
    # Memoised: the GPU blurs ask for their taps at every launch (per face and frame), and building
    # the literals costs about 65 us of host time; a few sigmas are ever used. Immutable values.
    k = gaussian_kernel(sigma)
    return ((f"{prefix}_RADIUS", str((k.size - 1) // 2)),
            (f"{prefix}_TAPS", "{" + ", ".join(f"(float){float(v).hex()}" for v in k) + "}"))


def _gaussian_blur_cuda(src: Any, sigma: float, out: Any, scratch: Any | None) -> Any:
    """`gaussian_blur` in two launches (cuda/blur.cu), bit for bit the reference's result. The
    reference spends two array operations per tap and pass: some 120 launches at sigma 5."""
    import cupy

    from .cuda_loader import grid, kernel

    h, w = src.shape[:2]
    c = 1 if src.ndim == 2 else src.shape[2]
    n = h * w * c
    if n == 0:
        return out
    a = cupy.ascontiguousarray(src)
    tmp = scratch if scratch is not None and scratch.flags.c_contiguous and scratch.shape == src.shape \
        and scratch.dtype == np.float32 else cupy.empty(src.shape, cupy.float32)
    dst = out if out.flags.c_contiguous else cupy.empty(src.shape, cupy.float32)
    if tmp is a or tmp is dst:  # the row pass must not overwrite what it or the column pass reads
        tmp = cupy.empty(src.shape, cupy.float32)
    blur = kernel("blur.cu", "blur_axis", taps_defines(sigma))
    blur(grid(n), (256,), (a, np.int64(n), np.int32(w), np.int64(c), tmp))          # rows
    blur(grid(n), (256,), (tmp, np.int64(n), np.int32(h), np.int64(w * c), dst))    # columns
    if dst is not out:
        out[...] = dst
    return out


def feather(hard: Any, sigma: float, out: Any) -> Any:
    """Soften a 0/1 mask inward: blur, then map [0.5, 1] to [0, 1].

    A blurred straight edge sits at 0.5 exactly on the boundary, so everything on or outside the hard
    mask ends at 0. The paste-back then never touches a pixel outside the face outline, and the ramp
    is about 2.4 sigma wide inside it.
    """
    xp = get_xp(hard, out)
    gaussian_blur(hard, sigma, out)
    out[...] = xp.clip(2.0 * out - 1.0, 0.0, 1.0)
    return out
