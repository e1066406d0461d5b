"""Check a video file or stream for SwapStream's watermark, frame by frame (`swapstream verify`).

Decodes with PyAV (any container and codec FFmpeg reads, local files or URLs), looks for the mark in
each frame's luma plane (`watermark.detect`, no original needed) and also decodes the sum of all
frames' soft values, which finds a mark that is too weak in any single frame but present throughout.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .errors import InputError, InputNotFoundError
from .watermark import CODED_BITS, Detection, Payload, decode_soft, detect

log = logging.getLogger(__name__)

# Planar formats whose first plane is luma: read it as it is (no conversion, no range change).
_LUMA_FIRST = {"yuv420p", "yuvj420p", "yuv422p", "yuvj422p", "yuv444p", "yuvj444p", "nv12", "nv21",
               "gray", "yuv410p", "yuv411p", "yuv440p"}


@dataclass(frozen=True)
class FrameResult:
    """One frame's verdict."""

    index: int
    """Decode order, from 0."""
    time: float | None
    """Presentation time in seconds, when the stream has timestamps."""
    found: bool
    payload: Payload | None
    score: float
    reason: str


KEEP_FRAMES = 10_000
"""Per-frame results a report keeps, the first ones: a file's first five minutes at 30 fps, a few
MB. A live URL without --max-frames runs without end; past this only the counts grow."""


@dataclass
class VerifyReport:
    """Per-frame results and the summary of one input. The summary counts every frame; `frames`
    holds the first `keep_frames` of them, so that an endless stream does not fill memory."""

    source: str
    width: int = 0
    height: int = 0
    keep_frames: int | None = KEEP_FRAMES
    """How many per-frame results to keep (None: all)."""
    frames: list[FrameResult] = field(default_factory=list)
    """The first `keep_frames` frames' results."""
    frame_count: int = 0
    """Frames checked, kept or not."""
    marked: int = 0
    """Frames in which the mark was found."""
    payloads: Counter[Payload] = field(default_factory=Counter)
    """Frames per payload read."""
    combined: Detection | None = None
    """All frames' soft values decoded together."""
    metadata: dict[str, str] = field(default_factory=dict)
    """The container's tags (where the synthetic-content note is)."""
    stopped_early: str = ""
    """Why decoding stopped before the end (a decode error), if it did."""

    def add(self, r: FrameResult) -> None:
        """Count one frame's result, and keep it while there is room."""
        self.frame_count += 1
        if r.found:
            self.marked += 1
            if r.payload is not None:
                self.payloads[r.payload] += 1
        if self.keep_frames is None or len(self.frames) < self.keep_frames:
            self.frames.append(r)

    @property
    def found(self) -> bool:
        """A mark was found in some frame, or in all frames taken together."""
        return self.marked > 0 or (self.combined is not None and self.combined.found)

    def to_dict(self) -> dict[str, Any]:
        def pay(p: Payload | None) -> dict[str, int] | None:
            return None if p is None else {"product_id": p.product_id, "stream_id": p.stream_id}

        return {
            "source": self.source, "width": self.width, "height": self.height,
            "frames": [{"index": f.index, "time": f.time, "marked": f.found, "payload": pay(f.payload),
                        "score": round(f.score, 4), **({"reason": f.reason} if f.reason else {})}
                       for f in self.frames],
            "frames_omitted": self.frame_count - len(self.frames),
            "summary": {
                "frames": self.frame_count, "marked_frames": self.marked,
                "payloads": [{**(pay(p) or {}), "frames": n} for p, n in self.payloads.most_common()],
                "combined": None if self.combined is None else {
                    "marked": self.combined.found, "payload": pay(self.combined.payload),
                    "score": round(self.combined.score, 4)},
                "mark_found": self.found,
                "metadata": self.metadata,
                **({"stopped_early": self.stopped_early} if self.stopped_early else {}),
            },
        }


def luma_plane(frame: Any) -> np.ndarray:
    """The luma plane of a PyAV VideoFrame as a 2-D uint8 array (a copy)."""
    w, h = frame.width, frame.height
    if frame.format.name in _LUMA_FIRST:
        plane = frame.planes[0]
        return np.frombuffer(plane, np.uint8).reshape(h, plane.line_size)[:, :w].copy()
    return frame.to_ndarray(format="gray")


def _open(source: str) -> Any:
    import av

    is_url = "://" in source
    if not is_url:
        p = Path(source)
        if not p.exists():
            raise InputNotFoundError(f"input '{source}' does not exist. Check the path.")
        if p.is_dir():
            raise InputError(f"input '{source}' is a folder. Give a video file or a URL.")
    try:
        return av.open(source, "r", timeout=(10.0, 10.0) if is_url else None, metadata_errors="replace")
    except (av.error.FFmpegError, OSError, ValueError) as e:
        why = getattr(e, "strerror", None) or str(e).splitlines()[0]
        raise InputError(f"cannot open '{source}' as a video: {why}. Give a video file (MP4, MKV, "
                         f"MOV, WebM, TS...) or a stream URL.") from None


def verify(source: str, *, max_frames: int | None = None,
           on_frame: Callable[[FrameResult], None] | None = None,
           keep_frames: int | None = KEEP_FRAMES) -> VerifyReport:
    """Check every frame of `source` (a path or URL), up to `max_frames`. The report keeps the first
    `keep_frames` per-frame results (None: all); `on_frame` sees every one as it comes."""
    import av

    report = VerifyReport(source, keep_frames=keep_frames)
    container = _open(source)
    with container:
        report.metadata = {k: str(v) for k, v in container.metadata.items()}
        if not container.streams.video:
            raise InputError(f"input '{source}' has no video stream. Give a video file or stream.")
        stream = container.streams.video[0]
        tb = stream.time_base
        total = np.zeros(CODED_BITS)
        n = 0
        try:
            for frame in container.decode(stream):
                luma = luma_plane(frame)
                report.height, report.width = luma.shape
                d = detect(luma)
                t = float(frame.pts * tb) if frame.pts is not None and tb is not None else None
                r = FrameResult(n, t, d.found, d.payload, d.score, d.reason)
                report.add(r)
                total += d.soft
                n += 1
                if on_frame is not None:
                    on_frame(r)
                if max_frames is not None and n >= max_frames:
                    break
        except av.error.FFmpegError as e:
            if n == 0:
                raise InputError(f"cannot decode '{source}': {str(e).splitlines()[0]}. Check that it is "
                                 f"a complete video.") from None
            report.stopped_early = f"decode error after {n} frames: {str(e).splitlines()[0]}"
            log.warning("%s: %s", source, report.stopped_early)
    if n == 0:
        raise InputError(f"input '{source}' has no decodable video frames. Check that it is a complete "
                         f"video file.")
    # Summing soft values over frames adds the mark coherently and the noise incoherently (sqrt(n)).
    report.combined = decode_soft(total / np.sqrt(n)) if np.any(total) else None
    return report
