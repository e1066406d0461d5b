"""NVENC encoding through PyNvVideoCodec, from NV12 planes in GPU memory.

`NvencSink` takes NV12 planes (from `rgb_to_nv12`, ideally written straight into
`NvencSink.input_planes()`) and returns H.264 or HEVC access units with their pts and dts
(`EncodedPacket`); `nvenc_options` builds the options it opens the encoder with.

PyNvVideoCodec is imported inside the functions (through `pynvc`), so this module imports without
it. Hopper and A100 GPUs have no NVENC: there `pynvc.nvenc_available()` reports that and `NvencSink`
raises an `OutputError`. The sources cited as [PG], [REF], [S:x] and [SRC] are listed in
`swapstream.gpu.pynvc`.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from fractions import Fraction
from types import TracebackType
from typing import Any

from ..errors import ConfigError, OutputError
from . import pynvc
from .bitstream import is_keyframe, split_access_units
from .planes import nv12_encoder_interfaces
from .pynvc import _import_failure, _reason, nvenc_failure_reason, same_context

log = logging.getLogger(__name__)

__all__ = [
    "EncodedPacket",
    "NvencSink",
    "nvenc_options",
]

CPU_ENCODE_FIX = "Encode with x264 instead (the CPU encoder, used by default where NVENC is missing)"

# NVENC's `Encode` copies our surface into its own input buffer asynchronously on the encoder's own
# stream, and returns before that copy has certainly finished. PyNvVideoCodec's NvEncoderCuda runs
# with an output delay of 3 frames ([SRC] NvEncoderCuda.h, nExtraOutputDelay = 3): the call for
# frame n+3 waits for frame n's bitstream, which NVENC produced after reading frame n's input. A
# surface is therefore free again after 4 calls; 8 leaves a margin ([S:Encode.py] rotates 4).
_STAGING_SLOTS = 8


# --------------------------------------------------------------------------------------------------
# Bytes out: access units with their timing


def _bitstream_bytes(result: Any) -> list[bytes]:
    """Encode/EndEncode's result as bytes chunks: bytes in PyNvVideoCodec 2.0 ([SRC]
    PyNvEncoder.cpp), a bytearray-convertible buffer per [S:Encode.py], or a list of either."""
    if result is None:
        return []
    if isinstance(result, (bytes, bytearray, memoryview)):
        return [bytes(result)] if len(result) else []
    if isinstance(result, (list, tuple)):
        return [chunk for item in result for chunk in _bitstream_bytes(item)]
    data = bytes(bytearray(result))
    return [data] if data else []


@dataclass(frozen=True)
class EncodedPacket:
    """One access unit out of the encoder, with its timing."""

    data: bytes
    pts: int
    dts: int
    """Equal to pts: the encoder makes no B-frames, so pictures leave in presentation order."""
    key: bool
    """Holds an IDR/IRAP picture (with SPS/PPS repeated before it): a viewer can join here."""
    time_base: Fraction


class _Packetizer:
    """Gives each access unit the pts of the frame it encodes: with no B-frames, pictures leave the
    encoder in the order they went in, so the oldest pts still waiting is the one."""

    def __init__(self, codec: str, time_base: Fraction) -> None:
        self.codec = codec
        self.time_base = time_base
        self.waiting: deque[int] = deque()

    def submitted(self, pts: int) -> None:
        self.waiting.append(pts)

    def packets(self, result: Any) -> list[EncodedPacket]:
        out = []
        for chunk in _bitstream_bytes(result):
            for au in split_access_units(chunk, self.codec):
                if not self.waiting:
                    raise RuntimeError(f"NVENC returned more pictures than frames were sent "
                                       f"({len(out) + 1} unmatched {self.codec} access units)")
                pts = self.waiting.popleft()
                out.append(EncodedPacket(au, pts, pts, is_keyframe(au, self.codec), self.time_base))
        return out


# --------------------------------------------------------------------------------------------------
# NVENC


_PRESETS = tuple(f"P{i}" for i in range(1, 8))
_TUNINGS = ("high_quality", "low_latency", "ultra_low_latency", "lossless")
_RATE_CONTROLS = ("cbr", "vbr")
_CODECS = ("h264", "hevc")


def _fps_option(fps: Fraction) -> int | str:
    # [SRC] NvEncoderClInterface.cpp parses "fps" as an integer or a decimal with 2 digits kept.
    return int(fps) if fps.denominator == 1 else f"{float(fps):.2f}"


def nvenc_options(*, codec: str, preset: str, tuning: str, rate_control: str, bitrate: int,
                  max_bitrate: int | None, fps: Fraction, gop: int, gpu_id: int) -> dict[str, Any]:
    """The keyword options for CreateEncoder ([PG] "Video Encoding Parameter Details" and [REF]'s
    parameter table; names and parsing per [SRC] NvEncoderClInterface.cpp; value types as in the
    config files [S:Encode.py] reads, with gpu_id as that sample passes it).

    No B-frames (bf=0), so that pictures leave in presentation order and dts = pts; an IDR every
    `gop` frames with SPS/PPS repeated before each, so that a viewer (an RTMP ingest, an HLS
    segment) can join at any GOP. Bitrates are given in bits per second: the option parser reads
    'k' and 'M' suffixes as 1024 and 1024*1024. No colorspace option: it marks the stream full-range,
    while `rgb_to_nv12` writes limited range (players assume BT.709 for untagged HD).
    """
    options: dict[str, Any] = {
        "codec": codec,
        "preset": preset,
        "tuning_info": tuning,
        "rc": rate_control,
        "bitrate": int(bitrate),
        "fps": _fps_option(fps),
        "bf": 0,
        "gop": int(gop),
        "idrperiod": int(gop),
        "repeatspspps": 1,
        "gpu_id": int(gpu_id),
    }
    if rate_control == "vbr":
        options["maxbitrate"] = int(max_bitrate if max_bitrate is not None else 2 * bitrate)
    return options


class _PlaneInterface:
    def __init__(self, cai: dict[str, Any]) -> None:
        self.__cuda_array_interface__ = cai


class _Nv12Surface:
    """What Encode takes: an object whose cuda() returns one array-interface object per plane
    ([PG] "Encode API": 'Encode accepts object of AppFrame only if it implements cuda method')."""

    def __init__(self, buffer: Any, width: int, height: int) -> None:
        self._buffer = buffer  # kept alive until Encode has read it
        self._planes = [_PlaneInterface(c) for c in nv12_encoder_interfaces(buffer.data.ptr, width, height)]

    def cuda(self) -> list[_PlaneInterface]:
        return self._planes


class NvencSink:
    """Encodes NV12 frames on NVENC into H.264 or HEVC access units, with no B-frames.

    The fast path writes each frame straight into the encoder's staging surface:

        y, uv = sink.input_planes()
        rgb_to_nv12(rgb, y, uv)              # on the current CuPy stream
        for packet in sink.encode(y, uv, pts=frame.pts): ...
        ...
        for packet in sink.flush(): ...

    `encode` accepts other planes too ((H, >=W) and (H/2, >=W) uint8 CuPy arrays) and copies them in.
    It waits for the current stream before handing the surface over, as NVENC reads it on a stream
    of its own. pts default to consecutive frames in `time_base` (1/fps unless given).

    Raises `OutputError` with the reason when NVENC cannot be used (not installed, or a GPU without
    an encoder such as the H200: "this GPU has no NVENC (...)").
    """

    def __init__(self, width: int, height: int, *, fps: float | Fraction, bitrate: int, gop: int,
                 codec: str = "h264", preset: str = "P1", tuning: str = "ultra_low_latency",
                 rate_control: str = "cbr", max_bitrate: int | None = None, gpu_id: int = 0,
                 time_base: Fraction | None = None) -> None:
        width, height = int(width), int(height)
        if width < 2 or height < 2 or width % 2 or height % 2:
            raise ConfigError(f"NVENC encodes NV12 4:2:0, which needs an even width and height; "
                              f"got {width}x{height}")
        if codec not in _CODECS:
            raise ConfigError(f"codec must be one of {', '.join(_CODECS)}, got {codec!r}")
        if preset not in _PRESETS:
            raise ConfigError(f"preset must be one of P1 (fastest) to P7 (best), got {preset!r}")
        if tuning not in _TUNINGS:
            raise ConfigError(f"tuning must be one of {', '.join(_TUNINGS)}, got {tuning!r}")
        if rate_control not in _RATE_CONTROLS:
            raise ConfigError(f"rate_control must be 'cbr' or 'vbr', got {rate_control!r}")
        if int(bitrate) <= 0 or int(gop) <= 0:
            raise ConfigError(f"bitrate and gop must be positive, got bitrate={bitrate}, gop={gop}")
        rate = Fraction(fps).limit_denominator(1001000) if not isinstance(fps, Fraction) else fps
        if rate <= 0:
            raise ConfigError(f"fps must be positive, got {fps}")
        self.width, self.height, self.codec, self.gpu_id = width, height, codec, int(gpu_id)
        self.fps = rate
        self.time_base = time_base if time_base is not None else 1 / rate
        self._step = max(1, round(1 / (rate * self.time_base)))
        self.options = nvenc_options(codec=codec, preset=preset, tuning=tuning, rate_control=rate_control,
                                     bitrate=int(bitrate), max_bitrate=max_bitrate, fps=rate, gop=int(gop),
                                     gpu_id=self.gpu_id)
        try:
            # Through the module, so that replacing `pynvc._import_nvc` (a test's fake) reaches here too.
            nvc = pynvc._import_nvc()
        except Exception as e:
            raise OutputError(f"cannot encode with NVENC: {_import_failure(e)}. {CPU_ENCODE_FIX}.") from e
        try:
            # [PG] "Encode API": CreateEncoder(width, height, "NV12", usecpuinputbuffer=False, **options).
            # In `same_context`: a failed CreateEncoder leaves a context of its own current (pynvc).
            with same_context():
                self._encoder = nvc.CreateEncoder(width, height, "NV12", False, **self.options)
        except Exception as e:
            raise OutputError(f"cannot encode with NVENC: {nvenc_failure_reason(e)}. "
                              f"{CPU_ENCODE_FIX}.") from e
        self.capabilities: dict[str, Any] = {}
        try:
            # [S:Encode.py] GetEncoderCaps(codec=...): num_encoder_engines, width_max, ...
            with same_context():
                self.capabilities = dict(nvc.GetEncoderCaps(gpuid=self.gpu_id, codec=codec))
        except Exception:  # noqa: BLE001 - informative only
            pass
        import cupy

        with cupy.cuda.Device(self.gpu_id):
            self._slots = [cupy.empty((height * 3 // 2, width), dtype=cupy.uint8)
                           for _ in range(_STAGING_SLOTS)]
        self._next = 0
        self._packetizer = _Packetizer(codec, self.time_base)
        self._last_pts: int | None = None
        self.frames = 0
        self.pts_bumped = 0
        """Frames whose pts did not increase and were moved one tick after the previous one."""
        self._flushed = False
        self._closed = False
        log.info("NVENC %s %dx%d on GPU %d: %s", codec, width, height, self.gpu_id, self.options)

    def input_planes(self) -> tuple[Any, Any]:
        """The (H, W) luma and (H/2, W) chroma planes of the surface the next `encode` sends: write
        the frame here (`rgb_to_nv12(rgb, y, uv)`) and no copy is made."""
        self._check_open()
        buf = self._slots[self._next]
        return buf[: self.height], buf[self.height:]

    def _check_open(self) -> None:
        if self._closed or self._flushed:
            raise ValueError("this NvencSink is " + ("closed" if self._closed else "flushed"))

    def _pts(self, pts: int | None) -> int:
        if pts is None:
            pts = 0 if self._last_pts is None else self._last_pts + self._step
        elif self._last_pts is not None and pts <= self._last_pts:
            pts = self._last_pts + 1
            self.pts_bumped += 1
        self._last_pts = int(pts)
        return self._last_pts

    def encode(self, y: Any, uv: Any, *, pts: int | None = None) -> list[EncodedPacket]:
        """Encode one NV12 frame; returns the access units that came out (none, or older frames':
        NVENC holds a few frames back), each with its pts and dts in `time_base`."""
        import cupy

        self._check_open()
        h, w = self.height, self.width
        for name, plane, rows in (("y", y, h), ("uv", uv, h // 2)):
            if not isinstance(plane, cupy.ndarray) or plane.dtype != cupy.uint8 or plane.ndim != 2 \
                    or plane.shape[0] != rows or plane.shape[1] < w:
                raise ValueError(f"{name} must be a ({rows}, >={w}) uint8 CuPy array, got "
                                 f"{type(plane).__name__} {getattr(plane, 'shape', '')}")
        slot = self._slots[self._next]
        self._next = (self._next + 1) % len(self._slots)
        sy, suv = slot[:h], slot[h:]
        stream = cupy.cuda.get_current_stream()
        with cupy.cuda.Device(self.gpu_id):
            if y.data.ptr != sy.data.ptr:
                sy[...] = y[:, :w]
            if uv.data.ptr != suv.data.ptr:
                suv[...] = uv[:, :w]
            # NVENC copies the surface on a stream of its own, which does not wait for ours
            # ([SRC] PyNvEncoder.cpp GetEncoderInput; [S:Utils.py] FetchGPUFrame synchronizes too).
            stream.synchronize()
        pts = self._pts(pts)
        self._packetizer.submitted(pts)
        try:
            result = self._encoder.Encode(_Nv12Surface(slot, w, h))  # [PG] "Encode API"
        except Exception as e:
            raise OutputError(f"NVENC failed to encode frame {self.frames}: {_reason(e)}. "
                              f"{CPU_ENCODE_FIX}.") from e
        self.frames += 1
        return self._packetizer.packets(result)

    def flush(self) -> list[EncodedPacket]:
        """End the stream: the access units NVENC still holds. The sink takes no frames after this."""
        if self._closed:
            raise ValueError("this NvencSink is closed")
        if self._flushed:
            return []
        self._flushed = True
        try:
            result = self._encoder.EndEncode()  # [PG] "Encode API": flushes the encoder's queue
        except Exception as e:
            raise OutputError(f"NVENC failed to finish the stream: {_reason(e)}") from e
        packets = self._packetizer.packets(result)
        if self._packetizer.waiting:
            log.warning("NVENC returned %d pictures for %d frames",
                        self.frames - len(self._packetizer.waiting), self.frames)
        return packets

    def close(self) -> None:
        """Release the encoder (without flushing: call `flush` first for the last packets)."""
        self._closed = True
        self._encoder = None
        self._slots = []

    def __enter__(self) -> NvencSink:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
