"""NVDEC behind PyNvVideoCodec's own FFmpeg demuxer: `NvdecSource` decodes the first video
stream of a file, or of bytes that our own code receives (RTMP, WebRTC, a pipe) and feeds through a
`ByteFeeder`.

The decoding itself (`NvdecFrame`, the decoder's creation, the step from a packet to frames) is
`nvdec`'s. PyNvVideoCodec is imported inside the functions, so this module imports without it. The
sources cited as [PG], [S:x] and [SRC] are listed in `swapstream.gpu.pynvc`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from fractions import Fraction
from types import TracebackType
from typing import Any

from ..errors import InputError, InputNotFoundError
from ..kernels.nv12 import Matrix
from .nvdec import (
    _NOPTS,
    CPU_DECODE_FIX,
    NvdecFrame,
    _Decoding,
    _create_decoder,
    _decoder_stream,
    _nvc_for,
    untagged_matrix,
)
from .pynvc import _enum_name, _reason, same_context

log = logging.getLogger(__name__)

__all__ = [
    "ByteFeeder",
    "NvdecSource",
    "bytes_source",
]


# --------------------------------------------------------------------------------------------------
# Bytes in: the demuxer's read callback


class ByteFeeder:
    """Adapts `read(n) -> bytes` (a socket's recv, a queue's get, a file's read) to the callback that
    `CreateDemuxer(callback)` calls: it fills the bytearray it is given and returns how many bytes it
    wrote, 0 at the end of the stream ([PG] "Buffer-Based Demuxing and Decoding").

    `read` may return fewer or more bytes than asked (the rest is kept for the next call) and must
    return b"" only at the end. An exception from `read` ends the stream and is kept in `error`,
    so that the source can report it instead of a demuxer error.
    """

    def __init__(self, read: Callable[[int], bytes]) -> None:
        self._read = read
        self._pending = bytearray()
        self._eof = False
        self.bytes_fed = 0
        self.error: BaseException | None = None

    def __call__(self, buffer: bytearray) -> int:
        capacity = len(buffer)
        while not self._pending and not self._eof and capacity:
            try:
                chunk = self._read(capacity)
            except Exception as e:  # noqa: BLE001 - kept and re-raised by the source as an InputError
                self.error = e
                self._eof = True
                break
            if not chunk:
                self._eof = True
            else:
                self._pending += chunk
        n = min(capacity, len(self._pending))
        if n:
            # In place: the demuxer copies back from this same bytearray ([SRC] FFmpegDemuxer.h).
            buffer[:n] = self._pending[:n]
            del self._pending[:n]
            self.bytes_fed += n
        return n


def bytes_source(read: Callable[[int], bytes]) -> ByteFeeder:
    """The demuxer callback for a byte stream that our own code receives (RTMP, WebRTC, a pipe).

    Pass the result (or `read` itself) to `NvdecSource`, which builds the demuxer with
    `CreateDemuxer(callback)`. The container must be readable without seeking (FLV, MPEG-TS,
    fragmented MP4): a callback cannot seek back to an MP4's index at the end of the file.
    """
    return ByteFeeder(read)


# --------------------------------------------------------------------------------------------------
# NVDEC behind the demuxer


class NvdecSource(_Decoding):
    """Decodes the first video stream of a file, or of bytes fed through a callback, on NVDEC.

    Iterate once to get `NvdecFrame`s in presentation order. `source` is a path, or a `read(n) ->
    bytes` callable (wrapped with `bytes_source`), or a `ByteFeeder`. `stream` is the CuPy stream the
    decoder copies its output on and `copy_to` converts on (a new non-blocking stream if None).

    `low_latency` decodes with `DisplayDecodeLatencyType.LOW` and hands each packet over as one
    whole picture, so a frame comes out as soon as its packet went in ([PG] "Latency Modes"). That
    mode is for streams without B-frames (what OBS and live encoders send); a stream whose packets
    arrive out of presentation order raises `InputError` telling to open it with low_latency=False.

    Errors a user can act on (a missing file, a codec or size this NVDEC cannot decode, 10-bit
    video) raise `InputError`/`InputNotFoundError` naming the input and the fix.
    """

    def __init__(self, source: str | os.PathLike[str] | Callable[..., Any], *, gpu_id: int = 0,
                 stream: Any = None, low_latency: bool = True, time_base: Fraction | None = None,
                 name: str | None = None) -> None:
        self.gpu_id = int(gpu_id)
        self.low_latency = bool(low_latency)
        self.time_base = time_base
        self.frames = 0
        self._feeder: ByteFeeder | None = None
        self._started = False
        self._closed = False
        self._decoder: Any = None
        self._demuxer: Any = None
        if callable(source):
            self._feeder = source if isinstance(source, ByteFeeder) else bytes_source(source)
            self.name = name or "<byte stream>"
        else:
            path = os.fspath(source)
            self.name = name or path
            if not os.path.exists(path):
                raise InputNotFoundError(f"input '{path}' does not exist. Check the path and its spelling.")
            if os.path.isdir(path):
                raise InputError(f"input '{path}' is a directory. Give the path of a video file.")
        self._nvc = nvc = _nvc_for(self.name)
        try:
            # [PG] "Demux API" (CreateDemuxer(filename=...)) and "Buffer-Based Demuxing and
            # Decoding" (CreateDemuxer(callback)).
            with same_context():
                if self._feeder is not None:
                    self._demuxer = nvc.CreateDemuxer(self._feeder)
                else:
                    self._demuxer = nvc.CreateDemuxer(filename=os.fspath(source))
        except Exception as e:
            raise self._open_error(e) from e
        try:
            codec = self._demuxer.GetNvCodecId()  # [PG] "Buffer-Based Demuxing and Decoding"
        except Exception as e:
            raise InputError(f"NVDEC cannot decode the video codec of '{self.name}' "
                             f"({_reason(e)}). {CPU_DECODE_FIX}") from e
        self.codec = _enum_name(codec)
        self._caps = self._query_caps(codec)
        self._check_caps()
        self.matrix, self.full_range = self._color()
        self._open_decoder(codec, stream)
        log.info("NVDEC for '%s' on GPU %d: %s", self.name, self.gpu_id, self._caps)

    # -- opening -----------------------------------------------------------------------------------

    def _open_error(self, error: BaseException) -> InputError:
        if self._feeder is not None and self._feeder.error is not None:
            return InputError(f"reading '{self.name}' failed: {_reason(self._feeder.error)}")
        return InputError(f"cannot open '{self.name}' for NVDEC: {_reason(error)}. Check that it is a "
                          f"complete video file. {CPU_DECODE_FIX}")

    def _query_caps(self, codec: Any) -> dict[str, Any]:
        dmx, nvc = self._demuxer, self._nvc
        caps: dict[str, Any] = {"codec": self.codec, "surface_format": "NV12", "gpu_id": self.gpu_id,
                                "latency": "LOW" if self.low_latency else "NATIVE"}
        # Stream properties, [SRC] PyNvDemuxer.cpp (Width, Height, BitDepth, ChromaFormat, FrameRate).
        for key, method in (("width", "Width"), ("height", "Height"), ("bit_depth", "BitDepth"),
                            ("chroma_format", "ChromaFormat"), ("frame_rate", "FrameRate")):
            get = getattr(dmx, method, None)
            if get is None:
                continue
            try:
                value = get()
            except Exception:  # noqa: BLE001 - an unanswered property is simply not reported
                continue
            caps[key] = _enum_name(value) if key == "chroma_format" else value
        try:
            # [S:Decode.py] GetDecoderCaps(gpuid, codec, chromaformat, bitdepth).
            with same_context():
                hw = dict(nvc.GetDecoderCaps(gpuid=self.gpu_id, codec=codec,
                                             chromaformat=dmx.ChromaFormat(), bitdepth=dmx.BitDepth()))
        except Exception as e:  # noqa: BLE001 - the decoder's creation is the last word
            log.debug("GetDecoderCaps failed for '%s': %s", self.name, e)
            return caps
        for key in ("supported", "width_min", "width_max", "height_min", "height_max", "mb_num_max",
                    "num_decoder_engines"):
            if key in hw:
                caps[key] = int(hw[key])
        return caps

    def _check_caps(self) -> None:
        caps, name, codec = self._caps, self.name, self.codec
        bit_depth, chroma = caps.get("bit_depth", 8), str(caps.get("chroma_format", "420"))
        if bit_depth != 8 or chroma != "420":
            raise InputError(f"'{name}' is {bit_depth}-bit {chroma} {codec} video; the GPU path takes "
                             f"8-bit 4:2:0 only. {CPU_DECODE_FIX}")
        if "supported" in caps and not caps["supported"]:
            raise InputError(f"NVDEC on this GPU cannot decode {codec} video ('{name}'). {CPU_DECODE_FIX}")
        w, h = int(caps.get("width", 0) or 0), int(caps.get("height", 0) or 0)
        if w and h and "width_max" in caps:
            too_big = w > caps["width_max"] or h > caps["height_max"]
            too_small = w < caps.get("width_min", 0) or h < caps.get("height_min", 0)
            mbs = ((w + 15) // 16) * ((h + 15) // 16)
            if too_big or too_small or mbs > caps.get("mb_num_max", mbs):
                raise InputError(
                    f"'{name}' is {w}x{h}; NVDEC on this GPU decodes {codec} from "
                    f"{caps.get('width_min', '?')}x{caps.get('height_min', '?')} to "
                    f"{caps['width_max']}x{caps['height_max']}. {CPU_DECODE_FIX}")

    def _color(self) -> tuple[Matrix, bool]:
        """The YUV matrix and range the container declares; untagged video gets what players assume:
        BT.709 for HD, BT.601 below 720 lines, limited range."""
        space = rng = ""
        try:
            space = _enum_name(self._demuxer.ColorSpace())  # [SRC] PyNvDemuxer.cpp: BT_601, BT_709, UNSPEC
            rng = _enum_name(self._demuxer.ColorRange())  # MPEG, JPEG, UDEF
        except Exception:  # noqa: BLE001 - not declared is the common case
            pass
        if space == "BT_709":
            matrix: Matrix = "bt709"
        elif space == "BT_601":
            matrix = "bt601"
        else:
            matrix = untagged_matrix(int(self._caps.get("height", 720) or 720))
        return matrix, rng == "JPEG"

    def _open_decoder(self, codec: Any, stream: Any) -> None:
        nvc = self._nvc
        self.stream = _decoder_stream(self.gpu_id, stream)
        try:
            self._decoder = _create_decoder(nvc, self.gpu_id, codec, self.stream, self.low_latency)
        except Exception as e:
            unsupported = getattr(nvc, "PyNvVCExceptionUnsupported", None)
            what = "cannot decode" if unsupported and isinstance(e, unsupported) else "failed to open for"
            raise InputError(f"NVDEC {what} {self.codec} video in '{self.name}' ({_reason(e)}). "
                             f"{CPU_DECODE_FIX}") from e

    def capabilities(self) -> dict[str, Any]:
        """What the decoder reported at start: codec, stream size, bit depth and chroma format, the
        hardware's size limits (width/height min and max, mb_num_max) and NVDEC engine count where
        the API exposes them, the surface format (NV12) and the latency mode."""
        return dict(self._caps)

    # -- decoding ----------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[NvdecFrame]:
        if self._closed:
            raise ValueError(f"NvdecSource for '{self.name}' is closed")
        if self._started:
            raise RuntimeError("an NvdecSource can be iterated only once; open a new one to re-read")
        self._started = True
        return self._frames()

    def _frames(self) -> Iterator[NvdecFrame]:
        nvc = self._nvc
        last_pts: int | None = None
        flushed = False
        packets = 0
        # [PG] "Basic Decoding Workflow": for packet in demuxer: for frame in decoder.Decode(packet).
        # The demuxer's last packet is empty, which the decoder takes as the end of the stream.
        for packet in self._demuxer:
            if not packet.bsl:
                flushed = True
            elif self.low_latency:
                pts = int(packet.pts)
                if pts != _NOPTS and last_pts is not None and pts < last_pts:
                    raise InputError(f"'{self.name}' has B-frames (packet {packets} goes back in time), "
                                     f"which low-latency decoding cannot reorder. Open it with "
                                     f"low_latency=False.")
                last_pts = pts if pts != _NOPTS else last_pts
                # [PG] "Latency Modes" / [S:Decode.py]: with LOW latency, mark each packet as one
                # whole picture so that the parser decodes it at once.
                packet.decode_flag = nvc.VideoPacketFlag.ENDOFPICTURE
            packets += 1
            yield from self._decode(packet)
        if not flushed:
            try:
                end = nvc.PacketData()  # empty: end of stream ([SRC] PyNvDemuxer.cpp binds PacketData())
            except Exception:  # noqa: BLE001 - nothing more to flush with
                end = None
            if end is not None:
                yield from self._decode(end)
        if self._feeder is not None and self._feeder.error is not None:
            raise InputError(f"reading '{self.name}' failed after {self.frames} frames: "
                             f"{_reason(self._feeder.error)}") from self._feeder.error
        if self.frames == 0:
            raise InputError(f"'{self.name}' has no video frames NVDEC could decode. Check that it is "
                             f"a complete video file. {CPU_DECODE_FIX}")

    def _decode(self, packet: Any) -> Iterator[NvdecFrame]:
        yield from self._decode_packet(packet)

    # -- closing -----------------------------------------------------------------------------------

    def close(self) -> None:
        """Release the decoder and demuxer. Frames still held become invalid. Safe to call twice."""
        self._closed = True
        self._release_decoder()
        with same_context():
            self._demuxer = None

    def __enter__(self) -> NvdecSource:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
