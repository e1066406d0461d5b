"""The Face Mesh topology: triangles and contour rings over the 468 landmarks (MediaPipe, Apache-2.0)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

_PATH = Path(__file__).resolve().parent.parent / "assets" / "face_mesh_topology.json"

# Landmarks used for the 5 alignment points and for the tracking ROI's rotation.
NOSE_TIP = 4
IMAGE_LEFT_MOUTH = 61
IMAGE_RIGHT_MOUTH = 291
IMAGE_LEFT_EYE_OUTER = 33
IMAGE_RIGHT_EYE_OUTER = 263


@dataclass(frozen=True)
class Topology:
    """Index arrays into the (468, 3) landmark array."""

    triangles: np.ndarray
    """(852, 3) int32 triangles of the canonical face mesh."""
    face_oval: np.ndarray
    """Ordered ring around the face outline."""
    lips_inner: np.ndarray
    """Ordered ring around the inner mouth opening."""
    lips_outer: np.ndarray
    """Ordered ring around the outer lips."""
    image_left_eye: np.ndarray
    """Ordered ring around the eye on the image left (the subject's right eye)."""
    image_right_eye: np.ndarray
    """Ordered ring around the eye on the image right."""


@cache
def load_topology() -> Topology:
    """Read the committed topology file once per process (it is immutable data)."""
    raw = json.loads(_PATH.read_text())
    arr = {k: np.asarray(v, dtype=np.int32) for k, v in raw.items() if isinstance(v, list)}
    return Topology(**{k: arr[k] for k in Topology.__dataclass_fields__})


def five_points(landmarks: np.ndarray, topo: Topology) -> np.ndarray:
    """The 5 alignment points (in the warp templates' order, docs/neural.md) from the 468 landmarks,
    as (5, 2) float32."""
    xy = landmarks[:, :2]
    return np.stack([
        xy[topo.image_left_eye].mean(axis=0),
        xy[topo.image_right_eye].mean(axis=0),
        xy[NOSE_TIP],
        xy[IMAGE_LEFT_MOUTH],
        xy[IMAGE_RIGHT_MOUTH],
    ]).astype(np.float32)


# The canonical mesh leaves the eye and mouth openings as holes. The swapper closes each with a fan
# of triangles around one extra vertex at the opening's centroid, so that the source's eyes and mouth
# can be painted too (or deliberately kept out by the keep_* options).
HOLE_RINGS: tuple[str, ...] = ("image_left_eye", "image_right_eye", "lips_inner")


def closed_mesh_triangles(topo: Topology) -> np.ndarray:
    """The mesh triangles plus hole fans; fan centres are vertices 468, 469, 470 (HOLE_RINGS order)."""
    fans = []
    n = int(topo.triangles.max()) + 1
    # Directed edges of the mesh: a fan wound consistently with the mesh runs each ring edge in the
    # opposite direction to the mesh triangle beside it (the rings' own order differs between the
    # two eyes), so that one orientation means "facing the camera" everywhere.
    directed = {(int(a), int(b)) for t in topo.triangles for a, b in ((t[0], t[1]), (t[1], t[2]), (t[2], t[0]))}
    for k, name in enumerate(HOLE_RINGS):
        ring = [int(v) for v in getattr(topo, name)]
        if (ring[0], ring[1]) in directed:
            ring = ring[::-1]
        centre = n + k
        fans += [[centre, ring[i], ring[(i + 1) % len(ring)]] for i in range(len(ring))]
    return np.ascontiguousarray(np.vstack([topo.triangles, np.asarray(fans, dtype=np.int32)]),
                                dtype=np.int32)


def closed_mesh_points(xy: np.ndarray, topo: Topology) -> np.ndarray:
    """(468, 2) landmark positions plus the hole centroids, matching `closed_mesh_triangles`."""
    centres = [xy[getattr(topo, name)].mean(axis=0) for name in HOLE_RINGS]
    return np.ascontiguousarray(np.vstack([xy, np.asarray(centres)]), dtype=np.float32)


_MIRROR_PATH = _PATH.parent / "face_mesh_mirror.json"


@cache
def load_mirror() -> np.ndarray:
    """(468,) int32: the landmark at the mirror-image position of each landmark (left <-> right;
    midline landmarks map to themselves). Made by tools/face_mesh_mirror.py; read-only."""
    m = np.asarray(json.loads(_MIRROR_PATH.read_text())["mirror"], dtype=np.int32)
    m.setflags(write=False)
    return m


def closed_mesh_mirror(topo: Topology) -> np.ndarray:
    """`load_mirror` extended to the hole centres of `closed_mesh_points`: the two eye centres swap,
    the mouth centre is its own mirror image."""
    n = int(topo.triangles.max()) + 1
    extra = {name: n + k for k, name in enumerate(HOLE_RINGS)}
    return np.concatenate([load_mirror(), [extra["image_right_eye"], extra["image_left_eye"],
                                           extra["lips_inner"]]]).astype(np.int32)
