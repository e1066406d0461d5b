"""Check a video file or stream for SwapStream's watermark, frame by frame (`swapstream verify`),
and validate its C2PA manifest beside it.

Decodes with PyAV (any container and codec FFmpeg reads, local files or URLs), looks for the mark in
each frame's luma plane (`watermark.detect`, no original needed) and also decodes the sum of all
frames' soft values, which finds a mark that is too weak in any single frame but present throughout.
A local file's C2PA manifest is validated with c2pa-python (`provenance.read_manifest`): absent,
invalid (changed after signing), valid, or trusted (chains to a CA given with --trust).

The v2 mark (`watermark_v2`, which survives crops, letterboxing, flips and small rotations) is looked
for in windows of `V2_WINDOW_S` seconds of frames, each decided on its own, and in all frames
together: its evidence is made to add up over frames.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .errors import InputError, InputNotFoundError
from .live.streams import join_rtmp
from .provenance import ManifestCheck, read_manifest
from .watermark import CODED_BITS, Detection, Payload, decode_soft, detect
from .watermark_v2 import WindowDetector

log = logging.getLogger(__name__)

# Planar formats whose first plane is luma: read it as it is (no conversion, no range change).
_LUMA_FIRST = {"yuv420p", "yuvj420p", "yuv422p", "yuvj422p", "yuv444p", "yuvj444p", "nv12", "nv21",
               "gray", "yuv410p", "yuv411p", "yuv440p"}


@dataclass(frozen=True)
class FrameResult:
    """One frame's verdict."""

    index: int
    """Decode order, from 0."""
    time: float | None
    """Presentation time in seconds, when the stream has timestamps."""
    found: bool
    payload: Payload | None
    score: float
    reason: str


V2_WINDOW_S = 2.0
"""Seconds of frames per v2 window (60 frames where a stream has no timestamps)."""
V2_WINDOW_FRAMES = 60


@dataclass(frozen=True)
class WindowResult:
    """One v2 window's verdict."""

    index: int
    start: float | None
    """Presentation time of its first frame, in seconds, when known."""
    frames: int
    found: bool
    payload: Payload | None
    score: float
    reason: str


KEEP_FRAMES = 10_000
"""Per-frame results a report keeps, the first ones: a file's first five minutes at 30 fps, a few
MB. A live URL without --max-frames runs without end; past this only the counts grow."""


@dataclass
class VerifyReport:
    """Per-frame results and the summary of one input. The summary counts every frame; `frames`
    holds the first `keep_frames` of them, so that an endless stream does not fill memory."""

    source: str
    width: int = 0
    height: int = 0
    keep_frames: int | None = KEEP_FRAMES
    """How many per-frame results to keep (None: all)."""
    frames: list[FrameResult] = field(default_factory=list)
    """The first `keep_frames` frames' results."""
    frame_count: int = 0
    """Frames checked, kept or not."""
    marked: int = 0
    """Frames in which the mark was found."""
    payloads: Counter[Payload] = field(default_factory=Counter)
    """Frames per payload read."""
    combined: Detection | None = None
    """All frames' soft values decoded together."""
    metadata: dict[str, str] = field(default_factory=dict)
    """The container's tags (where MP4, MKV and FLV keep the synthetic-content note)."""
    tags: dict[str, dict[str, str]] = field(default_factory=dict)
    """Tags at every level, by where they were found: "format" (the container's), "stream N" (each
    stream's), "program N" (an MPEG-TS service: HLS segments keep the note only there)."""
    stopped_early: str = ""
    """Why decoding stopped before the end (a decode error), if it did."""
    c2pa: ManifestCheck | None = None
    """The C2PA manifest's validation (None: not checked)."""
    v2_windows: list[WindowResult] = field(default_factory=list)
    """Each v2 window's result (the first `keep_frames` of them)."""
    v2_window_count: int = 0
    v2_marked: int = 0
    """Windows in which a v2 mark was found."""
    v2_payloads: Counter[Payload] = field(default_factory=Counter)
    v2_combined: Detection | None = None
    """All frames of the first size taken as one v2 window (None: v2 not checked)."""

    def add_window(self, w: WindowResult) -> None:
        self.v2_window_count += 1
        if w.found:
            self.v2_marked += 1
            if w.payload is not None:
                self.v2_payloads[w.payload] += 1
        if self.keep_frames is None or len(self.v2_windows) < self.keep_frames:
            self.v2_windows.append(w)

    def add(self, r: FrameResult) -> None:
        """Count one frame's result, and keep it while there is room."""
        self.frame_count += 1
        if r.found:
            self.marked += 1
            if r.payload is not None:
                self.payloads[r.payload] += 1
        if self.keep_frames is None or len(self.frames) < self.keep_frames:
            self.frames.append(r)

    @property
    def found_v1(self) -> bool:
        """A v1 mark was found in some frame, or in all frames taken together."""
        return self.marked > 0 or (self.combined is not None and self.combined.found)

    @property
    def found_v2(self) -> bool:
        """A v2 mark was found in some window, or in all frames taken together."""
        return self.v2_marked > 0 or (self.v2_combined is not None and self.v2_combined.found)

    @property
    def found(self) -> bool:
        """A mark of either layout was found."""
        return self.found_v1 or self.found_v2

    @property
    def declared(self) -> bool:
        """A C2PA manifest made by SwapStream validates."""
        return self.c2pa is not None and self.c2pa.by_swapstream

    def to_dict(self) -> dict[str, Any]:
        def pay(p: Payload | None) -> dict[str, int] | None:
            return None if p is None else {"product_id": p.product_id, "stream_id": p.stream_id}

        return {
            "source": self.source, "width": self.width, "height": self.height,
            "frames": [{"index": f.index, "time": f.time, "marked": f.found, "payload": pay(f.payload),
                        "score": round(f.score, 4), **({"reason": f.reason} if f.reason else {})}
                       for f in self.frames],
            "frames_omitted": self.frame_count - len(self.frames),
            # Kept like the frames: the first `keep_frames` windows (the summary counts them all).
            "v2_windows": [{"index": w.index, "start": w.start, "frames": w.frames, "marked": w.found,
                            "payload": pay(w.payload), "score": round(w.score, 4),
                            **({"reason": w.reason} if w.reason else {})} for w in self.v2_windows],
            "summary": {
                "frames": self.frame_count, "marked_frames": self.marked,
                "payloads": [{**(pay(p) or {}), "frames": n} for p, n in self.payloads.most_common()],
                "combined": None if self.combined is None else {
                    "marked": self.combined.found, "payload": pay(self.combined.payload),
                    "score": round(self.combined.score, 4)},
                "mark_found": self.found,
                "metadata": self.metadata,
                "tags": self.tags,
                "c2pa": None if self.c2pa is None else self.c2pa.to_dict(),
                "v2": None if self.v2_combined is None else {
                    "window_seconds": V2_WINDOW_S, "windows": self.v2_window_count,
                    "marked_windows": self.v2_marked,
                    "payloads": [{**(pay(p) or {}), "windows": n} for p, n in self.v2_payloads.most_common()],
                    "combined": {"marked": self.v2_combined.found, "payload": pay(self.v2_combined.payload),
                                 "score": round(self.v2_combined.score, 4)}},
                **({"stopped_early": self.stopped_early} if self.stopped_early else {}),
            },
        }


def luma_plane(frame: Any) -> np.ndarray:
    """The luma plane of a PyAV VideoFrame as a 2-D uint8 array (a copy)."""
    w, h = frame.width, frame.height
    if frame.format.name in _LUMA_FIRST:
        plane = frame.planes[0]
        return np.frombuffer(plane, np.uint8).reshape(h, plane.line_size)[:, :w].copy()
    return frame.to_ndarray(format="gray")


def _open(source: str) -> Any:
    """`source` opened for reading; a live RTMP URL is joined as the live reader joins it
    (`join_rtmp`: a short probe, and FFmpeg's full one when that saw no video)."""
    import av

    is_url = "://" in source
    if not is_url:
        p = Path(source)
        if not p.exists():
            raise InputNotFoundError(f"input '{source}' does not exist. Check the path.")
        if p.is_dir():
            raise InputError(f"input '{source}' is a folder. Give a video file or a URL.")

    def open_once(options: dict[str, str] | None) -> Any:
        return av.open(source, "r", timeout=(10.0, 10.0) if is_url else None, metadata_errors="replace",
                       options=options)

    try:
        if source.lower().startswith(("rtmp://", "rtmps://")):
            return join_rtmp(open_once, lambda c: c.close())
        return open_once(None)
    except (av.error.FFmpegError, OSError, ValueError) as e:
        why = getattr(e, "strerror", None) or str(e).splitlines()[0]
        raise InputError(f"cannot open '{source}' as a video: {why}. Give a video file (MP4, MKV, "
                         f"MOV, WebM, TS...) or a stream URL.") from None


TS_PACKET = 188
TS_SCAN_BYTES = 2 * 1024 * 1024
"""How much of an MPEG-TS file is searched for its service table: FFmpeg writes the SDT at the start
and again every few hundred ms, so it is in the first packets of any segment."""
SDT_PID, SDT_ACTUAL = 0x11, 0x42
SERVICE_DESCRIPTOR = 0x48


def _dvb_text(b: bytes) -> str:
    # A DVB string may start with a character-table byte (< 0x20); FFmpeg marks UTF-8 with 0x15.
    if b and b[0] < 0x20:
        b = b[1:]
    return b.decode("utf-8", "replace")


def ts_services(data: bytes) -> list[dict[str, str]]:
    """The services of an MPEG-TS stream's first SDT (actual transport stream), each as FFmpeg names
    them: {"service_provider": ..., "service_name": ...}. PyAV does not expose FFmpeg's programs, and
    the SDT is where FFmpeg's mpegts muxer (and so every HLS segment) keeps the service names."""
    start = data.find(b"\x47")
    section = bytearray()
    collecting = False
    for off in range(max(start, 0), len(data) - TS_PACKET + 1, TS_PACKET):
        pkt = data[off:off + TS_PACKET]
        if pkt[0] != 0x47:
            break  # lost sync: not (or no longer) a transport stream
        pid = ((pkt[1] & 0x1F) << 8) | pkt[2]
        if pid != SDT_PID:
            continue
        pusi = bool(pkt[1] & 0x40)
        afc = (pkt[3] >> 4) & 3
        i = 4 + (1 + pkt[4] if afc in (2, 3) else 0)
        if afc in (0, 2) or i >= TS_PACKET:
            continue  # no payload
        payload = pkt[i:]
        if pusi:
            payload = payload[1 + payload[0]:]  # skip the pointer field
            section, collecting = bytearray(payload), True
        elif collecting:
            section += payload
        else:
            continue
        if len(section) < 3:
            continue
        length = ((section[1] & 0x0F) << 8) | section[2]
        if len(section) < 3 + length:
            continue  # the section goes on in the next SDT packet
        if section[0] == SDT_ACTUAL:
            return _sdt_services(bytes(section[:3 + length]))
        collecting = False
    return []


def _sdt_services(sec: bytes) -> list[dict[str, str]]:
    end = len(sec) - 4  # the CRC
    out: list[dict[str, str]] = []
    i = 11  # after the section header, transport_stream_id, version, numbers and original_network_id
    while i + 5 <= end:
        loop = ((sec[i + 3] & 0x0F) << 8) | sec[i + 4]
        j, stop = i + 5, min(i + 5 + loop, end)
        tags: dict[str, str] = {}
        while j + 2 <= stop:
            tag, n = sec[j], sec[j + 1]
            d = sec[j + 2:j + 2 + n]
            if tag == SERVICE_DESCRIPTOR and len(d) >= 2:
                pn = d[1]
                provider = d[2:2 + pn]
                rest = d[2 + pn:]
                name = rest[1:1 + rest[0]] if rest else b""
                tags = {"service_provider": _dvb_text(provider), "service_name": _dvb_text(name)}
            j += 2 + n
        if tags:
            out.append(tags)
        i = stop
    return out


def _first_segment(playlist: Path) -> Path | None:
    """The first media segment of a local HLS playlist (following one level of variant playlist)."""
    for _ in range(2):
        try:
            lines = playlist.read_text(errors="replace").splitlines()
        except OSError:
            return None
        uri = next((ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")), None)
        if uri is None or "://" in uri:
            return None
        target = playlist.parent / uri
        if target.suffix.lower() != ".m3u8":
            return target
        playlist = target
    return None


def _local_ts(source: str, container: Any) -> Path | None:
    """The local MPEG-TS file whose service table to read: the source itself, or the first segment
    of a local HLS playlist. URLs are not fetched a second time (the demuxer's reading is all)."""
    if "://" in source:
        return None
    name = container.format.name if container.format is not None else ""
    p = Path(source)
    if "hls" in name or p.suffix.lower() == ".m3u8":
        return _first_segment(p)
    if "mpegts" in name:
        return p
    return None


def read_tags(source: str, container: Any) -> dict[str, dict[str, str]]:
    """Tags at every level: the container's ("format"), each stream's ("stream N"), and for MPEG-TS
    (a .ts file, or a local HLS playlist's first segment) each service's ("program N")."""
    tags: dict[str, dict[str, str]] = {}
    fmt = {k: str(v) for k, v in container.metadata.items()}
    if fmt:
        tags["format"] = fmt
    for s in container.streams:
        st = {k: str(v) for k, v in s.metadata.items()}
        if st:
            tags[f"stream {s.index}"] = st
    ts = _local_ts(source, container)
    if ts is not None:
        try:
            with ts.open("rb") as f:
                data = f.read(TS_SCAN_BYTES)
        except OSError as e:
            log.warning("cannot read %s for its service names: %s", ts, e)
        else:
            for n, service in enumerate(ts_services(data)):
                tags[f"program {n}"] = service
    return tags


def verify(source: str, *, max_frames: int | None = None,
           on_frame: Callable[[FrameResult], None] | None = None,
           keep_frames: int | None = KEEP_FRAMES, c2pa: bool = True,
           trust_pem: bytes | None = None, v2: bool = True,
           on_window: Callable[[WindowResult], None] | None = None) -> VerifyReport:
    """Check every frame of `source` (a path or URL), up to `max_frames`, and (`c2pa`) its C2PA
    manifest, trusting the CA certificates in `trust_pem`, and (`v2`) the v2 mark in windows of
    `V2_WINDOW_S` seconds. The report keeps the first `keep_frames` per-frame (and per-window)
    results (None: all); `on_frame` and `on_window` see every one as it comes."""
    import av

    report = VerifyReport(source, keep_frames=keep_frames)
    container = _open(source)
    if c2pa:
        # After _open: a missing or unreadable input is its error, not the manifest's.
        report.c2pa = read_manifest(source, trust_pem)
    with container:
        report.metadata = {k: str(v) for k, v in container.metadata.items()}
        report.tags = read_tags(source, container)
        if not container.streams.video:
            raise InputError(f"input '{source}' has no video stream. Give a video file or stream.")
        stream = container.streams.video[0]
        tb = stream.time_base
        total = np.zeros(CODED_BITS)
        n = 0
        whole = WindowDetector()        # every frame of the first size
        window = WindowDetector()       # the current v2 window
        w_start: float | None = None

        def close_window() -> None:
            nonlocal window
            if len(window):
                d2 = window.decode().detection
                wr = WindowResult(report.v2_window_count, w_start, len(window), d2.found, d2.payload,
                                  d2.score, d2.reason)
                report.add_window(wr)
                if on_window is not None:
                    on_window(wr)
            window = WindowDetector()

        try:
            for frame in container.decode(stream):
                luma = luma_plane(frame)
                report.height, report.width = luma.shape
                d = detect(luma)
                t = float(frame.pts * tb) if frame.pts is not None and tb is not None else None
                r = FrameResult(n, t, d.found, d.payload, d.score, d.reason)
                report.add(r)
                total += d.soft
                n += 1
                if on_frame is not None:
                    on_frame(r)
                if v2:
                    # A window ends after V2_WINDOW_S of timeline (60 frames without timestamps), or
                    # where the frame size changes (a window's frames must share their geometry).
                    full = (t - w_start >= V2_WINDOW_S) if (t is not None and w_start is not None) \
                        else len(window) >= V2_WINDOW_FRAMES
                    if len(window) and (full or window.shape != luma.shape):
                        close_window()
                    if not len(window):
                        w_start = t
                    window.add(luma)
                    if whole.shape is None or whole.shape == luma.shape:
                        whole.add(luma)
                if max_frames is not None and n >= max_frames:
                    break
        except av.error.FFmpegError as e:
            if n == 0:
                raise InputError(f"cannot decode '{source}': {str(e).splitlines()[0]}. Check that it is "
                                 f"a complete video.") from None
            report.stopped_early = f"decode error after {n} frames: {str(e).splitlines()[0]}"
            log.warning("%s: %s", source, report.stopped_early)
        if v2:
            close_window()
            report.v2_combined = whole.decode().detection
    if n == 0:
        raise InputError(f"input '{source}' has no decodable video frames. Check that it is a complete "
                         f"video file.")
    # Summing soft values over frames adds the mark coherently and the noise incoherently (sqrt(n)).
    report.combined = decode_soft(total / np.sqrt(n)) if np.any(total) else None
    return report
