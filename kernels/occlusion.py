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

The rest of a face's mask work on the GPU is fused into a few launches, each the twin of a
composition of reference ops, with the same bits (generic CuPy array code took about 230 launches a
face, 9.9 ms of host time at 720p on the H200):

- `canvas_sample`: the face's area box-averaged and warped onto the canvas (`warp.box_downsample`,
  then `warp.warp_affine` with a replicated border);
- `occluder_part`: the lips' and brows' own models applied over their boxes;
- `clean_and_average`: `clean_occluder`, then `ema_update` into the track's mask (three launches:
  median and dilation, blur rows, blur columns with the average; `cuda/occlusion_clean.cu`);
- `visible_region`: 1 - the canvas mask sampled at the swap region (`warp_affine`, constant border).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._xp import check_array, get_xp
from .mask import gaussian_blur, taps_defines
from .warp import box_downsample, warp_affine


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


def canvas_sample(frame: Any, origin: tuple[int, int], blocks: tuple[int, int], k: int, a: np.ndarray,
                  out: Any) -> Any:
    """The face canvas: `frame` (H, W, 3 uint8) from `origin` (x0, y0), `blocks` (bw, bh) blocks of
    k x k pixels box-averaged (`box_downsample`; none for k = 1), warped into `out` (h, w, 3 uint8)
    through `a` (2x3, canvas pixel -> block coordinates), bilinear, border replicated."""
    check_array("frame", frame, ndim=3, dtype=np.uint8)
    check_array("out", out, ndim=3, dtype=np.uint8)
    if frame.shape[2] != 3 or out.shape[2] != 3:
        raise ValueError(f"frame and out must have 3 channels, got {tuple(frame.shape)}, {tuple(out.shape)}")
    (x0, y0), (bw, bh) = origin, blocks
    if k < 1 or bw < 1 or bh < 1 or x0 < 0 or y0 < 0 or x0 + bw * k > frame.shape[1] \
            or y0 + bh * k > frame.shape[0]:
        raise ValueError(f"{bw}x{bh} blocks of {k} px at {origin} do not fit a frame of "
                         f"{frame.shape[1]}x{frame.shape[0]}")
    m = np.asarray(a, np.float64)
    if m.shape != (2, 3):
        raise ValueError(f"a must be a 2x3 matrix, got shape {m.shape}")
    xp = get_xp(frame, out)
    if xp is not np:
        return _canvas_cuda(frame, x0, y0, bw, bh, k, m, out)
    crop = frame[y0:y0 + bh * k, x0:x0 + bw * k]
    small = crop if k == 1 else box_downsample(np.ascontiguousarray(crop), k, np.empty((bh, bw, 3), np.uint8))
    return warp_affine(np.ascontiguousarray(small), m, out, border="replicate")


def occluder_part(patch: Any, allow: Any, whiten: np.ndarray, mean: np.ndarray, lo: float, hi: float,
                  weight: Any, origin: tuple[int, int], score: Any) -> Any:
    """In place over the box of `weight`'s shape at `origin` (x0, y0) of `score`: a pixel stays an
    occluder only as far as it is unlike the part's own model too:
    score -= weight * max(score - occluder_score(patch, allow; part model), 0)."""
    check_array("score", score, ndim=2, dtype=np.float32)
    check_array("weight", weight, ndim=2, dtype=np.float32)
    x0, y0 = origin
    bh, bw = weight.shape
    if x0 < 0 or y0 < 0 or y0 + bh > score.shape[0] or x0 + bw > score.shape[1]:
        raise ValueError(f"a {bw}x{bh} box at {origin} is not inside the {score.shape[1]}x{score.shape[0]} score")
    check_array("patch", patch, dtype=np.uint8, shape=tuple(score.shape) + (3,))
    check_array("allow", allow, dtype=np.float32, shape=tuple(score.shape))
    w, m = _check_model(whiten, mean, lo, hi)
    xp = get_xp(patch, allow, weight, score)
    if xp is not np:
        return _part_cuda(patch, allow, w, m, lo, hi, weight, x0, y0, score)
    box = (slice(y0, y0 + bh), slice(x0, x0 + bw))
    sub = occluder_score(np.ascontiguousarray(patch[box]), np.ascontiguousarray(allow[box]), w, m, lo, hi,
                         np.empty((bh, bw), np.float32))
    score[box] -= weight * np.maximum(score[box] - sub, np.float32(0.0))
    return score


def clean_and_average(score: Any, grow: int, sigma: float, state: Any, alpha: float, fresh: bool) -> Any:
    """`clean_occluder(score)` averaged into a track's mask `state` in place (`ema_update` with
    `alpha`), or copied into it for a track's first mask (`fresh`); returns `state`."""
    check_array("score", score, ndim=2, dtype=np.float32)
    check_array("state", state, dtype=np.float32, shape=tuple(score.shape))
    if not 0.0 < alpha <= 1.0:
        raise ValueError(f"alpha must be in (0, 1], got {alpha}")
    xp = get_xp(score, state)
    if xp is not np:
        return _clean_cuda(score, grow, sigma, state, alpha, fresh)
    cleaned = clean_occluder(score, grow, sigma, np.empty_like(score))
    if fresh:
        state[...] = cleaned
        return state
    return ema_update(state, cleaned, alpha)


def visible_region(occ: Any, a: np.ndarray, out: Any) -> Any:
    """1 - the canvas mask `occ` (ch, cw float32) sampled at each pixel of `out` (h, w float32)
    through `a` (2x3, out pixel -> canvas pixel), bilinear, 0 outside the canvas."""
    check_array("occ", occ, ndim=2, dtype=np.float32)
    check_array("out", out, ndim=2, dtype=np.float32)
    m = np.asarray(a, np.float64)
    if m.shape != (2, 3):
        raise ValueError(f"a must be a 2x3 matrix, got shape {m.shape}")
    xp = get_xp(occ, out)
    if xp is not np:
        return _to_region_cuda(occ, m, out)
    v = warp_affine(occ[..., None], m, np.empty(out.shape + (1,), np.float32), border="constant", fill=0.0)
    out[...] = np.float32(1.0) - v[..., 0]
    return out


# ---- CUDA launch ---------------------------------------------------------------------------------

def _canvas_cuda(frame: Any, x0: int, y0: int, bw: int, bh: int, k: int, m: np.ndarray, out: Any) -> Any:
    from .cuda_loader import grid, kernel, require_cupy

    require_cupy("frame", frame)
    require_cupy("out", out)
    h, w = out.shape[:2]
    if h * w:
        kernel("occlusion.cu", "occl_canvas_u8")(
            grid(h * w), (256,), (frame, np.int32(frame.shape[1]), np.int32(x0), np.int32(y0), np.int32(bw),
                                  np.int32(bh), np.int32(k), *[np.float64(v) for v in m.ravel()],
                                  np.int32(h), np.int32(w), out))
    return out


def _part_cuda(patch: Any, allow: Any, w: np.ndarray, m: np.ndarray, lo: float, hi: float, weight: Any,
               x0: int, y0: int, score: Any) -> Any:
    from .cuda_loader import grid, kernel, require_cupy

    for name, a in (("patch", patch), ("allow", allow), ("weight", weight), ("score", score)):
        require_cupy(name, a)
    bh, bw = weight.shape
    if bh * bw:
        f32 = np.float32
        inv = f32(1.0) / (f32(hi) - f32(lo))
        kernel("occlusion.cu", "occl_part_u8")(
            grid(bh * bw), (256,), (patch, allow, np.int32(score.shape[1]), np.int32(y0), np.int32(x0),
                                    np.int32(bh), np.int32(bw), weight, *[f32(v) for v in w.ravel()],
                                    *[f32(v) for v in m], f32(lo), inv, score))
    return score


def _clean_cuda(score: Any, grow: int, sigma: float, state: Any, alpha: float, fresh: bool) -> Any:
    import cupy

    from .cuda_loader import grid, kernel, require_cupy

    require_cupy("score", score)
    require_cupy("state", state)
    if grow < 0:
        raise ValueError(f"grow must be >= 0, got {grow}")
    h, w = score.shape
    n = h * w
    if n:
        defs = taps_defines(sigma, "OCCL")
        a, b = cupy.empty_like(score), cupy.empty_like(score)
        kernel("occlusion_clean.cu", "occl_median_dilate", defs)(
            grid(n), (256,), (score, np.int32(h), np.int32(w), np.int32(grow), a))
        # The row pass is the generic blur's (cuda/blur.cu); the column pass is fused with the average.
        kernel("blur.cu", "blur_axis", taps_defines(sigma))(grid(n), (256,), (a, np.int64(n), np.int32(w),
                                                                               np.int64(1), b))
        kernel("occlusion_clean.cu", "occl_blur_cols_ema", defs)(
            grid(n), (256,), (b, np.int32(h), np.int32(w), np.float32(alpha), np.int32(bool(fresh)), state))
    return state


def _to_region_cuda(occ: Any, m: np.ndarray, out: Any) -> Any:
    from .cuda_loader import grid, kernel, require_cupy

    require_cupy("occ", occ)
    require_cupy("out", out)
    h, w = out.shape
    if h * w:
        kernel("occlusion.cu", "occl_to_region")(
            grid(h * w), (256,), (occ, np.int32(occ.shape[0]), np.int32(occ.shape[1]),
                                  *[np.float64(v) for v in m.ravel()], np.int32(h), np.int32(w), out))
    return out

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
