"""The occlusion mask's GPU ops against their NumPy references (run with `pytest -m gpu`).

Fresh random inputs every run, outputs poisoned before each launch, every element compared.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np
import pytest

from swapstream.kernels.occlusion import clean_occluder, ema_update, occluder_score

from .test_occlusion_cpu import random_model

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
