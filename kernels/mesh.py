"""Piecewise-affine mesh mapping: rasterise target triangles into a map of source coordinates.

This is the geometric half of the `mesh` swapper: every pixel covered by a target triangle gets the
source-image position of the same point of the same triangle (barycentric interpolation is exactly
the triangle's affine map). `remap_bilinear` then samples the source texture through that map.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._xp import check_array, get_xp

# Barycentric slack, in units of the barycentric coordinate: pixels exactly on a shared edge belong
# to both triangles, and a tiny negative tolerance stops rounding from opening one-pixel cracks.
_EDGE_EPS = 1e-6


def rasterize_mesh(dst_pts: Any, src_pts: Any, tris: Any, origin: tuple[int, int], out_map: Any,
                   *, cull_backfaces: bool = True) -> Any:
    """Fill `out_map` (hxwx2 float32) with source coordinates for every covered pixel, NaN elsewhere.

    dst_pts: (N, 2) float32 target vertices in frame pixels; src_pts: (N, 2) float32 source vertices;
    tris: (T, 3) int32 vertex indices; origin: (x0, y0) frame position of `out_map[0, 0]`.
    With `cull_backfaces`, triangles whose winding in the target is opposite to the source's are
    skipped: they face away from the camera (the far side of a turned head) and would otherwise paint
    over the visible side. Where visible triangles overlap, the later one wins.
    """
    check_array("dst_pts", dst_pts, ndim=2, dtype=np.float32)
    check_array("src_pts", src_pts, ndim=2, dtype=np.float32, shape=(dst_pts.shape[0], 2))
    check_array("tris", tris, ndim=2, dtype=np.int32, shape=(None, 3))
    check_array("out_map", out_map, ndim=3, dtype=np.float32)
    if out_map.shape[2] != 2:
        raise ValueError(f"out_map must be hxwx2, got shape {tuple(out_map.shape)}")
    xp = get_xp(dst_pts, out_map)
    h, w = out_map.shape[:2]
    x0, y0 = origin
    out_map[...] = xp.nan
    if xp is not np:
        return _rasterize_mesh_cuda(dst_pts, src_pts, tris, origin, out_map, cull_backfaces)

    d = dst_pts[tris].astype(xp.float64) - xp.asarray([x0, y0], dtype=xp.float64)  # (T,3,2)
    s = src_pts[tris].astype(xp.float64)
    # Signed doubled area; its sign is the winding.
    area_d = ((d[:, 1, 0] - d[:, 0, 0]) * (d[:, 2, 1] - d[:, 0, 1])
              - (d[:, 2, 0] - d[:, 0, 0]) * (d[:, 1, 1] - d[:, 0, 1]))
    area_s = ((s[:, 1, 0] - s[:, 0, 0]) * (s[:, 2, 1] - s[:, 0, 1])
              - (s[:, 2, 0] - s[:, 0, 0]) * (s[:, 1, 1] - s[:, 0, 1]))
    keep = xp.abs(area_d) > 1e-9
    if cull_backfaces:
        keep &= (area_d * area_s) > 0
    # Pixel-centre bounding box of each triangle, clipped to the map.
    bx0 = xp.clip(xp.ceil(d[:, :, 0].min(axis=1)), 0, w).astype(xp.int64)
    bx1 = xp.clip(xp.floor(d[:, :, 0].max(axis=1)) + 1, 0, w).astype(xp.int64)
    by0 = xp.clip(xp.ceil(d[:, :, 1].min(axis=1)), 0, h).astype(xp.int64)
    by1 = xp.clip(xp.floor(d[:, :, 1].max(axis=1)) + 1, 0, h).astype(xp.int64)
    bw = xp.where(keep, xp.maximum(bx1 - bx0, 0), 0)
    bh = xp.where(keep, xp.maximum(by1 - by0, 0), 0)
    counts = bw * bh
    total = int(counts.sum())
    if total == 0:
        return out_map
    # One candidate per (triangle, pixel of its box), all triangles at once: the vectorised
    # equivalent of the GPU kernel's one-thread-per-candidate launch.
    tri_of = xp.repeat(xp.arange(tris.shape[0]), counts)
    starts = xp.cumsum(counts) - counts
    local = xp.arange(total) - starts[tri_of]
    px = bx0[tri_of] + local % bw[tri_of]
    py = by0[tri_of] + local // bw[tri_of]

    a, b, c = d[tri_of, 0], d[tri_of, 1], d[tri_of, 2]
    inv_area = 1.0 / area_d[tri_of]
    l1 = ((px - a[:, 0]) * (c[:, 1] - a[:, 1]) - (c[:, 0] - a[:, 0]) * (py - a[:, 1])) * inv_area
    l2 = ((b[:, 0] - a[:, 0]) * (py - a[:, 1]) - (px - a[:, 0]) * (b[:, 1] - a[:, 1])) * inv_area
    l0 = 1.0 - l1 - l2
    inside = (l0 >= -_EDGE_EPS) & (l1 >= -_EDGE_EPS) & (l2 >= -_EDGE_EPS)
    tri_of, px, py = tri_of[inside], px[inside], py[inside]
    l0, l1, l2 = l0[inside], l1[inside], l2[inside]
    st = s[tri_of]
    sx = l0 * st[:, 0, 0] + l1 * st[:, 1, 0] + l2 * st[:, 2, 0]
    sy = l0 * st[:, 0, 1] + l1 * st[:, 1, 1] + l2 * st[:, 2, 1]
    out_map[py, px, 0] = sx.astype(xp.float32)
    out_map[py, px, 1] = sy.astype(xp.float32)
    return out_map


def _rasterize_mesh_cuda(dst_pts: Any, src_pts: Any, tris: Any, origin: tuple[int, int],
                         out_map: Any, cull_backfaces: bool) -> Any:
    from .cuda_loader import kernel, require_cupy

    for name, a in (("dst_pts", dst_pts), ("src_pts", src_pts), ("tris", tris), ("out_map", out_map)):
        require_cupy(name, a)
    h, w = out_map.shape[:2]
    n = int(tris.shape[0])
    if n and h and w:
        # 128 threads per triangle: a face triangle covers ~50-500 pixels at 720p-1080p.
        kernel("mesh.cu", "rasterize_mesh_f32")(
            (n,), (128,), (dst_pts, src_pts, tris, np.int32(n), np.int32(origin[0]),
                           np.int32(origin[1]), np.int32(h), np.int32(w),
                           np.int32(1 if cull_backfaces else 0), out_map))
    return out_map
