"""Synthetic test clips, written with PyAV directly so that they do not depend on the code under test.

Every frame carries its own frame number as big flat blocks of grey, which survive lossy coding, so a
test can read back which input frame each output frame came from (`number_of`).
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

# Four grey levels, far apart and away from the ends of the range, carry two bits per block.
LEVELS = np.array([40, 100, 160, 220], dtype=np.int32)
COLS, ROWS = 4, 2  # 8 blocks x 2 bits: frame numbers up to 65535


def numbered_frame(n: int, width: int = 96, height: int = 64) -> np.ndarray:
    """An HxWx3 uint8 RGB picture showing `n` as base-4 digits, one flat grey block per digit."""
    img = np.empty((height, width, 3), np.uint8)
    bw, bh = width // COLS, height // ROWS
    for i in range(COLS * ROWS):
        r, c = divmod(i, COLS)
        digit = (n >> (2 * i)) & 3
        x1 = width if c == COLS - 1 else (c + 1) * bw
        y1 = height if r == ROWS - 1 else (r + 1) * bh
        img[r * bh : y1, c * bw : x1] = LEVELS[digit]
    return img


def number_of(rgb: np.ndarray) -> int:
    """Read back the number `numbered_frame` drew, from a possibly lossy decoded copy."""
    height, width = rgb.shape[:2]
    bw, bh = width // COLS, height // ROWS
    n = 0
    for i in range(COLS * ROWS):
        r, c = divmod(i, COLS)
        # The middle half of each block keeps clear of ringing at the block edges.
        block = rgb[r * bh + bh // 4 : (r + 1) * bh - bh // 4, c * bw + bw // 4 : (c + 1) * bw - bw // 4]
        digit = int(np.argmin(np.abs(LEVELS - float(block.mean()))))
        n |= digit << (2 * i)
    return n


def _tone(samples: int, start: int, rate: int, channels: int) -> np.ndarray:
    t = (start + np.arange(samples)) / rate
    wave = 0.3 * np.sin(2 * np.pi * 440.0 * t)
    return np.repeat(wave[None, :], channels, axis=0).astype(np.float32)


def write_clip(
    path: Path,
    *,
    frames: int = 30,
    rate: Fraction = Fraction(30),
    size: tuple[int, int] = (96, 64),
    pts: Sequence[int] | None = None,
    time_base: Fraction | None = None,
    audio: str | None = "aac",
    audio_rate: int = 48000,
    codec: str = "libx264",
    pix_fmt: str = "yuv420p",
    container_options: dict[str, str] | None = None,
) -> list[int]:
    """Write a numbered clip (and a 440 Hz tone) with PyAV; returns the pts given to the encoder.

    `pts` in `time_base` units makes a variable-frame-rate clip; otherwise frames are 1/rate apart.
    `audio` is an encoder name ("aac", "pcm_s16le", "libopus", ...) or None for no audio.
    """
    width, height = size
    if pts is None:
        time_base = time_base or 1 / rate
        step = 1 / (rate * time_base)
        pts = [round(i * step) for i in range(frames)]
    assert time_base is not None
    frames = len(pts)
    out = av.open(str(path), "w", options=container_options or {})
    video = out.add_stream(codec, rate=rate)
    video.width, video.height, video.pix_fmt = width, height, pix_fmt
    video.time_base = time_base
    video.codec_context.time_base = time_base
    if codec == "libx264":
        video.options = {"crf": "18", "preset": "ultrafast"}
    sound = None
    if audio is not None:
        sound = out.add_stream(audio, rate=audio_rate)
        sound.layout = "mono"
        sound.time_base = Fraction(1, audio_rate)
    # Audio covers the same span as the video: up to the end of the last frame.
    end = float((pts[-1] + (1 / (rate * time_base))) * time_base)
    total_samples = round(end * audio_rate)
    written = 0
    for i, p in enumerate(pts):
        vf = av.VideoFrame.from_ndarray(numbered_frame(i, width, height), format="rgb24")
        vf.pts, vf.time_base = p, time_base
        out.mux(video.encode(vf))
        if sound is not None:
            # Keep audio up to the next frame's time, so packets interleave like a real recording.
            until = total_samples if i == frames - 1 else round(float(pts[i + 1] * time_base) * audio_rate)
            while written < until:
                n = min(1024, until - written)
                data = _tone(n, written, audio_rate, 1)
                fmt = sound.codec_context.format.name
                if fmt in ("s16", "s16p"):
                    data = (data * 32767).astype(np.int16)
                    fmt = "s16p" if fmt == "s16p" else "s16"
                else:
                    fmt = "fltp"
                af = av.AudioFrame.from_ndarray(data, format=fmt, layout="mono")
                af.sample_rate, af.pts, af.time_base = audio_rate, written, Fraction(1, audio_rate)
                out.mux(sound.encode(af))
                written += n
    out.mux(video.encode(None))
    if sound is not None:
        out.mux(sound.encode(None))
    out.close()
    return list(pts)


def frame_pts(path: Path) -> tuple[list[int], Fraction]:
    """Presentation timestamps of every decoded video frame, and the stream's time base."""
    with av.open(str(path)) as c:
        stream = c.streams.video[0]
        return [f.pts for f in c.decode(stream)], stream.time_base


def decoded_numbers(path: Path) -> list[int]:
    """The frame numbers drawn into each decoded frame, in presentation order."""
    with av.open(str(path)) as c:
        return [number_of(f.to_ndarray(format="rgb24")) for f in c.decode(c.streams.video[0])]


def audio_packets(path: Path) -> list[av.Packet]:
    """Non-empty packets of the first audio stream."""
    with av.open(str(path)) as c:
        if not c.streams.audio:
            return []
        return [p for p in c.demux(c.streams.audio[0]) if p.size]


def audio_seconds(path: Path) -> float:
    """Span of the first audio stream from its packets' timestamps, in seconds."""
    packets = audio_packets(path)
    tb = packets[0].time_base
    start = min(p.pts for p in packets)
    end = max(p.pts + p.duration for p in packets)
    return float((end - start) * tb)


def concat_hls(folder: Path) -> Path:
    """The MPEG-TS segments of `folder`'s HLS playlist, in playlist order, as one file next to the
    folder (the format allows concatenation, so times are continuous across segments)."""
    playlist = (folder / "index.m3u8").read_text()
    segs = [line for line in playlist.splitlines() if line.endswith(".ts")]
    assert segs, playlist
    whole = folder.parent / f"{folder.name}_all.ts"
    whole.write_bytes(b"".join((folder / s).read_bytes() for s in segs))
    return whole
