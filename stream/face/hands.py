"""Hands in front of a face (`mask.hands`): MediaPipe Hands' palm detector and hand landmark model.

The occlusion mask's colour model (swap/occlusion.py) cannot tell a hand of the target's own skin
tone from the face it covers. The hand models can: this module finds hands as 21 landmarks each,
and the occlusion mask keeps the target wherever a hand's outline lies (`hand_mask`).

The two stages are MediaPipe's (modules/palm_detection and modules/hand_landmark, complexity 1,
from the same 0.10.21 wheel as the face models):

1. the palm detector, an SSD with BlazeFace's head (2016 anchors, strides 8/16/16/16 on a 192x192
   letterbox, input in [0, 1]) gives a box and 7 keypoints per palm;
2. the region of interest: rotated so that the wrist-to-middle-finger line points up, shifted half
   a box towards the fingers and grown to 2.6 times the box's long side, which holds the whole
   hand with its fingers spread;
3. the landmark model reads a 224x224 crop of that region: 21 landmarks (in crop pixels) and a
   hand-presence probability;
4. in video the next frame's region comes from this frame's landmarks (2 times their rotated box,
   shifted a tenth towards the fingers), so the palm detector runs only on its cadence
   (`mask.hands_detect_every`) to find new hands.

Landmark order (MediaPipe's): 0 wrist; thumb 1-4; index 5-8; middle 9-12; ring 13-16; pinky 17-20
(each finger from its base joint to its tip).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from ..engines.litert import LiteRTRunner
from ..kernels.warp_cpu import warp_affine_fast
from .blazeface import AnchorSpec, BlazeFaceDetector, Detection, ModelRunner, iou
from .facemesh import Roi

PALM_SPEC = AnchorSpec(192, (8, 16, 16, 16), True)
"""The palm detector's anchors: BlazeFace short range's layout on a 192x192 input."""
PALM_KEYPOINTS = 7
INPUT_SIZE = 224
"""The hand landmark model's input side."""

# Region of interest from a palm (MediaPipe's palm_detection_detection_to_roi) and from the last
# frame's landmarks (hand_landmark_landmarks_to_roi).
_PALM_SCALE, _PALM_SHIFT = 2.6, -0.5
_TRACK_SCALE, _TRACK_SHIFT = 2.0, -0.1
# The landmarks the tracking region is fitted to: the wrist, the thumb's lower joints and each
# finger's two lowest joints. Fingertips move fastest and are left out, as MediaPipe does.
_TRACK_SUBSET = (0, 1, 2, 3, 5, 6, 9, 10, 13, 14, 17, 18)
WRIST, INDEX_BASE, MIDDLE_BASE, RING_BASE, PINKY_BASE = 0, 5, 9, 13, 17
_MIDDLE_PIP = 10
FINGERS: tuple[tuple[int, ...], ...] = ((1, 2, 3, 4), (5, 6, 7, 8), (9, 10, 11, 12), (13, 14, 15, 16),
                                        (17, 18, 19, 20))
PALM: tuple[int, ...] = (0, 1, 2, 5, 9, 13, 17)
# A finger is about a fifth as wide as the palm is long (wrist to middle-finger base, ~9.5 cm for
# an adult, fingers ~1.6-2 cm); drawn a little wider, so that the edge blur does not eat into it.
_FINGER_WIDTH = 0.26
# Two tracked hands whose landmark boxes overlap this much are one hand found twice.
_SAME_HAND_IOU = 0.4


def _normalise(angle: float) -> float:
    return angle - 2.0 * math.pi * math.floor((angle + math.pi) / (2.0 * math.pi))


def upright_angle(p_from: np.ndarray, p_to: np.ndarray) -> float:
    """The crop rotation (Roi.angle) that makes the vector p_from -> p_to point up in the crop
    (MediaPipe's target angle of 90 degrees, with image y pointing down)."""
    return _normalise(math.pi / 2.0 - math.atan2(-float(p_to[1] - p_from[1]), float(p_to[0] - p_from[0])))


def _region(cx: float, cy: float, w: float, h: float, angle: float, scale: float, shift_y: float) -> Roi:
    """MediaPipe's RectTransformationCalculator: shift along the rotated box's own y axis by
    `shift_y` of its height, make it square on its long side, scale it."""
    dx = -h * shift_y * math.sin(angle)
    dy = h * shift_y * math.cos(angle)
    return Roi(cx + dx, cy + dy, max(w, h) * scale, angle)


def roi_from_palm(det: Detection) -> Roi:
    """The hand's region from a palm detection: wrist (keypoint 0) to middle-finger base (2) up."""
    b = det.box.astype(np.float64)
    angle = upright_angle(det.keypoints[0], det.keypoints[2])
    return _region((b[0] + b[2]) / 2.0, (b[1] + b[3]) / 2.0, b[2] - b[0], b[3] - b[1], angle,
                   _PALM_SCALE, _PALM_SHIFT)


def roi_from_hand(landmarks: np.ndarray) -> Roi:
    """The next frame's region from this frame's landmarks (MediaPipe's HandLandmarksToRect): the
    rotation from the wrist to the mean of the index, middle and ring finger bases (the middle
    counted as much as the other two together), the box of `_TRACK_SUBSET` in that rotation."""
    pts = landmarks[list(_TRACK_SUBSET), :2].astype(np.float64)
    xy = landmarks[:, :2].astype(np.float64)
    top = ((xy[INDEX_BASE] + xy[RING_BASE]) / 2.0 + xy[MIDDLE_BASE]) / 2.0
    angle = upright_angle(xy[WRIST], top)
    c0 = (pts.min(axis=0) + pts.max(axis=0)) / 2.0
    c, s = math.cos(angle), math.sin(angle)
    to_box = np.array([[c, s], [-s, c]])             # rotation by -angle
    proj = (pts - c0) @ to_box.T
    lo, hi = proj.min(axis=0), proj.max(axis=0)
    centre = to_box.T @ ((lo + hi) / 2.0) + c0
    return _region(float(centre[0]), float(centre[1]), float(hi[0] - lo[0]), float(hi[1] - lo[1]),
                   angle, _TRACK_SCALE, _TRACK_SHIFT)


def hand_box(landmarks: np.ndarray) -> np.ndarray:
    """(4,) x1, y1, x2, y2 of a hand's landmarks, grown by half a finger's width."""
    xy = landmarks[:, :2]
    pad = 0.5 * finger_width(landmarks)
    return np.concatenate([xy.min(axis=0) - pad, xy.max(axis=0) + pad]).astype(np.float32)


def finger_width(landmarks: np.ndarray) -> float:
    """The drawn finger width in the landmarks' units (see `_FINGER_WIDTH`)."""
    xy = landmarks[:, :2].astype(np.float64)
    return _FINGER_WIDTH * float(np.hypot(*(xy[MIDDLE_BASE] - xy[WRIST])))


def hand_mask(hands: list[np.ndarray], m: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """The hands' outlines as a (h, w) uint8 0/1 mask: each hand's palm (the convex hull of the
    wrist, the thumb's lower joints and the finger bases) and its fingers (thick polylines from the
    palm to each tip), mapped into the mask by the 2x3 matrix `m` (frame pixels -> mask pixels,
    a similarity), with 1/16-pixel vertex precision."""
    h, w = size
    out = np.zeros((h, w), np.uint8)
    scale = math.hypot(float(m[0, 0]), float(m[0, 1]))
    for lm in hands:
        xy = lm[:, :2].astype(np.float64) @ m[:, :2].T + m[:, 2]
        q = np.round(xy * 16.0).astype(np.int32)
        thick = max(1, int(round(finger_width(lm) * scale)))
        cv2.fillConvexPoly(out, cv2.convexHull(q[list(PALM)]), 1, cv2.LINE_8, shift=4)
        # The palm's own outline drawn thick as well: the hull runs through joint centres, half a
        # finger inside the skin's edge.
        cv2.polylines(out, [cv2.convexHull(q[list(PALM)])], True, 1, thick, cv2.LINE_8, shift=4)
        for f in FINGERS:
            # The thumb from the wrist; the other fingers from their bases, inside the palm.
            chain = q[[WRIST, *f]] if f[0] == 1 else q[list(f)]
            cv2.polylines(out, [chain], False, 1, thick, cv2.LINE_8, shift=4)
    return out


class HandLandmarker:
    """Runs the hand landmark model on a rotated square region of an RGB uint8 frame."""

    def __init__(self, model: Path | ModelRunner, *, threads: int = 1) -> None:
        self.runner: ModelRunner = LiteRTRunner(model, num_threads=threads) \
            if isinstance(model, Path) else model
        if tuple(self.runner.input_shape[1:]) != (INPUT_SIZE, INPUT_SIZE, 3):
            raise ValueError(f"{self.runner.path.name}: expected input 1x{INPUT_SIZE}x{INPUT_SIZE}x3, "
                             f"got {self.runner.input_shape}")
        self._crop = np.empty((INPUT_SIZE, INPUT_SIZE, 3), np.uint8)
        self._input = np.empty((1, INPUT_SIZE, INPUT_SIZE, 3), np.float32)
        self._gpu_input: Any = None

    def __call__(self, rgb: Any, roi: Roi) -> tuple[np.ndarray, float]:
        """(21, 3) float32 landmarks in frame pixel-centre coordinates (z in pixels, relative to
        the wrist) and the hand-presence probability."""
        m_idx = roi.pixels_to_frame(INPUT_SIZE)
        if type(rgb).__module__.startswith("cupy"):
            outs = self._run_gpu(rgb, m_idx)
        else:
            warp_affine_fast(rgb, m_idx, self._crop, border="replicate")
            np.multiply(self._crop, np.float32(1.0 / 255.0), out=self._input[0], casting="unsafe")
            outs = self.runner.run(self._input)
        coords, presence = np.asarray(outs[0]), np.asarray(outs[1])
        # The model's flag is already a probability (MediaPipe thresholds it at 0.5 as it is).
        return roi.to_frame(coords, INPUT_SIZE), float(presence.reshape(-1)[0])

    def _run_gpu(self, rgb: Any, m_idx: np.ndarray) -> list[np.ndarray]:
        import cupy

        from ..kernels.crop import crop_batch

        if self._gpu_input is None:
            self._gpu_input = cupy.empty((1, 3, INPUT_SIZE, INPUT_SIZE), cupy.float32)
        # x/255 in float32, as the CPU path (which rounds to uint8 first: < half a grey level).
        crop_batch(rgb, m_idx[None].astype(np.float32), self._gpu_input)
        return [np.asarray(o.get() if hasattr(o, "get") else o)
                for o in self.runner.run(self._gpu_input.transpose(0, 2, 3, 1))]

    def close(self) -> None:
        self.runner.close()


@dataclass
class _Hand:
    landmarks: np.ndarray
    presence: float


def _same_hand(det: Detection, landmarks: np.ndarray) -> bool:
    """Whether a palm detection is a hand already followed: its wrist and middle-finger base
    keypoints both within half a palm length of that hand's (boxes would not do: a spread thumb
    reaches over a neighbouring hand's palm)."""
    xy = landmarks[:, :2].astype(np.float64)
    reach = 0.5 * float(np.hypot(*(xy[MIDDLE_BASE] - xy[WRIST])))
    kp = det.keypoints.astype(np.float64)
    return bool(np.hypot(*(kp[0] - xy[WRIST])) < reach and np.hypot(*(kp[2] - xy[MIDDLE_BASE])) < reach)


class HandTracker:
    """Hands in the frames of one stream: followed from frame to frame by the landmark model,
    found by the palm detector every `detect_every` frames."""

    def __init__(self, palm: BlazeFaceDetector, landmarker: HandLandmarker, *, max_hands: int = 2,
                 detect_every: int = 3, min_presence: float = 0.5) -> None:
        if palm.keypoints != PALM_KEYPOINTS:
            raise ValueError(f"the palm detector must give {PALM_KEYPOINTS} keypoints per box")
        self.palm = palm
        self.landmarker = landmarker
        self.max_hands = max_hands
        self.detect_every = max(1, detect_every)
        self.min_presence = min_presence
        self._hands: list[_Hand] = []
        self._frames = 0
        self._owns_models = True

    def tracker(self) -> HandTracker:
        """Another tracker over the same networks, with hands of its own (one per stream)."""
        other = HandTracker(self.palm, self.landmarker, max_hands=self.max_hands,
                            detect_every=self.detect_every, min_presence=self.min_presence)
        other._owns_models = False
        return other

    def reset(self) -> None:
        self._hands = []
        self._frames = 0

    def detect(self, rgb: Any) -> list[np.ndarray]:
        """The hands of a still image (no tracking state is touched)."""
        found: list[np.ndarray] = []
        for det in self.palm(rgb, self.max_hands):
            lm, p = self.landmarker(rgb, roi_from_palm(det))
            if p >= self.min_presence:
                found.append(lm)
        return found

    def track(self, rgb: Any) -> list[np.ndarray]:
        """(21, 3) landmarks of each hand in the next video frame."""
        kept: list[_Hand] = []
        for hand in self._hands:
            lm, p = self.landmarker(rgb, roi_from_hand(hand.landmarks))
            if p < self.min_presence:
                continue
            box = hand_box(lm)
            # Two tracks that converged on one hand: keep the first.
            if all(iou(box, hand_box(o.landmarks)[None])[0] < _SAME_HAND_IOU for o in kept):
                kept.append(_Hand(lm, p))
        self._hands = kept
        if self._frames % self.detect_every == 0 and len(kept) < self.max_hands:
            for det in self.palm(rgb, self.max_hands + len(kept)):
                if len(self._hands) >= self.max_hands:
                    break
                if any(_same_hand(det, h.landmarks) for h in self._hands):
                    continue
                lm, p = self.landmarker(rgb, roi_from_palm(det))
                if p < self.min_presence:
                    continue
                self._hands.append(_Hand(lm, p))
        self._frames += 1
        return [h.landmarks for h in self._hands]

    def close(self) -> None:
        if self._owns_models:
            self.palm.close()
            self.landmarker.close()


def hands_near(hands: list[np.ndarray], face_box: np.ndarray) -> list[np.ndarray]:
    """The hands whose outline box meets a face's box: the ones that can be in front of it."""
    out = []
    for lm in hands:
        b = hand_box(lm)
        if b[0] < face_box[2] and b[2] > face_box[0] and b[1] < face_box[3] and b[3] > face_box[1]:
            out.append(lm)
    return out
