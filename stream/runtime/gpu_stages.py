"""The GPU side of a runtime stream's stages: decode into GPU memory, analysis batched across the
device's streams, and compose (label, watermark, NV12) on the device, so that a frame crosses to
the host once, as NV12 for the encoder, or not at all for a null sink.

```
reader thread                 device thread (one per GPU)                 encode thread
LiveReader packets ─► NVDEC ─► track_many (every stream's frames) ─► swap ─► label, mark, NV12
 (or PyAV + upload)   RGB on       one landmark call for all          batch    ─► pinned host ─► x264
                      the GPU                                                  (null sink: nothing)
```

The CPU implementations of the same stages are the stream's own (`runtime.stream`): PyAV frames, a
LiteRT analyser per stream in its thread, the disclosure on host arrays. A stream takes these when
its device is a GPU; everything else about it (queues, drop policy, batcher, controller, metrics)
is the same object.

Each class keeps to one thread: `GpuDecode` to the stream's reader thread, `DeviceAnalysis` to the
device's analysis thread (its networks and CUDA graphs are not for concurrent calls; the swap
thread with `runtime.analysis_thread` off), `GpuCompose` to the stream's encode thread. Each works
on a CUDA stream of its own and waits for its work before handing a frame on, so the next stage
reads finished data.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from fractions import Fraction
from typing import Any

import numpy as np

from ..config import Config
from ..types import Face, Frame

log = logging.getLogger(__name__)

HOST_NV12_MATRIX = "bt601"
"""The matrix of NV12 handed to x264: the one the CPU path's RGB -> YUV conversion uses (swscale's
default), so both paths give players the same untagged video."""
PINNED_FRAMES = 3
"""Host NV12 buffers per stream: the encoder copies each into x264's frame before the next comes."""
PREVIEW_EVERY_S = 1.0
"""How often a GPU stream copies its output picture to the host for the API's preview."""
HIGHEST_PRIORITY = -1000
"""A CUDA stream priority past any device's range (lower numbers are higher priorities), which CUDA
clamps to the device's highest (`runtime.analysis_priority`)."""


class GpuDecode:
    """Frames of one stream on the GPU: NVDEC decodes the reader's access units into GPU memory
    (NV12 -> RGB on the decoder's stream); without NVDEC, PyAV's host frames are uploaded."""

    def __init__(self, name: str, nvdec: bool, *, max_size: tuple[int, int] | None = None,
                 on_error: Callable[[], None] | None = None, crop_odd: bool = False) -> None:
        """`max_size`: the largest picture the first NVDEC decoder is made for (a WebRTC publisher's
        resolution changes with its bandwidth; None: the first picture's). `on_error`: called when an
        access unit fails to decode, which is then dropped and the next decoder sized to the stream,
        rather than the stream failing (WebRTC: a keyframe is asked for). `crop_odd`: a picture of
        an odd width or height loses its last column or row (a browser's camera may send one;
        4:2:0 needs even sizes) rather than failing the stream."""
        import cupy

        self.name = name
        self.nvdec = nvdec
        self._max_size = max_size
        self._on_error = on_error
        self._crop_odd = crop_odd
        self._failures = 0
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self._decoder: Any = None
        self._key: tuple[str, bool] | None = None
        self.frames = 0
        self.nvdec_frames = 0
        """Of `frames`, those NVDEC decoded (the rest were uploaded)."""

    def decode(self, item: Any) -> list[Frame]:
        """The frames an input item gives: a `VideoPacket` (0 or more frames: a reordering decoder
        holds some back) or a host `Frame` (uploaded)."""
        import cupy

        if isinstance(item, Frame):
            picture = item.data
            if self._crop_odd:
                picture = picture[:picture.shape[0] & ~1, :picture.shape[1] & ~1]
            self._check_size(picture.shape[1], picture.shape[0])
            with self.stream:
                data = cupy.asarray(np.ascontiguousarray(picture))
            self.stream.synchronize()
            self.frames += 1
            return [replace(item, data=data)]
        dec = self._decoder_for(item.codec, item.reorders, item.time_base)
        out = []
        try:
            decoded = dec.decode(item.data, item.pts)
        except Exception as e:  # noqa: BLE001 - any decoder failure; re-raised without a way to recover
            if self._on_error is None:
                raise
            self._failures += 1
            if self._failures == 1 or self._failures % 100 == 0:  # a broken stream fails every unit
                log.warning("stream %s: an access unit failed to decode (%s; %d in a row): dropped, "
                            "keyframe asked for", self.name, e, self._failures)
            self._decoder.close()
            self._decoder = None
            self._max_size = None  # the next decoder takes the stream's size as it is now
            self._on_error()
            return []
        self._failures = 0  # counted again from the next failure: an isolated one is logged
        for f in decoded:
            out.append(self._to_rgb(f, item.pts, item.time_base))
        return out

    def flush(self, time_base: Fraction | None) -> list[Frame]:
        if self._decoder is None:
            return []
        return [self._to_rgb(f, None, time_base) for f in self._decoder.flush()]

    def _decoder_for(self, codec: str, reorders: bool, time_base: Fraction) -> Any:
        from ..gpu.nvdec import NvdecAccessUnits

        if self._decoder is not None and self._key != (codec, reorders):
            # A new publisher with another codec or with B-frames: a decoder of its own.
            self._decoder.close()
            self._decoder = None
        if self._decoder is None:
            # LOW latency gives each frame out of its own access unit; a stream that may reorder
            # needs NVDEC's reordering (NATIVE), as in the live job.
            import cupy

            self._decoder = NvdecAccessUnits(codec=codec, time_base=time_base, name=self.name,
                                             gpu_id=cupy.cuda.Device().id, stream=self.stream,
                                             low_latency=not reorders, max_size=self._max_size)
            self._key = (codec, reorders)
        return self._decoder

    def _check_size(self, width: int, height: int) -> None:
        if width % 2 or height % 2:
            from ..errors import InputError

            # NV12 (the encoders' input) has chroma for 2x2 pixels: an odd size cannot be encoded.
            raise InputError(f"stream {self.name}: its video is {width}x{height}; the GPU path needs an even "
                             f"width and height. Scale it in the encoder, or run the server with "
                             f"--set device=cpu")

    def _to_rgb(self, f: Any, pts: int | None, time_base: Fraction | None) -> Frame:
        import cupy

        if not self._crop_odd:
            self._check_size(f.width, f.height)
        with self.stream:
            rgb = cupy.empty((f.height, f.width, 3), cupy.uint8)
        f.copy_to(rgb).synchronize()  # NV12 -> RGB done before another thread reads it
        if (f.width | f.height) & 1:  # crop_odd: the last column or row goes (a copy, on odd sizes only)
            with self.stream:
                rgb = cupy.ascontiguousarray(rgb[:f.height & ~1, :f.width & ~1])
            self.stream.synchronize()
        self.frames += 1
        self.nvdec_frames += 1
        return Frame(rgb, f.pts if f.pts is not None else pts, time_base, self.frames - 1)

    def close(self) -> None:
        if self._decoder is not None:
            self._decoder.close()
            self._decoder = None


class DeviceAnalysis:
    """One GPU's face analysis: one `GpuFaceAnalyser` (networks, CUDA graphs), one tracker per
    stream, and `track_many` over the frames that several streams submitted together. Built and used
    in the device's analysis thread only; closed by the swap thread once that thread has stopped."""

    def __init__(self, config: Config) -> None:
        import cupy

        from ..gpu.analyser import GpuFaceAnalyser

        # CUDA clamps a priority past the device's range to its end: this is the highest there is.
        # The landmark graphs are replayed on this stream, so they run at its priority.
        self.stream = cupy.cuda.Stream(non_blocking=True,
                                       priority=HIGHEST_PRIORITY if config.runtime.analysis_priority else None)
        with self.stream:
            # Landmark batches as large as an analysis batch of one-face frames (manager.ANALYSIS_BATCH).
            self.analyser = GpuFaceAnalyser(config, mesh_batch=8)
            t0 = time.perf_counter()
            # Every landmark batch size before the first frame: a size met mid-stream is a stall
            # of seconds (its CUDA graph is captured then).
            captured = self.analyser.prepare()
        log.info("GPU analysis ready in %.1f s: %s", time.perf_counter() - t0, captured)
        self._trackers: dict[str, Any] = {}

    def track(self, items: list[tuple[str, Frame, Config]]) -> list[list[Face]]:
        """Faces of each (stream id, frame, stream config), with each stream's own tracks."""
        from ..face.analyser import track_many

        pairs = []
        for sid, frame, cfg in items:
            t = self._trackers.get(sid)
            if t is None:
                t = self._trackers[sid] = self.analyser.tracker()
                # The stream's own config: its preset's cadence and tracking settings, and the
                # detector cadence the degradation controller changes for this stream alone. The
                # networks are the device's, whatever it says.
                t.config = cfg
            pairs.append((t, frame))
        with self.stream:
            found = track_many(pairs)
            self.stream.synchronize()
        return found

    def forget(self, stream_id: str) -> None:
        self._trackers.pop(stream_id, None)

    def close(self) -> None:
        self._trackers.clear()
        self.analyser.close()


class GpuCompose:
    """One stream's output on the GPU: the label and the watermark drawn on the device frame, then
    NV12 and one download into pinned memory for the encoder (none for a null sink)."""

    def __init__(self, disclosure: Any, matrix: str = HOST_NV12_MATRIX) -> None:
        import cupy

        self.disclosure = disclosure
        self.matrix = matrix
        """The NV12 conversion's matrix (limited range): what the sinks' encoders tag, or assume."""
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self._nv12: Any = None
        self._pinned: list[Any] = []
        self._next = 0
        self._preview_at = 0.0

    def compose(self, frame: Frame, swapped: bool, download: bool) -> np.ndarray | None:
        """Apply the disclosure in place; the NV12 picture on the host when `download`. Returns when
        the device work is done (the frame's latency ends with it)."""
        import cupy
        import cupyx

        from ..kernels.nv12 import rgb_to_nv12

        rgb = frame.data
        h, w = rgb.shape[:2]
        with self.stream:
            self.disclosure.apply(rgb, swapped)
            if not download:
                self.stream.synchronize()
                return None
            if self._nv12 is None or self._nv12.shape != (h * 3 // 2, w):
                self._nv12 = cupy.empty((h * 3 // 2, w), cupy.uint8)
                self._pinned = [cupyx.empty_pinned((h * 3 // 2, w), np.uint8) for _ in range(PINNED_FRAMES)]
            rgb_to_nv12(rgb, self._nv12[:h], self._nv12[h:], matrix=self.matrix)
            host = self._pinned[self._next % len(self._pinned)]
            self._next += 1
            self._nv12.get(stream=self.stream, out=host, blocking=False)
            self.stream.synchronize()
        return host

    def preview(self, frame: Frame) -> np.ndarray | None:
        """The frame on the host for the API's preview, at most every PREVIEW_EVERY_S."""
        now = time.monotonic()
        if now - self._preview_at < PREVIEW_EVERY_S:
            return None
        self._preview_at = now
        with self.stream:
            host = frame.data.get(stream=self.stream)
        return host
