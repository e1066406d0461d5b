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


def random_similarity(rng: np.random.Generator, scale: float, shift: tuple[float, float]) -> np.ndarray:
    """A 2x3 rotation by a random angle, scaled, moved to `shift` plus a random sub-pixel offset."""
    a = rng.uniform(-np.pi, np.pi)
    c, s = np.cos(a) * scale, np.sin(a) * scale
    return np.array([[c, -s, shift[0] + rng.uniform(0, 1)], [s, c, shift[1] + rng.uniform(0, 1)]])


def part_inputs(rng: np.random.Generator, size: tuple[int, int], box: tuple[int, int]) -> tuple[np.ndarray, ...]:
    """Random inputs of `occluder_part`: patch, allow, score (size), weight (box), whiten, mean."""
    patch = rng.integers(0, 256, size + (3,), dtype=np.uint8)
    allow = rng.uniform(0, 1, size).astype(np.float32)
    score = rng.uniform(0, 1, size).astype(np.float32)
    weight = rng.uniform(0, 1, box).astype(np.float32)
    w, m = random_model(rng)
    return patch, allow, score, weight, np.ascontiguousarray(w, np.float32), np.ascontiguousarray(m, np.float32)


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


# -- the fused GPU ops' NumPy paths (their kernels: test_occlusion_gpu.py) -------------------------

def test_canvas_sample_is_a_box_average_then_a_warp() -> None:
    """Against OpenCV: INTER_AREA at an integer factor is the box average, and the warp agrees
    with cv2.warpAffine up to its 5-bit interpolation weights (1 level)."""
    from swapstream.kernels.occlusion import canvas_sample

    rng = np.random.default_rng()
    small = rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)
    frame = cv2.resize(small, (24 * 8, 20 * 8), interpolation=cv2.INTER_CUBIC)
    ang, s = rng.uniform(-0.5, 0.5), rng.uniform(0.3, 0.9)
    a = np.array([[s * np.cos(ang), -s * np.sin(ang), 3.0], [s * np.sin(ang), s * np.cos(ang), 2.0]])
    for k in (1, 3):
        out = np.full((40, 40, 3), 77, np.uint8)
        canvas_sample(frame, (6, 9), (40 // k + 10, 40 // k + 8), k, a, out)
        crop = frame[9:9 + (40 // k + 8) * k, 6:6 + (40 // k + 10) * k]
        box = cv2.resize(crop, (40 // k + 10, 40 // k + 8), interpolation=cv2.INTER_AREA)
        want = cv2.warpAffine(box, a, (40, 40), flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
                              borderMode=cv2.BORDER_REPLICATE)
        assert np.abs(out.astype(int) - want).max() <= 1


def test_fused_ops_validate_arguments() -> None:
    from swapstream.kernels.occlusion import canvas_sample, clean_and_average, occluder_part, visible_region

    f = np.zeros((40, 50, 3), np.uint8)
    with pytest.raises(ValueError, match="do not fit"):
        canvas_sample(f, (35, 0), (10, 10), 2, np.eye(2, 3), np.empty((8, 8, 3), np.uint8))
    with pytest.raises(ValueError, match="2x3"):
        canvas_sample(f, (0, 0), (5, 5), 1, np.eye(3), np.empty((8, 8, 3), np.uint8))
    s = np.zeros((16, 16), np.float32)
    w, m = np.eye(3, dtype=np.float32), np.zeros(3, np.float32)
    with pytest.raises(ValueError, match="not inside"):
        occluder_part(np.zeros((16, 16, 3), np.uint8), s.copy(), w, m, 1.0, 2.0, np.ones((8, 8), np.float32),
                      (10, 0), s)
    with pytest.raises(ValueError, match="alpha"):
        clean_and_average(s, 1, 0.8, s.copy(), 0.0, False)
    with pytest.raises(ValueError, match="2x3"):
        visible_region(s, np.eye(2), np.empty((4, 4), np.float32))


def test_occluder_part_only_lowers_and_only_in_its_box() -> None:
    from swapstream.kernels.occlusion import occluder_part

    patch, allow, score, weight, w, m = part_inputs(np.random.default_rng(), (30, 40), (10, 12))
    before = score.copy()
    occluder_part(patch, allow, w, m, 2.0, 5.0, weight, (7, 11), score)
    box = (slice(11, 21), slice(7, 19))
    outside = np.ones(score.shape, bool)
    outside[box] = False
    assert np.array_equal(score[outside], before[outside])
    sub = occluder_score(patch, allow, w, m, 2.0, 5.0, np.empty((30, 40), np.float32))[box]
    want = before[box] - weight * np.maximum(before[box] - sub, 0)
    np.testing.assert_allclose(score[box], want, atol=1e-6, rtol=0)   # float32 vs float64 order
    assert (score <= before).all() and (score[box] < before[box]).any()


def test_clean_and_average_is_clean_then_ema() -> None:
    from swapstream.kernels.occlusion import clean_and_average

    rng = np.random.default_rng()
    score = rng.uniform(0, 1, (24, 30)).astype(np.float32)
    cleaned = clean_occluder(score, 1, 0.8, np.empty_like(score))
    state = np.full_like(score, np.nan)
    assert np.array_equal(clean_and_average(score, 1, 0.8, state, 0.5, True), cleaned)
    old = rng.uniform(0, 1, score.shape).astype(np.float32)
    got = clean_and_average(score, 1, 0.8, old.copy(), 0.25, False)
    assert np.array_equal(got, ema_update(old.copy(), cleaned, 0.25))


def test_visible_region_is_one_minus_the_warped_mask() -> None:
    from swapstream.kernels.occlusion import visible_region

    rng = np.random.default_rng()
    occ = rng.uniform(0, 1, (32, 32)).astype(np.float32)
    a = np.array([[0.5, 0.0, -3.0], [0.0, 0.5, 4.0]])   # part of the region is off the canvas
    out = visible_region(occ, a, np.full((60, 80), np.nan, np.float32))
    want = 1.0 - cv2.warpAffine(occ, a, (80, 60), flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
                                borderMode=cv2.BORDER_CONSTANT, borderValue=0.0)
    # OpenCV's 5-bit interpolation weights against exact bilinear weights: ~1/64 of a unit step.
    np.testing.assert_allclose(out, want, atol=0.02, rtol=0)
    assert (out[:, :5] == 1.0).all()            # off the canvas (x <= -1): nothing occluded


def test_blur_taps_are_exact_literals() -> None:
    from swapstream.kernels.mask import taps_defines

    d = taps_defines(0.8, "OCCL")
    taps = [float.fromhex(t.replace("(float)", "").strip()) for t in d["OCCL_TAPS"].strip("{}").split(",")]
    k = gaussian_kernel(0.8)
    assert int(d["OCCL_RADIUS"]) == (k.size - 1) // 2
    assert np.array_equal(np.array(taps, np.float32), k) and np.array_equal(np.array(taps), k.astype(np.float64))
