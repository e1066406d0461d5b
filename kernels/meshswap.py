"""Fused steps of the mesh swap after the geometry: mask, colour statistics, transfer and blend.

Each op has one signature for NumPy (the reference, composed from the small ops in `mask`, `color`
and `blend`) and for CuPy (hand-written kernels in `cuda/meshswap.cu`). On the GPU the colour
statistics never leave the device: `color_stats` leaves sums in a small device array that
`transfer_blend` reads directly, so a whole face is swapped without a host synchronisation.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np

from ._xp import check_array, get_xp
from .blend import blend_into
from .color import lab_to_rgb, rgb_to_lab
from .mask import feather, fill_polygon, gaussian_blur

ColorSpace = Literal["lab", "rgb", "none"]
# Layout of the statistics array: [count, sum_src[3], sumsq_src[3], sum_dst[3], sumsq_dst[3]].
STATS_LEN = 13
# Standard deviations are floored here before taking their ratio, so a flat region cannot blow up
# the gain (same floor as color.color_transfer).
MIN_STD = 1.0
_SPACE_CODE = {"none": 0, "rgb": 1, "lab": 2}
# A source whose skin chroma (the root of the summed variances of a* and b* inside the mask) is at or
# below CHROMA_GREY is treated as greyscale and takes a*, b* pixel by pixel from the target; at or
# above CHROMA_FULL it keeps its own (transferred) chroma; in between the two are mixed linearly.
# Colour portraits' skin measures 5-12; a greyscale photo measures < 0.5 (JPEG chroma noise).
CHROMA_GREY = 1.5
CHROMA_FULL = 4.0
# The GPU blur keeps its taps in shared memory (MAX_TAPS = 512 in meshswap.cu).
_MAX_RADIUS = 255


def mesh_mask(outline: Any, keep: Any, keep_counts: tuple[int, ...], map_xy: Any,
              origin: tuple[int, int], sigma: float, keep_sigma: float, out: Any) -> Any:
    """The swap mask of one face: the outline polygon where the mesh covers, feathered inward, times
    one minus the blurred keep-out polygons (mouth, eyes).

    outline: (K, 2) float32 frame coordinates; keep: (M, 2) float32, the keep-out polygons one after
    another, `keep_counts` giving each one's vertex count; map_xy: (h, w, 2) from `rasterize_mesh`
    (NaN = not covered); out: (h, w) float32.
    """
    check_array("outline", outline, ndim=2, dtype=np.float32, shape=(None, 2))
    check_array("keep", keep, ndim=2, dtype=np.float32, shape=(None, 2))
    check_array("map_xy", map_xy, ndim=3, dtype=np.float32)
    check_array("out", out, ndim=2, dtype=np.float32, shape=tuple(map_xy.shape[:2]))
    if sum(keep_counts) != keep.shape[0]:
        raise ValueError(f"keep_counts {keep_counts} must add up to keep's {keep.shape[0]} vertices")
    xp = get_xp(outline, map_xy, out)
    if xp is not np:
        return _mesh_mask_cuda(outline, keep, keep_counts, map_xy, origin, sigma, keep_sigma, out)
    h, w = out.shape
    hard = fill_polygon(outline, origin, np.empty((h, w), np.float32))
    hard *= np.isfinite(map_xy[..., 0])
    feather(hard, sigma, out)
    if keep_counts:
        # The keep-out regions are disjoint, so their union is the clipped sum of their fills.
        union = np.zeros((h, w), np.float32)
        start = 0
        one = np.empty((h, w), np.float32)
        for n in keep_counts:
            union += fill_polygon(keep[start:start + n], origin, one)
            start += n
        np.minimum(union, 1.0, out=union)
        soft = gaussian_blur(union, keep_sigma, np.empty((h, w), np.float32))
        out *= 1.0 - soft
    return out


def color_stats(warped: Any, frame: Any, mask: Any, origin: tuple[int, int], space: ColorSpace,
                out: Any) -> Any:
    """Sums over pixels with mask > 0.5 of the warped source (h, w, 3 float32 RGB) and of the frame
    region under it, in `space`: [count, sum_src[3], sumsq_src[3], sum_dst[3], sumsq_dst[3]] into
    `out` (13,) float64. The region must lie inside the frame."""
    check_array("warped", warped, ndim=3, dtype=np.float32)
    check_array("frame", frame, ndim=3, dtype=np.uint8)
    check_array("mask", mask, ndim=2, dtype=np.float32, shape=tuple(warped.shape[:2]))
    check_array("out", out, ndim=1, dtype=np.float64, shape=(STATS_LEN,))
    h, w = mask.shape
    x0, y0 = origin
    if x0 < 0 or y0 < 0 or y0 + h > frame.shape[0] or x0 + w > frame.shape[1]:
        raise ValueError(f"region at {origin} of size {w}x{h} is not inside the frame "
                         f"{frame.shape[1]}x{frame.shape[0]}")
    if space not in ("lab", "rgb"):
        raise ValueError(f"space must be 'lab' or 'rgb', got {space!r}")
    xp = get_xp(warped, frame, mask, out)
    if xp is not np:
        return _color_stats_cuda(warped, frame, mask, origin, space, out)
    target = frame[y0:y0 + h, x0:x0 + w]
    if space == "lab":
        src = rgb_to_lab(warped, np.empty((h, w, 3), np.float32))
        dst = rgb_to_lab(target, np.empty((h, w, 3), np.float32))
    else:
        src, dst = warped, target.astype(np.float32)
    sel = mask > 0.5
    s = src[sel].astype(np.float64)
    d = dst[sel].astype(np.float64)
    out[0] = s.shape[0]
    out[1:4] = s.sum(axis=0)
    out[4:7] = (s * s).sum(axis=0)
    out[7:10] = d.sum(axis=0)
    out[10:13] = (d * d).sum(axis=0)
    return out


def gain_offset(stats: np.ndarray, strength: float) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel gain and offset (float32) that move the source statistics towards the target's.

    With no selected pixel the transfer is the identity. The kernel computes the same in double.
    """
    n = float(stats[0])
    if n <= 0:
        return np.ones(3, np.float32), np.zeros(3, np.float32)
    ms, md = stats[1:4] / n, stats[7:10] / n
    ss = np.sqrt(np.maximum(stats[4:7] / n - ms * ms, 0.0))
    sd = np.sqrt(np.maximum(stats[10:13] / n - md * md, 0.0))
    gain = np.maximum(sd, MIN_STD) / np.maximum(ss, MIN_STD)
    gain = 1.0 + strength * (gain - 1.0)
    target_mean = ms + strength * (md - ms)
    return gain.astype(np.float32), (target_mean - ms * gain).astype(np.float32)


def chroma_weight(stats: np.ndarray) -> float:
    """How much of a*, b* comes from the target pixel (0..1), from `color_stats` in L*a*b*: 1 for a
    greyscale source, 0 for one with normal skin chroma (CHROMA_GREY, CHROMA_FULL)."""
    n = float(stats[0])
    if n <= 0:
        return 0.0
    m = stats[1:4] / n
    var = np.maximum(stats[4:7] / n - m * m, 0.0)
    spread = math.sqrt(float(var[1] + var[2]))
    return float(min(max((CHROMA_FULL - spread) / (CHROMA_FULL - CHROMA_GREY), 0.0), 1.0))


def smooth_stats(stats: Any, state: Any, alpha: float) -> Any:
    """Exponential moving average of colour statistics, in place into `state` (13,) float64, which
    starts as zeros for a new track. Sums are normalised by their count first (the state holds
    count 1 and per-pixel moments), so a face that grows or shrinks does not weigh more. A frame with
    no selected pixel leaves the state as it was. Runs on NumPy or CuPy arrays without a host
    synchronisation; the result feeds `transfer_blend` like raw `color_stats` output."""
    check_array("stats", stats, ndim=1, dtype=np.float64, shape=(STATS_LEN,))
    check_array("state", state, ndim=1, dtype=np.float64, shape=(STATS_LEN,))
    xp = get_xp(stats, state)
    n = stats[0:1]
    norm = stats / xp.maximum(n, 1.0)
    norm[0] = 1.0
    # The first frame of a track (state count 0) is taken as it is.
    a = xp.where(state[0:1] > 0, alpha, 1.0)
    state[...] = xp.where(n > 0, state + a * (norm - state), state)
    return state


def transfer_blend(frame: Any, warped: Any, mask: Any, stats: Any, origin: tuple[int, int],
                   space: ColorSpace, strength: float = 1.0) -> Any:
    """In place: colour-correct the warped source with `stats` (from `color_stats`) and blend it
    into the frame region at `origin` under `mask`. Pixels where mask == 0 keep their exact value.

    In L*a*b*, a greyscale source (`chroma_weight`) takes a*, b* from the target pixel under it,
    after L* has been matched: the target's skin, lips and cheek colour come through instead of the
    flat mean colour that a transfer of a chroma-less source gives."""
    check_array("frame", frame, ndim=3, dtype=np.uint8)
    check_array("warped", warped, ndim=3, dtype=np.float32)
    check_array("mask", mask, ndim=2, dtype=np.float32, shape=tuple(warped.shape[:2]))
    if space not in _SPACE_CODE:
        raise ValueError(f"space must be one of {sorted(_SPACE_CODE)}, got {space!r}")
    if space != "none":
        check_array("stats", stats, ndim=1, dtype=np.float64, shape=(STATS_LEN,))
    xp = get_xp(frame, warped, mask)
    if xp is not np:
        return _transfer_blend_cuda(frame, warped, mask, stats, origin, space, strength)
    h, w = mask.shape
    if space == "none":
        fg = warped
    else:
        gain, off = gain_offset(stats, strength)
        if space == "lab":
            lab = rgb_to_lab(warped, np.empty((h, w, 3), np.float32))
            lab *= gain
            lab += off
            k = np.float32(chroma_weight(stats) * strength)
            if k > 0:
                x0, y0 = origin
                if x0 < 0 or y0 < 0 or y0 + h > frame.shape[0] or x0 + w > frame.shape[1]:
                    raise ValueError(f"region at {origin} of size {w}x{h} is not inside the frame")
                tgt = rgb_to_lab(frame[y0:y0 + h, x0:x0 + w], np.empty((h, w, 3), np.float32))
                lab[..., 1:] = lab[..., 1:] * (np.float32(1.0) - k) + tgt[..., 1:] * k
            fg = lab_to_rgb(lab, np.empty((h, w, 3), np.float32))
        else:
            fg = np.clip(warped * gain + off, 0.0, 255.0)
    return blend_into(frame, fg, mask, origin)


# ---- CUDA launches ------------------------------------------------------------------------------

def _c_floats(m: np.ndarray) -> str:
    # repr of each float32 value read back as a C float literal rounds to the very same float32.
    return "{" + ",".join(f"{float(v)!r}f" for v in np.asarray(m, np.float32).ravel()) + "}"


def _k(name: str) -> Any:
    """A kernel of cuda/meshswap.cu, compiled with the colour matrices of `color.py`."""
    from .color import _M_FWD, _M_INV
    from .cuda_loader import kernel

    return kernel("meshswap.cu", name, {"M_FWD": _c_floats(_M_FWD), "M_INV": _c_floats(_M_INV),
                                        "CHROMA_GREY": repr(float(CHROMA_GREY)),
                                        "CHROMA_FULL": repr(float(CHROMA_FULL))})


def _blur_args(sigma: float) -> tuple[np.float64, np.int32]:
    # Same radius rule as mask.gaussian_kernel; sigma <= 0 is the identity (one tap of 1).
    if sigma <= 0:
        return np.float64(1.0), np.int32(0)
    r = max(1, int(math.ceil(3.0 * sigma)))
    if r > _MAX_RADIUS:
        raise ValueError(f"blur sigma {sigma:.1f} is too large for the GPU mask (at most "
                         f"{_MAX_RADIUS / 3:.0f} px); lower mesh.feather")
    return np.float64(sigma), np.int32(r)


def _mesh_mask_cuda(outline: Any, keep: Any, keep_counts: tuple[int, ...], map_xy: Any,
                    origin: tuple[int, int], sigma: float, keep_sigma: float, out: Any) -> Any:
    import cupy as cp

    from .cuda_loader import grid, require_cupy

    for name, a in (("outline", outline), ("keep", keep), ("map_xy", map_xy), ("out", out)):
        require_cupy(name, a)
    if len(keep_counts) > 4:
        raise ValueError(f"at most 4 keep-out polygons on the GPU, got {len(keep_counts)}")
    h, w = out.shape
    n = h * w
    if n == 0:
        return out
    counts = [np.int32(c) for c in tuple(keep_counts) + (0,) * (4 - len(keep_counts))]
    sa, ra = _blur_args(sigma)
    sb, rb = _blur_args(keep_sigma if keep_counts else 0.0)
    # Scratch from CuPy's pool: no cudaMalloc after the first frame of a given size.
    two = cp.empty((h, w, 2), cp.float32)
    tmp = cp.empty((h, w, 2), cp.float32)
    _k("mesh_mask_fill")(
        grid(n), (256,), (outline, np.int32(outline.shape[0]), keep, *counts, map_xy,
                          np.int32(origin[0]), np.int32(origin[1]), np.int32(h), np.int32(w), two))
    _k("blur2_rows")(grid(n), (256,), (two, np.int32(h), np.int32(w), sa, ra, sb, rb, tmp))
    _k("blur2_cols_combine")(grid(n), (256,), (tmp, np.int32(h), np.int32(w), sa, ra, sb, rb,
                                               np.int32(1 if keep_counts else 0), out))
    return out


def _color_stats_cuda(warped: Any, frame: Any, mask: Any, origin: tuple[int, int],
                      space: ColorSpace, out: Any) -> Any:
    from .cuda_loader import require_cupy

    for name, a in (("warped", warped), ("mask", mask), ("out", out)):
        require_cupy(name, a)
    require_cupy("frame", frame)
    h, w = mask.shape
    out.fill(0)
    n = h * w
    if n:
        # Grid-stride loop over about two blocks per SM of an H100/H200: enough to fill the GPU,
        # few enough that the per-block atomics stay cheap.
        blocks = min((n + 255) // 256, 264)
        _k(f"color_stats_{space}")(
            (blocks,), (256,), (warped, frame, np.int32(frame.shape[1]), mask, np.int32(origin[0]),
                                np.int32(origin[1]), np.int32(h), np.int32(w), out))
    return out


def _transfer_blend_cuda(frame: Any, warped: Any, mask: Any, stats: Any, origin: tuple[int, int],
                         space: ColorSpace, strength: float) -> Any:
    from .cuda_loader import grid, require_cupy

    for name, a in (("frame", frame), ("warped", warped), ("mask", mask)):
        require_cupy(name, a)
    if space != "none":
        require_cupy("stats", stats)
    else:
        stats = warped  # unused by the kernel's "none" variant; any device pointer will do
    h, w = mask.shape
    if h * w:
        _k(f"transfer_blend_{space}")(
            grid(h * w), (256,), (frame, np.int32(frame.shape[0]), np.int32(frame.shape[1]), warped,
                                  mask, stats, np.float64(strength), np.int32(origin[0]),
                                  np.int32(origin[1]), np.int32(h), np.int32(w)))
    return frame
