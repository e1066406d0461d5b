"""Pre- and post-processing for the zoo's face detectors: SCRFD / RetinaFace and YOLOface.

Follows FaceFusion's `face_detector.py` (docs/neural.md, "Detectors"), with two deliberate differences:
- Geometry. A frame larger than the detector is shrunk by one factor `scale` (the same on both axes)
  and pasted at the top left of a zero canvas. The shrink is a box average by an integer factor and
  a bilinear warp for the rest, with pixel centres at integer coordinates (the `kernels.warp`
  convention), so that a detector pixel u maps back to the frame at exactly (u + 0.5) / scale - 0.5.
  FaceFusion uses `cv2.resize` to int()-truncated sizes and multiplies by per-axis ratios, which is
  off by up to a detector pixel.
- Thresholds. A candidate is kept when its score is >= the threshold, for both families
  (FaceFusion uses >= for SCRFD and > for YOLOface).

Channel order: FaceFusion feeds these detectors its BGR frames unchanged. Our frames are RGB, so
`prepare_detector_input` flips them to BGR by default, to give the models exactly what FaceFusion
gives them; pass `channel_order="rgb"` to feed RGB instead.

Decoders return float64 arrays in frame pixels (pixel centres at integers): float32 cannot hold
4K-frame coordinates to 1e-4.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from ..kernels._xp import check_array, get_xp
from ..kernels.warp import box_downsample, warp_affine

Family = Literal["scrfd", "retinaface", "yoloface"]
FAMILIES: tuple[str, ...] = ("scrfd", "retinaface", "yoloface")
"""Detector families this module prepares and decodes (RetinaFace decodes like SCRFD)."""

SCRFD_STRIDES = (8, 16, 32)
SCRFD_ANCHORS_PER_CELL = 2
YOLOFACE_STRIDES = (8, 16, 32)
YOLOFACE_ROW = 20
"""cx, cy, w, h, score, then 5 x (x, y, confidence)."""
NMS_IOU = 0.4
"""FaceFusion's IoU for one detector and no extra angles (docs/neural.md, "Detectors")."""

Detections = tuple[np.ndarray, np.ndarray, np.ndarray]
"""boxes (K, 4) x1 y1 x2 y2, scores (K,), key points (K, 5, 2); float64, best score first."""


def letterbox_scale(height: int, width: int, size: int) -> float:
    """The factor a (height, width) frame is shrunk by to fit a size x size detector; 1.0 if it fits."""
    if height <= size and width <= size:
        return 1.0
    return min(size / height, size / width)


def prepare_detector_input(frame_rgb: Any, size: int, family: str, *,
                           channel_order: Literal["bgr", "rgb"] = "bgr") -> tuple[Any, float]:
    """Letterbox an RGB uint8 frame (H, W, 3) into a detector's input tensor.

    The frame is shrunk (keeping its aspect ratio) only if it is larger than `size`, and pasted at the
    top left of a zero canvas. Normalisation: SCRFD / RetinaFace (x - 127.5) / 128, YOLOface x / 255.
    Returns the (1, 3, size, size) float32 tensor (NumPy or CuPy, like the frame) and `scale`, the
    shrink factor (<= 1) that the decoders take to map detections back to frame pixels.
    """
    check_array("frame_rgb", frame_rgb, ndim=3, dtype=np.uint8)
    if frame_rgb.shape[2] != 3:
        raise ValueError(f"frame_rgb must have 3 channels (RGB), got shape {tuple(frame_rgb.shape)}")
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {', '.join(FAMILIES)}; got {family!r}")
    if channel_order not in ("bgr", "rgb"):
        raise ValueError(f"channel_order must be 'bgr' or 'rgb', got {channel_order!r}")
    _check_size(size)
    xp = get_xp(frame_rgb)
    h, w = int(frame_rgb.shape[0]), int(frame_rgb.shape[1])
    scale = letterbox_scale(h, w, size)
    canvas = xp.zeros((size, size, 3), dtype=xp.float32)
    if scale == 1.0:
        canvas[:h, :w] = frame_rgb
    else:
        nh, nw = max(1, round(h * scale)), max(1, round(w * scale))
        factor = max(1, int(1.0 / scale))
        src = frame_rgb
        if factor > 1:
            src = box_downsample(frame_rgb, factor, xp.empty((h // factor, w // factor, 3), xp.uint8))
        # Canvas pixel u sits at frame position (u + 0.5) / scale - 0.5; frame position p sits at
        # (p + 0.5) / factor - 0.5 in the box-averaged image.
        k = 1.0 / (scale * factor)
        m = np.array([[k, 0.0, 0.5 * k - 0.5], [0.0, k, 0.5 * k - 0.5]])
        warp_affine(src, m, canvas[:nh, :nw], border="replicate")
    if channel_order == "bgr":
        canvas = canvas[:, :, ::-1]
    if family == "yoloface":
        canvas = canvas / xp.float32(255.0)
    else:
        canvas = (canvas - xp.float32(127.5)) / xp.float32(128.0)
    tensor = xp.ascontiguousarray(canvas.transpose(2, 0, 1)[None], dtype=xp.float32)
    return tensor, scale


def to_frame(points: np.ndarray, scale: float) -> np.ndarray:
    """Map detector-input coordinates (any shape, x/y interleaved) to frame pixels."""
    points = np.asarray(points, dtype=np.float64)
    if scale == 1.0:
        return points
    return (points + 0.5) / scale - 0.5


def scrfd_anchors(size: int, stride: int) -> np.ndarray:
    """(N, 2) anchor points (x, y) of one SCRFD level in output order: cells row-major, each at
    (col, row) * stride, repeated for the 2 anchors of the cell."""
    fm = size // stride
    rows, cols = np.mgrid[:fm, :fm]
    pts = np.stack([cols, rows], axis=-1).reshape(-1, 2).astype(np.float64) * stride
    return np.repeat(pts, SCRFD_ANCHORS_PER_CELL, axis=0)


def decode_scrfd(outputs: Sequence[Any], size: int, scale: float, score_threshold: float, *,
                 nms_iou: float | None = NMS_IOU) -> Detections:
    """Decode SCRFD / RetinaFace outputs into frame-pixel detections.

    `outputs` are the model's 9 outputs in order [score x3, bbox x3, kps x3] for strides 8/16/32, each
    (N, C) or (1, N, C) with N = (size // stride)^2 * 2. Box = anchor -/+ (l, t, r, b) * stride; key
    points = anchor + d * stride. Candidates scoring >= `score_threshold` go through `nms` at `nms_iou`
    (None skips it) and are mapped to the frame through `scale` (from `prepare_detector_input`).
    """
    _check_size(size)
    if len(outputs) != 3 * len(SCRFD_STRIDES):
        raise ValueError(f"SCRFD/RetinaFace has 9 outputs [score x3, bbox x3, kps x3], got {len(outputs)}")
    boxes, scores, kps = [], [], []
    for i, stride in enumerate(SCRFD_STRIDES):
        n = (size // stride) ** 2 * SCRFD_ANCHORS_PER_CELL
        sc = _host(outputs[i], f"output {i} (scores, stride {stride})", n, 1).reshape(n)
        bb = _host(outputs[i + 3], f"output {i + 3} (boxes, stride {stride})", n, 4)
        kp = _host(outputs[i + 6], f"output {i + 6} (key points, stride {stride})", n, 10)
        sel = np.nonzero(sc >= score_threshold)[0]
        anchors = scrfd_anchors(size, stride)[sel]
        d = bb[sel] * stride
        boxes.append(np.concatenate([anchors - d[:, :2], anchors + d[:, 2:]], axis=1))
        kps.append(anchors[:, None, :] + kp[sel].reshape(-1, 5, 2) * stride)
        scores.append(sc[sel])
    return _finish(np.concatenate(boxes), np.concatenate(scores), np.concatenate(kps), scale, nms_iou)


decode_retinaface = decode_scrfd
"""RetinaFace (retinaface_10g) has SCRFD's output layout and decoding (FaceFusion decodes both alike)."""


def decode_yoloface(outputs: Sequence[Any], size: int, scale: float, score_threshold: float, *,
                    nms_iou: float | None = NMS_IOU) -> Detections:
    """Decode yoloface_8n's output into frame-pixel detections.

    `outputs[0]` is (1, 20, N) or (20, N), N = the cells of the stride 8/16/32 grids (8400 at 640). Its
    transpose has rows [cx, cy, w, h, score, 5 x (x, y, confidence)] in detector pixels. Candidates
    scoring >= `score_threshold` go through `nms` at `nms_iou` (None skips it) and are mapped to the
    frame through `scale`. The key points' confidences are dropped, as FaceFusion does.
    """
    _check_size(size)
    if len(outputs) < 1:
        raise ValueError("yoloface has one output, got none")
    a = _to_numpy(outputs[0])
    n = sum((size // s) ** 2 for s in YOLOFACE_STRIDES)
    if a.ndim == 3 and a.shape[0] == 1:
        a = a[0]
    if a.shape != (YOLOFACE_ROW, n):
        raise ValueError(f"yoloface output must be (1, {YOLOFACE_ROW}, {n}) for size {size}, got "
                         f"{tuple(np.shape(outputs[0]))}; check the detector size")
    rows = a.T
    sel = np.nonzero(rows[:, 4] >= score_threshold)[0]
    r = rows[sel]
    cx, cy, w, h = r[:, 0], r[:, 1], r[:, 2], r[:, 3]
    boxes = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1)
    kps = r[:, 5:].reshape(-1, 5, 3)[:, :, :2]
    return _finish(boxes, r[:, 4], kps, scale, nms_iou)


def nms(boxes: np.ndarray, scores: np.ndarray, iou: float) -> np.ndarray:
    """Greedy non-maximum suppression; returns the indices kept, best score first.

    A box is dropped when its IoU with a kept, better-scoring box is > `iou` (as `cv2.dnn.NMSBoxes`).
    Areas are continuous (x2 - x1) * (y2 - y1), without OpenCV's old +1. Equal scores keep input order.
    """
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    if len(boxes) != len(scores):
        raise ValueError(f"nms: {len(boxes)} boxes but {len(scores)} scores")
    areas = np.clip(boxes[:, 2] - boxes[:, 0], 0, None) * np.clip(boxes[:, 3] - boxes[:, 1], 0, None)
    order = np.argsort(-scores, kind="stable")
    keep: list[int] = []
    while order.size:
        i = int(order[0])
        keep.append(i)
        rest = order[1:]
        ix = np.clip(np.minimum(boxes[i, 2], boxes[rest, 2]) - np.maximum(boxes[i, 0], boxes[rest, 0]),
                     0, None)
        iy = np.clip(np.minimum(boxes[i, 3], boxes[rest, 3]) - np.maximum(boxes[i, 1], boxes[rest, 1]),
                     0, None)
        inter = ix * iy
        union = areas[i] + areas[rest] - inter
        overlap = np.where(union > 0, inter / np.where(union > 0, union, 1.0), 0.0)
        order = rest[overlap <= iou]
    return np.asarray(keep, dtype=np.intp)


# -- helpers ----------------------------------------------------------------------------------------

def _check_size(size: int) -> None:
    if not isinstance(size, (int, np.integer)) or size <= 0 or size % 32:
        raise ValueError(f"detector size must be a positive multiple of 32 (160-640 for the zoo's "
                         f"detectors), got {size!r}")


def _to_numpy(a: Any) -> np.ndarray:
    """A host float64 copy of a NumPy, CuPy or torch array."""
    if hasattr(a, "detach"):
        a = a.detach().cpu().numpy()
    elif hasattr(a, "get") and type(a).__module__.startswith("cupy"):
        a = a.get()
    return np.asarray(a, dtype=np.float64)


def _host(a: Any, what: str, n: int, c: int) -> np.ndarray:
    arr = _to_numpy(a)
    if arr.ndim == 3 and arr.shape[0] == 1:
        arr = arr[0]
    if arr.shape != (n, c):
        raise ValueError(f"SCRFD/RetinaFace {what} must be ({n}, {c}), got {tuple(np.shape(a))}; "
                         f"check the detector size and that the outputs are in model order")
    return arr


def _finish(boxes: np.ndarray, scores: np.ndarray, kps: np.ndarray, scale: float,
            nms_iou: float | None) -> Detections:
    """Sort best first, suppress overlaps, map to frame pixels."""
    boxes = boxes.reshape(-1, 4)
    kps = kps.reshape(-1, 5, 2)
    if nms_iou is None:
        keep = np.argsort(-scores, kind="stable")
    else:
        keep = nms(boxes, scores, nms_iou)
    return to_frame(boxes[keep], scale), scores[keep].astype(np.float64), to_frame(kps[keep], scale)
