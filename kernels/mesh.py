"""Piecewise-affine mesh mapping: rasterise target triangles into a map of source coordinates.

This is the geometric half of the `mesh` swapper: every pixel covered by a target triangle gets the
source-image position of the same point of the same triangle (barycentric interpolation is exactly
the triangle's affine map). `remap_bilinear` then samples the source texture through that map.

Coverage follows the Direct3D / OpenGL rasterisation rules, so that a pixel inside a mesh is covered
by exactly one triangle: pixel centres sit at integer coordinates; target vertices are snapped to a
1/256-pixel grid and the three edge functions are evaluated exactly in 64-bit integers; a centre
exactly on an edge belongs to the triangle for which that edge is a *top* edge (horizontal, interior
below) or a *left* edge (interior to its right). Two triangles that share an edge see it with opposite
orientation, so exactly one of them takes a centre lying on it, and a degenerate (zero-area)
triangle takes none. Where front-facing triangles overlap (a fold of the mesh on a turned head), the
one with the highest index wins; callers order triangles far to near to make that the nearest.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._xp import check_array, get_xp

SUBPIXEL_BITS = 8
"""Target vertices are snapped to 1/2**SUBPIXEL_BITS of a pixel, as GPUs' rasterisers do: with exact
integer edge functions a shared edge gives the same answer from both of its triangles."""
_ONE = 1 << SUBPIXEL_BITS


def _check(dst_pts: Any, src_pts: Any, tris: Any, src_tris: Any) -> None:
    check_array("dst_pts", dst_pts, ndim=2, dtype=np.float32, shape=(None, 2))
    check_array("src_pts", src_pts, ndim=2, dtype=np.float32, shape=(dst_pts.shape[0], 2))
    check_array("tris", tris, ndim=2, dtype=np.int32, shape=(None, 3))
    if src_tris is not None:
        check_array("src_tris", src_tris, ndim=2, dtype=np.int32, shape=(tris.shape[0], 3))


def _setup(dst_pts: np.ndarray, src_pts: np.ndarray, tris: np.ndarray, src_tris: np.ndarray,
           origin: tuple[int, int], cull: bool, front: int = 0) -> dict[str, np.ndarray]:
    """Per kept triangle: its index, snapped vertices (T, 3, 2) int64 relative to `origin`, wound so
    that the doubled area is positive, the matching source vertices (T, 3, 2) float64, the area, and
    the top-left flag of each edge (edge k runs from vertex k to vertex k+1)."""
    fixed = np.rint((dst_pts.astype(np.float64) - np.asarray(origin, np.float64)) * _ONE)
    d = fixed.astype(np.int64)[tris]                                   # (T, 3, 2)
    s = src_pts.astype(np.float64)[src_tris]                           # sampled source vertices
    w = src_pts.astype(np.float64)[tris]                               # winding reference
    area = ((d[:, 1, 0] - d[:, 0, 0]) * (d[:, 2, 1] - d[:, 0, 1])
            - (d[:, 1, 1] - d[:, 0, 1]) * (d[:, 2, 0] - d[:, 0, 0]))
    area_s = ((w[:, 1, 0] - w[:, 0, 0]) * (w[:, 2, 1] - w[:, 0, 1])
              - (w[:, 1, 1] - w[:, 0, 1]) * (w[:, 2, 0] - w[:, 0, 0]))
    keep = area != 0
    if cull and front:
        # The caller knows which winding faces the camera (a consistently wound mesh's majority).
        keep &= (area > 0) == (front > 0)
    elif cull:
        # A triangle wound the other way round in the target than in the source faces away from the
        # camera (the far side of a turned head).
        keep &= (area > 0) == (area_s > 0)
    idx = np.flatnonzero(keep)
    d, s, area = d[idx], s[idx], area[idx]
    flip = area < 0
    # Negative area: swap vertices 1 and 2 (and their source vertices) to wind it positively.
    d[flip] = d[flip][:, [0, 2, 1]]
    s[flip] = s[flip][:, [0, 2, 1]]
    area = np.abs(area)
    e = np.roll(d, -1, axis=1) - d                                     # edge vectors (T, 3, 2)
    top_left = (e[..., 1] < 0) | ((e[..., 1] == 0) & (e[..., 0] > 0))
    return {"idx": idx, "d": d, "s": s, "area": area, "tl": top_left}


def _edges(d: np.ndarray, tl: np.ndarray, px: np.ndarray, py: np.ndarray) -> list[np.ndarray]:
    """Edge functions (exact int64) of each candidate pixel, biased by -1 on edges that are not
    top-left: a pixel is inside when all three are >= 0."""
    X, Y = px * _ONE, py * _ONE
    out = []
    for k in range(3):
        a, b = d[:, k], d[:, (k + 1) % 3]
        f = (b[:, 0] - a[:, 0]) * (Y - a[:, 1]) - (b[:, 1] - a[:, 1]) * (X - a[:, 0])
        out.append(f - (~tl[:, k]).astype(np.int64))
    return out


def _boxes(d: np.ndarray, h: int, w: int) -> tuple[np.ndarray, ...]:
    """Pixel-centre bounding box [x0, x1) x [y0, y1) of each snapped triangle, clipped to the map."""
    lo, hi = d.min(axis=1), d.max(axis=1)
    bx0 = np.clip(-((-lo[:, 0]) // _ONE), 0, w)
    by0 = np.clip(-((-lo[:, 1]) // _ONE), 0, h)
    bx1 = np.clip(hi[:, 0] // _ONE + 1, 0, w)
    by1 = np.clip(hi[:, 1] // _ONE + 1, 0, h)
    return bx0, bx1, by0, by1


def _covered_ref(st: dict[str, np.ndarray], h: int, w: int) -> tuple[np.ndarray, ...]:
    """(kept-triangle row, px, py) of every covered (triangle, pixel) pair: one candidate per pixel
    of each triangle's box, all triangles at once, tested with the three edge functions."""
    bx0, bx1, by0, by1 = _boxes(st["d"], h, w)
    bw, bh = np.maximum(bx1 - bx0, 0), np.maximum(by1 - by0, 0)
    counts = bw * bh
    total = int(counts.sum())
    row = np.repeat(np.arange(len(counts)), counts)
    local = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
    px = bx0[row] + local % np.maximum(bw[row], 1)
    py = by0[row] + local // np.maximum(bw[row], 1)
    e0, e1, e2 = _edges(st["d"][row], st["tl"][row], px, py)
    inside = (e0 >= 0) & (e1 >= 0) & (e2 >= 0)
    return row[inside], px[inside], py[inside]


def _covered_spans(st: dict[str, np.ndarray], h: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    """The same pairs as `_covered_ref`, found per (triangle, row) span: each edge function is
    linear in x along a row, so the covered pixels of a row are an interval whose ends come out of
    exact divisions. Visits only covered pixels, not whole bounding boxes. Returns (kept-triangle
    row, flat pixel index py * w + px), in the order of the rows (triangle-index order)."""
    d, tl = st["d"], st["tl"]
    bx0, bx1, by0, by1 = _boxes(d, h, w)
    rows_per = np.maximum(by1 - by0, 0)
    total = int(rows_per.sum())
    row = np.repeat(np.arange(len(rows_per)), rows_per)
    py = np.arange(total) - np.repeat(np.cumsum(rows_per) - rows_per - by0, rows_per)
    # Edge k runs from vertex a = k to b = k + 1; along a row its function is A*x + B, with
    # A = -ey*ONE, B = ex*(Y - ay) + ey*ax, and a pixel is inside where A*x + B >= t (t = 0 on a
    # top-left edge, else 1). All three edges at once, (spans, 3).
    dk = np.ascontiguousarray(d.transpose(1, 2, 0), dtype=np.float64)[:, :, row]   # (3, 2, S)
    a, b = dk, np.roll(dk, -1, axis=0)
    ex, ey = b[:, 0] - a[:, 0], b[:, 1] - a[:, 1]                                   # (3, S)
    A = -ey * _ONE
    B = ex * (py * _ONE - a[:, 1]) + ey * a[:, 0]
    t = (~tl.T[:, row]).astype(np.float64)
    # x >= ceil(n/A) where A > 0, x <= floor(n/A) where A < 0 (n = t - B). The operands are integers
    # below 2^53 (exact in double), and a quotient that is not an integer lies at least 1/|A| (> 1e-8)
    # from one, far beyond double's rounding of it (< 1e-12 at these sizes): floor and ceil of the
    # double quotient are the exact integer ones.
    with np.errstate(divide="ignore", invalid="ignore"):
        q = (t - B) / A
    up = np.where(A > 0, np.ceil(q), -np.inf)
    down = np.where(A < 0, np.floor(q), np.inf)
    lo = np.maximum(np.maximum(bx0[row], up[0]), np.maximum(up[1], up[2])).astype(np.int64)
    hi = np.minimum(np.minimum(bx1[row] - 1, down[0]), np.minimum(down[1], down[2])).astype(np.int64)
    # A parallel edge (A == 0) keeps the whole row or none of it.
    flat_edge = (A == 0) & (B < t)
    none = flat_edge[0] | flat_edge[1] | flat_edge[2]
    n_px = np.where(none, 0, np.maximum(hi - lo + 1, 0))
    # Each span's pixels run from py * w + lo upwards: one repeat of the start less the span's offset
    # in the output, plus a running index.
    start = py * w + lo - (np.cumsum(n_px) - n_px)
    return np.repeat(row, n_px), np.repeat(start, n_px) + np.arange(int(n_px.sum()))


def _owner(row: np.ndarray, flat: np.ndarray, h: int, w: int) -> np.ndarray:
    """(h*w,) int64: per pixel (`flat` = py * w + px), the kept-triangle row with the highest
    triangle index that covers it, or -1."""
    owner = np.full(h * w, -1, np.int64)
    np.maximum.at(owner, flat, row)   # kept rows are in triangle-index order
    return owner


def _map_from_owner(st: dict[str, np.ndarray], owner: np.ndarray, out_map: np.ndarray) -> None:
    """Source coordinates of every owned pixel from exact edge functions (barycentric weights in
    double: w_k / area, source = sum of w_k * source vertex k, left to right), NaN elsewhere."""
    h, w = out_map.shape[:2]
    out_map[...] = np.nan
    pix = np.flatnonzero(owner >= 0)
    if pix.size == 0:
        return
    row = owner[pix]
    px, py = pix % w, pix // w
    d, s = st["d"][row], st["s"][row]
    X, Y = px * _ONE, py * _ONE
    wts = []
    for k in range(3):
        # The weight of vertex k is the edge function of the opposite edge (k+1 -> k+2), unbiased.
        a, b = d[:, (k + 1) % 3], d[:, (k + 2) % 3]
        wts.append((b[:, 0] - a[:, 0]) * (Y - a[:, 1]) - (b[:, 1] - a[:, 1]) * (X - a[:, 0]))
    area = st["area"][row].astype(np.float64)
    l0, l1, l2 = (wk.astype(np.float64) / area for wk in wts)
    flat = out_map.reshape(h * w, 2)
    flat[pix, 0] = (l0 * s[:, 0, 0] + l1 * s[:, 1, 0] + l2 * s[:, 2, 0]).astype(np.float32)
    flat[pix, 1] = (l0 * s[:, 0, 1] + l1 * s[:, 1, 1] + l2 * s[:, 2, 1]).astype(np.float32)


def rasterize_mesh(dst_pts: Any, src_pts: Any, tris: Any, origin: tuple[int, int], out_map: Any,
                   *, src_tris: Any = None, cull_backfaces: bool = True, front: int = 0) -> Any:
    """Fill `out_map` (hxwx2 float32) with source coordinates for every covered pixel, NaN elsewhere.

    dst_pts: (N, 2) float32 target vertices in frame pixels; src_pts: (N, 2) float32 source vertices;
    tris: (T, 3) int32 vertex indices; origin: (x0, y0) frame position of `out_map[0, 0]`.
    src_tris: (T, 3) int32, the source vertices each triangle samples (default `tris`): a triangle
    can take its texture from another one (its mirror image on the other side of the face).
    With `cull_backfaces`, triangles whose winding in the target is opposite to their winding in the
    source (`src_pts[tris]`) are skipped: they face away from the camera and would otherwise paint
    over the visible side. `front` (+1 or -1) instead names the winding (the sign of the target's
    doubled area) that faces the camera, whatever the source's: a fold in the source photo then does
    not cull a visible triangle. Coverage follows the top-left rule (module docstring); where kept
    triangles overlap, the one with the highest index wins.
    """
    _check(dst_pts, src_pts, tris, src_tris)
    check_array("out_map", out_map, ndim=3, dtype=np.float32)
    if out_map.shape[2] != 2:
        raise ValueError(f"out_map must be hxwx2, got shape {tuple(out_map.shape)}")
    xp = get_xp(dst_pts, out_map)
    if xp is not np:
        return _rasterize_mesh_cuda(dst_pts, src_pts, tris, tris if src_tris is None else src_tris,
                                    origin, out_map, cull_backfaces, front)
    h, w = out_map.shape[:2]
    st = _setup(dst_pts, src_pts, tris, tris if src_tris is None else src_tris, origin,
                cull_backfaces, _front(front))
    row, px, py = _covered_ref(st, h, w)
    _map_from_owner(st, _owner(row, py * w + px, h, w), out_map)
    return out_map


def _map_from_owner_affine(st: dict[str, np.ndarray], owner: np.ndarray, out_map: np.ndarray) -> None:
    """`_map_from_owner` with each triangle's barycentric weights folded into one affine map per
    triangle (in double) and evaluated per pixel: fewer operations, equal to within ~1e-9 px before
    the float32 rounding (so equal, or one float32 ulp apart)."""
    h, w = out_map.shape[:2]
    d, s = st["d"].astype(np.float64), st["s"]
    area = st["area"].astype(np.float64)
    # Weight of vertex k: E(p) of the opposite edge (a -> b) over the area, linear in the pixel
    # index: -(by - ay) ONE px + (bx - ax) ONE py + (by - ay) ax - (bx - ax) ay. One extra row of
    # NaNs at the end serves the pixels no triangle owns (owner -1), so every pixel of the box is
    # evaluated by the same gathers, with no index of owned pixels to build and scatter through.
    t = len(area)
    cx = np.zeros((t + 1, 2))
    cy = np.zeros((t + 1, 2))
    c0 = np.zeros((t + 1, 2))
    for c in (cx, cy, c0):
        c[t] = np.nan
    for k in range(3):
        a, b = d[:, (k + 1) % 3], d[:, (k + 2) % 3]
        ex, ey = b[:, 0] - a[:, 0], b[:, 1] - a[:, 1]
        lx, ly, l0 = -ey * _ONE / area, ex * _ONE / area, (ey * a[:, 0] - ex * a[:, 1]) / area
        cx[:t] += lx[:, None] * s[:, k]
        cy[:t] += ly[:, None] * s[:, k]
        c0[:t] += l0[:, None] * s[:, k]
    own = np.where(owner >= 0, owner, t).reshape(h, w)
    px = np.arange(w, dtype=np.float64)[None, :, None]
    py = np.arange(h, dtype=np.float64)[:, None, None]
    out_map[...] = cx.take(own, axis=0) * px + cy.take(own, axis=0) * py + c0.take(own, axis=0)


def rasterize_mesh_fast(dst_pts: np.ndarray, src_pts: np.ndarray, tris: np.ndarray,
                        origin: tuple[int, int], out_map: np.ndarray, *,
                        src_tris: np.ndarray | None = None, cull_backfaces: bool = True,
                        front: int = 0) -> np.ndarray:
    """`rasterize_mesh` for NumPy arrays, the CPU product path: the same coverage exactly, found by
    row spans instead of testing every pixel of every triangle's box, and the same values to within
    one float32 ulp (one affine map per triangle instead of per-pixel barycentric weights)."""
    _check(dst_pts, src_pts, tris, src_tris)
    check_array("out_map", out_map, ndim=3, dtype=np.float32, shape=(None, None, 2))
    h, w = out_map.shape[:2]
    st = _setup(dst_pts, src_pts, tris, tris if src_tris is None else src_tris, origin,
                cull_backfaces, _front(front))
    _map_from_owner_affine(st, _owner(*_covered_spans(st, h, w), h, w), out_map)
    return out_map


def mesh_coverage(dst_pts: np.ndarray, src_pts: np.ndarray, tris: np.ndarray,
                  origin: tuple[int, int], shape: tuple[int, int], *,
                  cull_backfaces: bool = True) -> np.ndarray:
    """(h, w) int32: how many kept triangles cover each pixel centre (NumPy reference). On a proper
    triangulation it is 1 inside the union of the triangles and 0 outside."""
    _check(dst_pts, src_pts, tris, None)
    h, w = shape
    st = _setup(dst_pts, src_pts, tris, tris, origin, cull_backfaces)
    _, px, py = _covered_ref(st, h, w)
    return np.bincount(py * w + px, minlength=h * w).reshape(h, w).astype(np.int32)


def _front(front: int) -> int:
    if front not in (-1, 0, 1):
        raise ValueError(f"front must be -1, 0 (use the source's winding) or 1, got {front!r}")
    return front


def facing_winding(dst_pts: np.ndarray, tris: np.ndarray) -> int:
    """The winding (+1 or -1) of most of `tris` in `dst_pts`: for a consistently wound mesh of a face
    that is turned less than 90 degrees, the one that faces the camera."""
    d = dst_pts.astype(np.float64)[tris]
    area = ((d[:, 1, 0] - d[:, 0, 0]) * (d[:, 2, 1] - d[:, 0, 1])
            - (d[:, 1, 1] - d[:, 0, 1]) * (d[:, 2, 0] - d[:, 0, 0]))
    return 1 if int((area > 0).sum()) >= int((area < 0).sum()) else -1


def _rasterize_mesh_cuda(dst_pts: Any, src_pts: Any, tris: Any, src_tris: Any,
                         origin: tuple[int, int], out_map: Any, cull_backfaces: bool,
                         front: int) -> Any:
    import cupy as cp

    from .cuda_loader import grid, kernel, require_cupy

    for name, a in (("dst_pts", dst_pts), ("src_pts", src_pts), ("tris", tris),
                    ("src_tris", src_tris), ("out_map", out_map)):
        require_cupy(name, a)
    h, w = out_map.shape[:2]
    n = int(tris.shape[0])
    if not (h and w):
        return out_map
    # Per pixel, the highest covering triangle index (-1: none), from CuPy's pool: after the first
    # frame of a given size no cudaMalloc happens.
    owner = cp.full((h, w), -1, cp.int32)
    args = (dst_pts, src_pts, tris, src_tris, np.int32(n), np.int32(origin[0]), np.int32(origin[1]),
            np.int32(h), np.int32(w), np.int32(1 if cull_backfaces else 0), np.int32(_front(front)))
    if n:
        # 128 threads per triangle: a face triangle covers ~50-500 pixels at 720p-1080p.
        kernel("mesh.cu", "mesh_owner")((n,), (128,), args + (owner,))
    kernel("mesh.cu", "mesh_map_from_owner")(grid(h * w), (256,), args + (owner, out_map))
    return out_map
