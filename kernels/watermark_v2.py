"""Watermark v2 embedding: a given luma pattern, scaled per 8x8 block by the block's own texture.

The pattern (what the mark says, how it tiles the frame: `swapstream.watermark_v2`) is one float32
value per pixel. This module only puts it into frames, perceptually shaped: a block that is flat gets
a fraction of it, a textured block more, because texture hides (masks) a small change that a flat
area shows, and an encoder spends few bits on the small change either way in a flat area.

Integer luma and texture, exact in both implementations:

    Y(y, x)   = (9798 R + 19235 G + 3735 B + 16384) >> 15        BT.601 weights, /32768 (OpenCV's)
    act(b)    = sum over the pixel pairs of block b (8x8, cut at the frame's edge) that are
                horizontal or vertical neighbours inside b, of |Y(p) - Y(q)|
    n(b)      = the number of pixels of b inside the frame
    m(b)      = min(max((float32(act(b)) / float32(n(b))) * inv_act, m_lo), m_hi)      float32
    out(y,x,c) = clip(frame(y,x,c) + rint(m(b(y,x)) * pattern(y,x)), 0, 255)          c = R, G, B

Only pairs inside a block count, so a block's mask depends on its own pixels alone: the CUDA kernel
(one thread block per 8x8 block) then reads no pixel that another thread block may already have
changed, and marks in place without a copy. Adding the same integer to R, G and B moves luma by it
and leaves Y'CbCr chroma as it was.

`embed_masked_ref` is the NumPy (or any `xp`) reference. `cuda/watermark_v2.cu` computes the same
integers, then the float32 division, product and rounding with `__fdiv_rn`, `__fmul_rn` and `rintf`
(half to even, as np.rint), never contracted into an FMA: kernel and reference agree bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ._xp import check_array, get_xp, on_gpu

MASK_BLOCK = 8
"""Pixels per side of a texture-mask block."""


@dataclass(frozen=True)
class MaskParams:
    """How texture turns into the pattern's scale (see the module doc)."""

    inv_act: float
    """1 / the mean |luma difference| per pixel at which a block gets the pattern at scale 1."""
    m_lo: float
    """Scale of a flat block."""
    m_hi: float
    """Largest scale, for the busiest blocks."""

    def __post_init__(self) -> None:
        for name in ("inv_act", "m_lo", "m_hi"):
            v = getattr(self, name)
            if not (np.isfinite(v) and v >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
        if self.m_lo > self.m_hi:
            raise ValueError(f"m_lo ({self.m_lo}) must not exceed m_hi ({self.m_hi})")


def _check(frame: Any, pattern: Any) -> None:
    check_array("frame", frame, ndim=3, dtype=np.uint8)
    if frame.shape[2] != 3:
        raise ValueError(f"frame must have shape HxWx3 (RGB), got {tuple(frame.shape)}")
    check_array("pattern", pattern, ndim=2, dtype=np.float32, shape=tuple(frame.shape[:2]))


def integer_luma(frame: Any) -> Any:
    """(H, W) int32 luma of an RGB uint8 frame: (9798 R + 19235 G + 3735 B + 16384) >> 15, the
    integers of OpenCV's RGB-to-grey conversion, so that the CPU path takes that one fast pass."""
    xp = get_xp(frame)
    f = frame.astype(xp.int32)
    return (9798 * f[..., 0] + 19235 * f[..., 1] + 3735 * f[..., 2] + 16384) >> 15


def block_scale_ref(frame: Any, params: MaskParams) -> Any:
    """m(b) of every 8x8 block, (ceil(H/8), ceil(W/8)) float32 (see the module doc)."""
    xp = get_xp(frame)
    h, w = frame.shape[:2]
    y = integer_luma(frame)
    bh, bw = -(-h // MASK_BLOCK), -(-w // MASK_BLOCK)
    act = xp.zeros((bh * MASK_BLOCK, bw * MASK_BLOCK), xp.int32)
    # A pair (x, x+1) is inside one block when x+1 is not a block's first column.
    dx = xp.abs(y[:, 1:] - y[:, :-1])
    dx[:, (xp.arange(1, w) % MASK_BLOCK) == 0] = 0
    dy = xp.abs(y[1:, :] - y[:-1, :])
    dy[(xp.arange(1, h) % MASK_BLOCK) == 0, :] = 0
    act[:h, :w - 1] += dx
    act[:h - 1, :w] += dy
    sums = act.reshape(bh, MASK_BLOCK, bw, MASK_BLOCK).sum(axis=(1, 3))
    rows = xp.minimum(MASK_BLOCK, h - MASK_BLOCK * xp.arange(bh))
    cols = xp.minimum(MASK_BLOCK, w - MASK_BLOCK * xp.arange(bw))
    n = (rows[:, None] * cols[None, :]).astype(xp.float32)
    mean = sums.astype(xp.float32) / n                                   # float32 / float32
    m = mean * xp.float32(params.inv_act)
    return xp.minimum(xp.maximum(m, xp.float32(params.m_lo)), xp.float32(params.m_hi)).astype(xp.float32)


def masked_delta_ref(frame: Any, pattern: Any, params: MaskParams) -> Any:
    """rint(m(b(y, x)) * pattern(y, x)) of every pixel, (H, W) int16."""
    xp = get_xp(frame, pattern)
    h, w = frame.shape[:2]
    m = block_scale_ref(frame, params)
    mp = xp.repeat(xp.repeat(m, MASK_BLOCK, axis=0), MASK_BLOCK, axis=1)[:h, :w]
    return xp.rint(mp * pattern).astype(xp.int16)


def embed_masked_ref(frame: Any, pattern: Any, params: MaskParams) -> None:
    """Reference of `embed_masked`; same arguments and effect."""
    _check(frame, pattern)
    xp = get_xp(frame, pattern)
    d = masked_delta_ref(frame, pattern, params)
    frame[...] = xp.clip(frame.astype(xp.int16) + d[..., None], 0, 255).astype(xp.uint8)


class CpuScratch:
    """`embed_masked_cpu`'s working arrays for one frame size, kept between frames: allocated anew
    for every 720p frame, their fresh pages cost more than the arithmetic (15-22 ms a frame against
    4 ms with them kept, on the 2-core machine)."""

    def __init__(self, h: int, w: int) -> None:
        self.shape = (h, w)
        self.y = np.empty((h, w), np.uint8)
        # Full-size difference planes whose last column (dx) and last row (dy) stay 0: the pairs
        # they would hold cross the frame's edge, which is also a block's edge.
        self.dx = np.zeros((h, w), np.uint8)
        self.dy = np.zeros((h, w), np.uint8)
        self.act = np.empty((h, w), np.float32)
        self.scale = np.empty((h, w), np.float32)
        # The delta's positive and negative parts, as uint8 (one plane, then one per channel): a
        # saturating add and subtract of uint8 is the reference's clip, at a third of the cost of
        # widening the frame to int16 (1.0 against 1.8 ms at 720p on the 2-core machine).
        self.up = np.empty((h, w), np.uint8)
        self.down = np.empty((h, w), np.uint8)
        self.up3 = np.empty((h, w, 3), np.uint8)
        self.down3 = np.empty((h, w, 3), np.uint8)


def luma_u8(frame: np.ndarray, dst: np.ndarray | None = None) -> np.ndarray:
    """`integer_luma` of a host RGB uint8 frame as (H, W) uint8: OpenCV's RGB-to-grey conversion,
    which computes exactly those integers (checked on all 2^24 colours by the tests), ten times
    faster than the rounding `cv2.transform` that reproduced the earlier /256 weights."""
    import cv2

    return cv2.cvtColor(frame, cv2.COLOR_RGB2GRAY, dst=dst)


def embed_masked_cpu(frame: np.ndarray, pattern: np.ndarray, params: MaskParams,
                     scratch: CpuScratch | None = None) -> None:
    """The CPU path of `embed_masked`: the reference's integers and float32 steps, on OpenCV's
    vectorised ops, bit for bit the same (a test checks every element on random frames). Frames
    whose sides are not multiples of 8, or that are not C-contiguous, take the reference.
    `scratch` (for this frame size) keeps the working arrays between frames.

    Exact because: `luma_u8` is `integer_luma` (OpenCV's own integers); the activity (at most 510 a
    pixel) is an integer that float32 holds; an 8x8 INTER_AREA resize of integer activities sums 64
    values times 1/64, a power of two, so it gives sum / 64 exactly, the reference's float32(act) /
    float32(n); INTER_NEAREST at a factor of 8 repeats each block; cv2.multiply of two float32
    planes into int16 rounds their float32 product half to even, as np.rint does (its out-of-range
    saturation only reaches deltas that clip the pixel anyway). Into uint8 it saturates instead:
    scale x pattern gives max(rint(d), 0) and, with cv2.multiply's factor -1 (exact: (-s) x p is
    -(s x p) rounded, as round-to-nearest-even is symmetric), max(-rint(d), 0), one of them 0; adding the first and subtracting the second with uint8 saturation is
    clip(frame + rint(d), 0, 255), the reference's clip."""
    import cv2

    h, w = frame.shape[:2]
    s = scratch if scratch is not None and scratch.shape == (h, w) else CpuScratch(h, w)
    luma_u8(frame, s.y)
    cv2.absdiff(s.y[:, 1:], s.y[:, :-1], dst=s.dx[:, :w - 1])
    s.dx[:, MASK_BLOCK - 1::MASK_BLOCK] = 0  # pairs across a block's edge do not count
    cv2.absdiff(s.y[1:, :], s.y[:-1, :], dst=s.dy[:h - 1, :])
    s.dy[MASK_BLOCK - 1::MASK_BLOCK, :] = 0
    cv2.add(s.dx, s.dy, dst=s.act, dtype=cv2.CV_32F)
    mean = cv2.resize(s.act, (w // MASK_BLOCK, h // MASK_BLOCK), interpolation=cv2.INTER_AREA)
    m = np.minimum(np.maximum(mean * np.float32(params.inv_act), np.float32(params.m_lo)),
                   np.float32(params.m_hi))
    cv2.resize(m, (w, h), dst=s.scale, interpolation=cv2.INTER_NEAREST)
    cv2.multiply(s.scale, pattern, dst=s.up, dtype=cv2.CV_8U)
    cv2.multiply(s.scale, pattern, dst=s.down, scale=-1.0, dtype=cv2.CV_8U)
    cv2.merge([s.up, s.up, s.up], dst=s.up3)
    cv2.merge([s.down, s.down, s.down], dst=s.down3)
    cv2.add(frame, s.up3, dst=frame)
    cv2.subtract(frame, s.down3, dst=frame)


def embed_masked(frame: Any, pattern: Any, params: MaskParams, scratch: CpuScratch | None = None) -> None:
    """Add `pattern`, scaled per 8x8 block by the block's texture, to the luma of `frame` in place.

    frame:   (H, W, 3) uint8 RGB, modified in place.
    pattern: (H, W) float32, the mark at scale 1, as an array of the frame's kind.

    A CuPy `frame` (C-contiguous, current device) runs `cuda/watermark_v2.cu` on the current stream;
    a NumPy `frame` runs `embed_masked_cpu` (or the reference, for sizes it does not take), with
    `scratch` if given. All three agree bit for bit.
    """
    _check(frame, pattern)
    if not on_gpu(frame=frame, pattern=pattern):
        h, w = frame.shape[:2]
        if h % MASK_BLOCK == 0 and w % MASK_BLOCK == 0 and frame.flags.c_contiguous \
                and pattern.flags.c_contiguous:
            embed_masked_cpu(frame, pattern, params, scratch)
        else:
            embed_masked_ref(frame, pattern, params)
        return
    from .cuda_loader import kernel, require_cupy

    require_cupy("frame", frame)
    require_cupy("pattern", pattern)
    h, w = frame.shape[:2]
    blocks = (-(-w // MASK_BLOCK), -(-h // MASK_BLOCK))
    kernel("watermark_v2.cu", "watermark_v2_embed")(
        blocks, (MASK_BLOCK, MASK_BLOCK),
        (frame, np.int32(h), np.int32(w), pattern, np.float32(params.inv_act),
         np.float32(params.m_lo), np.float32(params.m_hi)))
