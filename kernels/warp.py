"""Bilinear sampling: affine warps and arbitrary remaps.

Conventions shared with the CUDA kernels: pixel centres sit at integer coordinates (as in OpenCV), and
matrices map *output* pixels to *input* pixels, i.e. the `WARP_INVERSE_MAP` convention, because that
is what a gather kernel evaluates per output pixel.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

from ._xp import check_array, get_xp

Border = Literal["replicate", "constant"]


def invert_affine(m: np.ndarray) -> np.ndarray:
    """Inverse of a 2x3 affine matrix, as a 2x3 float64 matrix."""
    full = np.vstack([np.asarray(m, dtype=np.float64), [0.0, 0.0, 1.0]])
    return np.linalg.inv(full)[:2]


def _sample_bilinear(src: Any, x: Any, y: Any, border: Border, fill: float) -> Any:
    """Sample `src` (HxWxC) at float coordinates x, y (any equal shapes); returns float32 (..., C)."""
    xp = get_xp(src, x)
    h, w = src.shape[:2]
    x0f = xp.floor(x)
    y0f = xp.floor(y)
    fx = (x - x0f).astype(xp.float32)[..., None]
    fy = (y - y0f).astype(xp.float32)[..., None]
    x0 = x0f.astype(xp.int64)
    y0 = y0f.astype(xp.int64)
    x1 = x0 + 1
    y1 = y0 + 1
    if border == "replicate":
        xs = [xp.clip(x0, 0, w - 1), xp.clip(x1, 0, w - 1)]
        ys = [xp.clip(y0, 0, h - 1), xp.clip(y1, 0, h - 1)]
        p00 = src[ys[0], xs[0]].astype(xp.float32)
        p01 = src[ys[0], xs[1]].astype(xp.float32)
        p10 = src[ys[1], xs[0]].astype(xp.float32)
        p11 = src[ys[1], xs[1]].astype(xp.float32)
    else:
        def tap(yy: Any, xx: Any) -> Any:
            ok = (xx >= 0) & (xx < w) & (yy >= 0) & (yy < h)
            v = src[xp.clip(yy, 0, h - 1), xp.clip(xx, 0, w - 1)].astype(xp.float32)
            return xp.where(ok[..., None], v, xp.float32(fill))

        p00, p01, p10, p11 = tap(y0, x0), tap(y0, x1), tap(y1, x0), tap(y1, x1)
    top = p00 + (p01 - p00) * fx
    bot = p10 + (p11 - p10) * fx
    return top + (bot - top) * fy


def warp_affine(src: Any, dst_to_src: np.ndarray, out: Any, *, border: Border = "replicate",
                fill: float = 0.0) -> Any:
    """Warp `src` (HxWxC uint8 or float32) into `out` (hxwxC) through a 2x3 output->input matrix.

    Matches `cv2.warpAffine(src, M, (w, h), flags=INTER_LINEAR | WARP_INVERSE_MAP)` up to OpenCV's
    5-bit fixed-point interpolation weights. `out` is written in full and returned.
    """
    check_array("src", src, ndim=3)
    check_array("out", out, ndim=3)
    if out.shape[2] != src.shape[2]:
        raise ValueError(f"out must have {src.shape[2]} channels like src, got shape {tuple(out.shape)}")
    m = np.asarray(dst_to_src, dtype=np.float64)
    if m.shape != (2, 3):
        raise ValueError(f"dst_to_src must be a 2x3 matrix, got shape {m.shape}")
    xp = get_xp(src, out)
    h, w = out.shape[:2]
    gx = xp.arange(w, dtype=xp.float64)[None, :]
    gy = xp.arange(h, dtype=xp.float64)[:, None]
    x = m[0, 0] * gx + m[0, 1] * gy + m[0, 2]
    y = m[1, 0] * gx + m[1, 1] * gy + m[1, 2]
    vals = _sample_bilinear(src, x, y, border, fill)
    _store(out, vals)
    return out


def remap_bilinear(src: Any, map_xy: Any, out: Any, *, fill: float = 0.0) -> Any:
    """Sample `src` (HxWxC) at `map_xy` (hxwx2 float32 source x, y) into `out` (hxwxC float32).

    NaN entries of the map mean "no source here" and produce `fill`. Samples outside `src` replicate
    its border, because mesh coordinates that fall a fraction of a pixel outside the source image
    should take the edge colour rather than black.
    """
    check_array("src", src, ndim=3)
    check_array("map_xy", map_xy, ndim=3, dtype=np.float32)
    check_array("out", out, ndim=3, dtype=np.float32)
    if map_xy.shape[2] != 2 or out.shape[:2] != map_xy.shape[:2] or out.shape[2] != src.shape[2]:
        raise ValueError(
            f"map_xy must be hxwx2 and out hxwx{src.shape[2]} of the same h, w; "
            f"got {tuple(map_xy.shape)} and {tuple(out.shape)}")
    xp = get_xp(src, map_xy, out)
    if xp is not np and src.dtype == np.uint8:
        return _remap_bilinear_cuda(src, map_xy, out, fill)
    x = map_xy[..., 0]
    y = map_xy[..., 1]
    valid = xp.isfinite(x) & xp.isfinite(y)
    vals = _sample_bilinear(src, xp.where(valid, x, 0), xp.where(valid, y, 0), "replicate", fill)
    out[...] = xp.where(valid[..., None], vals, xp.float32(fill))
    return out


def _store(out: Any, vals: Any) -> None:
    """Write float samples into `out`, rounding to nearest for integer outputs (as OpenCV does)."""
    xp = get_xp(out)
    if out.dtype == xp.uint8:
        out[...] = xp.clip(xp.rint(vals), 0, 255).astype(xp.uint8)
    else:
        out[...] = vals.astype(out.dtype)


def box_downsample(src: Any, factor: int, out: Any) -> Any:
    """Average `factor` x `factor` blocks of `src` (HxWxC uint8) into `out` (H//f x W//f x C uint8).

    Detectors see a frame shrunk 5-15 times; a plain bilinear warp at that ratio aliases, so callers
    reduce by an integer factor first and warp the rest of the way.
    """
    check_array("src", src, ndim=3, dtype=np.uint8)
    h, w = src.shape[0] // factor, src.shape[1] // factor
    check_array("out", out, dtype=np.uint8, shape=(h, w, src.shape[2]))
    xp = get_xp(src, out)
    blocks = src[: h * factor, : w * factor].reshape(h, factor, w, factor, src.shape[2])
    out[...] = xp.rint(blocks.mean(axis=(1, 3), dtype=xp.float32)).astype(xp.uint8)
    return out


def _remap_bilinear_cuda(src: Any, map_xy: Any, out: Any, fill: float) -> Any:
    from .cuda_loader import grid, kernel, require_cupy

    for name, a in (("src", src), ("map_xy", map_xy), ("out", out)):
        require_cupy(name, a)
    n = int(out.shape[0] * out.shape[1])
    if n:
        kernel("mesh.cu", "remap_bilinear_u8_f32")(
            grid(n), (256,), (src, np.int32(src.shape[0]), np.int32(src.shape[1]),
                              np.int32(src.shape[2]), map_xy, np.int32(n), np.float32(fill), out))
    return out
