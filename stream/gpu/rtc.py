"""WebRTC input on the GPU: H.264 access units from aiortc go to NVDEC instead of FFmpeg.

aiortc depacketises each RTP video frame into an Annex-B access unit (`JitterFrame.data`, 90 kHz
timestamp) and hands it, through a queue, to a decoder thread that decodes with FFmpeg on the CPU.
`divert_video` replaces that queue on one receiver (before the connection starts, which is when the
thread is created) with `DivertingQueue`: in aiortc's own decoder thread, H.264 access units go to
our decode function instead, and the frames it returns (if any) go straight to the track's queue,
where `track.recv()` returns them. A WHIP publisher's runtime stream (`runtime.rtc`) takes the
access units themselves, returns no frames, and decodes them on NVDEC in its reader thread. Other codecs (VP8 from a browser that refused H.264) and the end marker pass through
to aiortc's decoder as before.

This reads aiortc's private attribute `RTCRtpReceiver.__decoder_queue` (name-mangled): aiortc has no
decoder hook. `divert_video` checks that the attribute exists and says so where it does not, and
the session then decodes on the CPU as before. Tested against aiortc 1.16.

`h264_first` orders the codecs of a transceiver so that the answer offers H.264 before VP8; a
publisher's stream on a GPU applies it, so that a browser sends what NVDEC decodes.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from fractions import Fraction
from typing import Any



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

    ask_keyframe = keyframe_request(receiver)

    def on_error() -> None:
        reset = getattr(decode, "reset", None)
        if reset is not None:
            reset()
        ask_keyframe()

    diverted = DivertingQueue(decode, deliver, on_error)
    setattr(receiver, _QUEUE_ATTR, diverted)
    return diverted


def keyframe_request(receiver: Any) -> Callable[[], None]:
    """A function that makes aiortc's `receiver` ask the publisher for a keyframe (a PLI at its next
    RTP packet): what a decoder needs after it failed on an access unit."""
    flag = getattr(receiver, "_RTCRtpReceiver__decoder_error", None)

    def ask() -> None:
        if isinstance(flag, threading.Event):
            flag.set()

    return ask


def _aiortc_version() -> str:
    try:
        from importlib.metadata import version

        return version("aiortc")
    except Exception:  # noqa: BLE001 - only for the message
        return "unknown version"


RTC_MAX_SIZE = (1920, 1088)
"""The largest WebRTC picture the first decoder is made for: browsers step their resolution up and
down with the bandwidth, up to the camera's (1080p for most). A larger one fails; the next decoder,
made after the keyframe the failure asks for, sizes itself to the stream as it is then."""
