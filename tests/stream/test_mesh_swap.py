"""The mesh swapper on the real portraits: where it paints, what it paints, and the identity swap."""

from __future__ import annotations

import numpy as np
import pytest

from swapstream.config import MeshConfig
from swapstream.face.analyser import FaceAnalyser
from swapstream.face.topology import closed_mesh_points, closed_mesh_triangles
from swapstream.kernels.mesh import rasterize_mesh
from swapstream.kernels.warp import remap_bilinear
from swapstream.swap.mesh import MeshSwapper
from swapstream.types import Face

from .measures import psnr


@pytest.fixture(scope="module")
def faces(portraits: dict[str, np.ndarray], analyser: FaceAnalyser) -> dict[str, Face]:
    return {k: analyser.analyse_image(v)[0] for k, v in portraits.items()}


def swap(portraits: dict[str, np.ndarray], faces: dict[str, Face], src: str, dst: str,
         cfg: MeshConfig) -> tuple[np.ndarray, np.ndarray, MeshSwapper, list]:
    sw = MeshSwapper(cfg)
    sw.set_source(portraits[src], faces[src])
    target = portraits[dst]
    out = target.copy()
    regions = sw.swap_regions(out, [faces[dst]])
    return target, out, sw, regions


def full_mask(shape: tuple[int, ...], region) -> np.ndarray:
    m = np.zeros(shape[:2], dtype=np.float32)
    x0, y0 = region.origin
    h, w = region.mask.shape
    m[y0:y0 + h, x0:x0 + w] = region.mask
    return m


@pytest.mark.parametrize("color", ["lab", "none"])
def test_outside_the_mask_is_the_target(portraits, faces, color: str) -> None:
    target, out, _, regions = swap(portraits, faces, "astronaut", "grace_hopper",
                                   MeshConfig(color_match=color))
    assert len(regions) == 1
    m = full_mask(target.shape, regions[0])
    diff = np.abs(out.astype(int) - target.astype(int)).max(axis=2)
    assert diff[m == 0].max() <= 1
    # ... and the face itself did change, a lot.
    assert (m > 0.5).sum() > 5000
    assert diff[m > 0.9].mean() > 10


def test_inside_the_mask_is_the_source_texture(portraits, faces) -> None:
    target, out, sw, regions = swap(portraits, faces, "astronaut", "grace_hopper",
                                    MeshConfig(color_match="none", keep_mouth=False))
    m = full_mask(target.shape, regions[0])
    # The warped source texture, computed independently from the kernels.
    h, w = target.shape[:2]
    mp = np.empty((h, w, 2), np.float32)
    rasterize_mesh(closed_mesh_points(faces["grace_hopper"].landmarks[:, :2], sw.topo),
                   closed_mesh_points(faces["astronaut"].landmarks[:, :2], sw.topo),
                   closed_mesh_triangles(sw.topo), (0, 0), mp)
    warped = remap_bilinear(portraits["astronaut"], mp, np.empty((h, w, 3), np.float32))
    core = m > 0.9
    to_src = np.abs(out[core].astype(float) - warped[core]).mean()
    to_dst = np.abs(out[core].astype(float) - target[core]).mean()
    assert to_src < 2.0          # blending at m > 0.9 leaves at most 10% of the target
    assert to_src < 0.2 * to_dst


def test_colour_matching_keeps_the_source_structure(portraits, faces) -> None:
    target, out, sw, regions = swap(portraits, faces, "astronaut", "grace_hopper", MeshConfig())
    _, raw, _, _ = swap(portraits, faces, "astronaut", "grace_hopper", MeshConfig(color_match="none"))
    m = full_mask(target.shape, regions[0]) > 0.9
    lum = lambda x: x.astype(float).mean(axis=2)[m]
    # Colour transfer is per-channel affine: the structure (correlation with the source texture)
    # stays, and the mean colour moves to the target's skin.
    assert np.corrcoef(lum(out), lum(raw))[0, 1] > 0.95
    assert np.corrcoef(lum(out), lum(target))[0, 1] < 0.8
    mean_gap_after = np.abs(out[m].mean(0) - target[m].mean(0)).max()
    mean_gap_before = np.abs(raw[m].mean(0) - target[m].mean(0)).max()
    assert mean_gap_after < 0.5 * mean_gap_before


@pytest.mark.parametrize("name", ["astronaut", "grace_hopper"])
def test_identity_swap_keeps_the_face(portraits, faces, name: str) -> None:
    target, out, _, regions = swap(portraits, faces, name, name, MeshConfig())
    m = full_mask(target.shape, regions[0]) > 0
    assert psnr(out[m], target[m]) >= 30.0


def test_keep_mouth_and_eyes_leave_the_target_there(portraits, faces) -> None:
    # The astronaut smiles with her mouth open: a real inner mouth to keep.
    target, out, _, regions = swap(portraits, faces, "grace_hopper", "astronaut",
                                   MeshConfig(keep_mouth=True, keep_eyes=True))
    _, out_no, _, regions_no = swap(portraits, faces, "grace_hopper", "astronaut",
                                    MeshConfig(keep_mouth=False, keep_eyes=False))
    lm = faces["astronaut"].landmarks
    topo = MeshSwapper(MeshConfig()).topo
    keep = full_mask(target.shape, regions[0])
    no_keep = full_mask(target.shape, regions_no[0])
    for ring in (topo.image_left_eye, topo.image_right_eye, topo.lips_inner):
        c = np.round(lm[ring, :2].mean(axis=0)).astype(int)
        assert keep[c[1], c[0]] < 0.2
    for ring in (topo.image_left_eye, topo.image_right_eye):
        # The eye openings are swapped (the mesh's holes are closed by fans) unless kept.
        c = np.round(lm[ring, :2].mean(axis=0)).astype(int)
        assert no_keep[c[1], c[0]] > 0.9
    # Grace Hopper's closed mouth has no inner texture, so the open target mouth is never painted
    # from it; the swap covers less there whether or not the mouth is kept.
