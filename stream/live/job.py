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
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable, Protocol

import numpy as np

from ..errors import InputError
from ..io.background import BackgroundCalls
from ..io.video import AudioPacket
from ..netpolicy import Outbound
from ..pipeline import FileJob
from ..types import Frame
from .streams import LiveReader, LiveWriter, VideoPacket, is_file_input
from .vcam import VirtualCamera, check_vcam

log = logging.getLogger(__name__)


STATS_WINDOW = 9000
"""Per-frame figures kept by a live run: the newest 9,000 (five minutes at 30 fps)."""

LIVE_ENCODE_QUEUE = 1
"""Swapped frames that may wait for the live encoder thread besides the one it encodes: one, so that
x264 overlaps the next frame's swap without adding more than a frame of latency. When the encoder
is slower, the loop waits on it and the input pump drops the oldest frames, as without the thread."""


@dataclass
class LiveStats:
    """What a live run did."""

    frames_in: int = 0
    frames_out: int = 0
    packets_in: int = 0
    """Compressed video packets read (the GPU path, which decodes them itself)."""
    dropped: int = 0
    """Frames dropped because the swap fell behind the input."""
    dropped_at_start: int = 0
    """Of `dropped`, those before the first frame out: what arrived while the job warmed up and
    opened its outputs, which it skips to catch up with the live input."""
    faces_swapped: int = 0
    audio_packets: int = 0
    reconnects: int = 0
    latency_ms: deque[float] = field(default_factory=lambda: deque(maxlen=STATS_WINDOW))
    """Per frame, the newest STATS_WINDOW: time from the frame's arrival (decoded) to its hand-over
    to the outputs. Bounded, so that a live run of days keeps constant memory."""
    first_write_ms: list[float] = field(default_factory=list)
    """How long the outputs took with each of the first 8 frames (the first opens the encoders)."""
    out_times: deque[float] = field(default_factory=lambda: deque(maxlen=STATS_WINDOW))
    """Monotonic clock at the newest STATS_WINDOW output frames, to see gaps (a dropped input) and
    when output resumed."""


class LiveOutput(Protocol):
    """Where swapped live frames go: `LiveWriter` (RTMP, HLS) and `VirtualCamera`."""

    def write(self, frame: Frame) -> None: ...

    def write_nv12(self, nv12: np.ndarray, pts: int | None, time_base: Fraction | None) -> None: ...

    def write_audio(self, packet: AudioPacket) -> None: ...

    def close(self) -> None: ...


class LiveJob(FileJob):
    """Swaps faces in a live input and writes live outputs. Construct like `FileJob`."""

    LIVE = True  # live outputs carry the visible label by default (disclosure.label_live)
    ENCODER_THREAD = True
    """Write to the outputs on a thread of their own (`io.background`): x264 then encodes frame N
    while frame N+1 is analysed and swapped. Needs frames whose arrays nobody reuses after the
    hand-over, as the CPU path's are (each decoded frame is a fresh array); the GPU job, whose
    frames are slots of a ring of pinned buffers, writes in the loop (False)."""

    def run_live(self, url: str, *, rtmp_out: str | None = None, hls_dir: Path | None = None,
                 max_frames: int | None = None, buffer_frames: int = 2,
                 stop: threading.Event | None = None, reconnect_seconds: float = 60.0,
                 vcam: bool = False, vcam_device: str | None = None, loop: bool = False,
                 on_wait: Callable[[], None] | None = None) -> LiveStats:
        """Run until the input ends (a file's end; a network input that stays away longer than
        `reconnect_seconds`), `max_frames` are out, or `stop` is set. A file input plays at its own
        pace, once, or again and again with `loop`.

        `reconnect_seconds` is the one outage window of the run: how long a network input that is
        not publishing yet is waited for (`on_wait` is called when that wait starts), how long a
        dropped input is reconnected to, and how long each output may fail before the run ends."""
        self._check_live_args(url, rtmp_out, hls_dir, vcam, vcam_device, loop)
        stop = stop or threading.Event()
        reader = self._live_reader(url, reconnect_seconds=reconnect_seconds, loop=loop)
        try:
            self._live_prepare()
        except BaseException:
            self._close_live()
            raise
        try:
            # docs/obs.md has the operator start SwapStream first and OBS second: wait for it.
            reader.open(wait_seconds=reconnect_seconds, on_wait=on_wait, stop=stop)
        except BaseException as e:
            self._close_live()
            if isinstance(e, InputError) and stop.is_set():
                return LiveStats()  # stopped (Ctrl+C) while waiting for the publisher: not an error
            raise
        try:
            self._live_warm_up(reader)
        except BaseException:
            reader.stop()
            reader.close()
            self._close_live()
            raise
        stats = LiveStats()
        # Decoded frames wait at most `buffer_frames` deep, the oldest dropped; compressed packets
        # (the GPU path) are never dropped, since later frames refer to them: `_live_frames` skips
        # the swap of a decoded frame instead when too many are waiting behind it.
        pump = _Pump(reader, stop, stats, keep=None if reader.packets else buffer_frames)
        writers: list[LiveOutput] = []
        encoder = BackgroundCalls(depth=LIVE_ENCODE_QUEUE, name="live-encoder") \
            if type(self).ENCODER_THREAD else None

        def send(fn: Callable[..., None], *args: Any) -> None:
            """Run an output call on the encoder thread (in order), or here without one."""
            if encoder is None:
                fn(*args)
            else:
                encoder.submit(fn, *args)

        def write_frame(out: LiveFrame, writers: list[LiveOutput]) -> None:
            t = time.perf_counter()
            for w in writers:
                if out.nv12:
                    w.write_nv12(out.data, out.pts, out.time_base)
                else:
                    w.write(Frame(out.data, out.pts, out.time_base, 0))
            if len(stats.first_write_ms) < 8:
                stats.first_write_ms.append(round((time.perf_counter() - t) * 1e3, 2))

        def write_audio(packets: list[AudioPacket], writers: list[LiveOutput]) -> None:
            for p in packets:
                for w in writers:
                    w.write_audio(p)

        def emit(out: LiveFrame, arrived: float, writers: list[LiveOutput]) -> list[LiveOutput]:
            """Send one swapped frame to the outputs (opened at the first, which gives the size)."""
            if not writers:
                writers = self._open_writers(out.width, out.height, out.time_base, reader, rtmp_out,
                                             hls_dir, vcam_device if vcam else None, vcam,
                                             reconnect_seconds=reconnect_seconds)
            stats.faces_swapped += out.faces
            send(write_frame, out, list(writers))
            if stats.frames_out == 0:
                stats.dropped_at_start = stats.dropped
            stats.frames_out += 1
            now = time.monotonic()
            stats.latency_ms.append((now - arrived) * 1e3)
            stats.out_times.append(now)
            return writers

        pump.start()
        ended = False
        try:
            while not stop.is_set():
                item, pending_audio, finished = pump.take()
                if item is None and not pending_audio and finished:
                    # The input has ended: what a decoder still holds goes out too.
                    for out in self._live_end(stats):
                        writers = emit(out, time.monotonic(), writers)
                    break
                if item is not None:
                    video, arrived = item
                    for out in self._live_frames(video, pump.backlog(), buffer_frames, stats):
                        if max_frames is not None and stats.frames_out >= max_frames:
                            break
                        writers = emit(out, arrived, writers)
                    if max_frames is not None and stats.frames_out >= max_frames:
                        break
                stats.audio_packets += len(pending_audio)
                if pending_audio and writers:
                    send(write_audio, pending_audio, list(writers))
            ended = True
        finally:
            failed: BaseException | None = None
            if encoder is not None:
                # The frames handed over go out before the outputs close; after an error, not.
                try:
                    if ended:
                        encoder.close()
                    else:
                        encoder.abandon()
                except BaseException as e:  # an output's error: raised once the rest is closed
                    failed = e
            reader.stop()
            stop.set()
            pump.join(timeout=10)
            for w in writers:
                w.close()
            if not pump.thread.is_alive():
                reader.close()  # the writers' audio template; a reader still stuck keeps it
            stats.reconnects = reader.reconnects
            self._close_live()
            if failed is not None:
                raise failed
        return stats

    @staticmethod
    def _check_live_args(url: str, rtmp_out: str | None, hls_dir: Path | None, vcam: bool,
                         vcam_device: str | None, loop: bool) -> None:
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

    def _live_reader(self, url: str, *, reconnect_seconds: float, loop: bool) -> LiveReader:
        """The input: decoded RGB frames here; the GPU job takes compressed packets for NVDEC."""
        return LiveReader(url, reconnect_seconds=reconnect_seconds, loop=loop, realtime=True,
                          outbound=self._outbound())

    def _outbound(self) -> Outbound:
        """The operator typed these URLs: no outbound policy; rtmps:// verified unless
        runtime.insecure_tls (--insecure-tls)."""
        return Outbound.from_config(self.config.runtime, enforce=False)

    def _live_frames(self, item: Frame | VideoPacket, backlog: int, buffer_frames: int,
                     stats: LiveStats) -> list[LiveFrame]:
        """The swapped output for one input item (the pump already dropped what was too old)."""
        assert isinstance(item, Frame)
        faces = self.swap_frame(item)
        return [LiveFrame(item.data, item.pts, item.time_base, faces)]

    def _live_prepare(self) -> None:
        """Before the input is opened: what can get ready without knowing the input (the GPU job
        warms its swap up here). Whatever the input sends meanwhile waits in its connection, and
        is skipped once the job reads it, so the work belongs before the connection is made."""

    def _live_warm_up(self, reader: LiveReader) -> None:
        """Before the first frame is read: get the models ready at the input's size (the GPU job's
        graph captures take seconds, which the first frames would otherwise wait for)."""
        width, height = reader.size
        self.warm_swap(size=(height, width))

    def _live_end(self, stats: LiveStats) -> list[LiveFrame]:
        """At the end of the input, the frames still held back (a decoder's reordering)."""
        return []

    def _close_live(self) -> None:
        """Release what `_live_frames` kept for the run (the GPU job's decoder and buffers)."""

    def _open_writers(self, width: int, height: int, time_base: Fraction | None, reader: LiveReader,
                      rtmp_out: str | None, hls_dir: Path | None, vcam_device: str | None = None,
                      vcam: bool = False, *, reconnect_seconds: float = 60.0) -> list[LiveOutput]:
        # Each output tolerates the outage the operator asked for (--reconnect), not a fixed one; its
        # tags claim the watermark only when this job embeds it.
        common: dict[str, Any] = dict(width=width, height=height, fps=reader.info_fps,
                                      time_base=time_base, audio_from=reader.audio_stream,
                                      crf=self.config.encode.crf, reconnect_seconds=reconnect_seconds,
                                      gop_seconds=self.config.encode.gop_seconds,
                                      tags=self.disclosure.tags, threads=self.config.encode.threads)
        out: list[LiveOutput] = []
        if rtmp_out:
            out.append(LiveWriter(rtmp_out, kind="rtmp", outbound=self._outbound(), **common))
        if hls_dir is not None:
            out.append(LiveWriter(str(hls_dir / "index.m3u8"), kind="hls", **common))
        if vcam:
            out.append(VirtualCamera(width=width, height=height, fps=reader.info_fps, device=vcam_device))
        return out


@dataclass
class LiveFrame:
    """A swapped frame on its way to the outputs: RGB (height, width, 3), or NV12 (height * 3/2,
    width) as the GPU path downloads it."""

    data: np.ndarray
    pts: int | None
    time_base: Fraction | None
    faces: int
    nv12: bool = False

    @property
    def width(self) -> int:
        return int(self.data.shape[1])

    @property
    def height(self) -> int:
        return int(self.data.shape[0] * 2 // 3) if self.nv12 else int(self.data.shape[0])


class _Pump:
    """The reader thread: demuxes (and on the CPU path decodes) the input while the job swaps.

    Video items wait in a deque; with `keep`, at most that many, the oldest dropped and counted (a
    live stream must not lag). Audio packets are never dropped.
    """

    def __init__(self, reader: LiveReader, stop: threading.Event, stats: LiveStats,
                 keep: int | None) -> None:
        self.reader, self.stop, self.stats, self.keep = reader, stop, stats, keep
        self.video: deque[tuple[Frame | VideoPacket, float]] = deque()
        self.audio: deque[AudioPacket] = deque()
        self.cond = threading.Condition()
        self.finished = threading.Event()
        self.thread = threading.Thread(target=self._run, name="live-reader", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def join(self, timeout: float) -> None:
        self.thread.join(timeout=timeout)

    def _run(self) -> None:
        try:
            for item in self.reader:
                if self.stop.is_set():
                    break
                with self.cond:
                    if isinstance(item, AudioPacket):
                        self.audio.append(item)
                    else:
                        if isinstance(item, VideoPacket):
                            # Counted as a frame once decoded (GpuLiveJob): the decoder may hold
                            # some back, and packets before the first keyframe give none.
                            self.stats.packets_in += 1
                        else:
                            self.stats.frames_in += 1
                        if self.keep is not None and len(self.video) >= self.keep:
                            self.video.popleft()  # the oldest waiting frame goes: keep up with live
                            self.stats.dropped += 1
                        self.video.append((item, time.monotonic()))
                    self.cond.notify()
        finally:
            self.finished.set()
            with self.cond:
                self.cond.notify()

    def take(self) -> tuple[tuple[Frame | VideoPacket, float] | None, list[AudioPacket], bool]:
        """The next video item (or None), all waiting audio, and whether the reader has ended; waits
        up to 0.1 s for something to arrive."""
        with self.cond:
            while (not self.video and not self.audio and not self.finished.is_set()
                   and not self.stop.is_set()):
                self.cond.wait(0.1)
            audio = list(self.audio)
            self.audio.clear()
            item = self.video.popleft() if self.video else None
            return item, audio, self.finished.is_set() and not self.video

    def backlog(self) -> int:
        """Video items waiting behind the one being processed."""
        with self.cond:
            return len(self.video)
