"""The occlusion mask's NumPy references against direct float64 formulas and against OpenCV."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from swapstream.kernels.mask import gaussian_kernel
from swapstream.kernels.occlusion import clean_occluder, dilate, ema_update, median3, occluder_score


def random_model(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A whitening matrix (inverse Cholesky factor of a random SPD covariance) and a mean."""
    a = rng.normal(0, 10, (3, 3))
    cov = a @ a.T + np.eye(3) * 4.0
    w = np.linalg.inv(np.linalg.cholesky(cov))
    return w.astype(np.float32), rng.uniform(60, 200, 3).astype(np.float32)


def test_occluder_score_is_the_ramped_mahalanobis_distance() -> None:
    rng = np.random.default_rng()
    patch = rng.integers(0, 256, (37, 53, 3), dtype=np.uint8)
    allow = rng.uniform(0, 1, (37, 53)).astype(np.float32)
    w, m = random_model(rng)
    lo, hi = 2.5, 5.0
    out = np.full((37, 53), np.nan, np.float32)
    occluder_score(patch, allow, w, m, lo, hi, out)
    z = (patch.astype(np.float64) - m.astype(np.float64)) @ w.astype(np.float64).T
    d = np.sqrt((z * z).sum(axis=2))
    want = np.clip((d - lo) / (hi - lo), 0, 1) * allow
    # float32 against float64: d is good to ~1e-6 relative, and the ramp divides by hi - lo = 2.5.
    np.testing.assert_allclose(out, want, atol=2e-5, rtol=0)
    assert 0.0 < (out > 0).mean() < 1.0          # random colours land on both sides of the ramp


def test_occluder_score_validates_arguments() -> None:
    p = np.zeros((4, 4, 3), np.uint8)
    a = np.ones((4, 4), np.float32)
    o = np.empty((4, 4), np.float32)
    with pytest.raises(ValueError, match="patch"):
        occluder_score(p.astype(np.float32), a, np.eye(3), np.zeros(3), 1, 2, o)
    with pytest.raises(ValueError, match="allow"):
        occluder_score(p, a[:3], np.eye(3), np.zeros(3), 1, 2, o)
    with pytest.raises(ValueError, match="whiten"):
        occluder_score(p, a, np.eye(2), np.zeros(3), 1, 2, o)
    with pytest.raises(ValueError, match="lo < hi"):
        occluder_score(p, a, np.eye(3), np.zeros(3), 2, 2, o)


def test_median_and_dilation_match_opencv() -> None:
    rng = np.random.default_rng()
    src = rng.uniform(0, 1, (41, 67)).astype(np.float32)
    out = np.full_like(src, np.nan)
    # Both are order statistics of the same values: exact.
    np.testing.assert_array_equal(median3(src, out), cv2.medianBlur(src, 3))
    for r in (0, 1, 2):
        out = np.full_like(src, np.nan)
        np.testing.assert_array_equal(dilate(src, r, out),
                                      cv2.dilate(src, np.ones((2 * r + 1, 2 * r + 1), np.uint8)))


def test_clean_removes_specks_and_keeps_thin_lines() -> None:
    score = np.zeros((60, 60), np.float32)
    score[10, 10] = 1.0                       # a one-pixel speck (a pore, a highlight)
    score[30:32, 5:55] = 1.0                  # a two-pixel line (a glasses frame on the canvas)
    out = clean_occluder(score, 1, 0.8, np.full_like(score, np.nan))
    assert out[10, 10] < 1e-6
    # The dilation makes up for the blur (the swapper's sigma, 0.8): the line's centre keeps
    # 97.7% (taps -1..2 of the kernel over the 4-pixel dilated line).
    assert out[30:32, 10:50].min() > 0.97
    assert np.isfinite(out).all()


def test_clean_blur_has_the_mask_taps() -> None:
    rng = np.random.default_rng()
    score = (rng.uniform(0, 1, (50, 40)) > 0.7).astype(np.float32)
    out = clean_occluder(score, 1, 0.8, np.empty_like(score))
    k = gaussian_kernel(0.8)
    pre = cv2.dilate(cv2.medianBlur(score, 3), np.ones((3, 3), np.uint8))
    want = cv2.sepFilter2D(pre, -1, k, k, borderType=cv2.BORDER_REPLICATE)
    # Same taps, float32 sums in a different order: a few ulps of 1.
    np.testing.assert_allclose(out, want, atol=1e-6, rtol=0)


def test_ema_update() -> None:
    rng = np.random.default_rng()
    state = rng.uniform(0, 1, (8, 9)).astype(np.float32)
    new = rng.uniform(0, 1, (8, 9)).astype(np.float32)
    want = state + 0.25 * (new - state)
    ema_update(state, new, 0.25)
    np.testing.assert_allclose(state, want, atol=1e-7, rtol=0)  # float32 rounding of one step
    with pytest.raises(ValueError, match="alpha"):
        ema_update(state, new, 0.0)
