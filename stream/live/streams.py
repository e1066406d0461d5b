"""Live inputs and outputs over PyAV (FFmpeg): RTMP pull with reconnect (or a file played in real
time), RTMP push and HLS out.

The options and arguments are built by pure functions (`rtmp_input_options`, `x264_live_options`,
`hls_options`) so that tests pin them exactly.
"""

from __future__ import annotations

import errno
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, NoReturn

import av
import numpy as np

from ..disclosure import SYNTHETIC_TAGS
from ..errors import InputError, InputNotFoundError, OutputError
from ..io.video import AudioPacket
from ..netpolicy import Connection, Outbound
from ..redact import RedactingFilter
from ..types import Frame

log = logging.getLogger(__name__)
log.addFilter(RedactingFilter())  # its lines quote input and output URLs: no stream keys


_NETWORK_URL = re.compile(r"^(?!file://)[a-z][a-z0-9+.-]*://", re.IGNORECASE)


def is_file_input(url: str) -> bool:
    """A local file (a path or a file: URL), which ends, rather than a network stream (rtmp://,
    srt://, http(s)://, udp:// ...), which drops and comes back."""
    return not _NETWORK_URL.match(url)


def rtmp_input_options() -> dict[str, str]:
    """FFmpeg options for pulling a live RTMP stream with the least buffering."""
    return {"rtmp_live": "live", "fflags": "nobuffer", "flags": "low_delay",
            "analyzeduration": "1000000", "probesize": "500000"}


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


def x264_live_options(fps: float, *, preset: str = "ultrafast", crf: int = 23,
                      keyint_seconds: float = 1.0) -> dict[str, str]:
    """libx264 for live outputs: no B-frames (no reordering delay), a keyframe every second so that
    players and HLS segments can start anywhere, zerolatency tuning."""
    g = max(1, round(fps * keyint_seconds))
    return {"preset": preset, "tune": "zerolatency", "crf": str(crf), "bf": "0", "g": str(g),
            "keyint_min": str(g), "sc_threshold": "0"}


def hls_options(folder: Path, *, segment_seconds: float = 1.0, list_size: int = 6) -> dict[str, str]:
    """A sliding-window live playlist: short segments, old ones deleted."""
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


class LiveReader:
    """Frames and audio packets from a live URL, reconnecting when the input drops, or from a file,
    which ends at its end (or starts again with `loop`).

    After a reconnect the new publisher's timestamps start again, and so do a looped file's; the
    reader shifts them so that `pts` keeps increasing across the gap (in the first connection's time
    base). With `realtime`, a file's frames come out at their own pace, as a live source sends them.
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
        self._offset = 0
        self._last_pts: int | None = None
        self._first_pts: int | None = None
        self._step = 1
        self._next_shift: int | None = None
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
        # Each connection is checked (and pinned, or relayed over verified TLS) on its own: a
        # reconnect looks the name up again.
        conn = self.outbound.connect(self.url, timeout=self.timeouts[0])
        try:
            opts = rtmp_input_options() if conn.url.startswith("rtmp") else {}
            if self.outbound.policy is not None:
                opts["protocol_whitelist"] = "rtmp,tcp"  # what was checked, and nothing it leads to
            timeouts = self.timeouts if open_timeout is None else (open_timeout, self.timeouts[1])
            c = av.open(conn.url, options=opts, timeout=timeouts)
        except BaseException:
            conn.close()
            raise
        self._connections[id(c)] = conn
        return c

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
        self._step = max(1, round(1 / (self.info_fps * v.time_base)))  # one frame, in pts
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
        streams = [v] + ([c.streams.audio[0]] if c.streams.audio else [])
        # A looped file's shift is known before its first packet, so its audio moves with it; a new
        # connection's is found from its first frame, and its audio keeps the publisher's times.
        shift, self._next_shift = self._next_shift, None
        audio_shift = 0
        if shift is not None and c.streams.audio and self._time_base is not None:
            audio_shift = round(shift * self._time_base / c.streams.audio[0].time_base)
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
                    if audio_shift and packet.pts is not None:
                        packet.pts += audio_shift
                        if packet.dts is not None:
                            packet.dts += audio_shift
                    yield AudioPacket(packet)
                continue
            if self.packets:
                units = self._annexb(bsf, packet)
                for data, raw_pts, raw_dts, key in units:
                    # Packets come in decode order: with B-frames their pts go back and forth.
                    shift, pts = self._shifted(raw_pts, shift, monotonic=False)
                    if self.realtime:
                        # A live source sends in decode order: pace by the decode time, which
                        # increases, rather than hold a reference frame until its display time.
                        self._pace(pts if raw_dts is None or raw_pts is None else raw_dts + shift)
                        if self._stopped:
                            return
                    yield VideoPacket(data, pts, self._time_base or v.time_base, self._index, key,
                                      connection, codec, reorders)
                    self._index += 1
                continue
            for vf in packet.decode():
                shift, pts = self._shifted(vf.pts, shift)
                rgb = np.ascontiguousarray(vf.to_ndarray(format="rgb24"))
                if self.realtime:
                    self._pace(pts)
                    if self._stopped:
                        return
                yield Frame(rgb, pts=pts, time_base=self._time_base or v.time_base, index=self._index)
                self._index += 1

    def _shifted(self, raw: int | None, shift: int | None, *, monotonic: bool = True) -> tuple[int, int]:
        """(shift, pts): the connection's shift (found at its first frame) and this frame's pts on
        the reader's continuous timeline, strictly increasing when `monotonic` (frames); packets in
        decode order keep their order, and the last pts is the largest so far."""
        pts = raw if raw is not None else (self._last_pts or 0) + 1
        if self._first_pts is None:
            self._first_pts = pts
        if shift is None:
            # A new connection: continue one frame after the last frame we gave out.
            shift = 0 if self._last_pts is None else self._last_pts + self._step - pts
        pts += shift
        if monotonic and self._last_pts is not None and pts <= self._last_pts:
            pts = self._last_pts + 1
        self._last_pts = pts if self._last_pts is None else max(pts, self._last_pts)
        return shift, pts

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
        if self._last_pts is not None and self._first_pts is not None:
            self._next_shift = self._last_pts + self._step - self._first_pts
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
            delay = min(delay * 2, 2.0)  # back off, but retry at least every 2 s
        log.warning("live input '%s' did not come back within %.0f s: ending", self.url,
                    self.reconnect_seconds)
        return False


RECOVERED_AFTER_S = 1.0
"""A reconnected output ends an outage only once it has carried frames this long. One frame written
proves nothing: a server that accepts the connection and drops it takes a frame or two into the
socket's buffer before a write fails."""


class LiveWriter:
    """Encodes RGB frames with x264 (+ AAC audio) and pushes them to an RTMP URL (FLV) or writes an
    HLS playlist. A push that fails reconnects with back-off; frames during the outage are counted
    in `dropped`, never queued without bound. An outage runs from the first failure until a
    connection has carried frames for `RECOVERED_AFTER_S`; one longer than `reconnect_seconds` is an
    `OutputError`."""

    def __init__(self, target: str, *, width: int, height: int, fps: float, time_base: Fraction,
                 audio_from: Any = None, kind: str = "rtmp", crf: int = 23,
                 segment_seconds: float = 1.0, reconnect_seconds: float = 30.0,
                 outbound: Outbound | None = None) -> None:
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
        self.segment_seconds = segment_seconds
        self.reconnect_seconds = reconnect_seconds
        self.frames = 0
        self.dropped = 0
        self._down_since: float | None = None
        """Start of the current outage (its first failure), or None while the output works."""
        self._up_since = time.monotonic()
        """When the current connection was opened."""
        self._next_try = 0.0
        self._delay = 0.25
        self._c: Any = None
        self._open()

    def _open(self) -> None:
        try:
            if self.kind == "hls":
                folder = Path(self.target).parent
                folder.mkdir(parents=True, exist_ok=True)
                c = av.open(self.target, "w", format="hls",
                            options=hls_options(folder, segment_seconds=self.segment_seconds))
            else:
                conn = self.outbound.connect(self.target, timeout=5.0)
                try:
                    c = av.open(conn.url, "w", format="flv", timeout=5.0)
                except BaseException:
                    conn.close()
                    raise
                self._conn = conn
        except (av.error.FFmpegError, OSError) as e:
            raise OutputError(f"cannot open live output '{self.target}': {e}. Check the URL or "
                              f"folder, and that the server accepts this stream key.") from None
        v = c.add_stream("libx264", rate=Fraction(self.fps).limit_denominator(1001))
        v.width, v.height, v.pix_fmt = self.width, self.height, "yuv420p"
        v.time_base = self.time_base
        v.codec_context.time_base = self.time_base
        v.options = x264_live_options(self.fps, crf=self.crf, keyint_seconds=self.segment_seconds)
        self._v = v
        self._a = None
        if self.audio_from is not None and self.audio_from.codec_context.name == "aac":
            self._a = c.add_stream_from_template(self.audio_from)
        # The content is synthetic: FLV keeps every tag, HLS's MPEG-TS segments the service names.
        c.metadata.update(SYNTHETIC_TAGS)
        self._c = c

    def write(self, frame: Frame) -> None:
        """Encode and send an RGB frame."""
        if self._c is None and not self._retry():
            self.dropped += 1
            return
        img = frame.data[: self.height, : self.width]
        vf = av.VideoFrame.from_ndarray(np.ascontiguousarray(img), format="rgb24")
        self._send(vf, frame.pts, frame.time_base)

    def write_nv12(self, nv12: np.ndarray, pts: int | None, time_base: Fraction | None) -> None:
        """Encode and send a frame given as NV12 (a (height * 3/2, width) uint8 array: the luma rows,
        then the interleaved chroma rows), as the GPU path downloads it: x264 then only
        de-interleaves the chroma instead of converting from RGB."""
        if self._c is None and not self._retry():
            self.dropped += 1
            return
        vf = av.VideoFrame.from_ndarray(nv12, format="nv12")
        self._send(vf, pts, time_base)

    def _send(self, vf: Any, pts: int | None, time_base: Fraction | None) -> None:
        vf.pts = pts
        vf.time_base = time_base
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

    def write_audio(self, packet: AudioPacket) -> None:
        if self._c is None or self._a is None:
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
        self._delay = min(self._delay * 2, 2.0)  # back off, but retry at least every 2 s

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
        if self._c is None:
            return
        try:
            for p in self._v.encode(None):
                self._c.mux(p)
        except (av.error.FFmpegError, OSError, ValueError):
            pass
        try:
            self._c.close()
        except (av.error.FFmpegError, OSError):
            pass
        self._c = None
        self._release()

    def _release(self) -> None:
        """The connection's TLS relay, if any (it ends by itself too, once FFmpeg has closed)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None


ProgressFn = Callable[[int], None]
