"""An RTMP publisher for the live benchmarks and diagnostics: a clip in real time with audio, as
OBS sends it. NumPy and PyAV only (no aiortc), so that tools which need nothing else can use it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from fractions import Fraction
from typing import Protocol

import av
import numpy as np
from av.video.frame import PictureType

from swapstream.live.flv import SplicedFlv
from swapstream.live.streams import x264_live_options

AUDIO_RATE = 48000
AudioFn = Callable[[int, int], np.ndarray]
"""Mono samples in [-1, 1]: (first sample's index, how many)."""


class Clip(Protocol):
    fps: float
    size: tuple[int, int]

    def frame(self, n: int) -> np.ndarray:
        """Frame n, RGB (height, width, 3)."""
        ...


def silence(_start: int, n: int) -> np.ndarray:
    return np.zeros(n, np.float32)


def publish_rtmp(url: str, clip: Clip, sent: dict[int, float], stop: threading.Event, *,
                 interleaved: bool = False, audio: AudioFn = silence) -> None:
    """Push `clip` and `audio` (AAC) to `url` in real time until `stop`; `sent[n]` is when frame n
    went to the encoder (x264 `ultrafast` + `zerolatency`, a keyframe a second). Each packet goes
    out as it is encoded (`SplicedFlv`); with `interleaved`, through FFmpeg's FLV muxer, which holds
    each frame until later audio is encoded: at 30 fps one frame interval more (the AAC encoder's
    output lags its input by more than a frame; tools/profile_rtmp_hops.py measures it)."""
    fps = clip.fps
    c = av.open(url, "w", format="flv", timeout=5.0) if interleaved else SplicedFlv(url, timeout=5.0)
    try:
        v = c.add_stream("libx264", rate=Fraction(fps).limit_denominator(1001))
        v.width, v.height, v.pix_fmt = clip.size[0], clip.size[1], "yuv420p"
        v.time_base = Fraction(1, 1000)
        v.options = x264_live_options(fps)
        a = c.add_stream("aac", rate=AUDIO_RATE)
        a.layout = "mono"
        t0, samples, n = time.monotonic(), 0, 0
        while not stop.is_set():
            # A real-time source: frame n exists from t0 + n / fps on (pacing, not synchronisation).
            time.sleep(max(0.0, t0 + n / fps - time.monotonic()))
            f = av.VideoFrame.from_ndarray(clip.frame(n), format="rgb24")
            f.pts, f.time_base = round(n * 1000 / fps), Fraction(1, 1000)
            if n % max(1, round(fps)) == 0:
                # A keyframe every second, as OBS sends (x264_live_options leaves keyframes to the
                # caller): nginx-rtmp starts a new player at a keyframe, so without them a job
                # joining after the first frame saw no video for 10 s.
                f.pict_type = PictureType.I
            sent[n] = time.monotonic()
            c.mux(v.encode(f))
            while samples < (n + 1) * AUDIO_RATE / fps:
                af = av.AudioFrame.from_ndarray(audio(samples, 1024).astype(np.float32)[None],
                                                format="fltp", layout="mono")
                af.sample_rate, af.pts, af.time_base = AUDIO_RATE, samples, Fraction(1, AUDIO_RATE)
                c.mux(a.encode(af))
                samples += 1024
            n += 1
        c.mux(v.encode(None))
    finally:
        c.close()
