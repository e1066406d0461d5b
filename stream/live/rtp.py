"""A received frame handed over as soon as it is complete, not one frame interval (or 80 ms) later.

aiortc's video jitter buffer (`aiortc.jitterbuffer.JitterBuffer`) completes a frame only when a
packet of the *next* frame comes in: it does not read the RTP marker bit, which the sender sets on
a frame's last packet (RFC 6184 for H.264, RFC 7741 for VP8; browsers and aiortc set it). So every
frame reached our swap one frame interval (33 ms at 30 fps, 67 ms at 15) after its last packet:
in the H200's WebRTC round trip that was half of the 64-74 ms measured.

Its audio jitter buffer holds each Opus packet until 4 more are in (80 ms): a player needs that
reserve against network jitter, but our server only relays the audio to players that have their
own; and once the video no longer waits, audio held 80 ms would leave later than its video (by
+87 ms, measured at the publisher with the CPU path).

`PromptJitterBuffer` hands a video frame over at its marker packet once every packet from the
frame's first is in, and an audio packet (Opus: one frame each) once every packet before it is in;
otherwise it behaves as aiortc's (a video sender that never sets the marker still gets its frames,
one interval late). `prompt_frames` puts it on one receiver. aiortc has no hook for this, so it
replaces the receiver's private buffer (`RTCRtpReceiver.__jitter_buffer`, name-mangled), after
checking that the attribute is what aiortc 1.16 makes; where it is not, the receiver keeps its own
buffer and this says so.

On the way out, aiortc encodes H.264 with x264's default preset (`medium`): 12 ms a 720p frame on
two cores, where `superfast` takes 4 (`LiveH264Encoder`; aiortc's VP8 encoder is set for real time
already). `fast_h264` gives one sender that encoder, through its private `__encoder`, which aiortc
fills only when it is empty.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from fractions import Fraction
from typing import Any

import av
from aiortc.codecs.h264 import MAX_FRAME_RATE, H264Encoder
from aiortc.jitterbuffer import JitterBuffer, JitterFrame

log = logging.getLogger(__name__)

_BUFFER_ATTR = "_RTCRtpReceiver__jitter_buffer"
_ENCODER_ATTR = "_RTCRtpSender__encoder"

WEBRTC_X264_PRESET = "superfast"
"""x264's preset for WebRTC's H.264 out: the fastest measured at 720p (3.7 ms a frame on two cores,
ultrafast 4.3, medium 12.1), and unlike ultrafast it keeps the deblocking filter, which WebRTC's
1-3 Mbit/s needs."""


class PromptJitterBuffer(JitterBuffer):
    """aiortc's jitter buffer, handing each frame over as soon as it is complete (module doc)."""

    def _remove_frame(self, sequence_number: int) -> JitterFrame | None:
        packets: list[Any] = []
        timestamp: int | None = None
        origin = self._origin
        assert origin is not None  # `add` sets it before it calls this
        for count in range(self.capacity):
            packet = self._packets[(origin + count) % self.capacity]
            if packet is None:
                return None  # a gap: the frame is not complete (a NACK may still fill it)
            if timestamp is None:
                timestamp = packet.timestamp
            elif packet.timestamp != timestamp:
                # The next frame began with no marker before it: a sender that does not set it.
                return self._take(packets, timestamp, count)
            packets.append(packet)
            if packet.marker or not self._is_video:
                return self._take(packets, timestamp, count + 1)
        return None

    def _take(self, packets: list[Any], timestamp: int, count: int) -> JitterFrame:
        # `_data` is the depayloaded payload that aiortc's receiver puts on each packet.
        frame = JitterFrame(data=b"".join(p._data for p in packets), timestamp=timestamp)
        self.remove(count)
        return frame


def prompt_frames(receiver: Any, kind: str) -> bool:
    """Give an `RTCRtpReceiver` of `kind` ("audio" or "video") a `PromptJitterBuffer`. Call before
    its media flows (when the offer is applied). Returns whether it now has one."""
    current = getattr(receiver, _BUFFER_ATTR, None)
    if isinstance(current, PromptJitterBuffer):
        return True
    if type(current) is not JitterBuffer:
        log.warning("this aiortc has no %s jitter buffer to replace (found %s): received %s reaches "
                    "the server later than it could", kind, type(current).__name__, kind)
        return False
    setattr(receiver, _BUFFER_ATTR, PromptJitterBuffer(capacity=current.capacity, is_video=kind == "video"))
    return True


class LiveH264Encoder(H264Encoder):
    """aiortc's H.264 encoder (Baseline, zerolatency, aiortc's bitrate control and packetising)
    with x264's `WEBRTC_X264_PRESET` (module doc)."""

    def _encode_frame(self, frame: av.VideoFrame, force_keyframe: bool) -> Iterator[bytes]:
        c = self.codec
        if (c is None or (frame.width, frame.height) != (c.width, c.height)
                or abs(self.target_bitrate - c.bit_rate) / c.bit_rate > 0.1):
            # Where aiortc would open its own (first frame, a new size, a bitrate changed by more
            # than 10%): ours, which it then finds matching and keeps.
            self.buffer_data = b""
            self.buffer_pts = None
            c = self.codec = av.CodecContext.create("libx264", "w")
            c.width, c.height = frame.width, frame.height
            c.bit_rate = self.target_bitrate
            c.pix_fmt = "yuv420p"
            c.framerate = Fraction(MAX_FRAME_RATE, 1)
            c.time_base = Fraction(1, MAX_FRAME_RATE)
            c.options = {"level": "31", "tune": "zerolatency", "preset": WEBRTC_X264_PRESET}
            c.profile = "Baseline"
        return super()._encode_frame(frame, force_keyframe)


def fast_h264(sender: Any) -> bool:
    """Give an `RTCRtpSender` that will send H.264 a `LiveH264Encoder`. Call after the answer is
    made and before media flows. Returns whether it now has one."""
    current = getattr(sender, _ENCODER_ATTR, False)
    if isinstance(current, LiveH264Encoder):
        return True
    if current is not None:  # False: no such attribute; an encoder: aiortc's, already running
        log.warning("this aiortc's H.264 sender cannot take another encoder: WebRTC video goes out "
                    "with x264's default preset")
        return False
    setattr(sender, _ENCODER_ATTR, LiveH264Encoder())
    return True
