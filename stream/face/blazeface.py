"""BlazeFace face detection (MediaPipe short- and full-range models) with our own anchor decoding."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ..engines.litert import LiteRTRunner
from ..kernels._xp import get_xp
from ..kernels.warp import box_downsample, warp_affine
from ..kernels.warp_cpu import box_downsample_fast, warp_affine_fast


class ModelRunner(Protocol):
    """What the face models need from a runner: LiteRTRunner (CPU) or TfliteTorchRunner (GPU)."""

    path: Path
    input_shape: tuple[int, ...]

    def run(self, x: Any) -> list[np.ndarray]: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class AnchorSpec:
    """SSD anchor options of one BlazeFace variant (from MediaPipe's detection graphs)."""

    input_size: int
    strides: tuple[int, ...]
    interpolated_scale: bool
    """True when every layer adds a second anchor per cell (short range), False for one (full range)."""


SHORT_RANGE = AnchorSpec(128, (8, 16, 16, 16), True)
FULL_RANGE = AnchorSpec(192, (4,), False)


def ssd_anchor_centres(spec: AnchorSpec) -> np.ndarray:
    """(N, 2) normalised anchor centres in the order the model emits its boxes.

    BlazeFace uses fixed-size anchors, so only the centres matter. Consecutive layers that share a
    stride share one feature map and contribute anchors per cell, as in MediaPipe's SsdAnchorsCalculator.
    """
    centres: list[np.ndarray] = []
    i = 0
    n = len(spec.strides)
    while i < n:
        j = i
        per_cell = 0
        while j < n and spec.strides[j] == spec.strides[i]:
            per_cell += 2 if spec.interpolated_scale else 1
            j += 1
        fm = math.ceil(spec.input_size / spec.strides[i])
        ys, xs = np.mgrid[0:fm, 0:fm]
        c = np.stack([(xs + 0.5) / fm, (ys + 0.5) / fm], axis=-1).reshape(-1, 1, 2)
        centres.append(np.repeat(c, per_cell, axis=1).reshape(-1, 2))
        i = j
    return np.concatenate(centres).astype(np.float32)


@dataclass
class Detection:
    """One detected face in frame pixel coordinates (pixel centres at integers)."""

    box: np.ndarray
    """(4,) x1, y1, x2, y2."""
    score: float
    keypoints: np.ndarray
    """(6, 2) for a face: subject's right eye, left eye, nose tip, mouth centre, right ear, left
    ear; (7, 2) for a palm: wrist centre, index, middle, ring and pinky finger bases, thumb base
    and thumb joint (MediaPipe's palm detector)."""


def iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of one box `a` (4,) against boxes `b` (N, 4)."""
    ix = np.clip(np.minimum(a[2], b[:, 2]) - np.maximum(a[0], b[:, 0]), 0, None)
    iy = np.clip(np.minimum(a[3], b[:, 3]) - np.maximum(a[1], b[:, 1]), 0, None)
    inter = ix * iy
    area = lambda x: np.clip(x[..., 2] - x[..., 0], 0, None) * np.clip(x[..., 3] - x[..., 1], 0, None)
    return inter / np.maximum(area(a) + area(b) - inter, 1e-9)


def weighted_nms(boxes: np.ndarray, kps: np.ndarray, scores: np.ndarray, iou_thr: float,
                 max_out: int) -> list[tuple[np.ndarray, np.ndarray, float]]:
    """MediaPipe's weighted NMS: overlapping detections are averaged by score, not discarded.

    Averaging the many anchors that fire on one face gives steadier boxes from frame to frame than
    keeping the single best anchor.
    """
    order = np.argsort(-scores)
    boxes, kps, scores = boxes[order], kps[order], scores[order]
    out = []
    alive = np.ones(len(scores), dtype=bool)
    for i in range(len(scores)):
        if not alive[i]:
            continue
        group = alive & (iou(boxes[i], boxes) > iou_thr)
        group[i] = True
        w = scores[group][:, None]
        out.append(((boxes[group] * w).sum(0) / w.sum(), (kps[group] * w[:, :, None]).sum(0) / w.sum(),
                    float(scores[i])))
        alive &= ~group
        if len(out) == max_out:
            break
    return out


class BlazeFaceDetector:
    """Finds faces in an RGB uint8 frame."""

    def __init__(self, model: Path | ModelRunner, spec: AnchorSpec, *, min_score: float = 0.5,
                 nms_iou: float = 0.3, threads: int = 1, reference: bool = False,
                 keypoints: int = 6, unit_input: bool = False) -> None:
        # A path runs the model with LiteRT on the CPU; the GPU analyser passes a runner of its own
        # (engines.tflite_torch) with the same interface, and CuPy frames.
        self.reference = reference
        """NumPy frames are letterboxed with the NumPy reference warps instead of OpenCV (tests)."""
        self.runner: ModelRunner = LiteRTRunner(model, num_threads=threads) \
            if isinstance(model, Path) else model
        self.spec = spec
        self.size = spec.input_size
        if tuple(self.runner.input_shape[1:]) != (self.size, self.size, 3):
            raise ValueError(f"{self.runner.path.name}: expected input 1x{self.size}x{self.size}x3, "
                             f"got {self.runner.input_shape}")
        self.anchors = ssd_anchor_centres(spec)
        self.keypoints = keypoints
        """Keypoints per box: BlazeFace's 6; the palm detector (same SSD head, stage 1 of MediaPipe
        Hands) gives 7."""
        self.unit_input = unit_input
        """Input values in [0, 1] (the palm detector) instead of BlazeFace's [-1, 1]."""
        self.min_score = min_score
        self.nms_iou = nms_iou
        # Work buffers, per array module (NumPy on the CPU path, CuPy on the GPU path).
        self._buffers: dict[Any, Any] = {}

    def _buffer(self, xp: Any, shape: tuple[int, ...]) -> Any:
        key = (xp.__name__, shape)
        buf = self._buffers.get(key)
        if buf is None:
            buf = self._buffers.setdefault(key, xp.empty(shape, dtype=np.uint8))
        return buf

    def _model_input(self, rgb: Any) -> tuple[Any, float, float, float]:
        """The (1, S, S, 3) float32 input in [-1, 1] (or [0, 1]: `unit_input`) and the
        (scale, pad_x, pad_y) of its letterbox."""
        if not type(rgb).__module__.startswith("cupy"):
            canvas, scale, pad_x, pad_y = self._letterbox(rgb)
            if self.unit_input:
                return (canvas.astype(np.float32) / np.float32(255.0))[None], scale, pad_x, pad_y
            return (canvas.astype(np.float32) / np.float32(127.5) - np.float32(1.0))[None], scale, pad_x, pad_y
        return self._letterbox_gpu(rgb)

    def _letterbox_gpu(self, rgb: Any) -> tuple[Any, float, float, float]:
        """`_letterbox` plus normalisation in three launches: box average, then one `crop_batch`
        (bilinear sample and (x/255 - 0.5)/0.5 = x/127.5 - 1), then the padding set to -1 (black).

        Array-op warping (the CPU path's `warp_affine`, written against NumPy) would take about forty
        small launches. Differences from the CPU input: the value is not rounded to uint8 before
        normalising (< 1/255), and the one row or column straddling each letterbox edge is sampled
        with edge replication instead of blending with black.
        """
        import cupy

        from ..kernels.crop import crop_batch

        s = self.size
        src, scale, pad_x, pad_y, m2 = self._reduce(rgb, cupy)
        m = m2.astype(np.float32)[None]
        k = float(m2[0, 0])
        key = ("input", s)
        out = self._buffers.get(key)
        if out is None:
            out = self._buffers.setdefault(key, cupy.empty((1, 3, s, s), cupy.float32))
        # [0, 1] is x/255 (mean 0, std 1), black 0; [-1, 1] is (x/255 - 0.5)/0.5, black -1.
        mean, std, black = ((0.0,) * 3, (1.0,) * 3, 0.0) if self.unit_input else ((0.5,) * 3, (0.5,) * 3, -1.0)
        crop_batch(src, m, out, mean=mean, std=std)
        g = np.arange(s, dtype=np.float64)
        hs, ws = src.shape[:2]
        rows = np.nonzero((g * k + m[0, 1, 2] <= -1.0) | (g * k + m[0, 1, 2] >= hs))[0]
        cols = np.nonzero((g * k + m[0, 0, 2] <= -1.0) | (g * k + m[0, 0, 2] >= ws))[0]
        # Contiguous runs at the two ends: slices, not index arrays, so no upload.
        for idx, axis in ((rows, 2), (cols, 3)):
            for part in (idx[idx < s // 2], idx[idx >= s // 2]):
                if part.size:
                    sl = [slice(None)] * 4
                    sl[axis] = slice(int(part.min()), int(part.max()) + 1)
                    out[tuple(sl)] = black
        return out.transpose(0, 2, 3, 1), scale, pad_x, pad_y

    def _reduce(self, rgb: Any, xp: Any) -> tuple[Any, float, float, float, np.ndarray]:
        """The frame box-averaged by the integer part of the shrink, and the letterbox geometry:
        (reduced frame, scale, pad_x, pad_y, 2x3 canvas pixel -> reduced-frame pixel matrix)."""
        h, w = rgb.shape[:2]
        s = self.size
        scale = s / max(h, w)
        factor = max(1, int(1.0 / scale))
        src = rgb
        if factor > 1:
            # NumPy frames: OpenCV (kernels.warp_cpu), about 25 ms faster at 720p than the reference.
            down = box_downsample_fast if xp is np and not self.reference else box_downsample
            src = down(rgb, factor, self._buffer(xp, (h // factor, w // factor, rgb.shape[2])))
        pad_x = (s - w * scale) / 2.0
        pad_y = (s - h * scale) / 2.0
        # Canvas pixel centre u sits at frame position (u + 0.5 - pad) / scale - 0.5; in the reduced
        # image, frame position p sits at (p + 0.5) / factor - 0.5.
        k = 1.0 / (scale * factor)
        m = np.array([[k, 0.0, (0.5 - pad_x) * k - 0.5],
                      [0.0, k, (0.5 - pad_y) * k - 0.5]])
        return src, scale, pad_x, pad_y, m

    def _letterbox(self, rgb: np.ndarray) -> tuple[np.ndarray, float, float, float]:
        """Fit the frame into the square input, centred, keeping its aspect ratio.

        Returns the canvas and the (scale, pad_x, pad_y) that map canvas pixels back to the frame.
        """
        xp = get_xp(rgb)
        s = self.size
        src, scale, pad_x, pad_y, m = self._reduce(rgb, xp)
        canvas = self._buffer(xp, (s, s, 3))
        warp = warp_affine_fast if xp is np and not self.reference else warp_affine
        warp(src, m, canvas, border="constant", fill=0.0)
        return canvas, scale, pad_x, pad_y

    def __call__(self, rgb: Any, max_faces: int = 64) -> list[Detection]:
        """Detections in an RGB uint8 frame (NumPy, or CuPy with a GPU runner)."""
        x, scale, pad_x, pad_y = self._model_input(rgb)
        raw, cls = self.runner.run(x)
        raw = raw[0]
        # MediaPipe clips logits at +-100; exp(100) still overflows float32, so clip at 80 (same result).
        scores = 1.0 / (1.0 + np.exp(-np.clip(cls[0, :, 0], -80.0, 80.0)))
        sel = np.nonzero(scores >= self.min_score)[0]
        if sel.size == 0:
            return []
        s = float(self.size)
        a = self.anchors[sel]
        r = raw[sel]
        cx = r[:, 0] / s + a[:, 0]
        cy = r[:, 1] / s + a[:, 1]
        bw = r[:, 2] / s
        bh = r[:, 3] / s
        boxes = np.stack([cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2], axis=1)
        k = self.keypoints
        kps = r[:, 4:4 + 2 * k].reshape(-1, k, 2) / s + a[:, None, :]
        dets = []
        for box, kp, score in weighted_nms(boxes, kps, scores[sel], self.nms_iou, max_faces):
            # Normalised canvas coordinates (continuous) -> frame pixel-centre coordinates.
            to_frame = lambda v: (v * s - np.array([pad_x, pad_y])) / scale - 0.5
            b = to_frame(box.reshape(2, 2)).reshape(4)
            dets.append(Detection(b.astype(np.float32), score, to_frame(kp).astype(np.float32)))
        return dets

    def close(self) -> None:
        self.runner.close()
