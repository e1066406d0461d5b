"""The live job on the GPU: RTMP (or a file played live) in, NVDEC, the GPU swap loop, x264 out.

The reader thread only demuxes: each video packet goes through FFmpeg's mp4toannexb filter and,
as an Annex-B access unit, to NVDEC (`NvdecAccessUnits`), so the picture is decoded straight into
GPU memory. From there `GpuSwapLoop` analyses, swaps and converts to NV12 on its own streams, and
only the NV12 picture comes back to the host, where x264 takes it without a colour conversion
(NVENC where the GPU has one is the next step; the H200 this was measured on has none).

Compressed packets cannot be dropped (later frames refer to them): every packet is decoded, and a
decoded frame with `buffer_frames` or more packets waiting behind it skips the swap and is counted
as dropped, which keeps the output live when the swap falls behind. Without PyNvVideoCodec the job
decodes on the CPU (PyAV) and uploads each frame instead.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any

from ..errors import InputError
from ..live.job import LiveFrame, LiveJob, LiveStats
from ..live.streams import LiveReader, VideoPacket
from ..redact import RedactingFilter
from ..types import Frame
from .job import GpuFileJob
from .loop import HOST_NV12_MATRIX, WARM_UP_SIZE, GpuSwapLoop, face_picture, nvtx
from .ring import Ring

log = logging.getLogger(__name__)
log.addFilter(RedactingFilter())  # its lines quote input and output URLs: no stream keys

FIRST_ITEMS = 8
"""Input items whose timings `first_items` keeps (where a slow start goes)."""

STEPS_KEPT = 1800
"""Frames whose step timings `steps_ms` keeps: a minute at 30 fps, bounded for long runs."""

PINNED_SLOTS = 4
"""Host NV12 buffers for the frames of one `_live_frames` call (one in low-latency decoding); the
writers copy each into their encoder before the next call."""


class GpuLiveJob(LiveJob, GpuFileJob):
    """`LiveJob` with NVDEC decoding and the swap on the GPU (module doc). Construct like `FileJob`."""

    ENCODER_THREAD = False  # its frames are slots of a ring of pinned buffers, reused after a few frames
    nvdec_frames = 0
    """Frames the last run decoded on NVDEC (0 when it decoded on the CPU)."""
    warm_up_ms = 0.0

    def _live_reader(self, url: str, *, reconnect_seconds: float, loop: bool) -> LiveReader:
        """The input, and the run's GPU state: the decoder's (or upload's) stream, the download
        stream; the decoder and the swap loop come with the first frame's size."""
        import cupy

        from .pynvc import nvdec_available

        ok, why = nvdec_available()
        if not ok:
            log.warning("live input '%s' is decoded on the CPU and uploaded: %s", url, why)
        self._url = url
        self._upload = cupy.cuda.Stream(non_blocking=True)
        self._download = cupy.cuda.Stream(non_blocking=True)
        self._decoder: Any = None
        self._loop: GpuSwapLoop | None = None
        self._index = 0
        self._nvdec_warm = 0
        self.nvdec_frames = 0
        self._last_pts: int | None = None
        self.first_items: list[dict[str, Any]] = []
        """Per input item, the first few: decode and swap milliseconds, frames out, backlog."""
        self._last_timing: dict[str, Any] = {}
        self.steps_ms: deque[dict[str, float]] = deque(maxlen=STEPS_KEPT)
        """Per swapped frame, the newest: host milliseconds of its steps (`GpuSwapLoop.to_host`)."""
        self._reader = LiveReader(url, reconnect_seconds=reconnect_seconds, loop=loop, realtime=True,
                                  packets=ok, outbound=self._outbound())
        return self._reader

    def _live_frames(self, item: Frame | VideoPacket, backlog: int, buffer_frames: int,
                     stats: LiveStats) -> list[LiveFrame]:
        if isinstance(item, Frame):  # no NVDEC: the pump dropped what was too old already
            loop = self._swap_loop(item.data.shape[1], item.data.shape[0])
            slot = loop.rgb_slot(item.pts)
            with nvtx("upload"):
                slot.buffer.set(item.data, stream=self._upload)
                ready = self._upload.record()
            return [self._swap(loop, slot, ready, item.pts, item.time_base)]
        held: list[LiveFrame] = []
        dec = self._decoder
        if dec is not None and (dec.codec, not dec.low_latency) != (item.codec, item.reorders):
            # A new publisher with another codec, or with B-frames where the last had none: its
            # own decoder; what the old one still holds goes out first.
            held = self._live_end(stats)
            for h in held:
                h.data = h.data.copy()  # out of the host ring, which the next frames go round
            dec.close()
            self._decoder = None
            self._nvdec_warm = 0
        t0 = time.perf_counter()
        with nvtx("nvdec"):
            frames = self._nvdec(item.codec, item.reorders, item.time_base).decode(item.data, item.pts)
        t1 = time.perf_counter()
        out = held + self._swap_decoded(frames, item.pts, item.time_base, backlog >= buffer_frames, stats)
        if len(self.first_items) < FIRST_ITEMS:
            # Where the first frames' time goes (a slow start makes the frames behind them late).
            self.first_items.append({"decode_ms": round((t1 - t0) * 1e3, 2), "frames": len(frames),
                                     "swap_ms": round((time.perf_counter() - t1) * 1e3, 2),
                                     "backlog": backlog, **(self._last_timing if out else {})})
        return out

    def _live_end(self, stats: LiveStats) -> list[LiveFrame]:
        if self._decoder is None:
            return []
        with nvtx("nvdec"):
            frames = self._decoder.flush()
        out = self._swap_decoded(frames, None, self._decoder.time_base, False, stats)
        self.nvdec_frames += self._decoder.frames - self._nvdec_warm
        self._nvdec_warm = self._decoder.frames  # counted: `_close_live` adds only what follows
        return out

    def _swap_decoded(self, frames: list[Any], pts: int | None, time_base: Any, behind: bool,
                      stats: LiveStats) -> list[LiveFrame]:
        from .nvdec import WARM_UP_PTS

        out = []
        for f in frames:
            if f.pts == WARM_UP_PTS:
                continue  # the warm-up picture, if the decoder held it back
            # In packet mode a frame is counted in when it is decoded (the pump counts packets):
            # so frames_in == frames_out + dropped holds, whatever the decoder holds back.
            stats.frames_in += 1
            if behind:
                # Decoded (later frames refer to it) but not swapped: the swap is behind.
                stats.dropped += 1
                continue
            loop = self._swap_loop(f.width, f.height)
            slot = loop.rgb_slot(f.pts)
            ready = f.copy_to(slot.buffer)  # NV12 -> RGB on the decoder's stream, before reuse
            out.append(self._swap(loop, slot, ready, pts if f.pts is None else f.pts, time_base))
            if len(out) >= PINNED_SLOTS:
                # More frames from one call than host buffers (a reordering decoder's flush): the
                # ring is about to come round to the first, which the writers have not read yet.
                out[-PINNED_SLOTS].data = out[-PINNED_SLOTS].data.copy()
        return out

    def _live_prepare(self) -> None:
        """Run frames showing the source face through the swap loop at `WARM_UP_SIZE` before the
        input is opened: the analysis networks' CUDA graphs, the swapper's and the kernels' first
        use are done when the first real frame comes. Done after the input was opened, the 3-6 s
        it takes on a fresh machine left that much of the stream waiting in the connection, read
        in a burst and skipped (201 frames at 720p30 on the H200). Without a face found, the first
        real face paid for the swap's kernels instead (3.9 s)."""
        t0 = time.perf_counter()
        with nvtx("warm-up"):
            # Every landmark batch size one frame can need (GpuFaceAnalyser sizes them by
            # detector.max_faces), whether or not the frames below show that many faces. Each
            # size costs up to seconds, once.
            log.info("analysis prepared: %s", self.analyser.prepare())
        swapped = self._warm_swap(*WARM_UP_SIZE)
        if self.source_image is not None and not swapped:
            log.warning("the GPU live warm-up found no face in its picture of the source: the "
                        "first real face will wait for the swap's first use")
        self.warm_up_ms = (time.perf_counter() - t0) * 1e3
        log.info("GPU live warm-up: %.0f ms", self.warm_up_ms)

    def _live_warm_up(self, reader: LiveReader) -> None:
        """Once the input is open: a frame at its size, if another (its loop's buffers; what was
        compiled is shared), and its decoder, on a picture of that size."""
        t0 = time.perf_counter()
        width, height = reader.size
        if width and height and not width % 2 and not height % 2:
            if (width, height) != WARM_UP_SIZE:
                self._warm_swap(width, height, frames=1)
            if reader.packets:
                from .nvdec import warm_nvdec

                with nvtx("warm-up"):
                    # The decoder the stream will use (its first connection's codec and reordering).
                    dec = self._nvdec(reader.codec, reader.reorders, reader.time_base)
                    warm_nvdec(dec, width, height)
                self._nvdec_warm = dec.frames
        self.warm_up_ms += (time.perf_counter() - t0) * 1e3

    def _warm_swap(self, width: int, height: int, *, frames: int = 3) -> int:
        """`frames` frames showing the source face through the swap loop at this size (the first
        detects, the next track: both paths get compiled); the tracker forgets the face after.
        Returns the faces swapped."""
        image = self.source_image
        if image is None:
            return 0
        face = getattr(self, "source_face", None)
        frame = face_picture(image, width, height, None if face is None else face.box)
        loop = self._swap_loop(width, height)
        swapped = 0
        with nvtx("warm-up"):
            for i in range(frames):
                slot = loop.rgb_slot(None)
                slot.buffer.set(frame, stream=self._upload)
                flight = loop.submit(slot, self._upload.record(), index=i, pts=i, time_base=None)
                flight.done.synchronize()
                loop.finished(flight)
                swapped += flight.swapped
        self.analyser.reset()
        loop.tracks.clear()
        return swapped

    def _nvdec(self, codec: str, reorders: bool, time_base: Any) -> Any:
        if self._decoder is None:
            from .nvdec import NvdecAccessUnits

            # A stream that may reorder (B-frames: OBS's x264 presets) needs NVDEC's reordering
            # (NATIVE latency); one that cannot gets each frame out of its own access unit (LOW).
            self._decoder = NvdecAccessUnits(codec=codec, time_base=time_base, name=self._url,
                                             stream=self._upload, low_latency=not reorders)
        return self._decoder

    def _swap_loop(self, width: int, height: int) -> GpuSwapLoop:
        import cupyx
        import numpy as np

        if width % 2 or height % 2:
            raise InputError(f"live input '{self._url}' is {width}x{height}; the GPU path needs an "
                             f"even width and height (4:2:0). Scale it in the encoder, or run with "
                             f"--set device=cpu")
        loop = self._loop
        if loop is None or (loop.width, loop.height) != (width, height):
            # A new publisher may send another size: everything is sized again.
            loop = self._loop = GpuSwapLoop(self.analyser, self.swap_faces, width, height,
                                            matrix=HOST_NV12_MATRIX)
            self._pinned: Ring[Any] = Ring(PINNED_SLOTS, lambda _i: cupyx.empty_pinned(
                (height * 3 // 2, width), np.uint8))
        return loop

    def _swap(self, loop: GpuSwapLoop, slot: Any, ready: Any, pts: int | None,
              time_base: Any) -> LiveFrame:
        # The encoder needs increasing pts; the decoder's are, except across a new publisher.
        last = self._last_pts
        if pts is None or (last is not None and pts <= last):
            pts = 0 if last is None else last + 1
        self._last_pts = pts
        host = self._pinned.acquire(pts)
        # The hand-over to the encoder: the one host wait per frame.
        flight, steps = loop.to_host(slot, ready, index=self._index, pts=pts, time_base=time_base,
                                     stream=self._download, out=host.buffer)
        self._index += 1
        self.steps_ms.append({**steps, "total": sum(steps.values())})
        if len(self.first_items) < FIRST_ITEMS:
            # For `first_items`: where the swap's time went (`GpuSwapLoop.to_host`).
            self._last_timing = {**{f"{k}_ms": round(v, 2) for k, v in steps.items()},
                                 "size": (loop.width, loop.height), "faces": len(flight.faces)}
        return LiveFrame(host.buffer, pts, time_base, flight.swapped, nv12=True)

    def _close_live(self) -> None:
        if self._loop is not None:
            self._loop.rgb_ring.drain()
        if self._decoder is not None:
            # What the run's log and tests report: the stream's frames, not the warm-up's (a
            # decoder replaced for a new publisher's codec counted its frames in `_live_end`).
            self.nvdec_frames += self._decoder.frames - self._nvdec_warm
            self._decoder.close()
        self._decoder = None
        self._loop = None
