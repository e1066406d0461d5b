"""The NumPy references in swapstream.kernels against OpenCV and against direct formulas.

Inputs are fresh random data for every test (never zeros) and outputs are poisoned before each call,
so an element the op forgot to write shows up as a failure.
"""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from swapstream.kernels.blend import blend_into
from swapstream.kernels.color import (color_transfer, lab_to_rgb, masked_mean_std, rgb_to_lab)
from swapstream.kernels.mask import feather, fill_polygon, gaussian_blur, gaussian_kernel
from swapstream.kernels.mesh import rasterize_mesh
from swapstream.kernels.warp import box_downsample, invert_affine, remap_bilinear, warp_affine


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng()


def smooth_image(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """Random but locally smooth content, so that interpolation differences stay small."""
    small = rng.integers(0, 256, (h // 8 + 2, w // 8 + 2, 3), dtype=np.uint8)
    return cv2.resize(small, (w, h), interpolation=cv2.INTER_CUBIC)


def random_affine(rng: np.random.Generator) -> np.ndarray:
    a = rng.uniform(-0.6, 0.6)
    s = rng.uniform(0.6, 1.6)
    return np.array([[s * np.cos(a), -s * np.sin(a), rng.uniform(-20, 40)],
                     [s * np.sin(a), s * np.cos(a), rng.uniform(-20, 40)]])


def test_warp_affine_matches_opencv(rng: np.random.Generator) -> None:
    src = rng.integers(0, 256, (97, 131, 3), dtype=np.uint8)
    for _ in range(3):
        m = random_affine(rng)
        out = np.full((80, 90, 3), 77, dtype=np.uint8)
        warp_affine(src, m, out, border="replicate")
        ref = cv2.warpAffine(src, m, (90, 80), flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
                             borderMode=cv2.BORDER_REPLICATE)
        diff = np.abs(out.astype(int) - ref.astype(int))
        # OpenCV quantises each bilinear weight to 1/32 (INTER_BITS=5): on white noise, where
        # neighbours differ by up to 255, that moves a result by up to 2 * 255/64 ~ 8 levels.
        assert diff.max() <= 9
        assert diff.mean() < 1.0


def test_warp_affine_exact_bilinear_and_constant_border(rng: np.random.Generator) -> None:
    src = rng.uniform(0, 255, (40, 50, 2)).astype(np.float32)
    m = random_affine(rng)
    out = np.full((30, 35, 2), np.nan, dtype=np.float32)
    warp_affine(src, m, out, border="constant", fill=-5.0)
    # Direct float64 evaluation of the bilinear formula at every output pixel.
    for y in range(30):
        for x in range(35):
            sx = m[0, 0] * x + m[0, 1] * y + m[0, 2]
            sy = m[1, 0] * x + m[1, 1] * y + m[1, 2]
            x0, y0 = int(np.floor(sx)), int(np.floor(sy))
            fx, fy = sx - x0, sy - y0
            def px(yy: int, xx: int) -> np.ndarray:
                if 0 <= yy < 40 and 0 <= xx < 50:
                    return src[yy, xx].astype(np.float64)
                return np.full(2, -5.0)
            v = ((px(y0, x0) * (1 - fx) + px(y0, x0 + 1) * fx) * (1 - fy)
                 + (px(y0 + 1, x0) * (1 - fx) + px(y0 + 1, x0 + 1) * fx) * fy)
            # float32 arithmetic on values up to 255: a few ulps of 255 is ~1e-4.
            np.testing.assert_allclose(out[y, x], v, atol=2e-3)


def test_invert_affine_round_trip(rng: np.random.Generator) -> None:
    m = random_affine(rng)
    inv = invert_affine(m)
    p = rng.uniform(-100, 100, (10, 2))
    q = p @ m[:, :2].T + m[:, 2]
    np.testing.assert_allclose(q @ inv[:, :2].T + inv[:, 2], p, atol=1e-9)


def test_remap_bilinear_nan_is_fill_and_values_match_warp(rng: np.random.Generator) -> None:
    src = smooth_image(rng, 60, 70)
    m = random_affine(rng)
    gy, gx = np.mgrid[0:40, 0:45].astype(np.float64)
    mp = np.stack([m[0, 0] * gx + m[0, 1] * gy + m[0, 2], m[1, 0] * gx + m[1, 1] * gy + m[1, 2]],
                  axis=-1).astype(np.float32)
    holes = rng.random((40, 45)) < 0.2
    mp[holes] = np.nan
    out = np.full((40, 45, 3), 123.0, dtype=np.float32)
    remap_bilinear(src, mp, out, fill=-1.0)
    ref = np.empty((40, 45, 3), dtype=np.float32)
    warp_affine(src, m, ref, border="replicate")
    assert np.all(out[holes] == -1.0)
    # The map is stored in float32: coordinates lose ~1e-5 px, i.e. < 0.01 level on 255 steps.
    np.testing.assert_allclose(out[~holes], ref[~holes], atol=0.01)


def test_box_downsample_matches_area_resize(rng: np.random.Generator) -> None:
    src = rng.integers(0, 256, (64, 96, 3), dtype=np.uint8)
    out = np.full((16, 24, 3), 1, dtype=np.uint8)
    box_downsample(src, 4, out)
    ref = cv2.resize(src, (24, 16), interpolation=cv2.INTER_AREA)
    # Both average 16 pixels exactly; they may round a .5 differently.
    assert np.abs(out.astype(int) - ref.astype(int)).max() <= 1


def grid_mesh(x0: float, y0: float, x1: float, y1: float, n: int) -> tuple[np.ndarray, np.ndarray]:
    xs, ys = np.meshgrid(np.linspace(x0, x1, n), np.linspace(y0, y1, n))
    pts = np.stack([xs.ravel(), ys.ravel()], axis=1).astype(np.float32)
    tris = []
    for r in range(n - 1):
        for c in range(n - 1):
            a, b, d, e = r * n + c, r * n + c + 1, (r + 1) * n + c, (r + 1) * n + c + 1
            tris += [[a, b, e], [a, e, d]]
    return pts, np.asarray(tris, dtype=np.int32)


def test_rasterize_mesh_is_the_piecewise_affine_map(rng: np.random.Generator) -> None:
    dst, tris = grid_mesh(5.3, 4.7, 60.2, 50.9, 7)
    m = random_affine(rng)
    src = (dst.astype(np.float64) @ m[:, :2].T + m[:, 2]).astype(np.float32)
    out = np.full((60, 70, 2), -123.0, dtype=np.float32)
    rasterize_mesh(dst, src, tris, (2, 1), out)
    ys, xs = np.mgrid[0:60, 0:70]
    fx, fy = xs + 2.0, ys + 1.0  # frame coordinates of each map pixel
    inside = (fx >= 5.3) & (fx <= 60.2) & (fy >= 4.7) & (fy <= 50.9)
    covered = np.isfinite(out[..., 0])
    # Every pixel centre inside the meshed rectangle is covered (no cracks), none outside.
    assert np.array_equal(covered, inside)
    exp_x = m[0, 0] * fx + m[0, 1] * fy + m[0, 2]
    exp_y = m[1, 0] * fx + m[1, 1] * fy + m[1, 2]
    # One global affine seen through many triangles. Target vertices are snapped to 1/256 px (at
    # most 1/512 px off in x and y), which the map's scale (<= 1.6) carries into the source:
    # 1.6 * sqrt(2) / 512 = 0.0044 px at most.
    np.testing.assert_allclose(out[..., 0][inside], exp_x[inside], atol=4.5e-3)
    np.testing.assert_allclose(out[..., 1][inside], exp_y[inside], atol=4.5e-3)


def test_rasterize_mesh_culls_flipped_triangles() -> None:
    dst = np.array([[0, 0], [20, 0], [0, 20]], dtype=np.float32)
    src = np.array([[0, 0], [0, 20], [20, 0]], dtype=np.float32)  # mirrored: opposite winding
    tris = np.array([[0, 1, 2]], dtype=np.int32)
    out = np.zeros((25, 25, 2), dtype=np.float32)
    rasterize_mesh(dst, src, tris, (0, 0), out)
    assert not np.isfinite(out).any()
    rasterize_mesh(dst, src, tris, (0, 0), out, cull_backfaces=False)
    assert np.isfinite(out[..., 0]).sum() > 150


def test_fill_polygon_matches_opencv_away_from_edges(rng: np.random.Generator) -> None:
    ang = np.sort(rng.uniform(0, 2 * np.pi, 12))
    rad = rng.uniform(15, 30, 12)
    poly = np.stack([40 + rad * np.cos(ang), 35 + rad * np.sin(ang)], axis=1).astype(np.float32)
    out = np.full((70, 80), 7.0, dtype=np.float32)
    fill_polygon(poly, (3, 2), out)
    ref = np.zeros((70, 80), dtype=np.uint8)
    shift = 8  # cv2 fixed-point vertices, 1/256 px
    pts = np.round((poly - np.array([3, 2])) * (1 << shift)).astype(np.int32)
    cv2.fillPoly(ref, [pts], 1, lineType=cv2.LINE_8, shift=shift)
    # OpenCV also paints the pixels its edge lines pass through, ours tests each pixel centre: they
    # may differ within about a pixel of the outline (thin spikes and notches included). Compare
    # the pixels whose centre is more than 1.5 px from every edge.
    ys, xs = np.mgrid[0:70, 0:80].astype(np.float64)
    p = (poly - np.array([3, 2])).astype(np.float64)
    a, b = p, np.roll(p, -1, axis=0)
    ab = b - a
    t = ((xs[..., None] - a[:, 0]) * ab[:, 0] + (ys[..., None] - a[:, 1]) * ab[:, 1]) / (ab ** 2).sum(1)
    t = np.clip(t, 0, 1)
    dist = np.hypot(xs[..., None] - (a[:, 0] + t * ab[:, 0]), ys[..., None] - (a[:, 1] + t * ab[:, 1]))
    sure = dist.min(axis=2) > 1.5
    assert sure.sum() > 2000
    assert np.array_equal(out[sure], ref[sure].astype(np.float32))
    assert set(np.unique(out)) <= {0.0, 1.0}


def test_gaussian_blur_matches_opencv(rng: np.random.Generator) -> None:
    img = rng.uniform(0, 1, (50, 61)).astype(np.float32)
    for sigma in (0.8, 2.5, 6.0):
        out = np.full_like(img, np.nan)
        gaussian_blur(img, sigma, out)
        k = gaussian_kernel(sigma)
        ref = cv2.sepFilter2D(img, -1, k, k, borderType=cv2.BORDER_REPLICATE)
        # Same taps, summed in a different order in float32: ~1e-7 relative.
        np.testing.assert_allclose(out, ref, atol=1e-5)


def test_feather_is_zero_outside_and_one_deep_inside(rng: np.random.Generator) -> None:
    hard = np.zeros((60, 60), dtype=np.float32)
    hard[10:50, 12:48] = 1.0
    out = np.full_like(hard, np.nan)
    feather(hard, 2.0, out)
    assert np.all(out[hard == 0] == 0.0)
    assert np.all(out[20:40, 22:38] > 0.999)
    assert out.min() >= 0 and out.max() <= 1


def test_lab_matches_opencv_and_round_trips(rng: np.random.Generator) -> None:
    rgb = rng.uniform(0, 255, (31, 29, 3)).astype(np.float32)
    lab = np.full_like(rgb, np.nan)
    rgb_to_lab(rgb, lab)
    ref = cv2.cvtColor(rgb / 255.0, cv2.COLOR_RGB2Lab)
    # OpenCV uses the same D65 matrix, but evaluates the sRGB curve and the cube root from
    # interpolated tables and returns a*, b* on a 1/64 grid: in dark colours that is off from the
    # exact formula by up to 0.52 units (largest seen over 200 random images), so allow 0.75.
    np.testing.assert_allclose(lab, ref, atol=0.75)
    assert np.abs(lab - ref).mean() < 0.1
    back = np.full_like(rgb, np.nan)
    lab_to_rgb(lab, back)
    # float32 through two non-linear transforms: ~1e-3 levels.
    np.testing.assert_allclose(back, rgb, atol=0.02)


def test_masked_stats_and_transfer(rng: np.random.Generator) -> None:
    img = rng.uniform(0, 100, (40, 40, 3)).astype(np.float32)
    mask = rng.uniform(0, 1, (40, 40)).astype(np.float32)
    mean, std = masked_mean_std(img, mask)
    sel = img[mask > 0.5].astype(np.float64)
    np.testing.assert_allclose(mean, sel.mean(0), rtol=1e-12)
    np.testing.assert_allclose(std, sel.std(0), rtol=1e-12)
    target = (np.array([10.0, 20.0, 30.0]), np.array([5.0, 6.0, 7.0]))
    out = np.full_like(img, np.nan)
    color_transfer(img, (mean, std), target, out)
    m2, s2 = masked_mean_std(out, mask)
    # float32 storage of values ~100: relative 1e-6.
    np.testing.assert_allclose(m2, target[0], atol=1e-3)
    np.testing.assert_allclose(s2, target[1], atol=1e-3)
    none = np.full_like(img, np.nan)
    color_transfer(img, (mean, std), target, none, strength=0.0)
    np.testing.assert_allclose(none, img, atol=1e-4)


def test_blend_into_touches_only_the_mask(rng: np.random.Generator) -> None:
    frame = rng.integers(0, 256, (50, 60, 3), dtype=np.uint8)
    before = frame.copy()
    fg = rng.uniform(0, 255, (30, 40, 3)).astype(np.float32)
    mask = rng.uniform(0, 1, (30, 40)).astype(np.float32)
    mask[rng.random((30, 40)) < 0.3] = 0.0
    blend_into(frame, fg, mask, (35, -5))  # hangs over the right and top edges
    roi = before[0:25, 35:60].astype(np.float32)
    m = mask[5:30, 0:25, None]
    exp = np.rint(roi + (fg[5:30, 0:25] - roi) * m)
    np.testing.assert_array_equal(frame[0:25, 35:60], np.clip(exp, 0, 255).astype(np.uint8))
    outside = np.ones((50, 60), dtype=bool)
    outside[0:25, 35:60] = False
    np.testing.assert_array_equal(frame[outside], before[outside])
    zero = np.zeros((50, 60), dtype=bool)
    zero[0:25, 35:60] = mask[5:30, 0:25] == 0
    np.testing.assert_array_equal(frame[zero], before[zero])


def test_validation_names_the_argument() -> None:
    with pytest.raises(ValueError, match="out must be float32"):
        remap_bilinear(np.zeros((4, 4, 3), np.uint8), np.zeros((2, 2, 2), np.float32),
                       np.zeros((2, 2, 3), np.uint8))
    with pytest.raises(ValueError, match="dst_to_src"):
        warp_affine(np.zeros((4, 4, 3), np.uint8), np.eye(3), np.zeros((2, 2, 3), np.uint8))


def test_label_blend_reference_is_the_integer_formula_and_checks_its_arguments() -> None:
    from swapstream.kernels.label import blend_patch

    rng = np.random.default_rng()
    region = rng.integers(0, 256, (5, 7, 3), dtype=np.uint8)
    alpha = rng.integers(0, 256, (5, 7), dtype=np.uint8)
    premul = rng.integers(0, 256, (5, 7, 1), dtype=np.uint8)
    want = (region.astype(int) * (255 - alpha[..., None].astype(int)) + premul.astype(int) * 255 + 127) // 255
    got = region.copy()
    blend_patch(got, alpha, premul)
    assert np.array_equal(got, want.astype(np.uint8))
    with pytest.raises(ValueError, match="alpha must have shape 5x7"):
        blend_patch(region, alpha[:4], premul)
