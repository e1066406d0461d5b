"""Invisible watermark embedding: a block-DCT spread-spectrum pattern added to the luma of an RGB frame.

The frame is divided into a grid of blocks defined in normalised coordinates (so the same grid is
found again after the frame is scaled). Each block carries K chips: signs s[by, bx, k] in {-1, 0, +1}
on K chosen coefficients (u_k, v_k) of an 8x8 DCT of that block, as seen on the frame resampled to a
canonical size of (8 x blocks across) x (8 x blocks down). Embedding adds the inverse DCT of those
chips, evaluated at every pixel's own position inside its block:

    pattern(y, x) = sum_k s[by(y), bx(x), k] * (basis_y[k, y] * basis_x[k, x])      float32, k ascending
    out(y, x, c)  = clip(frame(y, x, c) + rint(pattern(y, x)), 0, 255)              every channel c

Adding the same integer to R, G and B changes luma by that amount and leaves the chroma of
Y'CbCr untouched (the luma weights sum to 1, the chroma weights to 0), which is where codecs spend the
fewest bits. `block_pattern` builds the tables for one frame size: `basis_x[k, x]` is the strength
times the horizontal DCT basis of frequency u_k at column x, `basis_y[k, y]` the vertical one (no
strength), and `block_x`, `block_y` the block column and row of every pixel.

What the chips say (payload, error correction, the key) and how marks are found again are the
product's business (`swapstream.watermark`); this module only puts a given pattern into frames.

`embed_watermark_ref` is the NumPy (or any `xp`) reference. The CUDA twin in `cuda/watermark.cu`
runs one thread per pixel and performs the same float32 operations in the same order with the `_rn`
intrinsics (a multiplication by a chip of +-1 is exact, a chip of 0 adds nothing), and rintf rounds
half to even like np.rint, so the two agree bit for bit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._xp import check_array, get_xp, on_gpu

BLOCK = 8
"""Samples per block side on the canonical grid: the DCT is 8x8."""


@dataclass(frozen=True)
class BlockPattern:
    """The per-frame-size tables of `block_pattern` (NumPy or CuPy arrays, all on one device).

    Build them with `block_pattern`, which keeps every block index inside `grid`: the kernel trusts
    the index tables rather than check each pixel's (or synchronise to check them per frame)."""

    grid: tuple[int, int]
    """(blocks across, blocks down)."""
    basis_x: Any
    """(K, W) float32: strength x horizontal DCT basis of coefficient k at each column."""
    basis_y: Any
    """(K, H) float32: vertical DCT basis of coefficient k at each row."""
    block_x: Any
    """(W,) int32: block column of each pixel column."""
    block_y: Any
    """(H,) int32: block row of each pixel row."""

    @property
    def shape(self) -> tuple[int, int]:
        """(H, W) of the frames this pattern fits."""
        return int(self.basis_y.shape[1]), int(self.basis_x.shape[1])

    @property
    def coefficients(self) -> int:
        return int(self.basis_x.shape[0])

    def to(self, xp: Any) -> "BlockPattern":
        """The same tables as `xp` arrays (CuPy: uploaded to the current device)."""
        return BlockPattern(self.grid, *(xp.asarray(a) for a in (self.basis_x, self.basis_y,
                                                                  self.block_x, self.block_y)))


def _dct_basis_1d(n_pixels: int, n_blocks: int, freqs: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """For every pixel along one axis: its block index, and the 8-point DCT-II basis of each
    frequency evaluated at the pixel centre's position on the canonical grid (float64).

    A pixel centre at p (pixels, centres at integers) sits at canonical coordinate
    c = (p + 0.5) * (8 n_blocks / n_pixels) - 0.5, in block floor((c + 0.5) / 8) at local position
    t = c - 8 block in [-0.5, 7.5); the orthonormal basis is a(f) cos(pi (2t + 1) f / 16).
    """
    p = np.arange(n_pixels, dtype=np.float64)
    c = (p + 0.5) * (BLOCK * n_blocks / n_pixels) - 0.5
    block = np.clip(np.floor((c + 0.5) / BLOCK), 0, n_blocks - 1).astype(np.int32)
    t = c - BLOCK * block
    basis = np.empty((len(freqs), n_pixels), np.float64)
    for k, f in enumerate(freqs):
        a = math.sqrt(1.0 / BLOCK) if f == 0 else math.sqrt(2.0 / BLOCK)
        basis[k] = a * np.cos(np.pi * (2.0 * t + 1.0) * f / (2 * BLOCK))
    return block, basis


def block_pattern(height: int, width: int, grid: tuple[int, int],
                  coefficients: tuple[tuple[int, int], ...], strength: float) -> BlockPattern:
    """Tables for (height, width) frames: `grid` is (blocks across, blocks down), `coefficients`
    the (u, v) DCT frequencies (u horizontal, v vertical, each 0..7), `strength` the amplitude of
    each chip in DCT units (orthonormal 8x8 DCT of 0..255 luma). NumPy arrays; `.to(cupy)` uploads."""
    for name, v in (("height", height), ("width", width)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    bx, by = grid
    if bx < 1 or by < 1:
        raise ValueError(f"grid must be two positive block counts, got {grid!r}")
    if not coefficients or any(not (0 <= u < BLOCK and 0 <= v < BLOCK) for u, v in coefficients):
        raise ValueError(f"coefficients must be (u, v) pairs in 0..{BLOCK - 1}, got {coefficients!r}")
    if not (math.isfinite(strength) and strength > 0):
        raise ValueError(f"strength must be a finite number > 0, got {strength!r}")
    block_x, basis_x = _dct_basis_1d(int(width), bx, tuple(u for u, _ in coefficients))
    block_y, basis_y = _dct_basis_1d(int(height), by, tuple(v for _, v in coefficients))
    # The strength is folded into the horizontal table once, in float64, then rounded to float32:
    # both implementations read the same float32 values.
    return BlockPattern((bx, by), np.ascontiguousarray((strength * basis_x).astype(np.float32)),
                        np.ascontiguousarray(basis_y.astype(np.float32)), block_x, block_y)


def _check(frame: Any, signs: Any, pattern: BlockPattern) -> None:
    check_array("frame", frame, ndim=3, dtype=np.uint8)
    if frame.shape[2] != 3:
        raise ValueError(f"frame must have shape HxWx3 (RGB), got {tuple(frame.shape)}")
    h, w = frame.shape[:2]
    k = pattern.coefficients
    check_array("pattern.basis_x", pattern.basis_x, ndim=2, dtype=np.float32, shape=(k, w))
    check_array("pattern.basis_y", pattern.basis_y, ndim=2, dtype=np.float32, shape=(k, h))
    check_array("pattern.block_x", pattern.block_x, ndim=1, dtype=np.int32, shape=(w,))
    check_array("pattern.block_y", pattern.block_y, ndim=1, dtype=np.int32, shape=(h,))
    bx, by = pattern.grid
    check_array("signs", signs, ndim=3, dtype=np.int8, shape=(by, bx, k))


def pattern_delta_ref(signs: Any, pattern: BlockPattern) -> Any:
    """The rounded luma offset of every pixel, (H, W) int16: the reference's inner step, which the CPU
    pipeline computes once per stream and frame size and then only adds (`add_luma_delta_ref`)."""
    xp = get_xp(signs, pattern.basis_x)
    h, w = pattern.shape
    bx, by = pattern.grid
    check_array("signs", signs, ndim=3, dtype=np.int8, shape=(by, bx, pattern.coefficients))
    acc = xp.zeros((h, w), dtype=xp.float32)
    for k in range(pattern.coefficients):
        s = signs[:, :, k][pattern.block_y][:, pattern.block_x].astype(xp.float32)
        term = pattern.basis_y[k][:, None] * pattern.basis_x[k][None, :]   # float32, rounded once
        acc = acc + s * term                                                # s*term is exact (+-1, 0)
    return xp.rint(acc).astype(xp.int16)


def add_luma_delta_ref(frame: Any, delta: Any) -> None:
    """frame[..., c] = clip(frame[..., c] + delta, 0, 255) for every channel, in place."""
    xp = get_xp(frame, delta)
    frame[...] = xp.clip(frame.astype(xp.int16) + delta[..., None], 0, 255).astype(xp.uint8)


def split_luma_delta(delta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(raise, lower): `delta` (H, W) int16 as two (H, W, 3) uint8 images, max(delta, 0) and
    max(-delta, 0) on every channel, for `add_luma_delta_fast`. |delta| must be <= 255."""
    check_array("delta", delta, ndim=2, dtype=np.int16)
    if delta.size and int(np.abs(delta).max()) > 255:
        raise ValueError("delta must lie in [-255, 255]")
    up = np.repeat(np.maximum(delta, 0).astype(np.uint8)[..., None], 3, axis=2)
    down = np.repeat(np.maximum(-delta, 0).astype(np.uint8)[..., None], 3, axis=2)
    return np.ascontiguousarray(up), np.ascontiguousarray(down)


def add_luma_delta_fast(frame: np.ndarray, up: np.ndarray, down: np.ndarray) -> None:
    """`add_luma_delta_ref` bit for bit, with two saturating uint8 passes of OpenCV (SIMD) instead of
    a widening to int16 and back: at every pixel one of (up, down) is 0, so
    clip(clip(f + up) - down) = clip(f + delta)."""
    import cv2

    check_array("frame", frame, ndim=3, dtype=np.uint8)
    check_array("up", up, dtype=np.uint8, shape=tuple(frame.shape))
    check_array("down", down, dtype=np.uint8, shape=tuple(frame.shape))
    cv2.add(frame, up, dst=frame)
    cv2.subtract(frame, down, dst=frame)


def embed_watermark_ref(frame: Any, signs: Any, pattern: BlockPattern) -> None:
    """Reference of `embed_watermark`, written against `xp`; same arguments and effect."""
    _check(frame, signs, pattern)
    add_luma_delta_ref(frame, pattern_delta_ref(signs, pattern))


def embed_watermark(frame: Any, signs: Any, pattern: BlockPattern) -> None:
    """Add the block-DCT pattern of `signs` to the luma of `frame`, in place.

    frame:   (H, W, 3) uint8 RGB, modified in place (every pixel).
    signs:   (blocks down, blocks across, K) int8 chips in {-1, 0, +1}.
    pattern: `block_pattern(H, W, ...)` tables, as arrays of the frame's kind (`.to(cupy)`).

    A CuPy `frame` (C-contiguous, current device) runs `cuda/watermark.cu` on the current stream;
    a NumPy `frame` runs `embed_watermark_ref`. The two agree bit for bit.
    """
    _check(frame, signs, pattern)
    if not on_gpu(frame=frame, signs=signs, basis_x=pattern.basis_x, basis_y=pattern.basis_y,
                  block_x=pattern.block_x, block_y=pattern.block_y):
        embed_watermark_ref(frame, signs, pattern)
        return
    _embed_cuda(frame, signs, pattern)


def _embed_cuda(frame: Any, signs: Any, pattern: BlockPattern) -> None:
    from .cuda_loader import grid, kernel, require_cupy

    require_cupy("frame", frame)
    for name, a in (("signs", signs), ("pattern.basis_x", pattern.basis_x),
                    ("pattern.basis_y", pattern.basis_y), ("pattern.block_x", pattern.block_x),
                    ("pattern.block_y", pattern.block_y)):
        require_cupy(name, a)
    h, w = frame.shape[:2]
    k = pattern.coefficients
    n = h * w
    # K is compiled in (the chip loop unrolls); the kernel's name carries it for profiles.
    name = f"watermark_embed_k{k}"
    kernel("watermark.cu", name, {"WM_K": k, "WM_KERNEL": name})(
        grid(n), (256,), (frame, np.int32(h), np.int32(w), signs, np.int32(pattern.grid[0]),
                          pattern.basis_x, pattern.basis_y, pattern.block_x, pattern.block_y))
