"""Measurable media for live paths: frame-numbered video, a gated tone, and receivers that time them.

Every source frame carries its number in a corner (big black/white blocks that survive lossy
coding), so that each frame that comes out of SwapStream can be matched to the frame it came from,
for pixels and for latency, whatever was dropped on the way. The audio is a tone that is on during
even seconds and off during odd ones of the same clock as the video, so that the audio's delay can
be set against the video's. Used by the live tests and by `tools/bench_live.py`. The stamps
themselves are in `tests.helpers.stamps`, which needs nothing but NumPy.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from fractions import Fraction

import av
import numpy as np
from aiortc import MediaStreamTrack
from aiortc.mediastreams import MediaStreamError

from swapstream.demo import grace_hopper, render_target_frame

# The stamps live in `.stamps` (NumPy only); importable from here as before.
from .stamps import BITS, read_stamp, stamp  # noqa: F401

VIDEO_CLOCK = Fraction(1, 90000)
AUDIO_RATE = 48000
AUDIO_FRAME = 960
"""Samples per audio frame: 20 ms, what aiortc's Opus encoder sends per packet."""


class ProbeClock:
    """The time both probe tracks count from, on the event loop's clock (`loop.time()`)."""

    def __init__(self, start: float) -> None:
        self.start = start


class StampedClip:
    """The animated portrait (the demo clip's motion), frame n stamped with n mod 256.

    The animation repeats every `loop_frames`: rendering each frame once leaves the CPU to the code
    under test.
    """

    def __init__(self, *, size: tuple[int, int] = (320, 240), fps: float = 15,
                 loop_frames: int = 60) -> None:
        self.size, self.fps, self.loop_frames = size, fps, loop_frames
        self._portrait = grace_hopper()
        self._rendered: dict[int, np.ndarray] = {}

    def frame(self, n: int) -> np.ndarray:
        k = n % self.loop_frames
        if k not in self._rendered:
            self._rendered[k] = render_target_frame(self._portrait, k / self.fps, self.size)
        img = self._rendered[k].copy()
        stamp(img, n % 256)
        return img


class StampedVideoTrack(MediaStreamTrack):
    """A live camera stand-in: `StampedClip`'s frame n, due at `start + n / fps`.

    Like a camera it never catches up on frames it was too late for: it skips to the current one.
    `sent[n]` is when frame n was handed to the sender (before encoding); `sources[n % 256]` its
    pixels.
    """

    kind = "video"

    def __init__(self, clock: ProbeClock, *, size: tuple[int, int] = (320, 240), fps: float = 15,
                 loop_frames: int = 60) -> None:
        super().__init__()
        self.clock, self.size, self.fps = clock, size, fps
        self.clip = StampedClip(size=size, fps=fps, loop_frames=loop_frames)
        self._next: int | None = None
        self.sent: dict[int, float] = {}
        self.sources: dict[int, np.ndarray] = {}

    async def recv(self) -> av.VideoFrame:
        if self.readyState != "live":
            raise MediaStreamError
        loop = asyncio.get_running_loop()
        now = loop.time() - self.clock.start
        n = max(self._next or 0, math.ceil(now * self.fps))
        await asyncio.sleep(max(0.0, n / self.fps - now))
        self._next = n + 1
        img = self.clip.frame(n)
        self.sources[n % 256] = img
        f = av.VideoFrame.from_ndarray(img, format="rgb24")
        f.pts = round(n / self.fps / VIDEO_CLOCK)
        f.time_base = VIDEO_CLOCK
        self.sent[n] = loop.time()
        return f


def tone(first_sample: int, count: int, *, hz: float = 440.0, level: float = 0.3,
         rate: int = AUDIO_RATE) -> np.ndarray:
    """`count` samples of the probe tone from `first_sample` of the probe clock, as float in [-1, 1]:
    a sine at `hz`, on in even seconds."""
    t = (first_sample + np.arange(count)) / rate
    return level * (np.floor(t) % 2 == 0) * np.sin(2 * np.pi * hz * t)


class ToneTrack(MediaStreamTrack):
    """A microphone stand-in: a sine at `hz`, on in even seconds of the probe clock, in 20 ms frames
    of 16-bit mono, each handed over when its last sample is due (as a capture device would)."""

    kind = "audio"

    def __init__(self, clock: ProbeClock, *, hz: float = 440.0, level: float = 0.3) -> None:
        super().__init__()
        self.clock, self.hz, self.level = clock, hz, level
        self._next: int | None = None

    def samples(self, k: int) -> np.ndarray:
        """Audio frame k of the probe clock as int16."""
        return (32767 * tone(k * AUDIO_FRAME, AUDIO_FRAME, hz=self.hz, level=self.level)).astype(np.int16)

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        loop = asyncio.get_running_loop()
        if self._next is None:
            self._next = math.floor((loop.time() - self.clock.start) * AUDIO_RATE / AUDIO_FRAME)
        k = self._next
        # Audio never skips: a late frame goes at once and the next ones catch up.
        due = self.clock.start + (k + 1) * AUDIO_FRAME / AUDIO_RATE
        await asyncio.sleep(max(0.0, due - loop.time()))
        self._next = k + 1
        f = av.AudioFrame.from_ndarray(self.samples(k)[None, :], format="s16", layout="mono")
        f.sample_rate = AUDIO_RATE
        f.pts = k * AUDIO_FRAME
        f.time_base = Fraction(1, AUDIO_RATE)
        return f


@dataclass
class Received:
    """What a receiving peer got, with the loop time each frame came out of its track."""

    video: list[tuple[int, np.ndarray, float]] = field(default_factory=list)
    """(stamp, RGB picture, arrival) per video frame."""
    audio: list[tuple[np.ndarray, float]] = field(default_factory=list)
    """(mono float samples in [-1, 1], arrival) per audio frame."""
    audio_rate: int = AUDIO_RATE


async def receive(track: MediaStreamTrack, into: Received, *, keep_pixels: bool = True) -> None:
    """Read a remote track until it ends, timing each frame; video frames are read by their stamp."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            f = await track.recv()
        except MediaStreamError:
            return
        now = loop.time()
        if isinstance(f, av.AudioFrame):
            a = f.to_ndarray().astype(np.float64) / 32768.0
            # Packed stereo comes as one interleaved row: average the channels.
            channels = len(f.layout.channels)
            mono = a.reshape(-1, channels).mean(axis=1) if a.shape[0] == 1 else a.mean(axis=0)
            into.audio.append((mono, now))
            into.audio_rate = f.sample_rate
        else:
            img = f.to_ndarray(format="rgb24")
            into.video.append((read_stamp(img), img if keep_pixels else img[:0], now))


def peak_hz(samples: np.ndarray, rate: int) -> float:
    """The strongest frequency in `samples` (Hann window, FFT)."""
    spectrum = np.abs(np.fft.rfft(samples * np.hanning(len(samples))))
    return float(np.fft.rfftfreq(len(samples), 1 / rate)[int(np.argmax(spectrum[1:])) + 1])


def tone_edges(audio: list[tuple[np.ndarray, float]], *, level: float = 0.3) -> list[float]:
    """Arrival times of the frames in which the tone switches off (each "on" second ending).

    A frame counts as on when its RMS is above half the tone's (level / sqrt 2); a switch is the
    first frame below after at least five frames (100 ms) on, so that codec ringing at the edge
    does not count twice.
    """
    threshold = 0.5 * level / math.sqrt(2)
    edges, run = [], 0
    for samples, t in audio:
        on = float(np.sqrt(np.mean(samples ** 2))) > threshold
        if on:
            run += 1
        else:
            if run >= 5:
                edges.append(t)
            run = 0
    return edges


def unwrap(video: list[tuple[int, np.ndarray, float]], sent: dict[int, float]
           ) -> list[tuple[int, float, float]]:
    """Each received video frame as (source frame number, when it was handed over by the receiver,
    when it reached the receiver).

    Stamps wrap at 256: each is unwrapped to the latest frame with that stamp sent before it came.
    An aiortc receiver hands a frame over only when the next frame's first packet comes in, which
    adds one frame interval of the *sender's* rate (a slow sender: a long one) that a browser's
    receiver does not add; so frame k is taken to have reached it when frame k-1 was handed over
    (when frame k's first packet came). The first frame has no such time and is left out.
    """
    out = []
    numbers = sorted(sent)
    for k in range(1, len(video)):
        n8, _img, t = video[k]
        candidates = [n for n in numbers if n % 256 == n8 and sent[n] <= t]
        if candidates:
            out.append((candidates[-1], t, video[k - 1][2]))
    return out


def video_lag(video: list[tuple[int, np.ndarray, float]], clock: ProbeClock, fps: float,
              sent: dict[int, float]) -> list[float]:
    """Per received video frame: when it reached the receiver (see `unwrap`), minus when the source
    frame with that stamp was due on the probe clock (the audio's lag is measured the same way)."""
    return [reached - (clock.start + n / fps) for n, _handed, reached in unwrap(video, sent)]


def audio_lag(edges: list[float], clock: ProbeClock) -> list[float]:
    """Per tone switch-off seen: arrival minus when it was due (the end of an even second).

    Lags under two seconds are told apart; the live paths measured here are well under one.
    """
    lags = []
    for t in edges:
        since = t - clock.start
        # The switch-off due last before this arrival: at odd whole seconds 1, 3, 5...
        due = math.floor((since - 1) / 2) * 2 + 1
        lags.append(since - due)
    return lags
