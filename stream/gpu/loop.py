"""One frame's GPU work, from a decoded frame in GPU memory to an encoder-ready NV12 frame.

Stages, each on its own CUDA stream (CuPy-owned), ordered by events and never by a device-wide sync:
- in: the producer fills an RGB slot of `rgb_ring` on its stream (NVDEC's `copy_to`, which converts
  NV12 to RGB, or an asynchronous upload from pinned memory) and hands over the event that ends it;
- analyse: waits for that event, runs face analysis on the device frame; the host waits here for the
  landmarks (a few KB), the one mid-frame wait, because tracking and the swap geometry need them;
- swap: waits for the analysis, swaps the faces in place, then converts to NV12 into a slot of
  `nv12_ring` (what NVENC takes; x264 takes it after a download);
- out: the caller waits for `InFlight.done` only when it hands the frame to the encoder, so frame n's
  swap overlaps frame n+1's analysis.

`timing=True` brackets every stage with CUDA events, so that per-stage and end-to-end latencies are
measured on the GPU's clock (tools/bench_pipeline.py). NVTX ranges name the host side of each stage.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from ..kernels.nv12 import rgb_to_nv12
from ..types import Face, Frame
from .ring import Ring, Slot

HOST_NV12_MATRIX = "bt601"
"""The matrix of NV12 pictures handed to CPU encoders (x264, aiortc's): the one the CPU path's
RGB -> YUV conversion (swscale's default) uses, so that both paths give players the same untagged
video."""

SwapFn = Callable[[Any, list[Face]], int]
"""Swaps the given faces of a device frame in place and returns how many (FileJob.swap_faces)."""


@contextlib.contextmanager
def nvtx(name: str) -> Iterator[None]:
    """An NVTX range (visible in Nsight Systems), or nothing where NVTX is unavailable."""
    try:
        from cupy.cuda import nvtx as _nvtx

        _nvtx.RangePush(name)
    except Exception:  # NVTX is optional: profiling aid only
        yield
        return
    try:
        yield
    finally:
        _nvtx.RangePop()


def face_picture(image: Any, width: int, height: int, box: Any = None) -> Any:
    """A mid-grey `width` x `height` RGB picture with `image` (RGB) in its middle: what a warm-up
    runs through the analysis and the swap before the first real frame. With `box` (the face's x1,
    y1, x2, y2 in `image`), the face and a margin around it fill `WARM_UP_FACE_HEIGHT` of the
    height, large enough for the short-range detector; the whole image at that height left the
    face too small to find, so warm-ups swapped nothing and the first real face paid for the
    swap's kernels (3.9 s on a fresh H200 machine)."""
    import cv2
    import numpy as np

    if box is not None:
        x1, y1, x2, y2 = (float(v) for v in box[:4])
        cx, cy, half = (x1 + x2) / 2, (y1 + y2) / 2, 0.8 * max(x2 - x1, y2 - y1)
        top, left = max(0, int(cy - half)), max(0, int(cx - half))
        crop = image[top:int(cy + half), left:int(cx + half)]
        image = crop if crop.size else image
    frame = np.full((height, width, 3), 127, np.uint8)
    scale = WARM_UP_FACE_HEIGHT * min(height / image.shape[0], width / image.shape[1])
    face = cv2.resize(image, (max(1, int(image.shape[1] * scale)), max(1, int(image.shape[0] * scale))),
                      interpolation=cv2.INTER_AREA)
    y0, x0 = (height - face.shape[0]) // 2, (width - face.shape[1]) // 2
    frame[y0:y0 + face.shape[0], x0:x0 + face.shape[1]] = face
    return frame


WARM_UP_SIZE = (1280, 720)
"""The picture size the live paths warm up at before their input is known: a webcam's and a
stream's usual. Another size shares what was compiled and captured, and costs only its buffers."""

WARM_UP_FACE_HEIGHT = 0.8
"""The share of a warm-up picture's height that the source face and its margin fill."""


@dataclass
class InFlight:
    """A frame whose GPU work has been queued; `done` marks its NV12 output as complete."""

    index: int
    pts: int | None
    time_base: Fraction | None
    rgb: Slot[Any]
    nv12: Slot[tuple[Any, Any]]
    done: Any
    faces: list[Face]
    swapped: int
    events: dict[str, Any] = field(default_factory=dict)
    """With timing: CUDA events at the stage boundaries (ready, analysed, swapped, done)."""
    host_analyse_s: float = 0.0

    def stage_ms(self) -> dict[str, float]:
        """Per-stage and end-to-end milliseconds on the GPU clock (needs `timing`; after `done`)."""
        import cupy

        e = self.events
        t = cupy.cuda.get_elapsed_time
        return {"analyse": t(e["ready"], e["analysed"]), "swap": t(e["analysed"], e["swapped"]),
                "to_nv12": t(e["swapped"], e["done"]), "end_to_end": t(e["ready"], e["done"])}


class GpuSwapLoop:
    """Analysis, swap and NV12 conversion of frames of one size on dedicated streams (module doc)."""

    def __init__(self, analyser: Any, swap: SwapFn, width: int, height: int, *, slots: int = 3,
                 matrix: str = "bt709", full_range: bool = False, timing: bool = False) -> None:
        import cupy

        self.analyser = analyser
        self.swap = swap
        self.width, self.height = width, height
        self.matrix, self.full_range = matrix, full_range
        self.timing = timing
        self.analyse_stream = cupy.cuda.Stream(non_blocking=True)
        self.swap_stream = cupy.cuda.Stream(non_blocking=True)
        self.rgb_ring: Ring[Any] = Ring(slots, lambda _i: cupy.empty((height, width, 3), cupy.uint8))
        cw = (width + 1) // 2
        self.nv12_ring: Ring[tuple[Any, Any]] = Ring(slots, lambda _i: (
            cupy.empty((height, width), cupy.uint8), cupy.empty(((height + 1) // 2, 2 * cw), cupy.uint8)))
        self.tracks: set[int] = set()

    def _event(self, stream: Any) -> Any:
        import cupy

        ev = cupy.cuda.Event(disable_timing=not self.timing)
        ev.record(stream)
        return ev

    def rgb_slot(self, tag: Any = None) -> Slot[Any]:
        """The next RGB slot to decode or upload into (waits while the frame last in it is in flight)."""
        return self.rgb_ring.acquire(tag)

    def submit(self, slot: Slot[Any], ready: Any, *, index: int, pts: int | None,
               time_base: Fraction | None, start: Any = None) -> InFlight:
        """Queue the work on the frame in `slot`, which is complete once the event `ready` has fired.

        With timing, `start` (an event the producer recorded when the decoded frame was complete,
        before converting or uploading it) is where end-to-end latency starts; without it, `ready`.
        """
        events: dict[str, Any] = {}
        a, s = self.analyse_stream, self.swap_stream
        if self.timing:
            events["ready"] = ready if start is None else start
        frame = Frame(slot.buffer, pts, time_base, index)
        t = time.perf_counter()
        with nvtx("analyse"), a:
            a.wait_event(ready)
            faces = self.analyser.track(frame)
            analysed = self._event(a)
        host_analyse = time.perf_counter() - t
        self.tracks.update(f.track_id for f in faces)
        if self.timing:
            events["analysed"] = analysed
        out = self.nv12_ring.acquire(pts)
        with nvtx("swap"), s:
            s.wait_event(analysed)
            # Called with no faces too: the job's swap step also labels and marks every output
            # frame (FileJob.swap_faces), faceless ones included.
            swapped = self.swap(slot.buffer, faces)
            if self.timing:
                events["swapped"] = self._event(s)
            y, uv = out.buffer
            rgb_to_nv12(slot.buffer, y, uv, matrix=self.matrix,  # type: ignore[arg-type]
                        full_range=self.full_range)
            done = self._event(s)
        if self.timing:
            events["done"] = done
        self.rgb_ring.release(slot, done)
        return InFlight(index, pts, time_base, slot, out, done, faces, swapped, events, host_analyse)

    def download_nv12(self, item: InFlight, stream: Any, out: Any) -> Any:
        """Copy `item`'s NV12 picture into `out`, a (height * 3/2, width) host array (pinned for
        the copy to be asynchronous), on `stream` once the picture is done; the slot is free
        again after the copy. Returns the event that ends the copy: wait for it before reading."""
        h = self.height
        y, uv = item.nv12.buffer
        stream.wait_event(item.done)
        y.get(stream=stream, out=out[:h], blocking=False)
        uv.get(stream=stream, out=out[h:], blocking=False)
        copied = stream.record()
        self.finished(item, copied)
        return copied

    def to_host(self, slot: Slot[Any], ready: Any, *, index: int, pts: int | None,
                time_base: Fraction | None, stream: Any, out: Any) -> tuple[InFlight, dict[str, float]]:
        """One live frame, start to end: `submit`, then `download_nv12` into `out` on `stream`,
        waited for (the one host wait per frame). Returns the flight and the host milliseconds of
        its steps: `analyse` (which waits for the landmarks), `submit_rest` (queueing the swap,
        the label, the mark and the NV12 conversion), `gpu_wait` (the GPU finishing, the copy)."""
        t0 = time.perf_counter()
        flight = self.submit(slot, ready, index=index, pts=pts, time_base=time_base)
        t1 = time.perf_counter()
        with nvtx("download"):
            self.download_nv12(flight, stream, out).synchronize()
        t2 = time.perf_counter()
        return flight, {"analyse": flight.host_analyse_s * 1e3,
                        "submit_rest": (t1 - t0 - flight.host_analyse_s) * 1e3, "gpu_wait": (t2 - t1) * 1e3}

    def finished(self, item: InFlight, consumer_event: Any = None) -> None:
        """The consumer is done with `item`'s NV12 planes (after `consumer_event`, if given)."""
        self.nv12_ring.release(item.nv12, consumer_event if consumer_event is not None else item.done)
