"""WebRTC input on the GPU: H.264 access units from aiortc go to NVDEC, and the swap runs on the GPU.

aiortc depacketises each RTP video frame into an Annex-B access unit (`JitterFrame.data`, 90 kHz
timestamp) and hands it, through a queue, to a decoder thread that decodes with FFmpeg on the CPU.
`divert_video` replaces that queue on one receiver (before the connection starts, which is when the
thread is created) with `DivertingQueue`: in aiortc's own decoder thread, H.264 access units go to
our decode function instead, and its frames go straight to the track's queue, where `track.recv()`
returns them. Other codecs (VP8 from a browser that refused H.264) and the end marker pass through
to aiortc's decoder as before.

This reads aiortc's private attribute `RTCRtpReceiver.__decoder_queue` (name-mangled): aiortc has no
decoder hook. `divert_video` checks that the attribute exists and says so where it does not, and
the session then decodes on the CPU as before. Tested against aiortc 1.16.

`h264_first` orders the codecs of a transceiver so that the answer offers H.264 before VP8; the
WHIP server applies it on the GPU path, so that a browser sends what NVDEC decodes.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np

from .loop import HOST_NV12_MATRIX, WARM_UP_SIZE, GpuSwapLoop, face_picture, nvtx

log = logging.getLogger(__name__)

RTP_VIDEO_TIME_BASE = Fraction(1, 90000)
"""RTP's video clock: the unit of aiortc's frame timestamps."""

DecodeFn = Callable[[bytes, int], list[Any]]
"""Decodes one Annex-B access unit with its 90 kHz timestamp; returns the frames it completed."""

_QUEUE_ATTR = "_RTCRtpReceiver__decoder_queue"


def h264_first(codecs: list[Any]) -> list[Any]:
    """`codecs` (aiortc's RTCRtpCodecCapability list) with the H.264 ones first, the rest after in
    their order (so VP8 stays a fallback, and each codec keeps its retransmission codec)."""
    h264 = [c for c in codecs if c.mimeType.lower() == "video/h264"]
    return h264 + [c for c in codecs if c.mimeType.lower() != "video/h264"]


def prefer_h264(pc: Any) -> Any:
    """Add the video transceiver to a peer connection before the offer is applied, with H.264
    preferred: aiortc filters the offered codecs through a transceiver's preferences while it
    applies the offer, so they must be set before. Returns the transceiver."""
    from aiortc import RTCRtpSender

    transceiver = pc.addTransceiver("video", direction="sendrecv")
    transceiver.setCodecPreferences(h264_first(RTCRtpSender.getCapabilities("video").codecs))
    return transceiver


class DivertingQueue(queue.Queue):  # type: ignore[type-arg]
    """aiortc's decoder input queue, with H.264 access units decoded by `decode` (module doc).

    `get` runs in aiortc's decoder thread: it decodes H.264 tasks itself, puts the frames on the
    track's queue through `deliver`, and returns only what aiortc's decoder should handle.
    """

    def __init__(self, decode: DecodeFn, deliver: Callable[[Any], None],
                 on_error: Callable[[], None] | None = None) -> None:
        super().__init__()
        self._decode = decode
        self._deliver = deliver
        self._on_error = on_error
        self.access_units = 0
        self.frames = 0
        self.errors = 0

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        while True:
            task = super().get(block, timeout)
            if task is None or getattr(task[0], "name", "") != "H264":
                return task
            _codec, encoded = task
            self.access_units += 1
            try:
                frames = self._decode(encoded.data, encoded.timestamp)
            except Exception as e:  # noqa: BLE001 - one bad access unit must not end the session
                # The decoder starts afresh and the sender is asked for a keyframe (a PLI, as
                # aiortc's own decoder thread does on errors); until then access units fail.
                self.errors += 1
                if self.errors == 1 or self.errors % 100 == 0:
                    log.warning("decoding a WebRTC H.264 access unit failed (%d so far): %s",
                                self.errors, e)
                if self._on_error is not None:
                    self._on_error()
                continue
            for frame in frames:
                self.frames += 1
                self._deliver(frame)


def divert_video(receiver: Any, decode: DecodeFn, loop: asyncio.AbstractEventLoop) -> DivertingQueue | None:
    """Route `receiver`'s H.264 access units to `decode` (module doc). Call before the connection
    starts (right after creating the transceiver). Returns the queue, or None where this aiortc has
    no such queue (the session then decodes on the CPU)."""
    if not isinstance(getattr(receiver, _QUEUE_ATTR, None), queue.Queue):
        log.warning("this aiortc (%s) has no decoder queue to divert: WebRTC video is decoded on "
                    "the CPU", _aiortc_version())
        return None

    def deliver(frame: Any) -> None:
        # The remote track exists once the offer is applied (after this call); its own asyncio
        # queue is what recv() reads, and what aiortc's decoder thread puts frames on.
        asyncio.run_coroutine_threadsafe(receiver.track._queue.put(frame), loop)

    def on_error() -> None:
        reset = getattr(decode, "reset", None)
        if reset is not None:
            reset()
        # aiortc's receiver sends a PLI at its next RTP packet when this event is set.
        flag = getattr(receiver, "_RTCRtpReceiver__decoder_error", None)
        if isinstance(flag, threading.Event):
            flag.set()

    diverted = DivertingQueue(decode, deliver, on_error)
    setattr(receiver, _QUEUE_ATTR, diverted)
    return diverted


def _aiortc_version() -> str:
    try:
        from importlib.metadata import version

        return version("aiortc")
    except Exception:  # noqa: BLE001 - only for the message
        return "unknown version"


@dataclass(eq=False)
class DeviceVideoFrame:
    """A decoded WebRTC picture in GPU memory: RGB, complete once `ready` has fired on the device.

    Its memory came from CuPy's pool on `stream` (the decoder's). `release(event)` makes that stream
    wait for the consumer's last read before the array is let go, so that the pool's next allocation
    on that stream cannot overwrite it while the read is in flight.
    """

    rgb: Any
    pts: int | None
    time_base: Fraction
    ready: Any
    stream: Any = field(repr=False)

    def release(self, after: Any) -> None:
        self.stream.wait_event(after)
        self.rgb = None

    def to_ndarray(self, format: str = "rgb24") -> np.ndarray:  # noqa: A002 - av.VideoFrame's name
        """A host copy, for consumers of aiortc frames (`format` must be rgb24)."""
        if format != "rgb24":
            raise ValueError(f"a DeviceVideoFrame is RGB; asked for {format}")
        self.ready.synchronize()
        return self.rgb.get()


RTC_MAX_SIZE = (1920, 1088)
"""The largest WebRTC picture the first decoder is made for: browsers step their resolution up and
down with the bandwidth, up to the camera's (1080p for most). A larger one fails; the next decoder,
made after the keyframe the failure asks for, sizes itself to the stream as it is then."""


class NvdecRtcDecoder:
    """A `DecodeFn` on NVDEC: each access unit decoded and converted to RGB into a new CuPy array on
    the decoder's stream, returned as `DeviceVideoFrame`s. The decoder opens at the first access
    unit, in the thread that decodes (aiortc's), and again after `reset` (a failed access unit)."""

    def __init__(self, gpu_id: int = 0) -> None:
        self.gpu_id = gpu_id
        self._dec: Any = None
        self._max_size: tuple[int, int] | None = RTC_MAX_SIZE
        self.open_ms: list[float] = []
        """Milliseconds each decoder took to open (the first at the first access unit; one more
        after each failed access unit): time the session's first frame waits."""

    def reset(self) -> None:
        if self._dec is not None:
            self._dec.close()
        self._dec = None
        self._max_size = None  # see RTC_MAX_SIZE

    def __call__(self, data: bytes, timestamp: int) -> list[Any]:
        import cupy

        from .nvdec import NvdecAccessUnits

        dec = self._dec
        if dec is None:
            t0 = time.perf_counter()
            dec = self._dec = NvdecAccessUnits(codec="h264", gpu_id=self.gpu_id, max_size=self._max_size,
                                               time_base=RTP_VIDEO_TIME_BASE, name="WebRTC video")
            self.open_ms.append((time.perf_counter() - t0) * 1e3)
        out = []
        with nvtx("nvdec"):
            for f in dec.decode(data, timestamp):
                with cupy.cuda.Device(self.gpu_id), dec.stream:
                    rgb = cupy.empty((f.height, f.width, 3), cupy.uint8)
                ready = f.copy_to(rgb)
                pts = f.pts if f.pts is not None else timestamp
                out.append(DeviceVideoFrame(rgb, pts, RTP_VIDEO_TIME_BASE, ready, dec.stream))
        return out


def nvdec_decode(gpu_id: int = 0) -> NvdecRtcDecoder:
    """The WebRTC `DecodeFn` on NVDEC (`NvdecRtcDecoder`), one per publisher."""
    return NvdecRtcDecoder(gpu_id)


class GpuFrameSwap:
    """The WHIP server's swap on the GPU: takes a `DeviceVideoFrame` (NVDEC) or an aiortc
    `av.VideoFrame` (uploaded), runs `GpuSwapLoop` and returns the swapped picture on the host as
    the NV12 the loop already made (aiortc's encoders then only de-interleave its chroma), with the
    number of faces swapped. An odd width or height loses its last column or row (4:2:0). One
    caller at a time (the server's single swap thread)."""

    STEPS_KEPT = 1800
    """Frames whose step timings `steps_ms` keeps: a minute at 30 fps, bounded for long sessions."""

    SIZES_KEPT = 4
    """Loops (and their buffers) kept per picture size: browsers step their resolution with the
    bandwidth, and publishers of different sizes share this swap, so a size comes back often."""

    def __init__(self, job: Any, analyser: Any = None) -> None:
        """`analyser`: the face analysis to use (a tracker of the job's, for one publisher);
        default the job's own."""
        import cupy

        self.job = job
        self.analyser = analyser if analyser is not None else job.analyser
        self._loops: dict[tuple[int, int], tuple[GpuSwapLoop, Any]] = {}
        self._upload = cupy.cuda.Stream(non_blocking=True)
        self._download = cupy.cuda.Stream(non_blocking=True)
        self.frames = 0
        self.steps_ms: deque[dict[str, float]] = deque(maxlen=self.STEPS_KEPT)
        """Per swapped frame, the newest: host milliseconds of its steps, where the swap stage's
        time goes (upload; analysis, which waits for the landmarks; the rest of the submission; the
        wait for the GPU and the download)."""

    def _sized(self, width: int, height: int) -> GpuSwapLoop:
        import cupyx

        key = (width, height)
        entry = self._loops.pop(key, None)
        if entry is None:
            if len(self._loops) >= self.SIZES_KEPT:
                _old, (old_loop, _pin) = next(iter(self._loops.items()))
                old_loop.rgb_ring.drain()  # nothing of it is still in flight when it goes
                del self._loops[_old]
            entry = (GpuSwapLoop(self.analyser, self.job.swap_faces, width, height,
                                 matrix=HOST_NV12_MATRIX),
                     cupyx.empty_pinned((height * 3 // 2, width), np.uint8))
        self._loops[key] = entry  # most recently used last
        self._pinned = entry[1]
        return entry[0]

    def warm_up(self, width: int, height: int) -> float:
        """Run frames showing the job's source face through this swap at `width` x `height`, so
        that the first publisher's first frame does not pay for the analysis networks' CUDA graphs,
        the swapper's and the kernels' first use (on the H200 its frames queued for 4.4 s behind
        it). The tracker forgets the warm-up face after. Returns the milliseconds it took."""
        import av

        image = getattr(self.job, "source_image", None)
        if image is None:
            return 0.0
        t0 = time.perf_counter()
        prepare = getattr(self.job.analyser, "prepare", None)
        if prepare is not None:
            log.info("analysis prepared: %s", prepare())
        face = getattr(self.job, "source_face", None)
        picture = av.VideoFrame.from_ndarray(face_picture(image, width, height, None if face is None else face.box),
                                             format="rgb24")
        swapped = [self(picture, i)[1] for i in range(3)]  # detection, then tracking: both compiled
        if not any(swapped):
            log.warning("the WHIP warm-up found no face in its picture of the source: the first "
                        "publisher's first face will wait for the swap's first use")
        reset = getattr(self.analyser, "reset", None)
        if reset is not None:
            reset()
        for loop, _pinned in self._loops.values():
            loop.tracks.clear()
        self.frames = 0
        self.steps_ms.clear()
        return (time.perf_counter() - t0) * 1e3

    def __call__(self, frame: Any, index: int) -> tuple[np.ndarray, int]:
        import cupy

        t0 = time.perf_counter()
        if isinstance(frame, DeviceVideoFrame):
            h, w = frame.rgb.shape[0] & ~1, frame.rgb.shape[1] & ~1
            loop = self._sized(w, h)
            slot = loop.rgb_slot(frame.pts)
            with nvtx("upload"), self._upload:
                self._upload.wait_event(frame.ready)
                cupy.copyto(slot.buffer, frame.rgb[:h, :w])
                ready = self._upload.record()
            frame.release(ready)
        else:
            rgb = frame.to_ndarray(format="rgb24")
            h, w = rgb.shape[0] & ~1, rgb.shape[1] & ~1
            loop = self._sized(w, h)
            slot = loop.rgb_slot(frame.pts)
            with nvtx("upload"):
                slot.buffer.set(np.ascontiguousarray(rgb[:h, :w]), stream=self._upload)
                ready = self._upload.record()
        t1 = time.perf_counter()
        flight, steps = loop.to_host(slot, ready, index=index, pts=frame.pts, time_base=frame.time_base,
                                     stream=self._download, out=self._pinned)
        self.steps_ms.append({"upload": (t1 - t0) * 1e3, **steps, "total": (time.perf_counter() - t0) * 1e3})
        self.frames += 1
        # A copy: the caller makes the encoders' frames of it while the next frame is swapped.
        return self._pinned.copy(), flight.swapped


def gpu_whip_hooks(job: Any, gpu_id: int = 0) -> tuple[Callable[[], GpuFrameSwap],
                                                       Callable[[Any], DivertingQueue | None], str]:
    """What `WhipServer` takes for the GPU path: the per-publisher swap factory (`session_swap`: a
    `GpuFrameSwap` over a tracker of the job's analyser), the publisher hook (H.264 first; NVDEC
    where PyNvVideoCodec can decode, each publisher with its own decoder), and a line saying which
    decoder WebRTC video gets."""
    from .pynvc import nvdec_available

    nvdec, why = nvdec_available(gpu_id)

    def on_publisher(pc: Any) -> DivertingQueue | None:
        """Prepare a publisher's connection; the diverted queue (its NVDEC counts), if any."""
        transceiver = prefer_h264(pc)
        if nvdec:
            return divert_video(transceiver.receiver, nvdec_decode(gpu_id), asyncio.get_event_loop())
        return None

    def session_swap() -> GpuFrameSwap:
        make_tracker = getattr(job.analyser, "tracker", None)
        return GpuFrameSwap(job, make_tracker() if make_tracker is not None else None)

    # Before the first publisher, on a tracker of its own (its warm-up face is not a session's).
    warm_ms = session_swap().warm_up(*WARM_UP_SIZE)
    where = (f"WebRTC video: H.264 preferred, decoded on NVDEC ({why})" if nvdec else
             f"WebRTC video: decoded on the CPU and uploaded ({why})")
    where += f"; the GPU swap warmed up at {WARM_UP_SIZE[0]}x{WARM_UP_SIZE[1]} in {warm_ms:.0f} ms"
    return session_swap, on_publisher, where
