"""Reading and writing video files with PyAV (FFmpeg).

`VideoReader` yields decoded RGB `Frame`s and, for pass-through, the untouched packets of the first audio
stream, in demux order. `VideoWriter` encodes RGB frames to H.264 and either copies those audio packets
or transcodes them when the output container cannot hold their codec.

Timestamps are the contract between the two: the reader hands out each frame's pts in the stream's own
time base, and the writer keeps that time base and those pts, so variable frame rate and A/V sync
survive a round trip without any resampling of time.

Every failure that bad input or a bad output path can cause surfaces as an `InputError`,
`InputNotFoundError` or `OutputError` with a one-line message; a raw `av` exception escaping from here
is a bug.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from fractions import Fraction
from pathlib import Path
from types import TracebackType
from typing import Literal

import av
import av.error
import numpy as np
from av.audio.stream import AudioStream
from av.container import InputContainer, OutputContainer
from av.packet import Packet
from av.video.reformatter import ColorPrimaries, ColorRange, Colorspace, ColorTrc, VideoReformatter
from av.video.stream import VideoStream

from swapstream.errors import InputError, InputNotFoundError, OutputError
from swapstream.types import Frame

__all__ = [
    "NULL_OUTPUT",
    "AudioPacket",
    "AudioPlan",
    "VideoInfo",
    "VideoReader",
    "VideoWriter",
    "audio_plan",
    "ended_early",
    "is_null_output",
    "probe",
    "pts_step",
]

log = logging.getLogger(__name__)

AudioPlan = Literal["copy", "aac", "libopus"]

# Audio codecs each container holds *and* that common players handle there. This is deliberately
# stricter than what FFmpeg will mux (FFmpeg 8 puts PCM into .mp4, which few players can play).
_MP4_AUDIO = frozenset({"aac", "mp3", "ac3", "eac3", "alac", "opus", "flac"})
_PCM = frozenset(
    {
        "pcm_s16le", "pcm_s16be", "pcm_s24le", "pcm_s24be", "pcm_s32le", "pcm_s32be",
        "pcm_f32le", "pcm_f32be", "pcm_f64le", "pcm_f64be", "pcm_u8", "pcm_s8",
        "pcm_alaw", "pcm_mulaw",
    }
)  # fmt: skip
_AUDIO_COPY: Mapping[str, frozenset[str]] = {
    ".mp4": _MP4_AUDIO,
    ".m4v": _MP4_AUDIO,
    ".mov": frozenset({"aac", "mp3", "ac3", "eac3", "alac"}) | _PCM,
    ".3gp": frozenset({"aac", "amr_nb", "amr_wb"}),
    ".webm": frozenset({"opus", "vorbis"}),
    ".flv": frozenset({"aac", "mp3"}),
    ".ts": frozenset({"aac", "mp3", "mp2", "ac3", "eac3", "opus"}),
    ".m2ts": frozenset({"aac", "mp3", "mp2", "ac3", "eac3"}),
    ".avi": frozenset({"mp3", "ac3", "pcm_s16le", "pcm_u8"}),
}
# Matroska and NUT store any codec FFmpeg knows, so copying is always right there.
_COPY_ANY = frozenset({".mkv", ".mka", ".nut"})
# Containers whose only sensible transcode target is Opus.
_OPUS_TARGET = frozenset({".webm", ".ogg", ".opus"})

# x264 and x265 are the encoders whose option names `crf` and `preset` we know; other encoders
# (e.g. h264_nvenc) spell quality differently, so they run with their own defaults.
_CRF_ENCODERS = frozenset({"libx264", "libx265"})

_INPUT_FIX = "Check that it is a complete video file that FFmpeg can read."
_OUTPUT_FIX = "Choose a writable path with --output."


def audio_plan(container_suffix: str, codec_name: str) -> AudioPlan:
    """How to get audio in `codec_name` into a container with this file suffix.

    "copy" keeps the packets bit for bit; otherwise the name of the encoder to transcode with.
    `container_suffix` may be given with or without the dot, in any case (".MP4", "mp4").
    """
    suffix = container_suffix.lower()
    if not suffix.startswith("."):
        suffix = "." + suffix
    if suffix in _COPY_ANY:
        return "copy"
    if codec_name in _AUDIO_COPY.get(suffix, frozenset()):
        return "copy"
    return "libopus" if suffix in _OPUS_TARGET else "aac"


@dataclass(frozen=True)
class VideoInfo:
    """What a video file declares about itself, read without decoding."""

    path: str
    width: int
    height: int
    time_base: Fraction
    """The video stream's time base: seconds per pts tick."""
    avg_rate: Fraction | None
    """Average frame rate, None if the container does not say."""
    frames: int
    """Frame count the container declares, 0 if unknown (e.g. Matroska never declares one)."""
    duration: float | None
    """Seconds; the video stream's duration, else the container's, else None."""
    codec: str
    audio_codec: str | None
    """Codec of the first audio stream, None when there is no audio stream."""
    audio_rate: int | None
    """Sample rate of the first audio stream."""
    rotation: int = 0
    """Display rotation the file asks for (0, 90, 180 or 270 degrees counter-clockwise, e.g. from a
    phone held upright). The reader turns frames upright, as the `ffmpeg` tool does by default, and
    `width` and `height` are those of the upright picture."""


@dataclass
class AudioPacket:
    """A demuxed packet of the input's first audio stream, kept untouched for pass-through."""

    packet: Packet

    @property
    def pts(self) -> int | None:
        return self.packet.pts

    @property
    def dts(self) -> int | None:
        return self.packet.dts

    @property
    def duration(self) -> int:
        return self.packet.duration

    @property
    def time_base(self) -> Fraction:
        return self.packet.time_base

    @property
    def time(self) -> float | None:
        """Presentation time in seconds."""
        pts = self.packet.pts
        return None if pts is None else float(pts * self.packet.time_base)


# --------------------------------------------------------------------------------------------------
# Reading


def _one_line(text: str) -> str:
    return " ".join(str(text).split()).rstrip(".")


def _reason(error: BaseException) -> str:
    """The part of an exception that explains it, without errno noise or the path repeated."""
    strerror = getattr(error, "strerror", None)
    return _one_line(strerror if strerror else str(error) or type(error).__name__)


def _decode_error(path: str, reason: str) -> InputError:
    return InputError(f"cannot decode '{path}': {_one_line(reason)}. {_INPUT_FIX}")


def _open_input(path: str) -> InputContainer:
    """Open a container, turning every way that can fail into an error the user can act on."""
    if not os.path.exists(path):
        raise InputNotFoundError(f"input '{path}' does not exist. Check the path and its spelling.")
    if os.path.isdir(path):
        raise InputError(f"input '{path}' is a directory. Give the path of a video file.")
    try:
        # "replace": a tag in a legacy 8-bit encoding must not make a playable file unreadable.
        return av.open(path, "r", metadata_errors="replace")
    except PermissionError as e:
        raise InputError(f"cannot read '{path}': {_reason(e)}. Check the file's permissions.") from e
    except EOFError as e:
        raise _decode_error(path, "the file ends early, so it is probably truncated") from e
    except (av.error.FFmpegError, OSError, ValueError) as e:
        raise _decode_error(path, _reason(e)) from e


def _video_stream(container: InputContainer, path: str) -> VideoStream:
    if not container.streams.video:
        raise InputError(f"input '{path}' has no video stream. Give a video file.")
    stream = container.streams.video[0]
    if stream.codec_context is None:
        # PyAV leaves the codec context empty when this FFmpeg build has no decoder for the codec.
        raise _decode_error(path, "FFmpeg has no decoder for its video codec")
    return stream


def _first_audio(container: InputContainer) -> AudioStream | None:
    for stream in container.streams.audio:
        if stream.codec_context is not None:
            return stream
    return None


def _info(container: InputContainer, video: VideoStream, audio: AudioStream | None, path: str) -> VideoInfo:
    time_base = video.time_base or Fraction(1, 90000)
    duration: float | None = None
    if video.duration:
        duration = float(video.duration * time_base)
    elif container.duration:
        duration = container.duration / av.time_base
    avg_rate = video.average_rate
    return VideoInfo(
        path=path,
        width=video.codec_context.width,
        height=video.codec_context.height,
        time_base=time_base,
        avg_rate=avg_rate if avg_rate else None,
        frames=max(int(video.frames), 0),
        duration=duration,
        codec=video.codec_context.codec.canonical_name,
        audio_codec=None if audio is None else audio.codec_context.codec.canonical_name,
        audio_rate=None if audio is None else (audio.codec_context.sample_rate or None),
    )


def _quarter_turns(degrees: float) -> int:
    """Counter-clockwise quarter turns (0-3) for a display-matrix angle such as -90."""
    return int(round(degrees / 90.0)) % 4


def _display_rotation(path: str) -> int:
    """The first frame's display rotation in degrees (0, 90, 180, 270 counter-clockwise).

    FFmpeg exposes the display matrix on decoded frames, so this decodes one frame from a separate
    opening of the file; an unreadable file counts as unrotated and fails later with a proper error.
    """
    try:
        with av.open(path) as c:
            for vframe in c.decode(video=0):
                return _quarter_turns(vframe.rotation) * 90
    except (av.error.FFmpegError, OSError, StopIteration, ValueError):
        pass
    return 0


def _upright(info: VideoInfo, rotation: int) -> VideoInfo:
    if rotation in (90, 270):
        return replace(info, width=info.height, height=info.width, rotation=rotation)
    return replace(info, rotation=rotation)


def pts_step(rate: Fraction | float | None, time_base: Fraction) -> int:
    """Ticks of `time_base` between frames at `rate` (at least 1; 1 when the rate is unknown): where
    a frame without a pts goes after the one before it."""
    if not rate:
        return 1
    return max(1, round(1 / (Fraction(rate) * time_base)))


def probe(path: str | os.PathLike[str]) -> VideoInfo:
    """Read a video file's header. Raises `InputNotFoundError` or `InputError`."""
    name = os.fspath(path)
    container = _open_input(name)
    try:
        info = _info(container, _video_stream(container, name), _first_audio(container), name)
    finally:
        container.close()
    return _upright(info, _display_rotation(name))


def ended_early(info: VideoInfo, frames: int) -> int | None:
    """The frame count `info` promised, when the `frames` a full read decoded fall short of it (a
    truncated or damaged file: the index at the front of an MP4 promises frames whose data is
    missing, and the read stops quietly where the data does), else None.

    A count the container declares (MP4, MOV) is exact, but an edit list may hide a frame or two:
    short by more than 1% (at least 2 frames) counts. One estimated from the duration and the
    average rate (Matroska declares no count) is rougher, and variable frame rate makes it rougher
    still: short by more than 5% (at least 3 frames) counts. No count and no duration: None.
    """
    if info.frames:
        expected, margin = info.frames, max(1, info.frames // 100)
    elif info.duration and info.avg_rate:
        expected = int(round(info.duration * float(info.avg_rate)))
        margin = max(2, expected // 20)
    else:
        return None
    return expected if expected - frames > margin else None


class VideoReader:
    """Decodes the first video stream of a file to RGB frames, passing its first audio stream through.

    Iterate once; the reader yields `Frame` (HxWx3 uint8 RGB, C-contiguous) and `AudioPacket` in the
    order the container stores them. Decode errors are handled the way the `ffmpeg` tool handles them:
    a packet the decoder rejects is skipped (counted in `skipped_packets`), and a demux error ends the
    input like end of file. Only when that leaves no frame at all does the reader raise `InputError`.
    """

    def __init__(self, path: str | os.PathLike[str], *, threads: int = 0) -> None:
        self.path: str = os.fspath(path)
        self._container: InputContainer = _open_input(self.path)
        try:
            self._video: VideoStream = _video_stream(self._container, self.path)
            self.audio_stream: AudioStream | None = _first_audio(self._container)
            self.info: VideoInfo = _upright(
                _info(self._container, self._video, self.audio_stream, self.path),
                _display_rotation(self.path))
            ctx = self._video.codec_context
            # Frame threading decodes several frames at once; files are read ahead of time anyway,
            # so its extra latency costs nothing here. 0 lets FFmpeg pick one thread per core.
            ctx.thread_type = "AUTO"
            ctx.thread_count = threads
        except BaseException:
            self._container.close()
            raise
        # One converter for the whole stream, so swscale's context is built once, not per frame.
        self._to_rgb = VideoReformatter()
        self._step = self._pts_step()
        self._started = False
        self._closed = False
        self.frames_read: int = 0
        self.skipped_packets: int = 0
        """Packets the decoder rejected and the reader skipped, as `ffmpeg` would."""
        self._last_pts: int | None = None

    def _pts_step(self) -> int:
        """Ticks between frames at the nominal rate, for frames that arrive without a pts."""
        return pts_step(self.info.avg_rate or self._video.guessed_rate, self.info.time_base)

    def __iter__(self) -> Iterator[Frame | AudioPacket]:
        if self._closed:
            raise ValueError(f"VideoReader for '{self.path}' is closed")
        if self._started:
            raise RuntimeError("a VideoReader can be iterated only once; open a new one to re-read")
        self._started = True
        return self._packets()

    def _packets(self) -> Iterator[Frame | AudioPacket]:
        video, audio = self._video, self.audio_stream
        streams = [video] if audio is None else [video, audio]
        demuxer = self._container.demux(streams)
        last_error: str | None = None
        while True:
            try:
                packet = next(demuxer)
            except StopIteration:
                break
            except av.error.FFmpegError as e:
                if isinstance(e, MemoryError):
                    raise
                # `ffmpeg` treats a read error as the end of that input and keeps what it has.
                last_error = _reason(e)
                log.warning("'%s': stopped reading after a demux error: %s", self.path, last_error)
                break
            if packet.size == 0:
                continue  # PyAV's end-of-stream markers; the decoder is flushed below instead.
            if packet.stream is video:
                frames, error = self._decode(packet)
                if error is not None:
                    last_error = error
                    self.skipped_packets += 1
                for frame in frames:
                    yield frame
            else:
                yield AudioPacket(packet)
        # Flush the decoder (None) for the frames it still holds.
        frames, error = self._decode(None)
        last_error = error or last_error
        for frame in frames:
            yield frame
        if self.skipped_packets:
            log.warning("'%s': skipped %d corrupt video packets", self.path, self.skipped_packets)
        if self.frames_read == 0:
            raise _decode_error(self.path, last_error or "it contains no video frames")

    def _decode(self, packet: Packet | None) -> tuple[list[Frame], str | None]:
        """Decode one packet (None flushes): the frames it gives, or the decoder's error.

        A packet the decoder rejects is reported, not raised, so that the reader can skip it the
        way `ffmpeg` does; running out of memory is never swallowed.
        """
        try:
            decoded = self._video.decode(packet)
        except av.error.FFmpegError as e:
            if isinstance(e, MemoryError):
                raise
            return [], _reason(e)
        frames = []
        for vframe in decoded:
            frame = self._frame(vframe, self._last_pts)
            self._last_pts = frame.pts
            frames.append(frame)
        return frames, None

    def _frame(self, vframe: av.VideoFrame, last_pts: int | None) -> Frame:
        pts = vframe.pts
        if pts is None:
            # Streams without pts (raw H.264, some AVI): use dts like FFmpeg's best-effort
            # timestamp, else continue from the previous frame at the nominal rate.
            dts = vframe.dts
            if dts is not None and (last_pts is None or dts > last_pts):
                pts = dts
            else:
                pts = 0 if last_pts is None else last_pts + self._step
        try:
            rgb = self._to_rgb.reformat(vframe, format="rgb24").to_ndarray()
        except av.error.FFmpegError as e:
            if isinstance(e, MemoryError):
                raise
            raise _decode_error(self.path, f"cannot convert its {vframe.format.name} frames to RGB ({_reason(e)})") from e
        turns = _quarter_turns(vframe.rotation)
        if turns:
            # Turn the picture upright, as `ffmpeg` does by default, so that faces are upright for
            # the detector and the output plays the right way up without a display matrix.
            rgb = np.rot90(rgb, k=turns)
        if not rgb.flags.c_contiguous:
            # FFmpeg pads rows to its SIMD alignment; downstream (OpenCV, GPU upload) wants them packed.
            rgb = np.ascontiguousarray(rgb)
        frame = Frame(data=rgb, pts=pts, time_base=self.info.time_base, index=self.frames_read, format="rgb24")
        self.frames_read += 1
        return frame

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._container.close()

    def __enter__(self) -> VideoReader:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


# --------------------------------------------------------------------------------------------------
# Writing

NULL_OUTPUT = "null:"
"""The output that keeps nothing (`swapstream run -o null:`): every frame is decoded, analysed,
swapped and composed (label, watermark) and then dropped, as FFmpeg's `-f null`. It measures a job
without its encoder. (A file of that name needs a path with a folder: `/tmp/null:`.)"""


def is_null_output(path: str | os.PathLike[str]) -> bool:
    return os.fspath(path) == NULL_OUTPUT


def _write_error(path: str, reason: str) -> OutputError:
    return OutputError(f"cannot write '{path}': {_one_line(reason)}. {_OUTPUT_FIX}")


def _claim_output(path: str) -> bool:
    """Make sure `path` can be written now, not after minutes of processing. True if it was created.

    FFmpeg only opens the file when the first packet is muxed, so a bad path would otherwise be found
    late; a missing parent folder is created, as users expect from `--output out/x.mp4`.
    """
    if os.path.isdir(path):
        raise _write_error(path, "it is a directory")
    parent = Path(os.path.abspath(path)).parent
    existing = next(p for p in (parent, *parent.parents) if os.path.lexists(p))
    if not existing.is_dir():
        raise _write_error(path, f"'{existing}' is not a folder")
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as e:
        raise _write_error(path, f"cannot create the folder '{parent}' ({_reason(e)})") from e
    existed = os.path.exists(path)
    try:
        with open(path, "ab"):
            pass
    except OSError as e:
        raise _write_error(path, _reason(e)) from e
    return not existed


class VideoWriter:
    """Encodes RGB frames to H.264 (yuv420p) in a container chosen from the path's suffix.

    Timing: the output stream keeps `time_base` and every frame's pts, so variable frame rate survives.
    (MP4/MOV raise time bases coarser than 1/10000 to a finer multiple; pts are scaled exactly.
    Matroska always counts in milliseconds. Containers that cannot store negative timestamps --
    Matroska, FLV, MPEG-TS -- make FFmpeg shift all streams by the same small amount, such as the AAC
    priming frame or the B-frame delay, which keeps frame spacing and A/V sync.)
    A pts that does not increase is bumped to last+1, because H.264 encoders reject it, and counted in
    `pts_bumped`. Each frame is held until the next one arrives so that its duration is exact, which
    keeps the last frame's duration and hence the container's duration and average rate right.

    Odd sizes: yuv420p needs even width and height, so the last column and/or row is cropped
    (not padded): cropping is a view and adds no invented pixels.

    Audio: packets from `audio_from` are copied unchanged when the container holds that codec (see
    `audio_plan`), else decoded and re-encoded to AAC, or Opus for WebM/Ogg.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        width: int,
        height: int,
        time_base: Fraction,
        rate: Fraction | None,
        crf: int = 20,
        preset: str = "veryfast",
        codec: str = "libx264",
        audio_from: AudioStream | None = None,
        metadata: dict[str, str] | None = None,
        threads: int = 0,
    ) -> None:
        self.path: str = os.fspath(path)
        if width < 2 or height < 2:
            raise ValueError(f"video size {width}x{height} is too small to encode; need at least 2x2")
        self.width: int = width
        self.height: int = height
        self.time_base: Fraction = Fraction(time_base)
        self.rate: Fraction | None = Fraction(rate) if rate else None
        self.frames_written: int = 0
        self.pts_bumped: int = 0
        self.audio_plan: AudioPlan | None = None
        self._closed = False
        self._last_pts: int | None = None
        self._pending: av.VideoFrame | None = None
        self._durations: dict[int, int] = {}
        self._last_gap: int | None = None
        self._step = pts_step(self.rate, self.time_base)
        self._to_yuv = VideoReformatter()
        self._audio_in: AudioStream | None = audio_from
        self._audio_out: AudioStream | None = None

        created = _claim_output(self.path)
        self._created = created
        try:
            self._container: OutputContainer = av.open(self.path, "w", metadata_errors="replace")
        except (av.error.FFmpegError, ValueError, OSError) as e:
            if created:
                os.unlink(self.path)
            suffix = Path(self.path).suffix or "(none)"
            raise OutputError(
                f"cannot write '{self.path}': FFmpeg knows no container for the suffix {suffix}. "
                "Choose an output path ending in .mp4, .mkv or .mov with --output."
            ) from e
        try:
            self._video = self._add_video(codec, crf, preset, threads)
            if audio_from is not None:
                self._add_audio(audio_from)
            if metadata:
                self._container.metadata.update(metadata)
        except BaseException:
            self._container.close()
            if created:
                os.unlink(self.path)
            raise

    # -- setup -------------------------------------------------------------------------------------

    def _add_video(self, codec: str, crf: int, preset: str, threads: int) -> VideoStream:
        container = self._container
        try:
            stream = container.add_stream(codec, rate=self.rate)
        except ValueError as e:  # the container cannot hold this codec, e.g. H.264 in .webm
            raise OutputError(
                f"cannot write '{self.path}': the {container.format.name} format cannot hold {codec} video. "
                "Choose an output path ending in .mp4, .mkv or .mov with --output."
            ) from e
        except av.error.FFmpegError as e:
            raise OutputError(
                f"cannot write '{self.path}': this FFmpeg build has no {codec} encoder "
                f"({_reason(e)}). Install PyAV wheels from PyPI, which include libx264."
            ) from e
        ctx = stream.codec_context
        stream.width = self.width - self.width % 2
        stream.height = self.height - self.height % 2
        stream.pix_fmt = "yuv420p"
        # The frame's time base all the way down: encoder, packets and stream, so pts are never rounded.
        stream.time_base = self.time_base
        ctx.time_base = self.time_base
        if self.rate is None:
            # add_stream defaults to 24 fps; leave the rate unknown rather than declare a wrong one.
            ctx.framerate = Fraction(0, 1)
        # Tag what we convert with: players assume BT.709 for HD but BT.601 for SD when untagged.
        ctx.colorspace = Colorspace.ITU709
        ctx.color_primaries = ColorPrimaries.BT709
        ctx.color_trc = ColorTrc.BT709
        ctx.color_range = ColorRange.MPEG
        ctx.thread_count = threads
        if codec in _CRF_ENCODERS:
            ctx.options = {"crf": str(crf), "preset": preset}
        return stream

    def _add_audio(self, template: AudioStream) -> None:
        container = self._container
        name = template.codec_context.codec.canonical_name
        plan = audio_plan(Path(self.path).suffix, name)
        if plan == "copy":
            try:
                self._audio_out = container.add_stream_from_template(template)
                self.audio_plan = "copy"
                return
            except ValueError:
                # The table said copy but this FFmpeg's muxer disagrees: transcode instead.
                plan = "libopus" if container.format.name in ("webm", "ogg") else "aac"
        src = template.codec_context
        rate = src.sample_rate or 48000
        layout = src.layout.name if src.layout.nb_channels else "stereo"
        if plan == "libopus":
            # Opus runs only at these rates, and libopus needs a mapping family for >2 channels.
            rate = rate if rate in (8000, 12000, 16000, 24000, 48000) else 48000
            if src.layout.nb_channels > 2:
                layout = "stereo"
        try:
            out = container.add_stream(plan, rate=rate)
            out.layout = layout
        except (ValueError, av.error.FFmpegError) as e:
            raise OutputError(
                f"cannot write '{self.path}': cannot put {name} audio into {container.format.name} "
                f"and cannot encode {plan} here ({_reason(e)}). Choose an output path ending in .mkv "
                "with --output."
            ) from e
        out.time_base = Fraction(1, rate)
        out.codec_context.time_base = Fraction(1, rate)
        self._audio_out = out
        self.audio_plan = plan

    # -- writing -----------------------------------------------------------------------------------

    def write(self, frame: Frame) -> None:
        """Queue one RGB frame (HxWx3 uint8, the size given to the constructor) for encoding; a GPU
        hands over NV12 instead (`write_nv12`)."""
        if self._closed:
            raise ValueError(f"VideoWriter for '{self.path}' is closed")
        data = frame.data
        if frame.format != "rgb24" or not isinstance(data, np.ndarray) or data.dtype != np.uint8:
            raise TypeError("VideoWriter.write takes RGB frames: a HxWx3 uint8 NumPy array, format 'rgb24'")
        if data.shape != (self.height, self.width, 3):
            raise ValueError(f"frame is {data.shape}, the writer was opened for ({self.height}, {self.width}, 3)")
        even = data[: self.height - self.height % 2, : self.width - self.width % 2]
        if even.strides[1:] != (3, 1):
            even = np.ascontiguousarray(even)
        # Wrapping the array is free; the RGB->YUV conversion below is the one pass over the pixels, and
        # its output is owned by FFmpeg, so the caller may reuse its array as soon as this returns.
        yuv = self._to_yuv.reformat(
            av.VideoFrame.from_numpy_buffer(even, format="rgb24"),
            format="yuv420p",
            dst_colorspace=Colorspace.ITU709,
            dst_color_range=ColorRange.MPEG,
        )
        self._queue(yuv, frame)

    def write_nv12(self, nv12: np.ndarray, pts: int | None, time_base: Fraction | None) -> None:
        """Queue one frame given as NV12 ((H * 3/2)xW uint8, even sizes only: the luma rows, then the
        interleaved chroma rows), converted on a GPU with the writer's BT.709 limited-range matrix
        (`runtime.gpu_stages.GpuCompose`); x264 then only de-interleaves the chroma."""
        if self._closed:
            raise ValueError(f"VideoWriter for '{self.path}' is closed")
        want = (self.height * 3 // 2, self.width)
        if nv12.dtype != np.uint8 or nv12.shape != want or self.width % 2 or self.height % 2:
            raise ValueError(f"an NV12 frame for this writer is a {want[0]}x{want[1]} uint8 array "
                             f"(even sizes only), got {nv12.shape}")
        # A copy into FFmpeg's own frame: the caller reuses its pinned buffer.
        vf = av.VideoFrame.from_ndarray(nv12, format="nv12")
        self._queue(vf, Frame(nv12, pts, time_base if time_base is not None else self.time_base, 0))

    def _queue(self, yuv: av.VideoFrame, frame: Frame) -> None:
        pts = self._next_pts(frame)
        yuv.pts = pts
        yuv.time_base = self.time_base
        if self._pending is not None:
            self._last_gap = pts - self._pending.pts
            self._encode(self._pending, self._last_gap)
        self._pending = yuv

    def _next_pts(self, frame: Frame) -> int:
        pts = frame.pts
        if pts is not None and frame.time_base != self.time_base:
            pts = round(pts * frame.time_base / self.time_base)
        if pts is None:
            pts = 0 if self._last_pts is None else self._last_pts + self._step
        elif self._last_pts is not None and pts <= self._last_pts:
            pts = self._last_pts + 1
            self.pts_bumped += 1
        self._last_pts = pts
        return pts

    def _encode(self, vframe: av.VideoFrame | None, duration: int = 0) -> None:
        if vframe is not None:
            # Encoders reorder frames (B-frames), so the duration is matched back by pts below.
            self._durations[vframe.pts] = duration
            self.frames_written += 1
        try:
            packets = self._video.encode(vframe)
            for packet in packets:
                packet.duration = self._durations.pop(packet.pts, packet.duration)
            self._container.mux(packets)
        except av.error.FFmpegError as e:
            raise _write_error(self.path, _reason(e)) from e

    def write_audio(self, packet: AudioPacket) -> None:
        """Copy or transcode one packet of the `audio_from` stream."""
        if self._closed:
            raise ValueError(f"VideoWriter for '{self.path}' is closed")
        if self._audio_in is None or self._audio_out is None:
            raise ValueError("this VideoWriter was opened without audio_from, so it has no audio stream")
        pkt = packet.packet
        try:
            if self.audio_plan == "copy":
                # Only the routing changes; mux() rescales the timestamps from the packet's own time base.
                pkt.stream = self._audio_out
                self._container.mux(pkt)
            else:
                self._transcode(self._audio_in.codec_context.decode(pkt))
        except av.error.InvalidDataError as e:
            # A corrupt or mistimed audio packet: `ffmpeg` drops or patches it and goes on; we drop it.
            log.warning("'%s': dropped an audio packet FFmpeg rejected: %s", self.path, _reason(e))
        except av.error.FFmpegError as e:
            raise _write_error(self.path, _reason(e)) from e

    def _transcode(self, frames: list[av.AudioFrame] | None) -> None:
        """Encode decoded audio; None flushes the encoder."""
        assert self._audio_out is not None
        out = self._audio_out
        if frames is None:
            self._container.mux(out.encode(None))
            return
        for aframe in frames:
            self._container.mux(out.encode(aframe))

    # -- closing -----------------------------------------------------------------------------------

    def close(self) -> None:
        """Encode what is held back, flush the encoders and finish the file. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        try:
            try:
                if self._pending is not None:
                    last, self._pending = self._pending, None
                    self._encode(last, self._last_duration())
                self._encode(None)
                if self._audio_out is not None and self.audio_plan != "copy":
                    assert self._audio_in is not None
                    self._transcode(self._audio_in.codec_context.decode(None))
                    self._transcode(None)
                # With nothing written FFmpeg would leave an empty file; write a valid, empty one.
                self._container.start_encoding()
            finally:
                self._container.close()
        except av.error.FFmpegError as e:
            raise _write_error(self.path, _reason(e)) from e

    def _last_duration(self) -> int:
        """The last frame has no successor to measure against: show it as long as the one before it,
        which for variable frame rate is closer than the average rate; else for one nominal frame."""
        return self._step if self._last_gap is None else self._last_gap

    def __enter__(self) -> VideoWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is None:
            self.close()
            return
        # Already failing: finish the file as far as possible, but never hide the original error.
        try:
            self.close()
        except Exception:  # noqa: BLE001 - the exception in flight is the one to report
            log.debug("'%s': close after an error failed too", self.path, exc_info=True)
        if self._created and self.frames_written == 0:
            # A file with no video (e.g. the input had no decodable frame) is only litter.
            Path(self.path).unlink(missing_ok=True)
