"""The mesh swapper's quality test set, made from the shipped public-domain portraits: sources cut at
the forehead, chin or one cheek, greyscale sources, and targets turned up to 30 degrees of yaw.
Shared by tests/stream/test_mesh_quality.py and tools/quality_sheet.py."""

from __future__ import annotations

import math
from dataclasses import dataclass

import cv2
import numpy as np

from swapstream.face.analyser import FaceAnalyser
from swapstream.types import Face


@dataclass
class Case:
    name: str
    source: np.ndarray
    target: np.ndarray


def crop_source(img: np.ndarray, face: Face, where: str) -> np.ndarray:
    """`img` cut through the face: 'forehead' (top third of the forehead gone), 'chin' (below the
    mouth), 'cheek' (the image-left cheek up to the eye's outer corner)."""
    lm = face.landmarks
    assert lm is not None
    x0, y0 = lm[:, 0].min(), lm[:, 1].min()
    x1, y1 = lm[:, 0].max(), lm[:, 1].max()
    if where == "forehead":
        return np.ascontiguousarray(img[int(y0 + 0.12 * (y1 - y0)):])
    if where == "chin":
        return np.ascontiguousarray(img[:int(y1 - 0.12 * (y1 - y0))])
    if where == "cheek":
        return np.ascontiguousarray(img[:, int(x0 + 0.15 * (x1 - x0)):])
    raise ValueError(where)


def greyscale(img: np.ndarray) -> np.ndarray:
    g = cv2.cvtColor(img, cv2.COLOR_RGB2GRAY)
    return np.ascontiguousarray(np.repeat(g[..., None], 3, axis=2))


def yaw(img: np.ndarray, face: Face, degrees: float) -> np.ndarray:
    """A head turned by `degrees` about the vertical axis through the face centre, approximated by
    the perspective warp of a plane at the face's depth (a pinhole camera with a 50 degree field of
    view): the near side grows, the far side shrinks and moves in."""
    h, w = img.shape[:2]
    lm = face.landmarks
    assert lm is not None
    cx, cy = float(lm[:, 0].mean()), float(lm[:, 1].mean())
    f = 0.5 * w / math.tan(math.radians(25))
    a = math.radians(degrees)
    src = np.float32([[0, 0], [w, 0], [w, h], [0, h]])
    dst = []
    for x, y in src:
        X, Y, Z = (x - cx) * math.cos(a), y - cy, f + (x - cx) * math.sin(a)
        dst.append([cx + f * X / Z, cy + f * Y / Z])
    m = cv2.getPerspectiveTransform(src, np.float32(dst))
    return cv2.warpPerspective(img, m, (w, h), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)


def first_face(analyser: FaceAnalyser, img: np.ndarray) -> Face:
    faces = analyser.analyse_image(img)
    assert faces, "no face found"
    return faces[0]


def cases(portraits: dict[str, np.ndarray], analyser: FaceAnalyser) -> list[Case]:
    """Every case: (source, target) pairs; the swap of each is judged by the checks."""
    ast, gh = portraits["astronaut"], portraits["grace_hopper"]
    f_ast = first_face(analyser, ast)
    out = [Case(f"source cut at the {w}", crop_source(ast, f_ast, w), gh)
           for w in ("forehead", "chin", "cheek")]
    out.append(Case("greyscale source", greyscale(ast), gh))
    f_gh = first_face(analyser, gh)
    out += [Case(f"target turned {d:+d} deg", ast, yaw(gh, f_gh, d)) for d in (-30, 30)]
    return out
