"""The face analysis' CPU product path (kernels/warp_cpu.py) against the NumPy references in
kernels/warp.py, on fresh random inputs, outputs poisoned first, every element compared."""

from __future__ import annotations

import numpy as np
import pytest

from swapstream.kernels.warp import box_downsample, warp_affine
from swapstream.kernels.warp_cpu import box_downsample_fast, warp_affine_fast


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng()


def smooth_image(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """uint8 image with structure at several scales plus a little noise (pure noise would make every
    1/32-pixel position error a full-range one)."""
    import cv2

    small = rng.uniform(0, 255, (h // 8 + 2, w // 8 + 2, 3)).astype(np.float32)
    big = cv2.resize(small, (w, h), interpolation=cv2.INTER_CUBIC)
    return np.clip(big + rng.normal(0, 4, big.shape), 0, 255).astype(np.uint8)


def random_affine(rng: np.random.Generator, scale: float, shift: tuple[float, float]) -> np.ndarray:
    a = rng.uniform(-np.pi, np.pi)
    s = scale * rng.uniform(0.8, 1.25)
    return np.array([[s * np.cos(a), -s * np.sin(a), shift[0] + rng.uniform(-20, 20)],
                     [s * np.sin(a), s * np.cos(a), shift[1] + rng.uniform(-20, 20)]])


@pytest.mark.parametrize("border", ["replicate", "constant"])
@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
def test_warp_affine_fast(rng: np.random.Generator, border: str, dtype: type) -> None:
    src = smooth_image(rng, 180, 320).astype(dtype)
    # Local neighbour differences bound the error the 1/32-pixel positions can make (docstring).
    grad = max(np.abs(np.diff(src.astype(np.float64), axis=0)).max(),
               np.abs(np.diff(src.astype(np.float64), axis=1)).max())
    for _ in range(4):
        # Crops inside the frame, reaching past its edges, and wholly outside it.
        m = random_affine(rng, rng.uniform(0.3, 3.0), (rng.uniform(-100, 400), rng.uniform(-60, 240)))
        ref = np.full((97, 111, 3), 7, dtype)
        out = np.full((97, 111, 3), 200, dtype)
        warp_affine(src, m, ref, border=border, fill=3.0)  # type: ignore[arg-type]
        warp_affine_fast(src, m, out, border=border, fill=3.0)  # type: ignore[arg-type]
        diff = np.abs(ref.astype(np.float64) - out.astype(np.float64))
        bound = 2 * grad / 64 + (1.0 if dtype == np.uint8 else 1e-3)
        assert diff.max() <= bound, (diff.max(), bound)
        assert diff.mean() < 0.05


def test_warp_affine_fast_one_channel_and_strided_out(rng: np.random.Generator) -> None:
    src = smooth_image(rng, 64, 80)[..., :1].astype(np.float32)
    m = np.array([[0.7, 0.1, 5.2], [-0.1, 0.7, 3.9]])
    ref = warp_affine(src, m, np.zeros((40, 50, 1), np.float32), border="constant")
    big = np.full((50, 60, 1), -1.0, np.float32)
    out = warp_affine_fast(src, m, big[:40, :50], border="constant")
    assert np.abs(out - ref).max() < 0.05
    assert (big[40:] == -1).all() and (big[:, 50:] == -1).all()  # only the view is written


@pytest.mark.parametrize("factor", [1, 2, 5, 7])
def test_box_downsample_fast(rng: np.random.Generator, factor: int) -> None:
    src = rng.integers(0, 256, (123, 157, 3), dtype=np.uint8)
    shape = (123 // factor, 157 // factor, 3)
    ref = box_downsample(src, factor, np.full(shape, 9, np.uint8))
    out = box_downsample_fast(src, factor, np.full(shape, 250, np.uint8))
    diff = np.abs(ref.astype(int) - out.astype(int))
    # Equal but for a mean ending in exactly .5 (OpenCV rounds it up, the reference to even).
    assert diff.max() <= 1
    sums = src[: shape[0] * factor, : shape[1] * factor].reshape(
        shape[0], factor, shape[1], factor, 3).sum(axis=(1, 3)).astype(np.int64)
    tie = (2 * sums) % (factor * factor) == 0
    tie &= (2 * sums // (factor * factor)) % 2 == 1
    assert np.array_equal(ref[~tie], out[~tie])
