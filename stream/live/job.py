"""The live job: pull a stream, swap faces, push it to RTMP, HLS and/or a virtual camera without
building up latency.

A reader thread demuxes and decodes the input. Video frames wait in a small bounded buffer: when the
swap falls behind, the oldest waiting frame is dropped and counted (a live stream must not lag),
and frames leave in pts order. Audio packets are never dropped; they are passed through.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ..io.video import AudioPacket
from ..pipeline import FileJob
from ..types import Frame
from .streams import LiveReader, LiveWriter, is_file_input
from .vcam import VirtualCamera, check_vcam

log = logging.getLogger(__name__)


STATS_WINDOW = 9000
"""Per-frame figures kept by a live run: the newest 9,000 (five minutes at 30 fps)."""


@dataclass
class LiveStats:
    """What a live run did."""

    frames_in: int = 0
    frames_out: int = 0
    dropped: int = 0
    """Frames dropped because the swap fell behind the input."""
    faces_swapped: int = 0
    audio_packets: int = 0
    reconnects: int = 0
    latency_ms: deque[float] = field(default_factory=lambda: deque(maxlen=STATS_WINDOW))
    """Per frame, the newest STATS_WINDOW: time from the frame's arrival (decoded) to its hand-over
    to the outputs. Bounded, so that a live run of days keeps constant memory."""
    out_times: deque[float] = field(default_factory=lambda: deque(maxlen=STATS_WINDOW))
    """Monotonic clock at the newest STATS_WINDOW output frames, to see gaps (a dropped input) and
    when output resumed."""


class LiveOutput(Protocol):
    """Where swapped live frames go: `LiveWriter` (RTMP, HLS) and `VirtualCamera`."""

    def write(self, frame: Frame) -> None: ...

    def write_audio(self, packet: AudioPacket) -> None: ...

    def close(self) -> None: ...


class LiveJob(FileJob):
    """Swaps faces in a live input and writes live outputs. Construct like `FileJob`."""

    LIVE = True  # live outputs carry the visible label by default (disclosure.label_live)

    def run_live(self, url: str, *, rtmp_out: str | None = None, hls_dir: Path | None = None,
                 max_frames: int | None = None, buffer_frames: int = 2,
                 stop: threading.Event | None = None, reconnect_seconds: float = 60.0,
                 vcam: bool = False, vcam_device: str | None = None, loop: bool = False) -> LiveStats:
        """Run until the input ends (a file's end; a network input that stays away longer than
        `reconnect_seconds`), `max_frames` are out, or `stop` is set. A file input plays at its own
        pace, once, or again and again with `loop`."""
        from ..errors import ConfigError

        if rtmp_out is None and hls_dir is None and not vcam:
            raise ConfigError("a live run needs an output: --rtmp-out URL, --hls-dir FOLDER and/or --vcam")
        if rtmp_out is not None and not rtmp_out.lower().startswith(("rtmp://", "rtmps://")):
            # Anything else would be pushed as FLV wherever FFmpeg's protocol for it leads.
            raise ConfigError(f"--rtmp-out '{rtmp_out}' is not an RTMP URL: give "
                              f"rtmp://HOST[:PORT]/APP/KEY (or rtmps://); for HLS use --hls-dir")
        if loop and not is_file_input(url):
            raise ConfigError(f"--loop repeats a file input, and '{url}' is a network stream, which "
                              f"reconnects when it drops (--reconnect SECONDS); leave out --loop")
        if vcam:
            check_vcam(vcam_device)  # a missing device is known now, before waiting on the input
        stop = stop or threading.Event()
        reader = LiveReader(url, reconnect_seconds=reconnect_seconds, loop=loop, realtime=True)
        reader.open()
        stats = LiveStats()
        frames: deque[tuple[Frame, float]] = deque()
        audio: deque[AudioPacket] = deque()
        cond = threading.Condition()
        finished = threading.Event()

        def read() -> None:
            try:
                for item in reader:
                    if stop.is_set():
                        break
                    with cond:
                        if isinstance(item, AudioPacket):
                            audio.append(item)
                        else:
                            stats.frames_in += 1
                            if len(frames) >= buffer_frames:
                                frames.popleft()  # the oldest waiting frame goes: keep up with live
                                stats.dropped += 1
                            frames.append((item, time.monotonic()))
                        cond.notify()
            finally:
                finished.set()
                with cond:
                    cond.notify()

        writers: list[LiveOutput] = []
        thread = threading.Thread(target=read, name="live-reader", daemon=True)
        thread.start()
        try:
            while not stop.is_set():
                with cond:
                    while not frames and not audio and not finished.is_set() and not stop.is_set():
                        cond.wait(0.1)
                    pending_audio = list(audio)
                    audio.clear()
                    item = frames.popleft() if frames else None
                if item is None and not pending_audio and finished.is_set():
                    break
                if item is not None:
                    frame, arrived = item
                    if not writers:
                        writers = self._open_writers(frame, reader, rtmp_out, hls_dir,
                                                     vcam_device if vcam else None, vcam)
                    stats.faces_swapped += self.swap_frame(frame)
                    for w in writers:
                        w.write(frame)
                    stats.frames_out += 1
                    now = time.monotonic()
                    stats.latency_ms.append((now - arrived) * 1e3)
                    stats.out_times.append(now)
                    if max_frames is not None and stats.frames_out >= max_frames:
                        break
                for p in pending_audio:
                    stats.audio_packets += 1
                    for w in writers:
                        w.write_audio(p)
        finally:
            reader.stop()
            stop.set()
            thread.join(timeout=10)
            for w in writers:
                w.close()
            stats.reconnects = reader.reconnects
        return stats

    def _open_writers(self, first: Frame, reader: LiveReader, rtmp_out: str | None,
                      hls_dir: Path | None, vcam_device: str | None = None,
                      vcam: bool = False) -> list[LiveOutput]:
        h, w = first.data.shape[:2]
        common: dict[str, Any] = dict(width=w, height=h, fps=reader.info_fps, time_base=first.time_base,
                                      audio_from=reader.audio_stream, crf=self.config.encode.crf)
        out: list[LiveOutput] = []
        if rtmp_out:
            out.append(LiveWriter(rtmp_out, kind="rtmp", **common))
        if hls_dir is not None:
            out.append(LiveWriter(str(hls_dir / "index.m3u8"), kind="hls", **common))
        if vcam:
            out.append(VirtualCamera(width=w, height=h, fps=reader.info_fps, device=vcam_device))
        return out
