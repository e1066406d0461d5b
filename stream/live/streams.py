"""Live inputs and outputs over PyAV (FFmpeg): RTMP pull with reconnect (or a file played in real
time), RTMP push and HLS out.

The options and arguments are built by pure functions (`rtmp_input_options`, `x264_live_options`,
`hls_options`) so that tests pin them exactly.
"""

from __future__ import annotations

import errno
import logging
import math
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, NoReturn

import av
import numpy as np
from av.video.frame import PictureType

from ..disclosure import synthetic_tags
from ..errors import InputError, InputNotFoundError, OutputError
from ..io.video import AudioPacket
from ..netpolicy import Connection, Outbound
from ..redact import RedactingFilter
from ..types import Frame
from .flv import SplicedFlv

log = logging.getLogger(__name__)
log.addFilter(RedactingFilter())  # its lines quote input and output URLs: no stream keys


_NETWORK_URL = re.compile(r"^(?!file://)[a-z][a-z0-9+.-]*://", re.IGNORECASE)


def is_file_input(url: str) -> bool:
    """A local file (a path or a file: URL), which ends, rather than a network stream (rtmp://,
    srt://, http(s)://, udp:// ...), which drops and comes back."""
    return not _NETWORK_URL.match(url)


def _seconds(packet: AudioPacket) -> Fraction:
    """An audio packet's time on the output's timeline (one with none goes first)."""
    p = packet.packet
    return Fraction(-1) if p.pts is None or p.time_base is None else p.pts * p.time_base


def rtmp_input_options(*, quick_probe: bool = True) -> dict[str, str]:
    """FFmpeg options for pulling a live RTMP stream with the least buffering; with `quick_probe`,
    1 s of probing (FFmpeg's RTMP client always announces audio, and on a video-only stream its
    default probe waits 5 s for it), else FFmpeg's full probe."""
    opts = {"rtmp_live": "live", "fflags": "nobuffer", "flags": "low_delay"}
    if quick_probe:
        opts.update(analyzeduration="1000000", probesize="500000")
    return opts


def join_rtmp(open_once: Callable[[dict[str, str]], Any], close: Callable[[Any], None]) -> Any:
    """Join a live RTMP stream: `open_once(options)` makes one connection with `rtmp_input_options`
    and returns its open container. When the quick probe saw no video (a stream whose audio runs more
    than a second ahead of its video, as a busy server's output can), the container is closed with
    `close` and the stream joined once more with FFmpeg's full probe, on a new connection."""
    c = open_once(rtmp_input_options())
    if c.streams.video:
        return c
    close(c)
    return open_once(rtmp_input_options(quick_probe=False))


MEDIA_FORMATS = ("mov", "mp4", "matroska", "flv", "mpegts", "avi", "nut", "h264", "hevc", "mpeg")
"""Demuxers a media-root file may be read with: containers of H.264 or HEVC video that name no other
file. Playlists (hls), concat lists, image sequences and session descriptions (sdp) can make FFmpeg
read other files or connect elsewhere, and are left out."""


def media_file_options() -> dict[str, str]:
    """FFmpeg options for a file a request named (a --media-root file): read through the file
    protocol only (no http, no tcp from inside the file), with the demuxers of MEDIA_FORMATS, and
    MP4/MOV data references to other files left off. FFmpeg checks the demuxer against the list
    after probing and before it reads the file's header, so a playlist never opens what it names."""
    return {"protocol_whitelist": "file", "format_whitelist": ",".join(MEDIA_FORMATS),
            "enable_drefs": "0"}


KEYINT_BACKSTOP_GOPS = 10
"""x264's own keyframe interval, in GOPs at the rate given to `x264_live_options`: a backstop only."""


def x264_live_options(fps: float, *, preset: str = "ultrafast", crf: int = 23,
                      gop_seconds: float = 1.0, threads: int = 0) -> dict[str, str]:
    """libx264 for live outputs: no B-frames (no reordering delay), zerolatency tuning, and the
    keyframes placed by the caller, who forces one every `gop_seconds` of output time (`LiveWriter`).

    x264 counts its keyframe interval in frames, and a live output's rate is not known in advance
    (a CPU swap that keeps up with 2-7 of 30 input frames a second): `g` = 30 frames then meant a
    keyframe every 4-15 s. So x264's own interval is set far out (KEYINT_BACKSTOP_GOPS GOPs at
    `fps`), a backstop should forcing ever stop; forced keyframes are IDR (`forced-idr`), where a
    new viewer or an HLS segment can start; scene cuts add none (`sc_threshold` 0).

    `threads` 0 lets x264 choose (1.5 threads per core, sliced); a server with many outputs on
    shared cores gives each a few (see `LiveWriter`)."""
    # Never under HLS_SEGMENT_FRAMES GOPs' worth of frames either: at a few frames a second x264's
    # own keyframes would otherwise come sooner than the writer's, and cut HLS segments too short.
    g = max(HLS_SEGMENT_FRAMES * KEYINT_BACKSTOP_GOPS, round(fps * gop_seconds * KEYINT_BACKSTOP_GOPS))
    opts = {"preset": preset, "tune": "zerolatency", "crf": str(crf), "bf": "0", "g": str(g),
            "sc_threshold": "0", "forced-idr": "1"}
    if threads:
        opts["threads"] = str(threads)
    return opts


def hls_options(folder: Path, *, segment_seconds: float = 1.0, list_size: int = 6) -> dict[str, str]:
    """A sliding-window live playlist: short segments, old ones deleted. The muxer cuts a segment at
    the first keyframe past each `segment_seconds`: the writer's keyframes every `gop_seconds`
    (the same value) make every segment that long, within a frame."""
    return {"hls_time": f"{segment_seconds:g}", "hls_list_size": str(list_size),
            "hls_flags": "delete_segments+independent_segments+omit_endlist",
            "hls_segment_filename": str(folder / "seg_%05d.ts")}


def _not_publishing(e: BaseException) -> bool:
    """Whether a failed open looks like a server with nothing published yet: nginx-rtmp keeps a
    player of an unpublished stream connected and silent, and FFmpeg ends that at its open timeout
    with EIO (or ETIMEDOUT). A refused key, a server that speaks no RTMP or a bad URL fail otherwise,
    and at once: they are errors to report, not reasons to wait."""
    return isinstance(e, av.error.OSError) and e.errno in (errno.EIO, errno.ETIMEDOUT)


@dataclass(frozen=True)
class VideoPacket:
    """One compressed video access unit, Annex-B (start codes; SPS/PPS in-band before keyframes),
    on the reader's continuous timeline."""

    data: bytes
    pts: int
    time_base: Fraction
    index: int
    keyframe: bool
    connection: int = 0
    """Which connection (or pass of a looped file) it came from, counting from 0."""
    codec: str = "h264"
    """That connection's codec ('h264' or 'hevc'): a new publisher may send another."""
    reorders: bool = False
    """Whether that connection's stream may reorder (B-frames): its decoder must reorder."""


def _video_facts(v: Any) -> tuple[str, bool]:
    """(codec, reorders) of a PyAV video stream: 'hevc' or 'h264' (what the reader takes), and
    whether its SPS allows reordering (B-frames): then packets arrive out of presentation order and
    a decoder of packets must reorder (NVDEC's NATIVE latency, not LOW)."""
    return ("hevc" if v.codec_context.name == "hevc" else "h264"), bool(v.codec_context.has_b_frames)


JUMP_S = Fraction(1)
"""A stream's timestamps that move forward by more than this between two packets of one connection
have jumped (a publisher that restarted its clock, an encoder's wrap): a live input never leaves a
gap this long without the read timing out and the connection dropping first."""
BACK_S = Fraction(1, 2)
"""...and timestamps that go back by more than this have jumped too (decode order never does;
presentation order goes back by a few frames at most, with B-frames)."""


HELD_AUDIO = 500
"""Audio packets (about 10 s) a connection may hold while it waits for its first video packet."""


class Timeline:
    """One clock for a live input's video and audio: where each packet goes on the output timeline.

    The input's timestamps run in epochs: the first connection's first epoch keeps its own times;
    a new epoch starts at each reconnect (and each pass of a looped file), and wherever a stream's
    timestamps jump within a connection (forward by more than `JUMP_S`, back by more than
    `BACK_S`): a publisher restarted behind the same server, whose clock starts at 0 again, or an
    encoder whose clock jumps. The video starts each epoch one frame after its last frame, and that
    epoch's ONE shift moves its audio too: the publisher's own A/V offset is kept exactly. Audio that
    reaches a new epoch before the video does waits (`offset` answers None) until the video's first
    packet of it sets the shift, or until the video has gone on for `JUMP_S` without a jump of its
    own (an audio-only jump): then the audio continues one packet after its own last one.
    Times are exact fractions of a second.
    """

    def __init__(self) -> None:
        self._shifts: list[Fraction] = [Fraction(0)]
        """Each epoch's shift: seconds added to its packets' times."""
        self._epoch = {"video": 0, "audio": 0}
        """Which epoch each stream is in."""
        self._audio_next: int | None = None
        """The epoch the video started last, until the audio joins it (or the video has run on
        `JUMP_S` without it: that jump was the video's alone)."""
        self._video_jumped_at = Fraction(0)
        self._waiting: tuple[Fraction, Fraction] | None = None
        """While the audio waits in an epoch the video has not reached: (the audio's order time at
        its jump, the video's order time then)."""
        self._fresh: set[str] = set()
        """Streams whose next packet starts a new epoch (a new connection)."""
        self._last: dict[str, Fraction] = {}
        """Per stream: the order time of its last packet, to find jumps."""
        self._end: dict[str, Fraction] = {}
        """Per stream: the output time just after its latest packet."""
        self.jumps = 0
        """Timestamp jumps found within connections, in any stream."""

    def new_connection(self) -> None:
        """The next packets come from a new connection (or a new pass of a file): both streams
        start a new epoch with their next packet."""
        if self._end:
            self._fresh = {"video", "audio"}
        # What the last connection left half done goes with it: audio that waited for its video
        # (the reader drops a connection's held audio), or an epoch its video opened for audio that
        # never came. Kept, either would tie the next connection's audio to the wrong video.
        self._waiting = None
        self._audio_next = None

    def _jumped(self, kind: str, order: Fraction) -> bool:
        last = self._last.get(kind)
        self._last[kind] = order
        if kind in self._fresh:
            self._fresh.discard(kind)
            return True
        if last is None:
            return False
        gap = order - last
        if gap > JUMP_S or gap < -BACK_S:
            self.jumps += 1
            log.info("live input timestamps jumped by %.3f s (%s): continuing", float(gap), kind)
            return True
        return False

    def offset(self, kind: str, order: Fraction, pts: Fraction, duration: Fraction) -> Fraction | None:
        """The amount to add to a packet's times (seconds), or None for audio that must wait for
        the video to reach its epoch. `kind` is 'video' or 'audio'; `order` is the time the stream's
        packets increase in (decode time; the pts where there is none), `pts` its presentation time
        and `duration` its length, or the stream's frame or packet interval. A packet that waited
        is offered again, unchanged, until it is placed."""
        if kind == "video":
            off = self._video(order, self._jumped(kind, order))
        elif self._waiting is not None and self._last.get("audio") == order:
            return None  # the same packet, offered again: still waiting
        else:
            off = self._audio(order, self._jumped(kind, order))
            if off is None:
                return None
        end = max(order, pts) + off + duration
        if end > self._end.get(kind, end - 1):
            self._end[kind] = end
        return off

    def _video(self, order: Fraction, jumped: bool) -> Fraction:
        if jumped:
            shift = self._end.get("video", order) - order  # one frame after the last one
            if self._waiting is not None:
                self._shifts[self._epoch["audio"]] = shift  # the epoch the audio waits in
                self._epoch["video"] = self._epoch["audio"]
                self._waiting = None
            else:
                self._shifts.append(shift)
                self._epoch["video"] = self._audio_next = len(self._shifts) - 1
                self._video_jumped_at = order
        elif self._waiting is not None and order - self._waiting[1] > JUMP_S:
            # The audio jumped alone: it continues one packet after its own last one.
            a_order = self._waiting[0]
            self._shifts[self._epoch["audio"]] = self._end.get("audio", a_order) - a_order
            self._waiting = None
        elif self._audio_next is not None and order - self._video_jumped_at > JUMP_S:
            self._audio_next = None  # the video jumped alone
        return self._shifts[self._epoch["video"]]

    def _audio(self, order: Fraction, jumped: bool) -> Fraction | None:
        if jumped:
            if self._audio_next is not None:
                self._epoch["audio"], self._audio_next = self._audio_next, None
            else:
                self._shifts.append(Fraction(0))  # set by the video's jump, or by the wait's end
                self._epoch["audio"] = len(self._shifts) - 1
                self._waiting = (order, self._last.get("video", order))
        if self._waiting is not None:
            return None
        return self._shifts[self._epoch["audio"]]


class LiveReader:
    """Frames and audio packets from a live URL, reconnecting when the input drops, or from a file,
    which ends at its end (or starts again with `loop`).

    After a reconnect the new publisher's timestamps start again, and so do a looped file's; the
    reader's `Timeline` moves video and audio together so that both continue across the gap, in
    step (video pts in the first connection's time base). With `realtime`, a file's frames come out at their own pace, as a live source sends them.
    """

    def __init__(self, url: str, *, reconnect_seconds: float = 60.0, open_timeout: float = 5.0,
                 read_timeout: float = 2.0, loop: bool = False, realtime: bool = False,
                 packets: bool = False, outbound: Outbound | None = None, media: bool = False) -> None:
        self.url = url
        self.packets = packets
        """Yield the video as `VideoPacket`s (Annex-B access units for NVDEC) instead of decoding it."""
        self.is_file = is_file_input(url)
        self.outbound = outbound or Outbound()
        """Where a network input may connect (the API's policy; none for the operator's own URL)
        and how rtmps:// is verified."""
        self.media = media and self.is_file
        """A file a request named: opened with `media_file_options`."""
        self._connections: dict[int, Connection] = {}
        self.loop = loop and self.is_file
        self.realtime = realtime and self.is_file
        self.reconnect_seconds = reconnect_seconds
        # A read that waits longer than this is a dropped input (nginx keeps a player's connection
        # open after its publisher leaves): it ends the read and starts reconnecting.
        self.timeouts = (open_timeout, read_timeout)
        self.reconnects = 0
        self.loops = 0
        """Times a looped file started again."""
        self.audio_stream: Any = None
        self.codec = "h264"
        """The video codec FFmpeg names ('h264' or 'hevc'), known once the input is open."""
        self.reorders = False
        self.size = (0, 0)
        """(width, height) the input declared when it was opened; (0, 0) if it did not."""
        self._template: Any = None
        self.info_fps: float = 30.0
        self.timeline = Timeline()
        """Where video and audio go on the output timeline, together (one clock)."""
        self._last_pts: int | None = None
        """The largest video pts given out (output timeline, in `time_base`)."""
        self._last_audio: int | None = None
        """The last audio pts given out (output timeline, in the audio stream's time base)."""
        self._step = Fraction(1, 30)
        """One frame, in seconds: the video's duration when a packet gives none."""
        self._clock: tuple[float, float] | None = None
        self._time_base: Fraction | None = None
        self._index = 0
        self._stopped = False
        self._wake = threading.Event()
        self._container: Any = None

    def _open(self, open_timeout: float | None = None) -> Any:
        if self.is_file:
            return av.open(self.url, options=media_file_options() if self.media else {},
                           timeout=self.timeouts)
        timeouts = self.timeouts if open_timeout is None else (open_timeout, self.timeouts[1])

        def open_once(opts: dict[str, str]) -> Any:
            # Each connection is checked (and pinned, or relayed over verified TLS: one connection
            # per relay) on its own: a reconnect, or a second join, looks the name up again.
            conn = self.outbound.connect(self.url, timeout=self.timeouts[0])
            try:
                if self.outbound.policy is not None:
                    opts["protocol_whitelist"] = "rtmp,tcp"  # what was checked, and nothing it leads to
                c = av.open(conn.url, options=opts, timeout=timeouts)
            except BaseException:
                conn.close()
                raise
            self._connections[id(c)] = conn
            return c

        if self.url.lower().startswith(("rtmp://", "rtmps://")):
            return join_rtmp(open_once, self._close_container)
        return open_once({})

    def _close_container(self, c: Any) -> None:
        c.close()
        conn = self._connections.pop(id(c), None)
        if conn is not None:
            conn.close()

    def open(self, *, wait_seconds: float = 0.0, on_wait: Callable[[], None] | None = None,
             stop: threading.Event | None = None) -> None:
        """First connection: a failure here is the user's input error.

        With `wait_seconds`, a network input that is not yet publishing is tried again until that
        long has passed (the operator starts SwapStream first, then OBS); `on_wait` is called once,
        at the first such miss, so that the caller can say what it waits for. `stop` (or `stop()`)
        ends the wait early, as an `InputError` too."""
        deadline = time.monotonic() + wait_seconds
        waiting = False
        while True:
            try:
                self._container = self._open(
                    self._attempt_timeout(deadline, wait_seconds, first=not waiting)
                    if wait_seconds > 0 else None)
                break
            except (av.error.FFmpegError, OSError) as e:
                left = deadline - time.monotonic()
                stopped = self._stopped or (stop is not None and stop.is_set())
                if not self.is_file and _not_publishing(e) and left > 0 and not stopped:
                    if not waiting and on_wait is not None:
                        on_wait()
                    waiting = True
                    # A refused or empty play comes back at once or after the open timeout: a short
                    # pause keeps a fast refusal from spinning.
                    (stop or self._wake).wait(min(0.25, left))
                    continue
                self._raise_open_error(e)
        if not self._container.streams.video:
            raise InputError(f"live input '{self.url}' has no video stream")
        v = self._container.streams.video[0]
        if v.codec_context.name not in ("h264", "hevc"):
            name = v.codec_context.name
            self._close_container(self._container)
            raise InputError(f"live input '{self.url}' is {name} video; publish H.264 (in OBS: "
                             f"Output > Encoder x264 or NVENC H.264)")
        self._time_base = v.time_base
        self.codec, self.reorders = _video_facts(v)
        self.size = (int(v.codec_context.width or 0), int(v.codec_context.height or 0))
        self.info_fps = float(v.average_rate or v.guessed_rate or 30)
        self._step = 1 / Fraction(self.info_fps).limit_denominator(1001)
        self.audio_stream = self._container.streams.audio[0] if self._container.streams.audio else None
        # Writers add their audio stream from `audio_stream` as a template, possibly after this
        # container has ended (a short file; an output that reconnects later): it stays open until
        # `close()`, since a closed container's streams are freed memory.
        self._template = self._container

    def _attempt_timeout(self, deadline: float, wait_seconds: float, *, first: bool) -> float:
        """The open timeout of one try when the input may be waited for: never past the deadline, so
        that the wait ends when it says (nginx answers a player of a stream nobody publishes with
        silence, and FFmpeg gives up on it only at its open timeout). The first try of a short wait
        takes at most half of it, so that the "waiting" line comes while there is still a wait."""
        limit = min(self.timeouts[0], wait_seconds / 2) if first else self.timeouts[0]
        return max(0.5, min(limit, deadline - time.monotonic()))

    def _raise_open_error(self, e: BaseException) -> NoReturn:
        """The user's input error for a first connection that failed with `e`."""
        if self.is_file and isinstance(e, FileNotFoundError):
            raise InputNotFoundError(f"live input file '{self.url}' does not exist. Check the "
                                     f"path.") from None
        if self.media and isinstance(e, av.error.ArgumentError):
            # What FFmpeg answers for a demuxer off `format_whitelist` (a playlist, a list).
            raise InputError(f"live input file '{Path(self.url).name}' is not a video file of a "
                             f"kind read from the media folder ({', '.join(MEDIA_FORMATS)}): "
                             f"playlists (.m3u8) and concat lists, which name other files, are "
                             f"refused. Give an MP4, MKV, FLV or TS file.") from None
        raise InputError(f"cannot open live input '{self.url}': {e}. Check the URL and that "
                         f"the stream is being published.") from None

    @property
    def time_base(self) -> Fraction | None:
        """The video stream's time base (of every pts the reader gives), once open."""
        return self._time_base

    def stop(self) -> None:
        self._stopped = True
        self._wake.set()

    def close(self) -> None:
        """After the iteration has ended: release the first connection's container, kept open as
        the writers' audio template. Safe to call twice."""
        if self._template is not None:
            self._close_container(self._template)
            self._template = None

    def __iter__(self) -> Iterator[Frame | VideoPacket | AudioPacket]:
        if self._container is None:
            self.open()
        while not self._stopped:
            ended, start = False, self._index
            try:
                yield from self._read(self._container)
                ended = True
            except (av.error.FFmpegError, OSError) as e:
                log.warning("live input '%s' %s: %s", self.url, "failed" if self.is_file else "dropped", e)
            finally:
                if self._container is not self._template:
                    self._close_container(self._container)
            if self._stopped:
                return
            if self.is_file:
                # The end of a file is the end of the input, not a drop: no reconnecting. A loop
                # stops on an error, or on a pass without frames, rather than spin.
                if not (self.loop and ended and self._index > start and self._restart()):
                    log.info("live input file '%s' ended after %d frames", self.url, self._index)
                    return
            elif not self._reconnect():
                return

    def _read(self, c: Any) -> Iterator[Frame | VideoPacket | AudioPacket]:
        v = c.streams.video[0]
        a = c.streams.audio[0] if c.streams.audio else None
        streams = [v] + ([a] if a is not None else [])
        self.timeline.new_connection()
        held: list[Any] = []  # audio waiting for its connection's first video packet
        tb = self._time_base or v.time_base
        bsf = None
        connection = self.reconnects + self.loops
        codec, reorders = _video_facts(v)  # this connection's: a new publisher may differ
        if self.packets:
            from av.bitstream import BitStreamFilterContext

            # Per connection: a new publisher, new extradata.
            bsf = BitStreamFilterContext(f"{codec}_mp4toannexb", v)
        for packet in c.demux(streams):
            if self._stopped:
                return
            if packet.stream.type == "audio":
                if packet.size:
                    held.append(packet)
                    yield from self._audio_out(held)
                continue
            if self.packets:
                units = self._annexb(bsf, packet)
                for data, raw_pts, raw_dts, key in units:
                    # Packets come in decode order: with B-frames their pts go back and forth.
                    pts, dts = self._place_video(raw_pts, raw_dts, v.time_base, monotonic=False)
                    yield from self._audio_out(held)
                    if self.realtime:
                        # A live source sends in decode order: pace by the decode time, which
                        # increases, rather than hold a reference frame until its display time.
                        self._pace(dts)
                        if self._stopped:
                            return
                    yield VideoPacket(data, pts, tb, self._index, key, connection, codec, reorders)
                    self._index += 1
                continue
            for vf in packet.decode():
                pts, _ = self._place_video(vf.pts, None, v.time_base)
                yield from self._audio_out(held)
                rgb = np.ascontiguousarray(vf.to_ndarray(format="rgb24"))
                if self.realtime:
                    self._pace(pts)
                    if self._stopped:
                        return
                yield Frame(rgb, pts=pts, time_base=tb, index=self._index)
                self._index += 1

    def _place_video(self, raw_pts: int | None, raw_dts: int | None, time_base: Fraction, *,
                     monotonic: bool = True) -> tuple[int, int]:
        """(pts, dts) of a video frame or packet on the output timeline, in the reader's
        `time_base` (the first connection's). Frames (`monotonic`) get strictly increasing pts;
        packets in decode order keep their order, and `_last_pts` is the largest so far."""
        out_tb = self._time_base or time_base
        if raw_pts is None:
            # No time (a raw stream): one frame after the last one given out.
            pts = dts = (self._last_pts or 0) + max(1, round(self._step / out_tb))
        else:
            p = raw_pts * time_base
            d = raw_dts * time_base if raw_dts is not None else p
            off = self.timeline.offset("video", d, p, self._step)
            assert off is not None  # video always places itself
            pts = round((p + off) / out_tb)
            dts = round((d + off) / out_tb)
        if monotonic and self._last_pts is not None and pts <= self._last_pts:
            pts = self._last_pts + 1
        self._last_pts = pts if self._last_pts is None else max(pts, self._last_pts)
        return pts, dts

    def _audio_out(self, held: list[Any]) -> Iterator[AudioPacket]:
        """The held audio packets that can be placed now, in order; the rest stay held (at most
        `HELD_AUDIO`: a connection whose video never comes loses its oldest audio, not memory)."""
        while held:
            placed = self._place_audio(held[0])
            if placed is None:
                del held[:-HELD_AUDIO]
                return
            p = held.pop(0)
            if placed:
                yield AudioPacket(p)

    def _place_audio(self, packet: Any) -> bool | None:
        """Move an audio packet onto the output timeline, beside the video (one clock). None while
        its connection has no video yet; False for a packet to leave out: no time, or one that would
        not come after the last one given out (a new connection's first audio may start a few ms
        before its first video, which continues the video exactly; a muxer refuses audio that goes
        back)."""
        if packet.pts is None:
            return False
        tb = packet.time_base or packet.stream.time_base
        p = packet.pts * tb
        d = packet.dts * tb if packet.dts is not None else p
        dur = packet.duration * tb if packet.duration else Fraction(1024, max(1, packet.stream.rate or 48000))
        off = self.timeline.offset("audio", d, p, dur)
        if off is None:
            return None
        shift = round(off / tb)
        pts = packet.pts + shift
        if self._last_audio is not None and pts <= self._last_audio:
            return False
        packet.pts = pts
        if packet.dts is not None:
            packet.dts += shift
        self._last_audio = pts
        return True

    @staticmethod
    def _annexb(bsf: Any, packet: Any) -> list[tuple[bytes, int | None, int | None, bool]]:
        """The packet as Annex-B access units (data, pts, dts, keyframe): FLV and MP4 carry H.264 with
        length prefixes and the SPS/PPS in the stream's extradata; NVDEC's parser wants start codes
        and the parameter sets in-band, which FFmpeg's h264_mp4toannexb / hevc_mp4toannexb filter
        produces (and passes Annex-B input such as MPEG-TS through)."""
        out = []
        for p in bsf.filter(packet):
            if p.size:
                out.append((bytes(p), p.pts, p.dts, bool(p.is_keyframe)))
        return out

    def _pace(self, pts: int) -> None:
        """Hold a file's frame until its time, as a live source would send it. A reader that fell
        behind by more than 0.1 s starts the clock again rather than catching up in a burst."""
        t = float(pts * (self._time_base or 0))
        now = time.monotonic()
        if self._clock is None or now - (self._clock[0] + t - self._clock[1]) > 0.1:
            self._clock = (now, t)
        wait = self._clock[0] + t - self._clock[1] - now
        if wait > 0:
            self._wake.wait(wait)

    def _restart(self) -> bool:
        """Open a looped file again; its next pass starts one frame after the last frame of this one."""
        try:
            self._container = self._open()
        except (av.error.FFmpegError, OSError) as e:
            log.warning("live input file '%s' could not be opened again: %s", self.url, e)
            return False
        self.loops += 1
        return True

    def _reconnect(self) -> bool:
        deadline = time.monotonic() + self.reconnect_seconds
        delay = 0.25
        while not self._stopped and time.monotonic() < deadline:
            time.sleep(delay)
            try:
                self._container = self._open()
                if self._container.streams.video:
                    self.reconnects += 1
                    log.info("live input '%s' reconnected (%d)", self.url, self.reconnects)
                    return True
                self._close_container(self._container)
            except (av.error.FFmpegError, OSError):
                pass
            delay = min(delay * 2, 1.0)  # back off, but retry at least every second: a try costs nothing
        if not self._stopped:  # stopped (Ctrl+C, DELETE): not an outage to report
            log.warning("live input '%s' did not come back within %.0f s: ending", self.url,
                        self.reconnect_seconds)
        return False


RECOVERED_AFTER_S = 1.0
"""A reconnected output ends an outage only once it has carried frames this long. One frame written
proves nothing: a server that accepts the connection and drops it takes a frame or two into the
socket's buffer before a write fails."""


RATE_HOLD_FRAMES = 16
"""Most frames a new `LiveWriter` holds back while it measures the rate it will declare (16 frames
of 1080p are ~50 MB held as YUV 4:2:0, once per output, at its start)."""
RATE_WINDOW_FRAMES = 64
"""Frames whose output times a writer keeps to measure the rate it declares on a reconnection."""
AUDIO_HOLD_PACKETS = 256
"""Audio packets a new writer keeps while it measures (about 5 s of 48 kHz AAC); older ones go."""
HLS_PLAYABLE_SEGMENTS = 3
"""Segments a live playlist lists before a player can start it. A player starts three target
durations from the live edge (RFC 8216, 6.3.3), and Chromium's built-in HLS player fails a live
playlist of one or two segments with DEMUXER_ERROR_COULD_NOT_PARSE instead of waiting (measured)."""


def hls_playable(playlist: Path) -> bool:
    """Whether a live HLS playlist lists enough segments for a player to start it."""
    try:
        return playlist.read_text().count("#EXTINF:") >= HLS_PLAYABLE_SEGMENTS
    except (OSError, UnicodeDecodeError):
        return False  # not written yet


HLS_SEGMENT_FRAMES = 8
"""Fewest frames an HLS segment holds (all but a stream's last). Chromium's built-in HLS player
(Debian's Chromium 156) fails a segment of 7 frames or fewer with DEMUXER_ERROR_COULD_NOT_PARSE,
whatever its duration (measured: 8 frames at 30 fps or at 2 fps play, 7 do not); a CPU swap that
falls behind delivers 2-7 frames a second, so one-second segments were unplayable there."""


OUTAGE_FACTOR = 8
"""A gap between output frames longer than this many times the mean of the others is an outage
(`delivered_rate`): twice the longest batch of frames a swap hands out together."""


def delivered_rate(times: Iterable[Fraction]) -> Fraction | None:
    """The frame rate a series of output times (seconds, increasing) delivers: frames per second
    over its intervals, leaving out each gap over OUTAGE_FACTOR times the mean of the other gaps (an
    outage, or an input that dropped, is not the rate), in rounds until none is left out; None with
    fewer than two frames or no time between them.

    The mean of the others, not the median of all: a slow swap hands out its frames in bursts (the
    frames that queued while one batch ran are swapped together), so most gaps can be a burst's
    milliseconds and the rest a batch's time; a median then fell on the short ones and left the
    long ones out (CI: 22 fps declared for 7 delivered). A batch's gap is at most `neural.max_batch`
    (4) frame periods, within the factor of 8 wherever the window starts and ends. Not handled: an
    output that fails so often that outages are a large share of its gaps (each then counts as part
    of the rate). The shortest gap is never above the others' mean, so something is always kept."""
    t = list(times)
    kept = [b - a for a, b in zip(t, t[1:]) if b > a]
    if not kept:
        return None
    while True:
        total, n = sum(kept, Fraction(0)), len(kept)
        inside = [g for g in kept if g * (n - 1) <= OUTAGE_FACTOR * (total - g)]
        if len(inside) == n:
            return Fraction(n) / total
        kept = inside


class LiveWriter:
    """Encodes RGB frames with x264 (+ AAC audio) and pushes them to an RTMP URL (FLV) or writes an
    HLS playlist. A push that fails reconnects with back-off; frames during the outage are counted
    in `dropped`, never queued without bound. An outage runs from the first failure until a
    connection has carried frames for `RECOVERED_AFTER_S`; one longer than `reconnect_seconds` is an
    `OutputError`.

    Keyframes: one every `gop_seconds` of the output's timeline (the frames' pts), forced by the
    writer, whatever the frame rate: the first frame at or past each multiple of `gop_seconds` from
    the first frame is an IDR frame. A new RTMP viewer waits at most that long for a picture, at
    30 fps or at the 2-7 fps of a CPU swap that falls behind. An HLS segment is that long too, or a
    whole number of GOPs where one GOP holds too few frames (`_segment_gops`, with one-second GOPs:
    one GOP from 8.8 fps up, two at 4.4-8.8 fps, three at 2.9-4.4 fps, with hysteresis), and never
    fewer than HLS_SEGMENT_FRAMES frames.

    Declared rate: the rate the output delivers, measured. A live job's output rate is not known in
    advance: the CPU path drops the frames its swap cannot keep up with, so it delivers anything up
    to the input's rate (`fps`), and that input rate would be a false claim. The writer holds its
    first frames until they span `gop_seconds` (or RATE_HOLD_FRAMES frames), declares the rate they
    were delivered at (FLV's `framerate`, the stream's average rate, x264's SPS timing), then sends
    them; a reconnection declares the rate of the last RATE_WINDOW_FRAMES frames. The stream's
    start waits that long, once; HLS waits as long for its first segment anyway. `fps` is declared
    only when an output ends before two frames could be measured.

    Tags: `tags` are written as given (`Disclosure.tags`, which claims a watermark only when the
    frames carry one); without them, the synthetic-content tags without the watermark claim, since
    a writer that is not told what was done to its frames must not claim more.
    """

    def __init__(self, target: str, *, width: int, height: int, fps: float, time_base: Fraction,
                 audio_from: Any = None, kind: str = "rtmp", crf: int = 23,
                 gop_seconds: float = 1.0, reconnect_seconds: float = 30.0,
                 outbound: Outbound | None = None, tags: Mapping[str, str] | None = None,
                 threads: int = 0) -> None:
        if not gop_seconds > 0:
            raise ValueError(f"gop_seconds must be positive, got {gop_seconds!r}")
        self.target = target
        self.kind = kind
        self.outbound = outbound or Outbound()
        """Where an RTMP push may connect and how rtmps:// is verified (as `LiveReader.outbound`)."""
        self._conn: Connection | None = None
        self.width, self.height = width - width % 2, height - height % 2
        self.fps = fps
        self.time_base = time_base
        self.audio_from = audio_from
        self.crf = crf
        self.gop_seconds = gop_seconds
        self.threads = threads
        """x264 threads (0: x264's own choice, for a machine that runs this one output)."""
        self._gop = Fraction(gop_seconds).limit_denominator(1000)
        self.tags = dict(tags) if tags is not None else synthetic_tags(watermarked=False)
        self.reconnect_seconds = reconnect_seconds
        self.frames = 0
        self.dropped = 0
        self.keyframes = 0
        """Keyframes forced so far (one per `gop_seconds` of output)."""
        self.declared_rate: Fraction | None = None
        """The frame rate the current connection declares, once measured."""
        self._times: deque[Fraction] = deque(maxlen=RATE_WINDOW_FRAMES)
        """Output times (seconds) of the newest frames sent or held: the delivered rate."""
        self._held: list[tuple[Any, Fraction]] = []
        """Frames (and their times) held while the first rate is measured."""
        self._held_audio: deque[AudioPacket] = deque(maxlen=AUDIO_HOLD_PACKETS)
        self._next_key: Fraction | None = None
        """Output time from which the next frame is forced to be a keyframe; None: the next one is."""
        self._since_key = 0
        """Frames encoded since the last forced keyframe."""
        self._segment = 1
        """GOPs per HLS segment (always 1 for RTMP): see `_segment_gops`."""
        self._grid: Fraction = Fraction(0)
        self._down_since: float | None = None
        """Start of the current outage (its first failure), or None while the output works."""
        self._up_since = time.monotonic()
        """When the current connection was opened."""
        self._next_try = 0.0
        self._delay = 0.25
        self._c: Any = None
        self._v: Any = None
        self._a: Any = None
        self._deferred = kind != "hls"
        """An RTMP push connects only once its held frames are ready: a publisher that connects
        and then sends nothing for a GOP leaves a viewer who joins in that second with no video
        (nginx-rtmp passes it no codec headers; seen with PyAV and ffmpeg viewers)."""
        if not self._deferred:
            self._open()

    def _open(self) -> None:
        """Open the container (an unusable output fails here: HLS at once, RTMP when its first
        frames are ready); its streams are added once
        the rate to declare is known (`_add_streams`)."""
        try:
            if self.kind == "hls":
                folder = Path(self.target).parent
                folder.mkdir(parents=True, exist_ok=True)
                c = av.open(self.target, "w", format="hls",
                            options=hls_options(folder, segment_seconds=self.gop_seconds))
            else:
                conn = self.outbound.connect(self.target, timeout=5.0)
                try:
                    # Not FFmpeg's FLV muxer: its interleaving held each frame for the next audio.
                    c = SplicedFlv(conn.url, timeout=5.0)
                except BaseException:
                    conn.close()
                    raise
                self._conn = conn
        except (av.error.FFmpegError, OSError) as e:
            raise OutputError(f"cannot open live output '{self.target}': {e}. Check the URL or "
                              f"folder, and that the server accepts this stream key.") from None
        self._c, self._v, self._a = c, None, None
        if self.declared_rate is not None:
            # A reconnection: the rate delivered lately, known without holding frames back.
            self._add_streams(delivered_rate(self._times) or self.declared_rate)

    def _add_streams(self, rate: Fraction) -> None:
        rate = min(max(Fraction(rate), Fraction(1, 10)), Fraction(1000)).limit_denominator(1001)
        self.declared_rate = rate
        c = self._c
        v = c.add_stream("libx264", rate=rate)
        v.width, v.height, v.pix_fmt = self.width, self.height, "yuv420p"
        v.time_base = self.time_base
        v.codec_context.time_base = self.time_base
        v.options = x264_live_options(float(rate), crf=self.crf, gop_seconds=self.gop_seconds,
                                      threads=self.threads)
        self._v = v
        if self.audio_from is not None and self.audio_from.codec_context.name == "aac":
            self._a = c.add_stream_from_template(self.audio_from)
        # The content is synthetic: FLV keeps every tag, HLS's MPEG-TS segments the service names.
        c.metadata.update(self.tags)
        self._next_key = None  # a new encoder starts with a keyframe, and the grid from it

    @property
    def started(self) -> bool:
        """Whether the encoder runs: a new writer holds its first frames (up to RATE_HOLD_FRAMES or
        one GOP) to measure the rate it declares, then encodes them all at once (and an RTMP push
        connects then): a one-time stall its caller may want to tell from steady work."""
        return self._v is not None

    def write(self, frame: Frame) -> None:
        """Encode and send an RGB frame."""
        if self._c is None and not self._deferred and not self._retry():
            self.dropped += 1
            return
        img = frame.data[: self.height, : self.width]
        vf = av.VideoFrame.from_ndarray(np.ascontiguousarray(img), format="rgb24")
        self._send(vf, frame.pts, frame.time_base)

    def write_nv12(self, nv12: np.ndarray, pts: int | None, time_base: Fraction | None) -> None:
        """Encode and send a frame given as NV12 (a (height * 3/2, width) uint8 array: the luma rows,
        then the interleaved chroma rows), as the GPU path downloads it: x264 then only
        de-interleaves the chroma instead of converting from RGB."""
        if self._c is None and not self._deferred and not self._retry():
            self.dropped += 1
            return
        vf = av.VideoFrame.from_ndarray(nv12, format="nv12")
        self._send(vf, pts, time_base)

    def _time(self, pts: int | None, time_base: Fraction | None) -> Fraction:
        """The frame's time on the output timeline, in seconds; a frame without a pts comes one
        frame (at `fps`) after the last."""
        if pts is not None and time_base is not None:
            return pts * Fraction(time_base)
        step = 1 / Fraction(self.fps).limit_denominator(1001)
        return self._times[-1] + step if self._times else Fraction(0)

    def _send(self, vf: Any, pts: int | None, time_base: Fraction | None) -> None:
        vf.pts = pts
        vf.time_base = time_base
        t = self._time(pts, time_base)
        self._times.append(t)
        if self._v is None:
            # Held as YUV 4:2:0, half the size of RGB; x264 takes that format as it is.
            self._held.append((vf if vf.format.name != "rgb24" else self._yuv(vf), t))
            if t - self._held[0][1] < self._gop and len(self._held) < RATE_HOLD_FRAMES:
                return
            self._start()
            return
        self._encode(vf, t)

    @staticmethod
    def _yuv(vf: Any) -> Any:
        out = vf.reformat(format="yuv420p")
        out.pts, out.time_base = vf.pts, vf.time_base
        return out

    def _start(self) -> None:
        """Declare the rate of the held frames, then send them and the audio held with them."""
        held, self._held = self._held, []
        if self._deferred:
            self._deferred = False
            self._open()  # an unusable output fails here, one GOP in
        self._add_streams(delivered_rate([t for _, t in held]) or Fraction(self.fps).limit_denominator(1001))
        audio, self._held_audio = deque(self._held_audio), deque(maxlen=AUDIO_HOLD_PACKETS)
        for vf, t in held:
            # The held audio goes out in time order with the held frames: the RTMP output sends
            # each packet as it comes (`SplicedFlv`), and a player that joins at the start and
            # probes for a second must meet both streams in that second.
            while audio and _seconds(audio[0]) <= t:
                self.write_audio(audio.popleft())
            if self._c is None:
                self.dropped += 1  # the connection failed on an earlier held frame
                continue
            self._encode(vf, t)
        for p in audio:
            self.write_audio(p)

    def _encode(self, vf: Any, t: Fraction) -> None:
        if self._next_key is not None and t >= self._next_key and self.kind == "hls" \
                and self._since_key < HLS_SEGMENT_FRAMES:
            # Too few frames for a segment a browser plays (the rate fell): this segment takes
            # one more GOP; `_segment_gops` adapts the next ones.
            self._next_key = self._grid_after(t)
        if self._next_key is None or t >= self._next_key:
            # Forced, on the grid of gop_seconds from the connection's first frame: x264 counts
            # frames, and this output's frame rate is whatever the swap keeps up with.
            vf.pict_type = PictureType.I
            if self._next_key is None:
                self._grid = t
            if self.kind == "hls":
                self._segment = self._segment_gops()
            self._next_key = self._grid_after(t) + (self._segment - 1) * self._gop
            self.keyframes += 1
            self._since_key = 0
        self._since_key += 1
        try:
            for p in self._v.encode(vf):
                self._c.mux(p)
            self.frames += 1
        except (av.error.FFmpegError, OSError) as e:
            log.warning("live output '%s' failed: %s; reconnecting", self.target, e)
            self._drop_connection()
            self.dropped += 1
            return
        if self._down_since is not None and time.monotonic() - self._up_since >= RECOVERED_AFTER_S:
            log.info("live output '%s' is back", self.target)
            self._down_since = None

    def _segment_gops(self) -> int:
        """GOPs per HLS segment from here: the fewest that hold HLS_SEGMENT_FRAMES at the delivered
        rate with 10% to spare, and no fewer than now until fewer would hold 40% more (hysteresis:
        a rate that jitters about a boundary would otherwise flip the segments' length, and with it
        the playlist's #EXT-X-TARGETDURATION, which a live playlist must keep)."""
        rate = delivered_rate(self._times) or self.declared_rate or Fraction(self.fps)
        per_gop = float(rate) * float(self._gop)
        if per_gop <= 0:
            return self._segment
        need = max(1, math.ceil(1.1 * HLS_SEGMENT_FRAMES / per_gop))
        keep = max(1, math.ceil(1.4 * HLS_SEGMENT_FRAMES / per_gop))
        return max(need, min(self._segment, keep))

    def _grid_after(self, t: Fraction) -> Fraction:
        """The first point of the keyframe grid after output time `t`."""
        return self._grid + (int((t - self._grid) / self._gop) + 1) * self._gop

    def write_audio(self, packet: AudioPacket) -> None:
        if self._c is None and not self._deferred:
            return
        if self._v is None:
            if self.audio_from is not None:
                self._held_audio.append(packet)  # sent after the held frames, once streams exist
            return
        if self._a is None:
            return
        p = packet.packet
        p.stream = self._a
        try:
            self._c.mux(p)
        except (av.error.FFmpegError, OSError, ValueError):
            pass  # a late or malformed audio packet is dropped, the stream goes on

    def _drop_connection(self) -> None:
        try:
            if self._c is not None:
                self._c.close()
        except (av.error.FFmpegError, OSError):
            pass
        self._c = None
        self._v = self._a = None
        self._release()
        now = time.monotonic()
        if self._down_since is None:
            # A new outage: try again at once, then back off.
            self._down_since, self._next_try, self._delay = now, now, 0.25
        else:
            # A reconnection that failed again is the same outage: its clock and back-off go on.
            self._backoff(now)

    def _backoff(self, now: float) -> None:
        self._next_try = now + self._delay
        self._delay = min(self._delay * 2, 1.0)  # back off, but retry at least every second

    def _retry(self) -> bool:
        now = time.monotonic()
        if self._down_since is not None and now - self._down_since > self.reconnect_seconds:
            raise OutputError(f"live output '{self.target}' has failed for {self.reconnect_seconds:g} s "
                              f"without recovering. Check that the server is up and accepts this "
                              f"stream key")
        if now < self._next_try:
            return False
        try:
            self._open()
        except OutputError:
            self._backoff(now)
            return False
        self._up_since = now
        return True

    def close(self) -> None:
        if (self._c is not None or self._deferred) and self._v is None and self._held:
            held = len(self._held)
            try:
                self._start()  # an output shorter than one GOP: declare what its frames show
            except OutputError as e:
                log.warning("%s", e)
                self.dropped += held
        if self._c is None:
            return
        try:
            if self._v is not None:
                for p in self._v.encode(None):
                    self._c.mux(p)
        except (av.error.FFmpegError, OSError, ValueError):
            pass
        try:
            self._c.close()
        except (av.error.FFmpegError, OSError):
            pass
        self._c = None
        self._v = self._a = None
        self._release()

    def _release(self) -> None:
        """The connection's TLS relay, if any (it ends by itself too, once FFmpeg has closed)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None


ProgressFn = Callable[[int], None]
