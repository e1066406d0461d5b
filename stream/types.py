"""The two values that flow through every stage: a `Frame` and the `Face`s found in it."""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Literal, Protocol

import numpy as np

PixelFormat = Literal["rgb24", "nv12"]


@dataclass
class Frame:
    """One picture and its timing. `data` is HxWx3 uint8 RGB (or NV12) on the host or the GPU."""

    data: Any
    """NumPy or CuPy array; RGB frames are HxWx3 uint8, NV12 frames are (H*3/2)xW uint8."""
    pts: int | None
    """Presentation timestamp in `time_base` units, as the source gave it (None if it gave none)."""
    time_base: Fraction
    """Seconds per `pts` tick."""
    index: int = 0
    """Position of the frame in its stream, counted from 0 in decode order of presentation."""
    stream_id: str = "0"
    """Which stream the frame belongs to, for multi-stream runtimes."""
    format: PixelFormat = "rgb24"
    """Pixel layout of `data`."""

    @property
    def height(self) -> int:
        rows = int(self.data.shape[0])
        return rows * 2 // 3 if self.format == "nv12" else rows

    @property
    def width(self) -> int:
        return int(self.data.shape[1])

    @property
    def time(self) -> float | None:
        """Presentation time in seconds."""
        # A source may know the order of its frames but not their clock (a raw H.264 stream).
        return None if self.pts is None or self.time_base is None else float(self.pts * self.time_base)


# The five alignment points, in the order every warp template uses (docs/neural.md, "Warp templates").
FIVE_POINT_NAMES: tuple[str, ...] = (
    "image_left_eye",
    "image_right_eye",
    "nose_tip",
    "image_left_mouth",
    "image_right_mouth",
)


@dataclass
class Face:
    """One detected face in one frame, in that frame's pixel coordinates."""

    box: np.ndarray
    """(4,) float32 x1, y1, x2, y2."""
    score: float
    """Detector confidence in [0, 1]."""
    kps: np.ndarray
    """(5, 2) float32 alignment points in `FIVE_POINT_NAMES` order."""
    landmarks: np.ndarray | None = None
    """(468, 3) float32 dense mesh (x, y in pixels; z relative depth in pixels) when available."""
    embedding: np.ndarray | None = None
    """Raw identity embedding, where a recogniser computed one."""
    track_id: int = -1
    """Stable id of this face across frames of one stream (-1 before tracking)."""
    extras: dict[str, Any] = field(default_factory=dict)
    """Analyser-specific data (e.g. the landmark ROI used for tracking)."""

    @property
    def size(self) -> float:
        return float(max(self.box[2] - self.box[0], self.box[3] - self.box[1]))


class FaceSwapper(Protocol):
    """What every swapper of a frame is (the built-in mesh swapper, the neural swapper): one source
    identity, then faces swapped into frames in place, on the host or on the device."""

    def set_source(self, image: Any, face: Face) -> None:
        """Take the identity to swap in from `face` in `image` (RGB)."""
        ...

    def swap(self, frame: Any, faces: list[Face]) -> int:
        """Swap `faces` into `frame` (HxWx3 uint8 RGB, NumPy or CuPy) in place; returns how many were
        swapped (a face without the landmarks the swapper needs is left as it is)."""
        ...
