"""Batched face crops with fused pre-processing, the input side of every face model.

`crop_batch` samples N aligned faces out of one RGB frame in a single kernel launch: bilinear sampling
through each face's 2x3 output->input affine matrix (the `WARP_INVERSE_MAP` convention of
`warp.py`, pixel centres at integer coordinates), border replicate, an optional swap to BGR, then
value = (x/255 - mean[c]) / std[c], written NCHW as float32 or float16.

`crop_batch_ref` is the NumPy (or any `xp`) reference; it samples through `warp._sample_bilinear`.
The kernel in `cuda/crop.cu` performs the same operations in the same order (coordinates in float64,
weights and normalisation in float32, no FMA contraction), so the two agree bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ._xp import check_array, get_xp
from .warp import _sample_bilinear

_OUT_DTYPES = {np.dtype(np.float32): "f32", np.dtype(np.float16): "f16"}


def _check_triple(name: str, v: Any, *, nonzero: bool) -> np.ndarray:
    try:
        a = np.asarray(v, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be three numbers, got {v!r}") from None
    if a.shape != (3,) or not np.all(np.isfinite(a)) or (nonzero and np.any(a == 0)):
        what = "three finite non-zero numbers" if nonzero else "three finite numbers"
        raise ValueError(f"{name} must be {what}, got {v!r}")
    return a.astype(np.float32)


def _check_crop(frame: Any, mats: Any, out: Any, bgr: Any, mean: Any,
                std: Any) -> tuple[np.ndarray, np.ndarray]:
    check_array("frame", frame, ndim=3, dtype=np.uint8)
    if frame.shape[2] != 3 or frame.shape[0] < 1 or frame.shape[1] < 1:
        raise ValueError(f"frame must have shape HxWx3 (RGB) with H, W >= 1, got {tuple(frame.shape)}")
    check_array("mats", mats, ndim=3, dtype=np.float32)
    if tuple(mats.shape[1:]) != (2, 3):
        raise ValueError(f"mats must have shape Nx2x3, got {tuple(mats.shape)}")
    check_array("out", out, ndim=4)
    if out.dtype not in _OUT_DTYPES:
        raise ValueError(f"out must be float32 or float16, got {out.dtype}")
    n, c, s, s2 = out.shape
    if n != mats.shape[0] or c != 3 or s != s2 or s < 1:
        raise ValueError(f"out must have shape {mats.shape[0]}x3xSxS (one crop per matrix in mats), "
                         f"got {tuple(out.shape)}")
    if not isinstance(bgr, (bool, np.bool_)):
        raise ValueError(f"bgr must be a bool, got {type(bgr).__name__}")
    return _check_triple("mean", mean, nonzero=False), _check_triple("std", std, nonzero=True)


def crop_batch_ref(frame: Any, mats: Any, out: Any, *, bgr: bool = False,
                   mean: Sequence[float] = (0.0, 0.0, 0.0),
                   std: Sequence[float] = (1.0, 1.0, 1.0)) -> Any:
    """Reference of `crop_batch`, written against `xp`; same arguments."""
    mean32, std32 = _check_crop(frame, mats, out, bgr, mean, std)
    xp = get_xp(frame, mats, out)
    n, s = out.shape[0], out.shape[2]
    if n == 0:
        return out
    m = xp.asarray(mats).astype(xp.float64)
    g = xp.arange(s, dtype=xp.float64)
    gx = g[None, None, :]
    gy = g[None, :, None]
    x = m[:, 0, 0, None, None] * gx + m[:, 0, 1, None, None] * gy + m[:, 0, 2, None, None]
    y = m[:, 1, 0, None, None] * gx + m[:, 1, 1, None, None] * gy + m[:, 1, 2, None, None]
    vals = _sample_bilinear(frame, x, y, "replicate", 0.0)  # (N, S, S, 3) float32
    if bgr:
        vals = vals[..., ::-1]
    norm = (vals / xp.float32(255.0) - xp.asarray(mean32)) / xp.asarray(std32)
    out[...] = xp.moveaxis(norm, -1, 1).astype(out.dtype)
    return out


def crop_batch(frame: Any, mats: Any, out: Any, *, bgr: bool = False,
               mean: Sequence[float] = (0.0, 0.0, 0.0),
               std: Sequence[float] = (1.0, 1.0, 1.0)) -> Any:
    """Crop N faces from `frame` into `out`, normalised, in one pass.

    frame: (H, W, 3) uint8 RGB.
    mats:  (N, 2, 3) float32, per face the affine map from crop pixel (x, y) to frame pixel.
    out:   (N, 3, S, S) float32 or float16, written in full and returned.
    bgr:   store the channels in B, G, R order (mean and std are then given in that order too).
    mean, std: per output channel, applied as (x/255 - mean[c]) / std[c].

    A CuPy `frame` runs one `crop_batch_f32`/`crop_batch_f16` launch for all N faces on the current
    stream (frame and out C-contiguous on the current device). `mats` may then be a CuPy array or,
    for convenience, a NumPy array, which is uploaded (a 24*N-byte host-to-device copy) first. A NumPy
    `frame` runs `crop_batch_ref`.
    """
    mean32, std32 = _check_crop(frame, mats, out, bgr, mean, std)
    frame_gpu = type(frame).__module__.startswith("cupy")
    out_gpu = type(out).__module__.startswith("cupy")
    mats_gpu = type(mats).__module__.startswith("cupy")
    if out_gpu != frame_gpu:
        where = "a CuPy array on the GPU" if frame_gpu else "a NumPy array"
        raise ValueError(f"out must be {where} like frame, got {type(out).__name__}")
    if not frame_gpu:
        if mats_gpu:
            raise ValueError(f"mats must be a NumPy array when frame is on the host, got "
                             f"{type(mats).__name__}")
        return crop_batch_ref(frame, mats, out, bgr=bgr, mean=mean, std=std)

    import cupy

    from .cuda_loader import grid, kernel, require_cupy

    require_cupy("frame", frame)
    require_cupy("out", out)
    if mats_gpu:
        require_cupy("mats", mats)
    n, s = out.shape[0], out.shape[2]
    if n == 0:
        return out
    if not mats_gpu:
        mats = cupy.asarray(np.ascontiguousarray(mats))
    h, w = frame.shape[:2]
    total = n * s * s
    fn = kernel("crop.cu", f"crop_batch_{_OUT_DTYPES[out.dtype]}")
    fn(grid(total, 256), (256,),
       (frame, np.int32(h), np.int32(w), mats, out, np.int32(n), np.int32(s), np.int32(bool(bgr)),
        *mean32, *std32))
    return out
