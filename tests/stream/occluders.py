"""Synthetic occluders painted in front of a target face, placed from its Face Mesh landmarks.

Each painter draws into a copy of the frame and returns it with the occluder's pixel mask (True
where the occluder was painted), for the occlusion tests and the quality contact sheets. Shapes are
filled without anti-aliasing so that the mask is exact. Colours are the hard part of the problem and
are chosen on purpose, see each painter.
"""

from __future__ import annotations

import math

import cv2
import numpy as np

from swapstream.face.topology import Topology


def _face_geometry(lm: np.ndarray, topo: Topology) -> tuple[np.ndarray, np.ndarray, float]:
    """Eye centres (2, 2) (image left, image right) and the face's size (outline diagonal)."""
    xy = lm[:, :2].astype(np.float64)
    eyes = np.stack([xy[topo.image_left_eye].mean(axis=0), xy[topo.image_right_eye].mean(axis=0)])
    oval = xy[topo.face_oval]
    return eyes, oval, float(np.hypot(*np.ptp(oval, axis=0)))


def _textured(frame: np.ndarray, mask: np.ndarray, rgb: tuple[int, int, int], rng: np.random.Generator,
              noise: float) -> np.ndarray:
    """Paint `rgb` with a little pixel noise (a real occluder has texture) where `mask` is set."""
    out = frame.copy()
    n = int(mask.sum())
    vals = np.asarray(rgb, np.float64)[None] + rng.normal(0.0, noise, (n, 1))
    out[mask] = np.clip(np.rint(vals), 0, 255).astype(np.uint8)
    return out


def hair_fringe(frame: np.ndarray, lm: np.ndarray, topo: Topology,
                rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Dark brown strands hanging from the top of the face outline to above the brows."""
    eyes, oval, size = _face_geometry(lm, topo)
    top = oval[np.argsort(oval[:, 1])[:12]]          # the upper part of the outline
    x_lo, x_hi = top[:, 0].min(), top[:, 0].max()
    y_top = float(top[:, 1].min()) - 0.02 * size
    brow_y = float(eyes[:, 1].mean()) - 0.13 * size  # down to just above the brows
    m = np.zeros(frame.shape[:2], np.uint8)
    thick = max(2, int(round(0.018 * size)))
    for x in np.linspace(x_lo + 0.1 * (x_hi - x_lo), x_hi - 0.1 * (x_hi - x_lo), 22):
        length = rng.uniform(0.6, 1.0) * (brow_y - y_top)
        bend = rng.uniform(-0.06, 0.06) * size
        t = np.linspace(0.0, 1.0, 12)
        pts = np.stack([x + bend * t ** 2, y_top + length * t], axis=1)
        cv2.polylines(m, [np.round(pts).astype(np.int32)], False, 1, thick, cv2.LINE_8)
    mask = m.astype(bool)
    return _textured(frame, mask, (52, 36, 28), rng, 6.0), mask


def mouth_bar(frame: np.ndarray, lm: np.ndarray, topo: Topology,
              rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A dark grey bar (a microphone held across the mouth), slightly tilted."""
    eyes, _, size = _face_geometry(lm, topo)
    c = lm[topo.lips_outer, :2].mean(axis=0)
    ang = math.degrees(math.atan2(*(eyes[1] - eyes[0])[::-1])) + 8.0
    rect = ((float(c[0]), float(c[1])), (0.55 * size, 0.11 * size), ang)
    m = np.zeros(frame.shape[:2], np.uint8)
    cv2.fillConvexPoly(m, np.round(cv2.boxPoints(rect)).astype(np.int32), 1, cv2.LINE_8)
    mask = m.astype(bool)
    return _textured(frame, mask, (38, 38, 44), rng, 4.0), mask


def glasses(frame: np.ndarray, lm: np.ndarray, topo: Topology,
            rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Black rectangular-ish frames round both eyes and a bridge (lenses clear: only the frame)."""
    eyes, _, size = _face_geometry(lm, topo)
    d = float(np.hypot(*(eyes[1] - eyes[0])))
    ang = math.degrees(math.atan2(*(eyes[1] - eyes[0])[::-1]))
    thick = max(3, int(round(0.02 * size)))
    m = np.zeros(frame.shape[:2], np.uint8)
    for e in eyes:
        cv2.ellipse(m, (int(round(e[0])), int(round(e[1] + 0.04 * d))),
                    (int(round(0.4 * d)), int(round(0.24 * d))), ang, 0, 360, 1, thick, cv2.LINE_8)
    inner = eyes + np.array([[0.4 * d, 0.0], [-0.4 * d, 0.0]])
    cv2.line(m, tuple(int(round(v)) for v in inner[0]), tuple(int(round(v)) for v in inner[1]), 1,
             thick, cv2.LINE_8)
    mask = m.astype(bool)
    return _textured(frame, mask, (22, 22, 26), rng, 3.0), mask


def hand(frame: np.ndarray, lm: np.ndarray, topo: Topology, rng: np.random.Generator,
         rgb: tuple[int, int, int] = (140, 110, 95), side: str = "jaw") -> tuple[np.ndarray, np.ndarray]:
    """A hand (palm and four fingers) raised in front of the lower face.

    The default colour is a mid-tone, less saturated skin than the portraits' (another person's
    hand, or one in shadow): clearly apart from the target's cheeks in chroma. A hand of the
    target's own skin tone is not reliably found by a colour model (see stream/swap/occlusion.py).
    side: "jaw" (over the image-left jaw and chin) or "cheek" (over the image-left cheek).
    """
    eyes, oval, size = _face_geometry(lm, topo)
    xy = lm[:, :2].astype(np.float64)
    if side == "jaw":
        base = np.array([xy[topo.lips_outer, 0].min() - 0.05 * size, oval[:, 1].max() + 0.1 * size])
        tilt = math.radians(-20.0)
    else:
        base = np.array([eyes[0, 0] - 0.05 * size, oval[:, 1].max() + 0.05 * size])
        tilt = math.radians(-8.0)
    u = np.array([math.sin(tilt), -math.cos(tilt)])      # up along the fingers
    v = np.array([u[1], -u[0]])                          # across the palm
    pw, ph = 0.26 * size, 0.28 * size
    m = np.zeros(frame.shape[:2], np.uint8)
    palm = [base - v * pw / 2, base + v * pw / 2, base + v * pw / 2 + u * ph, base - v * pw / 2 + u * ph]
    cv2.fillConvexPoly(m, np.round(np.array(palm)).astype(np.int32), 1, cv2.LINE_8)
    fw = pw / 4.4
    for k, length in enumerate((0.22, 0.27, 0.25, 0.19)):
        x = -pw / 2 + fw * (0.6 + 1.1 * k)
        a = base + v * x + u * ph
        b = a + u * length * size
        cv2.line(m, tuple(int(round(p)) for p in a), tuple(int(round(p)) for p in b), 1,
                 max(2, int(round(fw))), cv2.LINE_8)
    mask = m.astype(bool)
    out = _textured(frame, mask, rgb, rng, 4.0)
    return out, mask


PAINTERS = {"fringe": hair_fringe, "mouth_bar": mouth_bar, "glasses": glasses, "hand": hand}


def open_hand(frame: np.ndarray, lm: np.ndarray, topo: Topology, rng: np.random.Generator,
              tilt_deg: float = 0.0, scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """An open hand (palm, four spread fingers and a thumb) raised in front of the mouth and chin,
    in the target's own skin tone: the median colour of its cheeks, shaded darker towards the
    hand's outline as a rounded hand is lit. The colour model cannot tell it from the face (see
    stream/swap/occlusion.py); the hand models of `mask.hands` must."""
    from swapstream.swap.occlusion import CHEEK_IMAGE_LEFT, CHEEK_IMAGE_RIGHT

    eyes, oval, size = _face_geometry(lm, topo)
    xy = lm[:, :2].astype(np.float64)
    cheeks = np.zeros(frame.shape[:2], np.uint8)
    for g in (CHEEK_IMAGE_LEFT, CHEEK_IMAGE_RIGHT):
        cv2.fillConvexPoly(cheeks, cv2.convexHull(np.round(xy[list(g)]).astype(np.int32)), 1)
    tone = np.median(frame[cheeks > 0].reshape(-1, 3).astype(np.float64), axis=0)
    s = 0.62 * size * scale                              # the hand's length, wrist to middle tip
    c = np.array([xy[topo.lips_outer, 0].mean(), oval[:, 1].max() - 0.02 * size])
    a = math.radians(tilt_deg)
    rot = np.array([[math.cos(a), -math.sin(a)], [math.sin(a), math.cos(a)]])

    def p(x: float, y: float) -> tuple[int, int]:
        q = c + rot @ np.array([x * s, y * s])
        return int(round(q[0])), int(round(q[1]))

    m = np.zeros(frame.shape[:2], np.float32)
    palm = np.array([p(-0.21, -0.08), p(0.21, -0.09), p(0.20, 0.18), p(0.13, 0.30), p(-0.11, 0.30),
                     p(-0.20, 0.18)], np.int32)
    cv2.fillConvexPoly(m, palm, 1.0, cv2.LINE_AA)
    for x0, y0, x1, y1, t in ((-0.155, -0.06, -0.20, -0.39, 0.085), (-0.05, -0.085, -0.06, -0.475, 0.09),
                              (0.055, -0.085, 0.07, -0.46, 0.09), (0.155, -0.07, 0.20, -0.35, 0.08)):
        cv2.line(m, p(x0, y0), p(x1, y1), 1.0, max(2, int(t * s)), cv2.LINE_AA)
        cv2.circle(m, p(x1, y1), max(1, int(t * s / 2)), 1.0, -1, cv2.LINE_AA)
    cv2.line(m, p(0.19, 0.18), p(0.375, -0.025), 1.0, max(2, int(0.1 * s)), cv2.LINE_AA)   # thumb
    cv2.circle(m, p(0.375, -0.025), max(1, int(0.05 * s)), 1.0, -1, cv2.LINE_AA)
    shade = 0.72 + 0.28 * np.clip(cv2.GaussianBlur(m, (0, 0), 0.03 * s), 0.0, 1.0)
    col = tone[None, None] * shade[..., None] + rng.normal(0.0, 2.0, frame.shape)
    out = frame.astype(np.float64) * (1.0 - m[..., None]) + col * m[..., None]
    return np.clip(np.rint(out), 0, 255).astype(np.uint8), m > 0.5
