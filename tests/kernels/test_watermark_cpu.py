"""The watermark embedding reference (kernels/watermark.py) against direct formulas.

Inputs are fresh random data for every test (never zeros). The op works in place, so every test
compares the WHOLE frame.
"""

from __future__ import annotations

import math

import cv2
import numpy as np
import pytest

from swapstream.kernels.watermark import (BLOCK, add_luma_delta_ref, block_pattern, embed_watermark,
                                          embed_watermark_ref, pattern_delta_ref)

COEFS = ((0, 2), (1, 1), (2, 0), (0, 3), (1, 2), (2, 1), (3, 0))


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng()


def random_signs(rng: np.random.Generator, grid: tuple[int, int], k: int, zeros: bool = True) -> np.ndarray:
    choices = [-1, 0, 1] if zeros else [-1, 1]
    return rng.choice(np.array(choices, np.int8), size=(grid[1], grid[0], k))


def dct_basis(f: int, t: np.ndarray) -> np.ndarray:
    """8-point orthonormal DCT-II basis function of frequency f at (continuous) position t."""
    a = math.sqrt(1 / BLOCK) if f == 0 else math.sqrt(2 / BLOCK)
    return a * np.cos(np.pi * (2 * t + 1) * f / (2 * BLOCK))


def direct_pattern(h: int, w: int, grid: tuple[int, int], signs: np.ndarray, strength: float) -> np.ndarray:
    """The pattern in float64, straight from the definition: each pixel centre's position on the
    canonical grid, its block, and the sum of the chips' DCT basis functions there."""
    gx, gy = grid
    yc = (np.arange(h) + 0.5) * (BLOCK * gy / h) - 0.5
    xc = (np.arange(w) + 0.5) * (BLOCK * gx / w) - 0.5
    by = np.clip(np.floor((yc + 0.5) / BLOCK), 0, gy - 1).astype(int)
    bx = np.clip(np.floor((xc + 0.5) / BLOCK), 0, gx - 1).astype(int)
    ty, tx = yc - BLOCK * by, xc - BLOCK * bx
    out = np.zeros((h, w))
    for k, (u, v) in enumerate(COEFS):
        s = signs[by][:, bx, k].astype(np.float64)
        out += s * strength * dct_basis(v, ty)[:, None] * dct_basis(u, tx)[None, :]
    return out


@pytest.mark.parametrize("size", [(720, 1280), (480, 854), (1080, 1920), (301, 517), (1280, 720)])
def test_tables_follow_the_definition(size: tuple[int, int]) -> None:
    h, w = size
    grid = (64, 36) if w >= h else (36, 64)
    p = block_pattern(h, w, grid, COEFS, 7.0)
    assert p.shape == (h, w) and p.grid == grid and p.coefficients == len(COEFS)
    assert p.basis_x.dtype == np.float32 and p.basis_y.dtype == np.float32
    assert p.block_x.dtype == np.int32 and p.block_y.dtype == np.int32
    # Every block is used, in order, and no index leaves the grid.
    assert np.array_equal(np.unique(p.block_x), np.arange(grid[0]))
    assert np.array_equal(np.unique(p.block_y), np.arange(grid[1]))
    assert np.all(np.diff(p.block_x) >= 0) and np.all(np.diff(p.block_y) >= 0)


def test_at_the_canonical_size_the_tables_are_the_dct_basis() -> None:
    """At exactly 8 pixels per block the pattern of one chip is one DCT basis image, so the
    forward DCT of a marked flat frame gives back strength x sign on the chip's coefficient."""
    grid = (64, 36)
    h, w = grid[1] * BLOCK, grid[0] * BLOCK
    p = block_pattern(h, w, grid, COEFS, 1.0)
    t = np.arange(BLOCK, dtype=np.float64)
    for k, (u, v) in enumerate(COEFS):
        np.testing.assert_allclose(p.basis_x[k][:BLOCK], dct_basis(u, t), rtol=0, atol=1e-7)
        np.testing.assert_allclose(p.basis_y[k][:BLOCK], dct_basis(v, t), rtol=0, atol=1e-7)
        # float32 tables: within a float32 ulp of the float64 basis.


def test_dct_of_a_marked_flat_frame_recovers_every_chip(rng: np.random.Generator) -> None:
    grid = (64, 36)
    h, w = grid[1] * BLOCK, grid[0] * BLOCK
    signs = random_signs(rng, grid, len(COEFS), zeros=False)
    frame = np.full((h, w, 3), 128, np.uint8)
    embed_watermark_ref(frame, signs, block_pattern(h, w, grid, COEFS, 7.0))
    y = frame[..., 0].astype(np.float64)  # R = G = B: the luma
    m = np.array([dct_basis(u, np.arange(BLOCK, dtype=np.float64)) for u in range(BLOCK)])
    blocks = y.reshape(grid[1], BLOCK, grid[0], BLOCK).transpose(0, 2, 1, 3)
    coef = np.einsum("vy,abyx,ux->abvu", m, blocks, m)
    got = np.stack([coef[:, :, v, u] for u, v in COEFS], axis=-1)
    # Rounding the pattern to integers moves each pixel by at most 0.5; the basis images have unit
    # norm, so (Cauchy-Schwarz) any coefficient moves by at most sqrt(64) x 0.5 = 4 DCT units.
    # Strength 7 therefore keeps every chip's sign, and its magnitude within 4 of 7.
    assert np.array_equal(np.sign(got), signs)
    assert np.abs(np.abs(got) - 7.0).max() <= 4.0


@pytest.mark.parametrize("size", [(720, 1280), (240, 427), (1280, 720)])
def test_reference_matches_direct_evaluation(rng: np.random.Generator, size: tuple[int, int]) -> None:
    h, w = size
    grid = (64, 36) if w >= h else (36, 64)
    signs = random_signs(rng, grid, len(COEFS))
    strength = float(rng.uniform(3, 14))
    frame = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    want = direct_pattern(h, w, grid, signs, strength)
    delta = pattern_delta_ref(signs, block_pattern(h, w, grid, COEFS, strength)).astype(np.float64)
    # float32 against float64: the two roundings to integers differ only where the float64 value
    # lies within float32 error (~1e-5 here) of a half-integer, so by at most 1, at a handful of
    # pixels out of ~10^6.
    d = np.abs(delta - np.rint(want))
    assert d.max() <= 1 and (d > 0).mean() < 1e-4
    out = frame.copy()
    embed_watermark_ref(out, signs, block_pattern(h, w, grid, COEFS, strength))
    expect = np.clip(frame.astype(np.int32) + delta.astype(np.int32)[..., None], 0, 255)
    assert np.array_equal(out, expect)


def test_numpy_dispatch_runs_the_reference(rng: np.random.Generator) -> None:
    h, w = 360, 640
    grid = (64, 36)
    signs = random_signs(rng, grid, len(COEFS))
    p = block_pattern(h, w, grid, COEFS, 7.0)
    frame = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    a, b, c = frame.copy(), frame.copy(), frame.copy()
    embed_watermark(a, signs, p)
    embed_watermark_ref(b, signs, p)
    add_luma_delta_ref(c, pattern_delta_ref(signs, p))  # the CPU pipeline's cached form
    assert np.array_equal(a, b) and np.array_equal(a, c)
    assert not np.array_equal(a, frame)


def test_only_luma_changes_and_clipping_is_per_channel(rng: np.random.Generator) -> None:
    h, w = 288, 512
    grid = (64, 36)
    signs = random_signs(rng, grid, len(COEFS), zeros=False)
    frame = rng.integers(20, 236, (h, w, 3), dtype=np.uint8)   # away from the ends: no clipping
    frame[:16] = rng.integers(0, 4, (16, w, 3), dtype=np.uint8)      # near black: clips at 0
    frame[-16:] = rng.integers(252, 256, (16, w, 3), dtype=np.uint8)  # near white: clips at 255
    out = frame.copy()
    embed_watermark_ref(out, signs, block_pattern(h, w, grid, COEFS, 7.0))
    d = out.astype(int) - frame.astype(int)
    mid = d[16:-16]
    # The same offset on R, G and B: Cb and Cr (weights summing to 0) do not move.
    assert np.array_equal(mid[..., 0], mid[..., 1]) and np.array_equal(mid[..., 0], mid[..., 2])
    yuv0 = cv2.cvtColor(frame[16:-16], cv2.COLOR_RGB2YCrCb).astype(int)
    yuv1 = cv2.cvtColor(out[16:-16], cv2.COLOR_RGB2YCrCb).astype(int)
    # OpenCV's 8-bit conversion rounds each of Cr and Cb once: at most 1 level apart.
    assert np.abs(yuv1[..., 1:] - yuv0[..., 1:]).max() <= 1
    assert np.abs(yuv1[..., 0] - yuv0[..., 0]).max() >= 5   # the luma does
    assert out.min() == 0 and out.max() == 255                 # clipped, not wrapped
    assert np.all(out[:16][d[:16] < 0] <= 3) and np.all(out[-16:][d[-16:] > 0] >= 252)


def test_psnr_of_the_default_strength() -> None:
    """Strength 7 (the product's default amplitude) on a mid-grey frame: ~2.3 levels RMS, > 40 dB."""
    rng = np.random.default_rng(1)
    h, w = 720, 1280
    grid = (64, 36)
    delta = pattern_delta_ref(random_signs(rng, grid, len(COEFS), zeros=False),
                              block_pattern(h, w, grid, COEFS, 7.0)).astype(np.float64)
    rms = float(np.sqrt(np.mean(delta ** 2)))
    psnr = 20 * np.log10(255 / rms)
    print(f"pattern RMS {rms:.2f} levels, PSNR {psnr:.1f} dB, max |delta| {int(np.abs(delta).max())}")
    assert 2.0 < rms < 2.6 and psnr > 40.0


def test_bad_arguments_are_named(rng: np.random.Generator) -> None:
    grid = (64, 36)
    p = block_pattern(360, 640, grid, COEFS, 7.0)
    signs = random_signs(rng, grid, len(COEFS))
    frame = rng.integers(0, 256, (360, 640, 3), dtype=np.uint8)
    with pytest.raises(ValueError, match="frame"):
        embed_watermark(frame.astype(np.float32), signs, p)
    with pytest.raises(ValueError, match="pattern.basis_x"):
        embed_watermark(frame[:, :600].copy(), signs, p)  # a pattern for another frame size
    with pytest.raises(ValueError, match="signs"):
        embed_watermark(frame, signs[:, :, :5].copy(), p)
    with pytest.raises(ValueError, match="signs"):
        embed_watermark(frame, signs.astype(np.int16), p)
    with pytest.raises(ValueError, match="strength"):
        block_pattern(360, 640, grid, COEFS, 0.0)
    with pytest.raises(ValueError, match="coefficients"):
        block_pattern(360, 640, grid, ((0, 8),), 1.0)
