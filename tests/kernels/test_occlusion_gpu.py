"""The occlusion mask's GPU ops against their NumPy references (run with `pytest -m gpu`).

Fresh random inputs every run, outputs poisoned before each launch, every element compared.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np
import pytest

from swapstream.kernels.occlusion import (canvas_sample, clean_and_average, clean_occluder, ema_update,
                                          occluder_part, occluder_score, visible_region)

from .test_occlusion_cpu import part_inputs, random_model, random_similarity

pytestmark = pytest.mark.gpu


def test_occluder_score_matches_reference(cp: ModuleType) -> None:
    rng = np.random.default_rng()
    for shape in ((160, 160), (37, 211), (1, 1)):
        patch = rng.integers(0, 256, shape + (3,), dtype=np.uint8)
        allow = rng.uniform(0, 1, shape).astype(np.float32)
        pick = rng.random(shape)
        allow[pick < 0.2] = 0.0
        allow[pick > 0.8] = 1.0
        w, m = random_model(rng)
        lo = float(rng.uniform(1.5, 4.0))
        hi = lo + float(rng.uniform(0.5, 4.0))
        ref = np.full(shape, -3.0, np.float32)
        occluder_score(patch, allow, w, m, lo, hi, ref)
        out = cp.full(shape, cp.nan, cp.float32)  # poison: every element must be written
        occluder_score(cp.asarray(patch), cp.asarray(allow), w, m, lo, hi, out)
        got = out.get()
        # The kernel rounds every float32 product and sum in the reference's order (no FMA
        # contraction) and sqrt is correctly rounded on both: the same bits.
        np.testing.assert_array_equal(got, ref)
        if shape == (160, 160):  # the ramp's both ends and its slope were all exercised
            assert (ref == 0).any() and (ref == 1).any() and ((ref > 0) & (ref < 1)).any()


def test_clean_occluder_matches_reference(cp: ModuleType) -> None:
    rng = np.random.default_rng()
    score = rng.uniform(0, 1, (160, 160)).astype(np.float32)
    score[rng.random((160, 160)) < 0.5] = 0.0
    ref = clean_occluder(score, 1, 0.8, np.full_like(score, np.nan))
    out = cp.full((160, 160), cp.nan, cp.float32)
    clean_occluder(cp.asarray(score), 1, 0.8, out)
    # Median and dilation are exact; the blur is the same generic float32 code in the same tap
    # order, which CuPy may compile with fused multiply-adds: a few ulps of values <= 1.
    np.testing.assert_allclose(out.get(), ref, atol=2e-6, rtol=0)


def test_ema_update_matches_reference(cp: ModuleType) -> None:
    rng = np.random.default_rng()
    state = rng.uniform(0, 1, (160, 160)).astype(np.float32)
    new = rng.uniform(0, 1, (160, 160)).astype(np.float32)
    ref = ema_update(state.copy(), new, 0.3)
    dev = cp.asarray(state)
    ema_update(dev, cp.asarray(new), 0.3)
    # One float32 subtract, multiply and add; an FMA contraction can differ by one ulp.
    np.testing.assert_allclose(dev.get(), ref, atol=1e-7, rtol=0)


def test_occluder_score_rejects_host_arrays(cp: ModuleType) -> None:
    with pytest.raises(ValueError, match="allow"):
        occluder_score(cp.zeros((4, 4, 3), cp.uint8), np.ones((4, 4), np.float32), np.eye(3),
                       np.zeros(3), 1.0, 2.0, cp.zeros((4, 4), cp.float32))


# -- the fused per-face ops: the same bits as their NumPy paths -----------------------------------

@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_canvas_sample_matches_reference(cp: ModuleType, k: int) -> None:
    rng = np.random.default_rng()
    frame = rng.integers(0, 256, (181, 243, 3), dtype=np.uint8)
    bw, bh = 200 // k, 170 // k
    x0, y0 = int(rng.integers(0, 243 - bw * k + 1)), int(rng.integers(0, 181 - bh * k + 1))
    # Canvas pixels land inside the blocks and (a few) beyond their edge, where the border repeats.
    a = random_similarity(rng, rng.uniform(0.3, 1.3), (bw / 2, bh / 2))
    a[:, 2] -= a[:, :2] @ np.array([30.0, 30.0])
    ref = canvas_sample(frame, (x0, y0), (bw, bh), k, a, np.full((60, 60, 3), 7, np.uint8))
    dev = cp.asarray(frame)
    for poison in (0, 255):   # every element written: two poisons, one answer
        out = cp.full((60, 60, 3), poison, cp.uint8)
        canvas_sample(dev, (x0, y0), (bw, bh), k, a, out)
        # The box sums are exact integers in float32, the division and every float of the warp
        # are rounded in the reference's order (double coordinates, float32 lerp): the same bits.
        np.testing.assert_array_equal(out.get(), ref)


def test_occluder_part_matches_reference(cp: ModuleType) -> None:
    patch, allow, score, weight, w, m = part_inputs(np.random.default_rng(), (160, 160), (37, 61))
    ref = occluder_part(patch, allow, w, m, 2.0, 5.0, weight, (83, 101), score.copy())
    out = cp.asarray(score)
    occluder_part(cp.asarray(patch), cp.asarray(allow), w, m, 2.0, 5.0, cp.asarray(weight), (83, 101), out)
    # Only the box is written, in place; each float32 operation in the reference's order.
    np.testing.assert_array_equal(out.get(), ref)


@pytest.mark.parametrize("fresh", [True, False])
def test_clean_and_average_matches_reference(cp: ModuleType, fresh: bool) -> None:
    rng = np.random.default_rng()
    score = rng.uniform(0, 1, (160, 160)).astype(np.float32)
    score[rng.random((160, 160)) < 0.5] = 0.0
    state = rng.uniform(0, 1, (160, 160)).astype(np.float32)
    ref = clean_and_average(score, 1, 0.8, state.copy(), 0.5, fresh)
    dev = cp.asarray(state) if not fresh else cp.full((160, 160), cp.nan, cp.float32)
    clean_and_average(cp.asarray(score), 1, 0.8, dev, 0.5, fresh)
    # Median and dilation select values; the blur's taps are the reference's float32 numbers,
    # summed in its order without contraction; the average likewise: the same bits.
    np.testing.assert_array_equal(dev.get(), ref)


def test_visible_region_matches_reference(cp: ModuleType) -> None:
    rng = np.random.default_rng()
    occ = rng.uniform(0, 1, (160, 160)).astype(np.float32)
    a = random_similarity(rng, rng.uniform(0.6, 0.8), (80.0, 80.0))   # corners >= 115 px out: past the canvas
    a[:, 2] -= a[:, :2] @ np.array([150.0, 120.0])   # the region reaches past the canvas
    ref = visible_region(occ, a, np.empty((240, 300), np.float32))
    out = cp.full((240, 300), cp.nan, cp.float32)
    visible_region(cp.asarray(occ), a, out)
    np.testing.assert_array_equal(out.get(), ref)
    assert (ref == 1.0).any() and (ref < 1.0).any()
