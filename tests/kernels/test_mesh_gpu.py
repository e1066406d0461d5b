"""CUDA mesh rasterisation and remap against their NumPy references (run with `pytest -m gpu`).

Fresh random inputs every run, outputs poisoned before each launch, every element compared.
"""

from __future__ import annotations

from types import ModuleType

import cv2
import numpy as np
import pytest

from swapstream.kernels.mesh import rasterize_mesh
from swapstream.kernels.warp import remap_bilinear, warp_affine

from .test_cpu_reference import grid_mesh, random_affine

pytestmark = pytest.mark.gpu


def test_rasterize_mesh_matches_reference(cp: ModuleType) -> None:
    rng = np.random.default_rng()
    for k in range(4):
        n = int(rng.integers(4, 12))
        dst, tris = grid_mesh(*rng.uniform(0, 30, 2), *rng.uniform(150, 300, 2), n)
        if k % 2:
            dst = np.round(dst * 2) / 2                # vertices on half pixels: ties on edges
        dst += rng.normal(0, 2.0, dst.shape).astype(np.float32) * (k < 2)
        dst = dst.astype(np.float32)
        m = random_affine(rng)
        src = (dst.astype(np.float64) @ m[:, :2].T + m[:, 2]).astype(np.float32)
        src += rng.normal(0, 4.0, src.shape).astype(np.float32)  # folds: culled and overlapping
        src_tris = tris[rng.permutation(len(tris))]
        origin = (int(rng.integers(-5, 10)), int(rng.integers(-5, 10)))
        ref = np.full((260, 280, 2), -7.0, np.float32)
        rasterize_mesh(dst, src, tris, origin, ref, src_tris=src_tris)
        out = cp.full((260, 280, 2), -7.0, cp.float32)  # poison: the op must write NaN or a value
        rasterize_mesh(cp.asarray(dst), cp.asarray(src), cp.asarray(tris), origin, out,
                       src_tris=cp.asarray(src_tris))
        got = out.get()
        # Coverage is exact integer arithmetic on the same snapped vertices, and overlaps go to the
        # highest index (atomicMax) in both: identical.
        assert np.array_equal(np.isnan(got), np.isnan(ref))
        cov = ~np.isnan(ref)
        assert cov.sum() > 1000
        # The same double operations without FMA contraction, then one rounding to float32: equal.
        assert np.array_equal(got[cov], ref[cov])


def test_rasterize_mesh_culls_like_reference(cp: ModuleType) -> None:
    dst = np.array([[0, 0], [40, 0], [0, 40], [40, 40]], np.float32)
    src = np.array([[0, 0], [0, 40], [40, 0], [40, 40]], np.float32)  # mirrored winding
    tris = np.array([[0, 1, 2], [1, 3, 2]], np.int32)
    for cull in (True, False):
        ref = np.zeros((45, 45, 2), np.float32)
        rasterize_mesh(dst, src, tris, (0, 0), ref, cull_backfaces=cull)
        out = cp.full((45, 45, 2), 3.0, cp.float32)
        rasterize_mesh(cp.asarray(dst), cp.asarray(src), cp.asarray(tris), (0, 0), out,
                       cull_backfaces=cull)
        assert np.array_equal(np.isnan(out.get()), np.isnan(ref))


def test_remap_bilinear_matches_reference(cp: ModuleType) -> None:
    rng = np.random.default_rng()
    src = rng.integers(0, 256, (123, 157, 3), dtype=np.uint8)
    mp = rng.uniform(-10, 170, (90, 110, 2)).astype(np.float32)
    mp[rng.random((90, 110)) < 0.1] = np.nan
    ref = np.full((90, 110, 3), 55.0, np.float32)
    remap_bilinear(src, mp, ref, fill=-3.0)
    out = cp.full((90, 110, 3), np.nan, cp.float32)
    remap_bilinear(cp.asarray(src), cp.asarray(mp), out, fill=-3.0)
    # Same float32 operations in the same order (no FMA contraction in the kernel): equal to the
    # last bit in practice; 1e-3 levels allows for one ulp of 255 in case a compiler reorders.
    np.testing.assert_allclose(out.get(), ref, atol=1e-3, rtol=0)


def test_warp_affine_on_gpu_matches_opencv(cp: ModuleType) -> None:
    rng = np.random.default_rng()
    src = rng.integers(0, 256, (200, 260, 3), dtype=np.uint8)
    m = random_affine(rng)
    out = cp.full((150, 170, 3), 0xAB, cp.uint8)
    warp_affine(cp.asarray(src), m, out, border="replicate")
    ref = cv2.warpAffine(src, m, (170, 150), flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
                         borderMode=cv2.BORDER_REPLICATE)
    diff = np.abs(out.get().astype(int) - ref.astype(int))
    # OpenCV quantises bilinear weights to 1/32: up to 2 * 255/64 ~ 8 levels on white noise.
    assert diff.max() <= 9 and diff.mean() < 1.0


def test_gpu_ops_reject_host_arrays(cp: ModuleType) -> None:
    with pytest.raises(ValueError, match="out_map"):
        rasterize_mesh(cp.zeros((3, 2), cp.float32), cp.zeros((3, 2), cp.float32),
                       cp.zeros((1, 3), cp.int32), (0, 0), cp.zeros((4, 4, 3), cp.float32))
    with pytest.raises(ValueError, match="map_xy"):
        remap_bilinear(cp.zeros((4, 4, 3), cp.uint8), cp.zeros((2, 2, 2), cp.float64),
                       cp.zeros((2, 2, 3), cp.float32))
