"""The GPU Gaussian blur (`cuda/blur.cu`) and bilinear resize (`cuda/resize.cu`) against their NumPy
references (run with `pytest -m gpu`).

Fresh random inputs every run, outputs poisoned before each launch, every element compared. Both
kernels round every float32 product and sum in the reference's order (no FMA contraction), so the
comparison is exact."""

from __future__ import annotations

from types import ModuleType

import numpy as np
import pytest

from swapstream.kernels.mask import feather, gaussian_blur
from swapstream.kernels.resize import resize_bilinear

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("sigma", [0.0, 0.8, 5.0, 12.5])
@pytest.mark.parametrize("shape", [(53, 71), (40, 37, 3), (128, 128, 4), (9, 300, 1), (1, 1)])
def test_gaussian_blur_matches_reference(cp: ModuleType, sigma: float, shape: tuple[int, ...]) -> None:
    src = np.random.default_rng().uniform(-1, 2, shape).astype(np.float32)
    ref = gaussian_blur(src, sigma, np.empty(shape, np.float32))
    out = cp.full(shape, cp.nan, cp.float32)
    scratch = cp.full(shape, cp.nan, cp.float32)
    gaussian_blur(cp.asarray(src), sigma, out, scratch)
    np.testing.assert_array_equal(out.get(), ref)


def test_gaussian_blur_in_place_and_strided(cp: ModuleType) -> None:
    """`out` the same array as `src` (occlusion's clean-up blurs in place), and a strided `out`."""
    src = np.random.default_rng().uniform(0, 1, (64, 80)).astype(np.float32)
    ref = gaussian_blur(src, 3.0, np.empty_like(src))
    a = cp.asarray(src)
    gaussian_blur(a, 3.0, a)
    np.testing.assert_array_equal(a.get(), ref)
    big = cp.full((64, 160), cp.nan, cp.float32)
    gaussian_blur(cp.asarray(src), 3.0, big[:, ::2])
    np.testing.assert_array_equal(big[:, ::2].get(), ref)
    assert bool(cp.isnan(big[:, 1::2]).all())  # nothing written beside the view


def test_feather_matches_reference(cp: ModuleType) -> None:
    hard = (np.random.default_rng().random((128, 128, 2)) > 0.4).astype(np.float32)
    ref = feather(hard, 5.0, np.empty_like(hard))
    out = cp.full(hard.shape, cp.nan, cp.float32)
    feather(cp.asarray(hard), 5.0, out)
    np.testing.assert_array_equal(out.get(), ref)


@pytest.mark.parametrize("n,h,w,c,size", [(1, 37, 37, 1, 16), (3, 128, 128, 3, 256), (2, 256, 256, 1, 128),
                                          (4, 128, 64, 2, 97), (1, 5, 7, 3, 512), (2, 512, 512, 3, 128)])
def test_resize_bilinear_matches_reference(cp: ModuleType, n: int, h: int, w: int, c: int, size: int) -> None:
    src = np.random.default_rng().uniform(0, 255, (n, h, w, c)).astype(np.float32)
    ref = resize_bilinear(src, size)
    got = resize_bilinear(cp.asarray(src), size)  # a fresh array; its pool memory was poisoned below
    np.testing.assert_array_equal(got.get(), ref)


@pytest.fixture(autouse=True)
def _poison_pool(cp: ModuleType) -> None:
    """Fill CuPy's pool with NaNs so that a fresh output array that a kernel leaves partly unwritten
    shows NaNs rather than a previous test's numbers."""
    junk = cp.full((1 << 24,), cp.nan, cp.float32)
    del junk
