"""CUDA mesh-swap steps (mask, colour statistics, transfer + blend) against their NumPy references."""

from __future__ import annotations

from types import ModuleType

import numpy as np
import pytest

from swapstream.kernels.meshswap import (STATS_LEN, chroma_weight, color_stats, mesh_mask, smooth_stats,
                                         transfer_blend)

pytestmark = pytest.mark.gpu


def star(rng: np.random.Generator, cx: float, cy: float, r0: float, r1: float, n: int) -> np.ndarray:
    ang = np.sort(rng.uniform(0, 2 * np.pi, n))
    rad = rng.uniform(r0, r1, n)
    return np.stack([cx + rad * np.cos(ang), cy + rad * np.sin(ang)], 1).astype(np.float32)


def test_mesh_mask_matches_reference(cp: ModuleType) -> None:
    rng = np.random.default_rng()
    h, w, origin = 180, 160, (37, 21)
    outline = star(rng, 37 + 80, 21 + 90, 55, 75, 36)
    keeps = [star(rng, 37 + 80, 21 + 120, 8, 14, 20), star(rng, 37 + 55, 21 + 70, 5, 9, 16)]
    mp = rng.uniform(0, 300, (h, w, 2)).astype(np.float32)
    mp[rng.random((h, w)) < 0.05] = np.nan
    for keep_list in (keeps, []):
        keep = np.concatenate(keep_list) if keep_list else np.zeros((0, 2), np.float32)
        counts = tuple(len(k) for k in keep_list)
        ref = np.full((h, w), -1.0, np.float32)
        mesh_mask(outline, keep, counts, mp, origin, 3.7, 1.9, ref)
        out = cp.full((h, w), np.nan, cp.float32)  # poison
        mesh_mask(cp.asarray(outline), cp.asarray(keep), counts, cp.asarray(mp), origin, 3.7, 1.9, out)
        # Polygon tests run in double on both sides; the blurs add the same float32 products in
        # the same order with no FMA contraction, so the masks agree to the last bit. 1e-6 allows
        # for one ulp should a compiler ever reorder.
        np.testing.assert_allclose(out.get(), ref, atol=1e-6, rtol=0)
        assert 0.0 < ref.mean() < 1.0


@pytest.mark.parametrize("space", ["lab", "rgb"])
def test_color_stats_matches_reference(cp: ModuleType, space: str) -> None:
    rng = np.random.default_rng()
    frame = rng.integers(0, 256, (120, 150, 3), dtype=np.uint8)
    warped = rng.uniform(0, 255, (70, 90, 3)).astype(np.float32)
    mask = rng.uniform(0, 1, (70, 90)).astype(np.float32)
    ref = np.full(STATS_LEN, np.nan)
    color_stats(warped, frame, mask, (40, 33), space, ref)
    out = cp.full(STATS_LEN, np.nan, cp.float64)
    color_stats(cp.asarray(warped), cp.asarray(frame), cp.asarray(mask), (40, 33), space, out)
    # Double-precision sums in another order, of float32 values whose L*a*b* conversion (powf,
    # cbrtf) may differ from NumPy's by an ulp: relative 1e-6 on sums of ~3000 terms.
    np.testing.assert_allclose(out.get(), ref, rtol=1e-6)
    assert ref[0] > 1000


@pytest.mark.parametrize("grey", [False, True])
@pytest.mark.parametrize("space", ["lab", "rgb", "none"])
def test_transfer_blend_matches_reference(cp: ModuleType, space: str, grey: bool) -> None:
    rng = np.random.default_rng()
    frame = rng.integers(0, 256, (120, 150, 3), dtype=np.uint8)
    warped = rng.uniform(0, 255, (70, 90, 3)).astype(np.float32)
    if grey:
        # A greyscale source, in part: chroma_weight strictly between 0 and 1 or 1, so the kernel's
        # per-pixel target chroma mix runs.
        warped[..., 1:] = warped[..., :1] + rng.uniform(-3, 3, (70, 90, 2)).astype(np.float32)
    mask = rng.uniform(0, 1, (70, 90)).astype(np.float32)
    mask[rng.random((70, 90)) < 0.3] = 0.0
    stats = np.zeros(STATS_LEN)
    if space != "none":
        color_stats(warped, frame, mask, (40, 33), space, stats)
        stats[7:10] += rng.uniform(-20, 20, 3) * stats[0]  # move the target mean
        if space == "lab":
            assert (chroma_weight(stats) > 0) == grey
    ref = frame.copy()
    transfer_blend(ref, warped, mask, stats if space != "none" else None, (40, 33), space, 0.8)
    out = cp.asarray(frame)
    transfer_blend(out, cp.asarray(warped), cp.asarray(mask),
                   cp.asarray(stats) if space != "none" else None, (40, 33), space, 0.8)
    got = out.get()
    diff = np.abs(got.astype(int) - ref.astype(int))
    # Whole frame compared: nothing outside the region or under mask 0 may change. Inside, powf
    # and cbrtf on the GPU differ from NumPy's by an ulp, which can move a value across a .5
    # rounding boundary: at most 1 level, and rarely.
    assert diff.max() <= 1
    assert (diff > 0).mean() < 0.01
    untouched = np.ones(frame.shape[:2], bool)
    untouched[33:103, 40:130] = mask == 0
    assert np.array_equal(got[untouched], frame[untouched])


def test_smooth_stats_on_the_gpu_matches_numpy(cp: ModuleType) -> None:
    rng = np.random.default_rng()
    frames = [np.concatenate([[rng.integers(0, 3) * 500.0], rng.uniform(1, 9e4, 12)]) for _ in range(6)]
    ref = np.zeros(STATS_LEN)
    out = cp.full(STATS_LEN, 0.0)
    for f in frames:
        smooth_stats(f, ref, 0.25)
        smooth_stats(cp.asarray(f), out, 0.25)
        # The same double-precision element-wise operations: equal to rounding.
        np.testing.assert_allclose(out.get(), ref, rtol=1e-14, atol=0)
