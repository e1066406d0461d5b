"""Find the left/right mirror map of the 468 Face Mesh landmarks and write stream/assets/face_mesh_mirror.json.

    python tools/face_mesh_mirror.py

The Face Mesh topology is left/right symmetric, but the model file carries no such map. This detects
both shipped portraits (near-frontal), levels each face's eye axis, reflects it about its midline and
pairs every landmark with its reflected counterpart by one assignment (Hungarian, summed over both
faces, scaled by the eye distance), which makes the map a bijection. tests/stream/test_mesh_quality.py
checks the result: an involution that maps the eye, lip and oval rings onto their counterparts and
every triangle onto a triangle or the other diagonal of the same quad (6 quads of MediaPipe's
triangulation are split asymmetrically).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from scipy.optimize import linear_sum_assignment

from swapstream.config import load_config
from swapstream.demo import astronaut, grace_hopper
from swapstream.face.analyser import FaceAnalyser
from swapstream.face.topology import load_topology

OUT = Path(__file__).resolve().parent.parent / "stream" / "assets" / "face_mesh_mirror.json"


def mirror_cost(lm: np.ndarray) -> np.ndarray:
    """(468, 468) squared distances between landmark i and the reflection of landmark j."""
    topo = load_topology()
    p = lm.astype(np.float64) - lm.mean(axis=0)
    axis = (p[topo.image_right_eye].mean(axis=0) - p[topo.image_left_eye].mean(axis=0))[:2]
    a = -np.arctan2(axis[1], axis[0])
    p[:, :2] = p[:, :2] @ np.array([[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]]).T
    q = p.copy()
    q[:, 0] = -q[:, 0]
    for _ in range(3):
        # Centre the reflection on the face's own midline: the mean offset of the current pairs.
        _, j = linear_sum_assignment(((p[:, None] - q[None]) ** 2).sum(-1))
        q[:, 0] += (p[j, 0] - q[:, 0]).mean()
    return ((p[:, None] - q[None]) ** 2).sum(-1) / float(np.linalg.norm(axis)) ** 2


def main() -> None:
    analyser = FaceAnalyser(load_config())
    cost = sum(mirror_cost(analyser.analyse_image(img)[0].landmarks) for img in (astronaut(), grace_hopper()))
    _, m = linear_sum_assignment(cost)
    assert np.array_equal(m[m], np.arange(len(m))), "the assignment is not an involution"
    OUT.write_text(json.dumps({
        "source": "tools/face_mesh_mirror.py: reflected landmarks of the shipped portraits, paired "
                  "by linear assignment",
        "mirror": [int(v) for v in m]}) + "\n")
    print(f"wrote {OUT}: {int((m == np.arange(len(m))).sum())} landmarks on the midline")


if __name__ == "__main__":
    main()
