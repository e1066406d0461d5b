"""Face Mesh: 468 landmarks from a rotated square crop around a face (MediaPipe model via LiteRT)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..engines.litert import LiteRTRunner
from ..engines.tflite_torch import PendingOutputs, TfliteTorchRunner
from ..kernels.warp import warp_affine
from ..kernels.warp_cpu import warp_affine_fast
from .blazeface import Detection, ModelRunner
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

    def pixels_to_frame(self, n: int = INPUT_SIZE) -> np.ndarray:
        """`crop_to_frame` for crop pixel *indices* (index u has continuous coordinate u + 0.5):
        the matrix the crop warps take."""
        m = self.crop_to_frame(n)
        return np.hstack([m[:, :2], (m[:, 2] + m[:, :2] @ np.array([0.5, 0.5]))[:, None]])

    def to_frame(self, coords: np.ndarray, n: int = INPUT_SIZE) -> np.ndarray:
        """A landmark model's (K, 3) crop-space outputs (x, y in crop coordinates, z in crop
        pixels) as float32 frame-space landmarks (z scaled to frame pixels)."""
        m = self.crop_to_frame(n)
        pts = coords.reshape(-1, 3).astype(np.float64)
        lm = np.empty((pts.shape[0], 3), dtype=np.float32)
        lm[:, :2] = pts[:, :2] @ m[:, :2].T + m[:, 2]
        lm[:, 2] = pts[:, 2] * (self.size / n)
        return lm


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


class PendingLandmarks:
    """Landmarks on their way (`FaceMesh.start_frames`); `result()` waits for them."""

    def __init__(self, finish: Callable[[], list[list[tuple[np.ndarray, float]]]]) -> None:
        self._finish = finish

    def result(self) -> list[list[tuple[np.ndarray, float]]]:
        return self._finish()


def _gather(chunks: list[tuple[int, PendingOutputs]]) -> list[tuple[np.ndarray, float]]:
    """Per face, the flat coordinates and the presence logit, from the chunks' pending outputs."""
    res: list[tuple[np.ndarray, float]] = []
    for n, pending in chunks:
        coords, flags = pending.result()
        res += [(coords[i].reshape(-1), float(flags.reshape(n, -1)[i, 0])) for i in range(n)]
    return res


def _split(flat: list[Any], idx: list[list[Any]]) -> list[list[Any]]:
    """`flat` cut into runs as long as the lists of `idx` (one run per frame)."""
    out, at = [], 0
    for ii in idx:
        out.append(flat[at:at + len(ii)])
        at += len(ii)
    return out


class FaceMesh:
    """Runs the landmark model on square ROIs of an RGB uint8 frame."""

    def __init__(self, model: Path | ModelRunner, *, threads: int = 1, reference: bool = False) -> None:
        # A path runs LiteRT on the CPU, one face per call; the GPU analyser passes a batched runner
        # (engines.tflite_torch) and gives CuPy frames.
        self.runner: ModelRunner = LiteRTRunner(model, num_threads=threads) \
            if isinstance(model, Path) else model
        if tuple(self.runner.input_shape[1:]) != (INPUT_SIZE, INPUT_SIZE, 3):
            raise ValueError(f"{self.runner.path.name}: unexpected input shape {self.runner.input_shape}")
        self.max_batch = int(getattr(self.runner, "max_batch", 1))
        # The CPU crop: OpenCV (kernels.warp_cpu), or the NumPy reference it is tested against.
        self._warp = warp_affine if reference else warp_affine_fast
        self._crop = np.empty((INPUT_SIZE, INPUT_SIZE, 3), dtype=np.uint8)
        self._input = np.empty((1, INPUT_SIZE, INPUT_SIZE, 3), dtype=np.float32)
        self._gpu_input: Any = None

    def __call__(self, rgb: Any, roi: Roi) -> tuple[np.ndarray, float]:
        """(468, 3) float32 landmarks in frame pixel-centre coordinates, and the presence score."""
        return self.many(rgb, [roi])[0]

    def many(self, rgb: Any, rois: list[Roi]) -> list[tuple[np.ndarray, float]]:
        """`__call__` for several ROIs of one frame; a CuPy frame is cropped and run as one batch."""
        return self.start_frames([(rgb, rois)]).result()[0]

    def start_frames(self, items: list[tuple[Any, list[Roi]]]) -> PendingLandmarks:
        """The ROIs of several frames (several streams) at once, in two halves: on the GPU every
        face of every frame goes into the same model calls of up to `max_batch`, and the crops, the
        model and the copies of its outputs are queued now; `result()` waits for them (one wait
        for all) and maps the landmarks into the frames. On the CPU the work is done here.

        On the GPU everything is queued on the current CuPy stream, and the model's CUDA graph
        and this mesh's input buffer are reused by the next call: make the calls of one mesh on
        one stream (stream order then keeps each call's outputs until they are copied)."""
        idx = [[roi.pixels_to_frame() for roi in rois] for _rgb, rois in items]
        if items and all(type(rgb).__module__.startswith("cupy") for rgb, _r in items):
            chunks = self._launch_gpu([(rgb, i) for (rgb, _r), ii in zip(items, idx) for i in ii])
            return PendingLandmarks(lambda: self._to_frames(items, _split(_gather(chunks), idx)))
        raws = []
        for (rgb, _r), ii in zip(items, idx):
            raw = []
            for m_idx in ii:
                self._warp(rgb, m_idx, self._crop, border="replicate")
                np.multiply(self._crop, np.float32(1.0 / 255.0), out=self._input[0], casting="unsafe")
                coords, flag = self.runner.run(self._input)
                raw.append((coords.reshape(-1), float(flag.reshape(-1)[0])))
            raws.append(raw)
        done = self._to_frames(items, raws)
        return PendingLandmarks(lambda: done)

    @staticmethod
    def _to_frames(items: list[tuple[Any, list[Roi]]],
                   raws: list[list[tuple[np.ndarray, float]]]) -> list[list[tuple[np.ndarray, float]]]:
        """The model's crop-space outputs as frame-space landmarks and presence probabilities."""
        return [[(roi.to_frame(coords), 1.0 / (1.0 + math.exp(-float(np.clip(flag, -80, 80)))))
                 for roi, (coords, flag) in zip(rois, raw)] for (_rgb, rois), raw in zip(items, raws)]

    def _launch_gpu(self, crops: list[tuple[Any, np.ndarray]]) -> list[tuple[int, PendingOutputs]]:
        """(frame, crop matrix) pairs, possibly of different frames: crops in one buffer, then the
        model in chunks of `max_batch`; returns each chunk's size and pending outputs
        (`TfliteTorchRunner.run_async`)."""
        import cupy

        from ..kernels.crop import crop_batch

        if not isinstance(self.runner, TfliteTorchRunner):
            raise ValueError(f"{self.runner.path.name}: CuPy frames need the GPU runner "
                             "(engines.tflite_torch.TfliteTorchRunner, as GpuFaceAnalyser builds)")
        chunks: list[tuple[int, PendingOutputs]] = []
        for start in range(0, len(crops), self.max_batch):
            chunk = crops[start:start + self.max_batch]
            n = len(chunk)
            if self._gpu_input is None or self._gpu_input.shape[0] < n:
                self._gpu_input = cupy.empty((self.max_batch, 3, INPUT_SIZE, INPUT_SIZE), cupy.float32)
            # One launch per frame crops all of its faces, as x/255 in float32 (the CPU path rounds
            # the crop to uint8 first; the difference is below half a grey level). Reusing the one
            # input buffer for the next chunk is safe: the runner copies it into its graph's input
            # on the same stream before the next crop is written.
            at = 0
            while at < n:
                rgb = chunk[at][0]
                end = at + 1
                while end < n and chunk[end][0] is rgb:
                    end += 1
                crop_batch(rgb, np.stack([c[1] for c in chunk[at:end]]).astype(np.float32),
                           self._gpu_input[at:end])
                at = end
            batch = self._gpu_input[:n]
            chunks.append((n, self.runner.run_async(batch.transpose(0, 2, 3, 1))))
        return chunks

    def close(self) -> None:
        self.runner.close()
