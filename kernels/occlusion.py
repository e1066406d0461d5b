"""Occlusion mask ops: how far each pixel's colour is from a skin model, and the clean-up of that map.

The swapper's occlusion mask (issue 20, `stream/swap/occlusion.py`) works on a small canvas that
follows the face. Its per-pixel steps are here:

- `occluder_score`: a skin model given as a whitening matrix W and a mean m (so that W (rgb - m) has
  unit covariance for skin) turns each pixel into a Mahalanobis distance d, and d into a soft
  "something is in front of the face" score with a linear ramp from `lo` to `hi`, times an `allow`
  map (0 where the face itself is legitimately not skin: eyes, brows, lips, nostrils).
- `clean_occluder`: a 3x3 median (drops isolated specks: pores, a highlight), a square dilation (the
  blur that follows must not thin a glasses frame away) and a Gaussian blur (soft edges).
- `ema_update`: the temporal smoothing of the mask, in place.

`occluder_score` has a CUDA kernel (`cuda/occlusion.cu`) that follows the NumPy reference operation
by operation; the other two are generic array code that runs unchanged on CuPy arrays.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._xp import check_array, get_xp
from .mask import gaussian_blur


def _check_model(whiten: np.ndarray, mean: np.ndarray, lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
    w = np.asarray(whiten, dtype=np.float32)
    m = np.asarray(mean, dtype=np.float32)
    if w.shape != (3, 3):
        raise ValueError(f"whiten must be a 3x3 matrix, got shape {w.shape}")
    if m.shape != (3,):
        raise ValueError(f"mean must have 3 values, got shape {m.shape}")
    if not (np.isfinite(w).all() and np.isfinite(m).all()):
        raise ValueError("whiten and mean must be finite")
    if not (0.0 <= lo < hi):
        raise ValueError(f"need 0 <= lo < hi, got lo={lo}, hi={hi}")
    return w, m


def occluder_score(patch: Any, allow: Any, whiten: np.ndarray, mean: np.ndarray, lo: float,
                   hi: float, out: Any) -> Any:
    """Per pixel: d = |W (rgb - m)|, score = clip((d - lo) / (hi - lo), 0, 1) * allow, into `out`.

    patch: (h, w, 3) uint8 RGB; allow: (h, w) float32 in [0, 1]; whiten: host (3, 3); mean: host
    (3,) RGB; lo < hi: the ramp in units of the model's standard deviations; out: (h, w) float32.
    Float32 throughout, each product and sum rounded in the order written here (the kernel does the
    same, without fused multiply-adds), so both give the same bits.
    """
    check_array("patch", patch, ndim=3, dtype=np.uint8)
    if patch.shape[2] != 3:
        raise ValueError(f"patch must have 3 channels, got shape {tuple(patch.shape)}")
    check_array("allow", allow, dtype=np.float32, shape=tuple(patch.shape[:2]))
    check_array("out", out, dtype=np.float32, shape=tuple(patch.shape[:2]))
    w, m = _check_model(whiten, mean, lo, hi)
    xp = get_xp(patch, allow, out)
    if xp is not np:
        return _occluder_score_cuda(patch, allow, w, m, lo, hi, out)
    f32 = np.float32
    x = [patch[..., c].astype(f32) - m[c] for c in range(3)]
    z = [(w[k, 0] * x[0] + w[k, 1] * x[1]) + w[k, 2] * x[2] for k in range(3)]
    d = np.sqrt((z[0] * z[0] + z[1] * z[1]) + z[2] * z[2])
    inv = f32(1.0) / (f32(hi) - f32(lo))
    np.multiply(np.clip((d - f32(lo)) * inv, f32(0.0), f32(1.0)), allow, out=out)
    return out


def _shifted(a: Any, dy: int, dx: int) -> Any:
    """`a` moved by (dy, dx) with its border replicated: out[y, x] = a[clip(y + dy), clip(x + dx)]."""
    xp = get_xp(a)
    h, w = a.shape
    ys = xp.clip(xp.arange(h) + dy, 0, h - 1)
    xs = xp.clip(xp.arange(w) + dx, 0, w - 1)
    return a[ys][:, xs]


def median3(src: Any, out: Any) -> Any:
    """3x3 median of `src` (h, w float32) into `out`, border replicated (as cv2.medianBlur(src, 3))."""
    check_array("src", src, ndim=2, dtype=np.float32)
    check_array("out", out, dtype=np.float32, shape=tuple(src.shape))
    xp = get_xp(src, out)
    stack = xp.stack([_shifted(src, dy, dx) for dy in (-1, 0, 1) for dx in (-1, 0, 1)])
    out[...] = xp.sort(stack, axis=0)[4]
    return out


def dilate(src: Any, radius: int, out: Any) -> Any:
    """Maximum over the (2 radius + 1)^2 square around each pixel of `src` (h, w float32), as
    cv2.dilate with a square kernel: pixels outside the image take no part (same as replicating)."""
    check_array("src", src, ndim=2, dtype=np.float32)
    check_array("out", out, dtype=np.float32, shape=tuple(src.shape))
    if radius < 0:
        raise ValueError(f"radius must be >= 0, got {radius}")
    xp = get_xp(src, out)
    rows = src.copy()
    for dx in range(-radius, radius + 1):
        if dx:
            xp.maximum(rows, _shifted(src, 0, dx), out=rows)
    acc = rows.copy()
    for dy in range(-radius, radius + 1):
        if dy:
            xp.maximum(acc, _shifted(rows, dy, 0), out=acc)
    out[...] = acc
    return out


def clean_occluder(score: Any, grow: int, sigma: float, out: Any) -> Any:
    """The raw occluder score (h, w float32) cleaned: 3x3 median, dilation by `grow` pixels, then a
    Gaussian blur of `sigma` pixels, into `out`.

    The median removes specks of one or two pixels but keeps lines two pixels wide (a glasses frame
    or a strand of hair on a small canvas); the dilation makes up for the blur, which would otherwise
    pull a thin occluder's centre below full strength and let the swap bleed over it.
    """
    check_array("score", score, ndim=2, dtype=np.float32)
    check_array("out", out, dtype=np.float32, shape=tuple(score.shape))
    xp = get_xp(score, out)
    tmp = xp.empty_like(score)
    median3(score, tmp)
    dilate(tmp, grow, out)
    gaussian_blur(out, sigma, tmp)
    out[...] = tmp
    return out


def ema_update(state: Any, new: Any, alpha: float) -> Any:
    """In place: state <- state + alpha * (new - state), the per-track temporal smoothing."""
    check_array("state", state, dtype=np.float32)
    check_array("new", new, dtype=np.float32, shape=tuple(state.shape))
    if not 0.0 < alpha <= 1.0:
        raise ValueError(f"alpha must be in (0, 1], got {alpha}")
    state += np.float32(alpha) * (new - state)
    return state


# ---- CUDA launch ---------------------------------------------------------------------------------

def _occluder_score_cuda(patch: Any, allow: Any, w: np.ndarray, m: np.ndarray, lo: float, hi: float,
                         out: Any) -> Any:
    from .cuda_loader import grid, kernel, require_cupy

    require_cupy("patch", patch)
    require_cupy("allow", allow)
    require_cupy("out", out)
    h, wd = out.shape
    n = h * wd
    if n:
        # The model goes in as scalars: no upload, no host synchronisation per face.
        f32 = np.float32
        inv = f32(1.0) / (f32(hi) - f32(lo))
        kernel("occlusion.cu", "occluder_score_u8")(
            grid(n), (256,), (patch, allow, *[f32(v) for v in w.ravel()], *[f32(v) for v in m],
                              f32(lo), inv, np.int32(n), out))
    return out
