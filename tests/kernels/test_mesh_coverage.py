"""Coverage of the mesh rasteriser (kernels/mesh.py): every pixel centre inside a mesh is covered by
exactly one triangle (the top-left rule), the CPU fast path covers exactly the same pixels, and its
values agree with the reference's. Fresh random meshes every run."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.spatial import Delaunay

from swapstream.face.topology import closed_mesh_triangles, load_topology
from swapstream.kernels.mesh import mesh_coverage, rasterize_mesh, rasterize_mesh_fast
from swapstream.kernels.mask import fill_polygon


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng()


def transform(pts: np.ndarray, rng: np.random.Generator, *, snap: bool = False) -> np.ndarray:
    """A random rotation, scale and sub-pixel offset of `pts` (float64, unit-ish coordinates)."""
    a = rng.uniform(-math.pi, math.pi)
    s = rng.uniform(60, 220)
    r = np.array([[math.cos(a), -math.sin(a)], [math.sin(a), math.cos(a)]]) * s
    out = pts @ r.T + rng.uniform(0, 1, 2) + 150
    if snap:
        # Vertices on pixel centres and half-pixels: edges through many pixel centres, ties everywhere.
        out = np.round(out * 2) / 2
    return out.astype(np.float32)


def hull_distance(pts: np.ndarray, h: int, w: int) -> np.ndarray:
    """(h, w) signed distance-like value of each pixel centre to the convex hull of `pts`: the
    largest of the hull's half-plane distances (< 0 inside, > 0 outside), independent of the
    rasteriser."""
    from scipy.spatial import ConvexHull

    ys, xs = np.mgrid[0:h, 0:w]
    p = np.stack([xs.ravel(), ys.ravel()], axis=1).astype(np.float64)
    eq = ConvexHull(pts.astype(np.float64)).equations  # unit normal n, offset b: n.p + b <= 0 inside
    dist = (p @ eq[:, :2].T + eq[:, 2]).max(axis=1)
    return dist.reshape(h, w)


@pytest.mark.parametrize("snap", [False, True])
def test_random_triangulations_are_covered_exactly_once(rng: np.random.Generator, snap: bool) -> None:
    h = w = 400
    for _ in range(6):
        unit = rng.uniform(-1, 1, (int(rng.integers(20, 120)), 2))
        dst = transform(unit, rng, snap=snap)
        if snap:
            dst = np.unique(dst, axis=0)
        tri = Delaunay(dst.astype(np.float64))
        tris = tri.simplices.astype(np.int32)
        src = (dst * 0.7 + 5).astype(np.float32)    # same winding: nothing culled
        count = mesh_coverage(dst, src, tris, (0, 0), (h, w))
        d = hull_distance(dst, h, w)
        # Vertices are snapped to 1/256 px (each moves < 0.003 px), so the float hull is trusted only
        # 0.003 px away from its boundary. Holes: centres inside the union that nothing covers.
        assert (count[d < -0.003] != 1).sum() == 0
        assert count.max() == 1                     # no double cover anywhere
        assert (count[d > 0.003] == 0).all()        # nothing outside
        # The hull's own fan triangulation covers the very same pixels, on the hull boundary too
        # (collinear points on the hull are vertices of the Delaunay mesh but not of the fan, so
        # only a generic, unsnapped hull is compared).
        if not snap:
            from scipy.spatial import ConvexHull

            ring = ConvexHull(dst.astype(np.float64)).vertices
            fan = np.array([[ring[0], ring[i], ring[i + 1]] for i in range(1, len(ring) - 1)], np.int32)
            assert np.array_equal(mesh_coverage(dst, src, fan, (0, 0), (h, w)), count)


def _segment_distance(pts: np.ndarray, ring: np.ndarray) -> np.ndarray:
    """Distance of each point (P, 2) to the closed polyline `ring` (K, 2)."""
    a, b = ring, np.roll(ring, -1, axis=0)
    ab = b - a
    t = np.clip(((pts[:, None] - a[None]) * ab[None]).sum(-1) / (ab * ab).sum(-1)[None], 0, 1)
    near = a[None] + t[..., None] * ab[None]
    return np.sqrt(((pts[:, None] - near) ** 2).sum(-1)).min(axis=1)


def test_the_closed_face_mesh_is_covered_exactly_once(rng: np.random.Generator) -> None:
    """The swapper's own triangles (Face Mesh plus hole fans) on a real face, at random rotations,
    scales and sub-pixel offsets. Detected landmarks fold here and there (a few triangles wound the
    other way, lying over their neighbours), so the exact statement is the winding number: inside
    the face oval, (triangles of the majority winding) - (the others) covering a centre is exactly 1;
    wherever no reversed triangle lies, exactly one triangle covers it; outside, the winding is 0.
    (The rasteriser then keeps the forward ones when the source is frontal, and of those the nearest.)"""
    from swapstream.config import load_config
    from swapstream.demo import astronaut, grace_hopper
    from swapstream.face.analyser import FaceAnalyser
    from swapstream.face.topology import closed_mesh_points

    topo = load_topology()
    analyser = FaceAnalyser(load_config())
    try:
        lms = [analyser.analyse_image(img)[0].landmarks for img in (astronaut(), grace_hopper())]
    finally:
        analyser.close()
    tris = closed_mesh_triangles(topo)
    h = w = 420
    ys, xs = np.mgrid[0:h, 0:w]
    centres = np.stack([xs.ravel(), ys.ravel()], axis=1).astype(np.float64)
    for k in range(6):
        base = closed_mesh_points(lms[k % 2][:, :2], topo).astype(np.float64)
        base = (base - base.mean(axis=0)) / np.ptp(base, axis=0).max()
        dst = (transform(base, rng) + 60).astype(np.float32)
        # Windings as the rasteriser sees them: on vertices snapped to 1/256 px (a sliver can flip).
        d = np.rint(dst.astype(np.float64) * 256)[tris]
        area = ((d[:, 1, 0] - d[:, 0, 0]) * (d[:, 2, 1] - d[:, 0, 1])
                - (d[:, 1, 1] - d[:, 0, 1]) * (d[:, 2, 0] - d[:, 0, 0]))
        major = area > 0 if (area > 0).sum() > (area < 0).sum() else area < 0
        fwd = mesh_coverage(dst, dst, tris[major], (0, 0), (h, w))
        rev = mesh_coverage(dst, dst, tris[~major & (area != 0)], (0, 0), (h, w))
        oval = fill_polygon(dst[topo.face_oval], (0, 0), np.empty((h, w), np.float32)) > 0
        # The oval fill is computed in float, the mesh on vertices snapped to 1/256 px: centres within
        # 0.01 px of the outline may differ and are left out.
        clear = (_segment_distance(centres, dst[topo.face_oval].astype(np.float64)) > 0.01).reshape(h, w)
        assert oval.sum() > 2000
        wind = (fwd - rev)[oval & clear]
        assert (wind == 1).all(), f"winding {np.unique(wind, return_counts=True)}, {int(major.sum())} of {len(tris)} majority"
        assert (fwd[oval & clear & (rev == 0)] == 1).all()
        # Outside, folds over the outline cancel: the winding number is 0.
        assert ((fwd - rev)[~oval & clear] == 0).all()


def test_fast_path_equals_the_reference(rng: np.random.Generator) -> None:
    for k in range(6):
        dst = transform(rng.uniform(-1, 1, (80, 2)), rng, snap=k % 2 == 1)
        dst = np.unique(dst, axis=0)
        tris = Delaunay(dst.astype(np.float64)).simplices.astype(np.int32)
        # A source with folds (random jitter): some triangles flip and are culled, others overlap.
        src = (dst + rng.normal(0, 6, dst.shape)).astype(np.float32)
        src_tris = tris[rng.permutation(len(tris))]   # sampled triangles differ from drawn ones
        origin = (int(rng.integers(-20, 60)), int(rng.integers(-20, 60)))
        for cull in (True, False):
            ref = np.full((330, 350, 2), 9.0, np.float32)     # poisoned
            fast = np.full((330, 350, 2), -9.0, np.float32)
            rasterize_mesh(dst, src, tris, origin, ref, src_tris=src_tris, cull_backfaces=cull)
            rasterize_mesh_fast(dst, src, tris, origin, fast, src_tris=src_tris, cull_backfaces=cull)
            cov = np.isfinite(ref[..., 0])
            assert cov.sum() > 1000
            assert np.array_equal(cov, np.isfinite(fast[..., 0]))
            assert np.array_equal(cov, np.isfinite(ref[..., 1]))
            # One affine map per triangle in double instead of per-pixel weights: the same value
            # before the float32 rounding, so at most one float32 ulp at |x| < 1024 (6.1e-5).
            np.testing.assert_allclose(fast[cov], ref[cov], rtol=0, atol=1.3e-4)


def test_overlaps_go_to_the_highest_index_and_culling_follows_the_source_winding() -> None:
    dst = np.array([[0, 0], [40, 0], [0, 40], [5, 5], [35, 5], [5, 35]], np.float32)
    src = dst + np.float32(100)
    tris = np.array([[0, 1, 2], [3, 4, 5]], np.int32)
    for order in (tris, tris[::-1].copy()):
        out = np.zeros((45, 45, 2), np.float32)
        rasterize_mesh(dst, src, order, (0, 0), out)
        win = 1 if order[1, 0] == 3 else 0           # the second row wins the overlap
        inner = order[win]
        # Inside the small triangle the winner's map: identical here (same affine), so check coverage
        # counts instead, and that the highest index wins on a map that differs.
        assert np.isfinite(out[10, 10]).all() and inner is not None
    src2 = src.copy()
    src2[3:] += np.float32(50)                        # the inner triangle samples elsewhere
    out = np.zeros((45, 45, 2), np.float32)
    rasterize_mesh(dst, src2, tris, (0, 0), out)
    assert out[10, 10, 0] == pytest.approx(10 + 150, abs=1e-3)
    out2 = np.zeros((45, 45, 2), np.float32)
    rasterize_mesh(dst, src2, tris[::-1].copy(), (0, 0), out2)
    assert out2[10, 10, 0] == pytest.approx(10 + 100, abs=1e-3)
    # A triangle wound the other way in the source is culled, even when it samples another one.
    flipped = src.copy()
    flipped[[1, 2]] = flipped[[2, 1]]
    out3 = np.zeros((45, 45, 2), np.float32)
    rasterize_mesh(dst, flipped, tris[:1].copy(), (0, 0), out3, src_tris=tris[1:].copy())
    assert not np.isfinite(out3).any()
