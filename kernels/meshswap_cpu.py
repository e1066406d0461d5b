"""The mesh swap's CPU product path: the NumPy references of `mesh`, `warp`, `mask`, `color` and
`meshswap` rebuilt on OpenCV's optimised (SIMD, multi-threaded) ops, on the face's box only.

Same signatures and meaning as the references, which stay the specification: tests/kernels/
test_meshswap_cpu.py compares every function here with its reference on random inputs, with the
tolerance each docstring states. Only NumPy arrays: CuPy frames take the CUDA kernels.
"""

from __future__ import annotations

from typing import Any

import cv2
import numpy as np

from ._xp import check_array
from .mask import gaussian_kernel
from .meshswap import STATS_LEN, ColorSpace, chroma_weight, gain_offset

_FAR = -1.0e6
"""Map value for uncovered pixels: far outside any image, so that cv2.remap's constant border
gives 0 there whatever its fixed-point arithmetic does with the coordinate."""


def remap_fast(src: np.ndarray, map_xy: np.ndarray, out: np.ndarray, *, fill: float = 0.0) -> np.ndarray:
    """`warp.remap_bilinear` through cv2.remap (src float32 HxWxC). OpenCV quantises the
    interpolation position to 1/32 pixel: a sample differs from the reference by at most
    1/64 of the local difference between neighbouring pixels in each axis."""
    check_array("src", src, ndim=3, dtype=np.float32)
    check_array("map_xy", map_xy, ndim=3, dtype=np.float32)
    check_array("out", out, ndim=3, dtype=np.float32, shape=(*map_xy.shape[:2], src.shape[2]))
    valid = np.isfinite(map_xy[..., 0]) & np.isfinite(map_xy[..., 1])
    m = np.where(valid[..., None], map_xy, np.float32(_FAR))
    # Border replicate like the reference, for covered samples a fraction of a pixel outside.
    cv2.remap(src, m, None, cv2.INTER_LINEAR, dst=out, borderMode=cv2.BORDER_REPLICATE)
    out[~valid] = fill
    return out


def fill_polygon_fast(poly: np.ndarray, origin: tuple[int, int], out: np.ndarray) -> np.ndarray:
    """`mask.fill_polygon`, exactly (same crossings in double, same even-odd count): per row the
    crossings start +1 runs in a difference array, and one cumulative sum counts them."""
    check_array("poly", poly, ndim=2, dtype=np.float32, shape=(None, 2))
    check_array("out", out, ndim=2, dtype=np.float32)
    h, w = out.shape
    p = poly.astype(np.float64) - np.asarray(origin, dtype=np.float64)
    q = np.roll(p, -1, axis=0)
    ys = np.arange(h, dtype=np.float64)[:, None]
    y0, y1, x0, x1 = p[:, 1][None], q[:, 1][None], p[:, 0][None], q[:, 0][None]
    crosses = (y0 <= ys) != (y1 <= ys)
    dy = np.where(y1 == y0, 1.0, y1 - y0)
    xcross = x0 + (ys - y0) * (x1 - x0) / dy
    r, k = np.nonzero(crosses)
    # A crossing at c is "left of" every pixel centre x > c, i.e. x >= floor(c) + 1.
    start = np.clip(np.floor(xcross[r, k]) + 1, 0, w).astype(np.int64)
    diff = np.zeros((h, w + 1), np.int32)
    np.add.at(diff, (r, start), 1)
    out[...] = (np.cumsum(diff[:, :w], axis=1) & 1).astype(np.float32)
    return out


def gaussian_blur_fast(src: np.ndarray, sigma: float, out: np.ndarray) -> np.ndarray:
    """`mask.gaussian_blur` with the very same taps through cv2.sepFilter2D (borders replicated).
    Sums are float32 in both, in a different order: within 1e-5 of the reference for [0, 1] input."""
    check_array("src", src, dtype=np.float32)
    check_array("out", out, dtype=np.float32, shape=tuple(src.shape))
    k = gaussian_kernel(sigma)
    cv2.sepFilter2D(src, cv2.CV_32F, k, k, dst=out, borderType=cv2.BORDER_REPLICATE)
    return out


def rgb_to_lab_fast(rgb: np.ndarray, out: np.ndarray) -> np.ndarray:
    """`color.rgb_to_lab` through cv2.cvtColor (same sRGB/D65 matrix; OpenCV interpolates the gamma
    curve and the cube root from tables): within 0.6 of the reference in L*, a*, b* (a just
    noticeable colour difference is about 2)."""
    check_array("out", out, dtype=np.float32, shape=tuple(rgb.shape))
    scaled = rgb.astype(np.float32) * np.float32(1.0 / 255.0)
    cv2.cvtColor(scaled, cv2.COLOR_RGB2Lab, dst=out)
    return out


def lab_to_rgb_fast(lab: np.ndarray, out: np.ndarray) -> np.ndarray:
    """`color.lab_to_rgb` through cv2.cvtColor: within 0.05 levels of the reference, clipped to
    [0, 255] like it."""
    check_array("lab", lab, dtype=np.float32)
    check_array("out", out, dtype=np.float32, shape=tuple(lab.shape))
    cv2.cvtColor(lab, cv2.COLOR_Lab2RGB, dst=out)
    np.clip(out * np.float32(255.0), 0.0, 255.0, out=out)
    return out


def mesh_mask_fast(outline: np.ndarray, keep: np.ndarray, keep_counts: tuple[int, ...],
                   map_xy: np.ndarray, origin: tuple[int, int], sigma: float, keep_sigma: float,
                   out: np.ndarray) -> np.ndarray:
    """`meshswap.mesh_mask` from the exact fills above and OpenCV blurs: within 3e-5 of the
    reference (the blurs' float32 rounding, doubled by the feather's 2x - 1)."""
    h, w = out.shape
    check_array("map_xy", map_xy, ndim=3, dtype=np.float32, shape=(h, w, 2))
    hard = fill_polygon_fast(outline, origin, np.empty((h, w), np.float32))
    hard *= np.isfinite(map_xy[..., 0])
    gaussian_blur_fast(hard, sigma, out)
    np.clip(np.float32(2.0) * out - np.float32(1.0), 0.0, 1.0, out=out)
    if keep_counts:
        union = np.zeros((h, w), np.float32)
        one = np.empty((h, w), np.float32)
        start = 0
        for n in keep_counts:
            union += fill_polygon_fast(keep[start:start + n], origin, one)
            start += n
        np.minimum(union, 1.0, out=union)
        soft = gaussian_blur_fast(union, keep_sigma, one)
        out *= np.float32(1.0) - soft
    return out


def color_stats_fast(warped: np.ndarray, frame: np.ndarray, mask: np.ndarray,
                     origin: tuple[int, int], space: ColorSpace, out: np.ndarray,
                     labs: dict[str, np.ndarray] | None = None) -> np.ndarray:
    """`meshswap.color_stats` with OpenCV's L*a*b* and cv2.meanStdDev: means within 0.6 and standard
    deviations within 0.3 of the reference's (the conversion's error, mostly averaged out).

    `labs`, when given, receives the two L*a*b* images ("src", "dst") for `transfer_blend_fast`,
    which would otherwise convert them again."""
    check_array("warped", warped, ndim=3, dtype=np.float32)
    check_array("mask", mask, ndim=2, dtype=np.float32, shape=tuple(warped.shape[:2]))
    check_array("out", out, ndim=1, dtype=np.float64, shape=(STATS_LEN,))
    h, w = mask.shape
    x0, y0 = origin
    if x0 < 0 or y0 < 0 or y0 + h > frame.shape[0] or x0 + w > frame.shape[1]:
        raise ValueError(f"region at {origin} of size {w}x{h} is not inside the frame")
    target = frame[y0:y0 + h, x0:x0 + w]
    if space == "lab":
        src = rgb_to_lab_fast(warped, np.empty((h, w, 3), np.float32))
        dst = rgb_to_lab_fast(target, np.empty((h, w, 3), np.float32))
        if labs is not None:
            labs["src"], labs["dst"] = src, dst
    elif space == "rgb":
        src, dst = warped, target
    else:
        raise ValueError(f"space must be 'lab' or 'rgb', got {space!r}")
    sel = (mask > 0.5).view(np.uint8)
    n = cv2.countNonZero(sel)
    out[0] = n
    for img, at in ((src, 1), (dst, 7)):
        if n == 0:
            out[at:at + 6] = 0.0
            continue
        mean, std = cv2.meanStdDev(img, mask=sel)
        mean, std = mean.ravel(), std.ravel()
        # Back to the reference's layout: sums and sums of squares (mean^2 + var = E[x^2]).
        out[at:at + 3] = mean * n
        out[at + 3:at + 6] = (std * std + mean * mean) * n
    return out


def transfer_blend_fast(frame: np.ndarray, warped: np.ndarray, mask: np.ndarray, stats: Any,
                        origin: tuple[int, int], space: ColorSpace, strength: float = 1.0,
                        labs: dict[str, np.ndarray] | None = None) -> np.ndarray:
    """`meshswap.transfer_blend` with OpenCV's L*a*b* conversions: mostly 0 or 1 level from the
    reference (the conversions' error, then rounding), never a visible difference (dE76 < 2.3); a
    channel near 0 beside a saturated one may differ by several levels. `labs` from
    `color_stats_fast` on the same warped image and frame saves two conversions."""
    check_array("frame", frame, ndim=3, dtype=np.uint8)
    check_array("warped", warped, ndim=3, dtype=np.float32)
    h, w = mask.shape
    x0, y0 = origin
    if space == "none":
        fg = warped
    else:
        gain, off = gain_offset(stats, strength)
        if space == "lab":
            src = labs["src"] if labs else rgb_to_lab_fast(warped, np.empty((h, w, 3), np.float32))
            lab = src * gain
            lab += off
            k = np.float32(chroma_weight(stats) * strength)
            if k > 0:
                tgt = labs["dst"] if labs else rgb_to_lab_fast(frame[y0:y0 + h, x0:x0 + w],
                                                               np.empty((h, w, 3), np.float32))
                lab[..., 1:] = lab[..., 1:] * (np.float32(1.0) - k) + tgt[..., 1:] * k
            fg = lab_to_rgb_fast(lab, np.empty((h, w, 3), np.float32))
        elif space == "rgb":
            fg = np.clip(warped * gain + off, 0.0, 255.0)
        else:
            raise ValueError(f"space must be one of 'lab', 'rgb', 'none', got {space!r}")
    return blend_fast(frame, fg, mask, origin)


def blend_fast(frame: np.ndarray, fg: np.ndarray, mask: np.ndarray, origin: tuple[int, int]) -> np.ndarray:
    """`blend.blend_into` for a region inside the frame, in place over the region only, without the
    reference's select and clip passes: with finite fg in [0, 255] the mix is a convex combination,
    and where mask == 0 it is the frame value exactly, so both are no-ops. Equal to the reference
    except where a float32 rounding lands on the other side of a .5 (at most 1 level)."""
    check_array("frame", frame, ndim=3, dtype=np.uint8)
    check_array("fg", fg, ndim=3, dtype=np.float32)
    h, w = mask.shape
    x0, y0 = origin
    if x0 < 0 or y0 < 0 or y0 + h > frame.shape[0] or x0 + w > frame.shape[1]:
        raise ValueError(f"region at {origin} of size {w}x{h} is not inside the frame")
    roi = frame[y0:y0 + h, x0:x0 + w]
    base = roi.astype(np.float32)
    mixed = fg - base
    mixed *= mask[..., None]
    mixed += base
    np.rint(mixed, out=mixed)
    np.clip(mixed, 0.0, 255.0, out=mixed)   # -0.0 and 255.00002 from rounding
    roi[...] = mixed.astype(np.uint8)
    return frame


__all__ = ["blend_fast", "color_stats_fast", "fill_polygon_fast", "gaussian_blur_fast", "lab_to_rgb_fast",
           "mesh_mask_fast", "remap_fast", "rgb_to_lab_fast", "transfer_blend_fast"]
