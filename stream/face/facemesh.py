"""Face Mesh: 468 landmarks from a rotated square crop around a face (MediaPipe model via LiteRT)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..engines.litert import LiteRTRunner
from ..kernels.warp import warp_affine
from .blazeface import Detection
from .topology import IMAGE_LEFT_EYE_OUTER, IMAGE_RIGHT_EYE_OUTER

INPUT_SIZE = 192


@dataclass(frozen=True)
class Roi:
    """A rotated square in frame pixel-centre coordinates."""

    cx: float
    cy: float
    size: float
    angle: float
    """Radians; the crop is rotated by this so that the eyes come out level."""

    def crop_to_frame(self, n: int = INPUT_SIZE) -> np.ndarray:
        """2x3 matrix from crop *continuous* coordinates (0..n) to frame pixel-centre coordinates."""
        c, s = math.cos(self.angle), math.sin(self.angle)
        k = self.size / n
        a = np.array([[c * k, -s * k], [s * k, c * k]])
        # Crop point n/2 (its centre) lands on the ROI centre.
        t = np.array([self.cx, self.cy]) - a @ np.array([n / 2.0, n / 2.0])
        return np.hstack([a, t[:, None]])


def _roi_from_points(box: np.ndarray, p_from: np.ndarray, p_to: np.ndarray, scale: float) -> Roi:
    # Rotation that makes the eye-to-eye vector horizontal (MediaPipe's target angle 0).
    angle = math.atan2(float(p_to[1] - p_from[1]), float(p_to[0] - p_from[0]))
    w, h = float(box[2] - box[0]), float(box[3] - box[1])
    return Roi(float(box[0] + box[2]) / 2, float(box[1] + box[3]) / 2, max(w, h) * scale, angle)


def roi_from_detection(det: Detection, scale: float = 1.5) -> Roi:
    """Landmark ROI from a BlazeFace detection: box centre, eyes for rotation, 1.5x the long side."""
    return _roi_from_points(det.box, det.keypoints[0], det.keypoints[1], scale)


def roi_from_landmarks(landmarks: np.ndarray, scale: float = 1.5) -> Roi:
    """Landmark ROI for the next frame from this frame's landmarks (MediaPipe's tracking path)."""
    xy = landmarks[:, :2]
    box = np.concatenate([xy.min(axis=0), xy.max(axis=0)])
    return _roi_from_points(box, xy[IMAGE_LEFT_EYE_OUTER], xy[IMAGE_RIGHT_EYE_OUTER], scale)


class FaceMesh:
    """Runs the landmark model on one ROI of an RGB uint8 frame."""

    def __init__(self, model_path: Path, *, threads: int = 1) -> None:
        self.runner = LiteRTRunner(model_path, num_threads=threads)
        if self.runner.input_shape != (1, INPUT_SIZE, INPUT_SIZE, 3):
            raise ValueError(f"{model_path.name}: unexpected input shape {self.runner.input_shape}")
        self._crop = np.empty((INPUT_SIZE, INPUT_SIZE, 3), dtype=np.uint8)
        self._input = np.empty((1, INPUT_SIZE, INPUT_SIZE, 3), dtype=np.float32)

    def __call__(self, rgb: np.ndarray, roi: Roi) -> tuple[np.ndarray, float]:
        """(468, 3) float32 landmarks in frame pixel-centre coordinates, and the presence score."""
        m = roi.crop_to_frame()
        # Crop pixel index u has continuous coordinate u + 0.5.
        m_idx = m.copy()
        m_idx[:, 2] += m[:, :2] @ np.array([0.5, 0.5])
        warp_affine(rgb, m_idx, self._crop, border="replicate")
        np.multiply(self._crop, np.float32(1.0 / 255.0), out=self._input[0], casting="unsafe")
        coords, flag = self.runner.run(self._input)
        pts = coords.reshape(-1, 3).astype(np.float64)
        out = np.empty((pts.shape[0], 3), dtype=np.float32)
        out[:, :2] = pts[:, :2] @ m[:, :2].T + m[:, 2]
        out[:, 2] = pts[:, 2] * (roi.size / INPUT_SIZE)
        presence = 1.0 / (1.0 + math.exp(-float(np.clip(flag.reshape(-1)[0], -80, 80))))
        return out, presence

    def close(self) -> None:
        self.runner.close()
