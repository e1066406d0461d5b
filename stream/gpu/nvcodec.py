"""NVDEC decoding and NVENC encoding through PyNvVideoCodec, with the frames in GPU memory.

`NvdecSource` demuxes a file (or bytes fed by our own code: RTMP, WebRTC) with PyNvVideoCodec's
FFmpeg demuxer and decodes on NVDEC. Each `NvdecFrame` holds zero-copy CuPy views of the decoder's
NV12 surface; `NvdecFrame.copy_to` converts it into one of our RGB buffers with
`kernels.nv12.nv12_to_rgb`, which is how a frame outlives the surface. `NvencSink` takes NV12
planes (from `rgb_to_nv12`, ideally written straight into `NvencSink.input_planes()`) and returns
H.264 or HEVC access units with their pts and dts.

PyNvVideoCodec is optional: it is imported inside the functions, so this module imports without
it, and the `*_available()` checks say why a path cannot run. Hopper and A100 GPUs have NVDEC but
no NVENC; there `nvenc_available()` reports that and `NvencSink` raises an `OutputError`.

Where each call comes from (cited at the call as [tag]):
  [PG]   PyNvVideoCodec API Programming Guide 2.x,
         https://docs.nvidia.com/video-technologies/pynvvideocodec/pynvc-api-prog-guide/
         ("Demux API", "Buffer-Based Demuxing and Decoding", "Creating a Decoder", "Latency Modes",
         "Error Handling", "Encode API", "Video Encoding Parameter Details").
  [REF]  PyNvVideoCodec API Reference, Encoder,
         https://docs.nvidia.com/video-technologies/pynvvideocodec/pynvc-api-reference/encoder.html
  [S:x]  NVIDIA's sample x in the PyNvVideoCodec package (samples/Decode.py, samples/Encode.py,
         samples/Utils.py).
  [SRC]  PyNvVideoCodec 2.0 sources (src/PyNvVideoCodec/...), for what the guide leaves out: the
         plane layout of decoded frames (utils/PyNvVideoCodecUtils.hpp), the exact array interfaces
         Encode accepts (src/PyCAIMemoryView.cpp), the option names and their parsing
         (src/NvEncoderClInterface.cpp), and what Encode returns (src/PyNvEncoder.cpp).
The machine this was written for has PyNvVideoCodec 2.2.4; nothing here was run against it.
"""

from __future__ import annotations

import logging
import os
import re
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from fractions import Fraction
from types import TracebackType
from typing import Any, NamedTuple

from ..errors import ConfigError, InputError, InputNotFoundError, OutputError
from ..kernels.nv12 import Matrix, nv12_to_rgb

log = logging.getLogger(__name__)

__all__ = [
    "ByteFeeder",
    "NvdecAccessUnits",
    "EncodedPacket",
    "Nv12Layout",
    "NvdecFrame",
    "NvdecSource",
    "NvencSink",
    "PlaneView",
    "bytes_source",
    "is_keyframe",
    "nv12_encoder_interfaces",
    "nv12_planes_from_interface",
    "nvdec_available",
    "nvenc_available",
    "nvenc_options",
    "split_access_units",
    "primary_context",
    "untagged_matrix",
    "WARM_UP_PTS",
    "warm_nvdec",
]

CPU_DECODE_FIX = "Decode it with PyAV instead (the GPU file job does by default)"
CPU_ENCODE_FIX = "Encode with x264 instead (the CPU encoder, used by default where NVENC is missing)"

# FFmpeg's AV_NOPTS_VALUE: the packet or frame carries no timestamp (raw H.264, some AVI).
_NOPTS = -(2**63)

# The size `nvenc_available` opens its probe encoder at: small, and above the minimum frame size
# of every NVENC generation (the encoder caps width_min / height_min).
_PROBE_SIZE = (256, 256)

# NVENC's `Encode` copies our surface into its own input buffer asynchronously on the encoder's own
# stream, and returns before that copy has certainly finished. PyNvVideoCodec's NvEncoderCuda runs
# with an output delay of 3 frames ([SRC] NvEncoderCuda.h, nExtraOutputDelay = 3): the call for
# frame n+3 waits for frame n's bitstream, which NVENC produced after reading frame n's input. A
# surface is therefore free again after 4 calls; 8 leaves a margin ([S:Encode.py] rotates 4).
_STAGING_SLOTS = 8


def _one_line(text: object) -> str:
    return " ".join(str(text).split()).rstrip(".")


def _reason(error: BaseException) -> str:
    return _one_line(str(error) or type(error).__name__)


def _enum_name(value: Any) -> str:
    """'H264' for cudaVideoCodec.H264, '420' for cudaVideoChromaFormat.420 (pybind11 enums)."""
    name = getattr(value, "name", None)
    return str(name) if name else str(value).rsplit(".", 1)[-1]


def _import_nvc() -> Any:
    import PyNvVideoCodec as nvc  # optional: the [gpu] extra

    return nvc


def _import_failure(error: BaseException) -> str:
    if isinstance(error, ImportError):
        return "PyNvVideoCodec is not installed (pip install 'swapstream[gpu]')"
    # Its __init__ raises on drivers too old for its NVENC API, and logs the details.
    return f"PyNvVideoCodec does not load here: {_reason(error)}"


# --------------------------------------------------------------------------------------------------
# What this machine can do


def nvdec_available(gpu_id: int = 0) -> tuple[bool, str]:
    """Whether NVDEC can decode 8-bit 4:2:0 H.264 on GPU `gpu_id`, and why (or why not)."""
    try:
        nvc = _import_nvc()
    except Exception as e:  # ImportError, or a driver its loader rejects
        return False, _import_failure(e)
    version = getattr(nvc, "__version__", "?")
    try:
        # [S:Decode.py] GetDecoderCaps(gpuid, codec, chromaformat, bitdepth) returns a dict with
        # supported, width_max, height_max, num_decoder_engines ([SRC] PyNvDecoder.cpp); the
        # defaults are 4:2:0 and 8 bits.
        with same_context():
            caps = dict(nvc.GetDecoderCaps(gpuid=gpu_id, codec=nvc.cudaVideoCodec.H264))
    except AttributeError:
        caps = None  # a build without the caps query: opening a decoder is the test
    except Exception as e:
        return False, f"NVDEC cannot be queried on GPU {gpu_id}: {_reason(e)}"
    if caps is None:
        try:
            # [PG] "Creating a Decoder"
            nvc.CreateDecoder(gpuid=gpu_id, codec=nvc.cudaVideoCodec.H264, usedevicememory=True)
        except Exception as e:
            return False, f"NVDEC cannot decode H.264 on GPU {gpu_id} (CreateDecoder failed: {_reason(e)})"
        return True, f"NVDEC decodes H.264 on GPU {gpu_id} (PyNvVideoCodec {version})"
    if not caps.get("supported", 0):
        return False, f"this GPU's NVDEC cannot decode 8-bit 4:2:0 H.264 (GPU {gpu_id})"
    return True, (f"NVDEC decodes H.264 up to {caps.get('width_max', '?')}x{caps.get('height_max', '?')} "
                  f"on GPU {gpu_id} with {caps.get('num_decoder_engines', '?')} decoder engines "
                  f"(PyNvVideoCodec {version})")


# A GPU without an encoder fails nvEncOpenEncodeSessionEx with NV_ENC_ERR_UNSUPPORTED_DEVICE (2);
# the H200 here reports "error 2". A missing libnvidia-encode is the same fact seen from the driver.
_NO_NVENC = re.compile(r"error(?:\s+code)?\s*[:=]?\s*2\b|NV_ENC_ERR_UNSUPPORTED_DEVICE|"
                       r"NV_ENC_ERR_NO_ENCODE_DEVICE|libnvidia-encode", re.IGNORECASE)


def nvenc_failure_reason(error: BaseException) -> str:
    """Why CreateEncoder failed, in words: 'this GPU has no NVENC (...)' when that is the cause."""
    detail = f"CreateEncoder failed: {_reason(error)}"
    if _NO_NVENC.search(str(error)):
        return f"this GPU has no NVENC ({detail})"
    return f"NVENC cannot be used here ({detail})"


def nvenc_available(gpu_id: int = 0) -> tuple[bool, str]:
    """Whether NVENC can encode H.264 on GPU `gpu_id`: opens (and closes) a small encoder to find out."""
    try:
        nvc = _import_nvc()
    except Exception as e:
        return False, _import_failure(e)
    try:
        # [PG] "Encode API": CreateEncoder(width, height, format, usecpuinputbuffer, **kwargs);
        # host input, so the probe needs no device buffer. gpu_id as in [S:Encode.py].
        encoder = nvc.CreateEncoder(_PROBE_SIZE[0], _PROBE_SIZE[1], "NV12", True, codec="h264",
                                    gpu_id=gpu_id)
    except Exception as e:
        return False, nvenc_failure_reason(e)
    del encoder
    return True, f"NVENC encodes H.264 on GPU {gpu_id} (PyNvVideoCodec {getattr(nvc, '__version__', '?')})"


# --------------------------------------------------------------------------------------------------
# Decoded planes: from array interfaces to views


class PlaneView(NamedTuple):
    """One image plane in memory: `rows` rows of `row_bytes` bytes, each `pitch` bytes after the last."""

    ptr: int
    rows: int
    row_bytes: int
    pitch: int

    @property
    def nbytes(self) -> int:
        """Bytes from the first to the last byte the plane covers (no padding after the last row)."""
        return 0 if self.rows == 0 else (self.rows - 1) * self.pitch + self.row_bytes


class Nv12Layout(NamedTuple):
    """Where an NV12 picture of `width` x `height` lies: its luma plane and interleaved chroma plane."""

    width: int
    height: int
    luma: PlaneView
    chroma: PlaneView


def _plane_from_interface(name: str, cai: Mapping[str, Any]) -> PlaneView:
    """A plane from a CUDA array interface dict: rows from the first dimension, the rest one row."""
    try:
        ptr = int(cai["data"][0])
        shape = tuple(int(s) for s in cai["shape"])
        typestr = str(cai["typestr"])
    except (KeyError, TypeError, IndexError, ValueError) as e:
        raise ValueError(f"{name}: not a CUDA array interface ({e!r})") from e
    if typestr not in ("|u1", "<u1", ">u1", "B"):
        raise ValueError(f"{name}: elements are {typestr!r}; NV12 planes hold 8-bit samples (|u1), "
                         f"and 10/16-bit surfaces (P016) are not supported")
    if len(shape) < 2:
        raise ValueError(f"{name}: needs at least 2 dimensions (rows, row), got shape {shape}")
    if ptr == 0:
        raise ValueError(f"{name}: null data pointer")
    rows, inner = shape[0], shape[1:]
    row_bytes = 1
    for s in inner:
        row_bytes *= s
    strides = cai.get("strides")
    if strides is None:  # C-contiguous, per the interface's definition
        return PlaneView(ptr, rows, row_bytes, row_bytes)
    strides = tuple(int(s) for s in strides)
    if len(strides) != len(shape):
        raise ValueError(f"{name}: {len(strides)} strides for {len(shape)} dimensions")
    # Within a row the samples must be packed (any stride is fine across a dimension of size 1).
    expect = 1
    for s, st in zip(reversed(inner), reversed(strides[1:])):
        if s > 1 and st != expect:
            raise ValueError(f"{name}: rows are not packed (shape {shape}, strides {strides})")
        expect *= s
    pitch = strides[0]
    if rows > 1 and pitch < row_bytes:
        raise ValueError(f"{name}: row pitch {pitch} is shorter than a row ({row_bytes} bytes)")
    return PlaneView(ptr, rows, row_bytes, pitch if rows > 1 else max(pitch, row_bytes))


def nv12_planes_from_interface(planes: Sequence[Mapping[str, Any]], width: int | None = None,
                               height: int | None = None) -> Nv12Layout:
    """Locate the luma and chroma planes of an NV12 surface from its CUDA array interfaces.

    `planes` is what a decoded frame's `cuda()` views expose as `__cuda_array_interface__`: either
    two dicts, luma then interleaved chroma (PyNvVideoCodec 2.x: luma shape (H, W, 1) strides (W, 1, 1),
    chroma (H/2, W/2, 2) strides (W, 2, 1), [SRC] utils/PyNvVideoCodecUtils.hpp), or one dict for
    the whole (H + ceil(H/2), W) surface, as its DLPack export describes it. Pitched layouts
    (row stride > W) and 2-D views are accepted as well. `width` and `height` default to the luma
    plane's; the decoder's own values are better where it reports them.

    Raises ValueError when the planes cannot hold a `width` x `height` NV12 picture.
    """
    if len(planes) == 2:
        luma = _plane_from_interface("luma plane", planes[0])
        chroma = _plane_from_interface("chroma plane", planes[1])
    elif len(planes) == 1:
        whole = _plane_from_interface("NV12 surface", planes[0])
        if height is None:
            if whole.rows % 3:
                raise ValueError(f"NV12 surface: {whole.rows} rows is not 3/2 of a height; give the height")
            height = whole.rows * 2 // 3
        if whole.rows < height + (height + 1) // 2:
            raise ValueError(f"NV12 surface: {whole.rows} rows cannot hold {height} luma rows and "
                             f"{(height + 1) // 2} chroma rows")
        luma = PlaneView(whole.ptr, height, whole.row_bytes, whole.pitch)
        chroma = PlaneView(whole.ptr + height * whole.pitch, whole.rows - height, whole.row_bytes,
                           whole.pitch)
    else:
        raise ValueError(f"an NV12 surface has 1 or 2 plane interfaces, got {len(planes)}")
    width = luma.row_bytes if width is None else int(width)
    height = luma.rows if height is None else int(height)
    if width < 1 or height < 1:
        raise ValueError(f"picture size must be positive, got {width}x{height}")
    if luma.rows < height or luma.row_bytes < width:
        raise ValueError(f"luma plane is {luma.rows} rows of {luma.row_bytes} bytes; a {width}x{height} "
                         f"picture needs {height} rows of {width}")
    chroma_rows, chroma_bytes = (height + 1) // 2, 2 * ((width + 1) // 2)
    if chroma.rows < chroma_rows or chroma.row_bytes < chroma_bytes:
        raise ValueError(f"chroma plane is {chroma.rows} rows of {chroma.row_bytes} bytes; a "
                         f"{width}x{height} picture needs {chroma_rows} rows of {chroma_bytes}")
    return Nv12Layout(width, height, PlaneView(luma.ptr, height, width, luma.pitch),
                      PlaneView(chroma.ptr, chroma_rows, chroma_bytes, chroma.pitch))


def _device_plane(cupy: Any, plane: PlaneView, owner: Any, device_id: int) -> Any:
    """A CuPy (rows, row_bytes) uint8 view of `plane`, without a copy; `owner` keeps the memory alive."""
    mem = cupy.cuda.UnownedMemory(plane.ptr, plane.nbytes, owner, device_id)
    return cupy.ndarray((plane.rows, plane.row_bytes), dtype=cupy.uint8,
                        memptr=cupy.cuda.MemoryPointer(mem, 0), strides=(plane.pitch, 1))


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
# NVDEC


@dataclass(eq=False)
class NvdecFrame:
    """One decoded picture, still in the decoder's surface.

    `y` is a (height, width) and `uv` a (ceil(height/2), 2*ceil(width/2)) uint8 CuPy view whose row
    stride is the surface's pitch: no copy was made. They are valid until the next frame is taken
    from the source, when the decoder may reuse the surface; `copy_to` keeps the picture.
    """

    y: Any
    uv: Any
    pts: int | None
    """Presentation timestamp in the stream's time base (None if the stream gave none)."""
    index: int
    """Position in presentation order, from 0."""
    time_base: Fraction | None
    """Seconds per pts tick, where the source knows it."""
    matrix: Matrix
    full_range: bool
    _stream: Any = field(repr=False)
    _device_id: int = field(repr=False)
    _owner: Any = field(repr=False)

    @property
    def width(self) -> int:
        return int(self.y.shape[1])

    @property
    def height(self) -> int:
        return int(self.y.shape[0])

    def copy_to(self, rgb_out: Any, matrix: Matrix | None = None, full_range: bool | None = None) -> Any:
        """Convert into `rgb_out`, a (height, width, 3) uint8 C-contiguous CuPy array of ours.

        Runs on the decoder's stream, after the decode and before the surface can be reused. Returns
        the CuPy event that marks the end of the conversion: another stream must wait for it
        (`stream.wait_event(event)`) before reading `rgb_out`. `matrix` and `full_range` default to
        what the stream declares (see `NvdecSource.matrix`).
        """
        import cupy

        with cupy.cuda.Device(self._device_id), self._stream:
            nv12_to_rgb(self.y, self.uv, rgb_out, matrix=self.matrix if matrix is None else matrix,
                        full_range=self.full_range if full_range is None else full_range)
            return self._stream.record()


def _frame_pts(frame: Any) -> int | None:
    # [SRC] PyNvDecoder.cpp binds getPTS() (and the `timestamp` field it reads); later guides spell
    # it GetPTS(). The value is the packet pts the demuxer gave, in the stream's time base.
    for name in ("getPTS", "GetPTS"):
        get = getattr(frame, name, None)
        if get is not None:
            pts = int(get())
            break
    else:
        value = getattr(frame, "timestamp", None)
        if value is None:
            return None
        pts = int(value)
    return None if pts == _NOPTS else pts


@contextmanager
def same_context() -> Iterator[None]:
    """Leave the calling thread's current CUDA context as it was around a PyNvVideoCodec call.

    PyNvVideoCodec pushes and pops contexts of its own (cuCtxPushCurrent/PopCurrent, and
    cuCtxCreate when not given one); a call that leaves another context current makes the next
    CuPy or PyTorch call in this thread run there, where their streams are "invalid resource
    handle"s. Seen on the H200: a PyTorch graph capture failed after NVDEC tests in the same thread.
    """
    try:
        import cupy

        before = int(cupy.cuda.driver.ctxGetCurrent())
    except Exception:  # noqa: BLE001 - no CuPy or no driver: nothing of ours to keep
        yield
        return
    try:
        yield
    finally:
        after = int(cupy.cuda.driver.ctxGetCurrent())
        if after != before and before:
            log.debug("PyNvVideoCodec left CUDA context %#x current; restoring %#x", after, before)
            cupy.cuda.driver.ctxSetCurrent(before)


def primary_context(gpu_id: int) -> int:
    """The handle of GPU `gpu_id`'s primary CUDA context, the one CuPy and PyTorch use.

    PyNvVideoCodec's CreateDecoder with `cudacontext=0` creates a context of its own and makes it
    current in the calling thread: CuPy and PyTorch calls made later in that thread then run in
    that context, where their streams are invalid handles ("invalid resource handle" on the H200).
    Passing the primary context keeps every library in one context ([S:decode_with_cuda_control.py]
    passes the retained primary context the same way)."""
    import cupy

    with cupy.cuda.Device(gpu_id):
        cupy.cuda.runtime.free(0)  # the runtime makes the primary context current once it is used
        return int(cupy.cuda.driver.ctxGetCurrent())


def untagged_matrix(height: int) -> Matrix:
    """The YUV matrix players assume for video that declares none: BT.709 for HD, BT.601 below 720
    lines."""
    return "bt709" if height >= 720 else "bt601"


def _nvc_for(name: str) -> Any:
    """PyNvVideoCodec, or the user's error for decoding `name` without it."""
    try:
        return _import_nvc()
    except Exception as e:  # ImportError, or a driver its loader rejects
        raise InputError(f"cannot decode '{name}' on the GPU: {_import_failure(e)}. "
                         f"{CPU_DECODE_FIX}") from e


def _decoder_stream(gpu_id: int, stream: Any) -> Any:
    """`stream`, or a new non-blocking CuPy stream on GPU `gpu_id` for a decoder's output."""
    import cupy

    with cupy.cuda.Device(gpu_id):
        return stream if stream is not None else cupy.cuda.Stream(non_blocking=True)


def _create_decoder(nvc: Any, gpu_id: int, codec: Any, stream: Any, low_latency: bool,
                    max_size: tuple[int, int] | None = None) -> Any:
    """[PG] "Creating a Decoder": CreateDecoder(gpuid, codec, cudacontext, cudastream,
    usedevicememory, latency), in the primary context CuPy uses (`primary_context`) and on our
    stream, so that the decoder's output copies are ordered before our kernels. LOW latency outputs
    each picture as soon as its access unit is in ([PG] "Latency Modes"); NATIVE reorders.

    `max_size`: the largest picture the decoder must take. Without it NVIDIA's decoder sizes itself
    to the first sequence and cannot grow in place (its reconfigure refuses a larger picture), which
    a WebRTC sender stepping its resolution up runs into. PyNvVideoCodec's bindings name the
    arguments `maxwidth` and `maxheight` ([SRC] the CreateDecoder docstring: "maximum width set by
    application for the decoded surface"); a build without them gets a decoder without a maximum."""
    latency = nvc.DisplayDecodeLatencyType.LOW if low_latency else nvc.DisplayDecodeLatencyType.NATIVE
    ctx = primary_context(gpu_id)
    kwargs: dict[str, Any] = dict(gpuid=gpu_id, codec=codec, cudacontext=ctx, cudastream=int(stream.ptr),
                                  usedevicememory=True, latency=latency)
    with same_context():
        if max_size is not None:
            try:
                return nvc.CreateDecoder(**kwargs, maxwidth=int(max_size[0]), maxheight=int(max_size[1]))
            except TypeError as e:  # pybind11's "incompatible function arguments"
                log.warning("this PyNvVideoCodec takes no maximum decode size (%s): a stream that "
                            "grows past its first size needs a new decoder", _reason(e))
        return nvc.CreateDecoder(**kwargs)


def _wrap_frame(frame: Any, *, decoder: Any, name: str, index: int, stream: Any, gpu_id: int,
                time_base: Fraction | None, matrix: Matrix, full_range: bool) -> NvdecFrame:
    """An `NvdecFrame` of zero-copy views of a decoded frame's NV12 planes (see `NvdecSource`)."""
    import cupy

    if index == 0:
        fmt = _enum_name(getattr(frame, "format", "NV12"))
        if fmt != "NV12":
            raise InputError(f"NVDEC decodes '{name}' to {fmt}, not NV12; the GPU path takes "
                             f"8-bit 4:2:0 only. {CPU_DECODE_FIX}")
    # [PG] "Encode API" and [SRC] PyNvDecoder.cpp: cuda() returns one view per plane, each with
    # a __cuda_array_interface__.
    interfaces = [view.__cuda_array_interface__ for view in frame.cuda()]
    width = height = None
    try:
        width, height = int(decoder.GetWidth()), int(decoder.GetHeight())
    except Exception:  # noqa: BLE001 - then the luma plane's own size is the picture's
        pass
    try:
        layout = nv12_planes_from_interface(interfaces, width, height)
    except ValueError as e:
        raise InputError(f"NVDEC's output for '{name}' is not a usable NV12 picture ({e}). "
                         f"{CPU_DECODE_FIX}") from e
    event = int(getattr(frame, "decoder_stream_event", 0) or 0)
    if event:
        # [SRC] DecodedFrame.decoder_stream_event marks the end of the decoder's output copy. The
        # decoder was given our stream, so this is already ordered; the wait covers a build that
        # copies on a stream of its own.
        try:
            cupy.cuda.runtime.streamWaitEvent(int(stream.ptr), event, 0)
        except Exception as e:  # noqa: BLE001 - a redundant safeguard must not stop decoding
            log.debug("'%s': waiting on the decoder's event failed: %s", name, e)
    y = _device_plane(cupy, layout.luma, frame, gpu_id)
    uv = _device_plane(cupy, layout.chroma, frame, gpu_id)
    return NvdecFrame(y=y, uv=uv, pts=_frame_pts(frame), index=index, time_base=time_base,
                      matrix=matrix, full_range=full_range, _stream=stream, _device_id=gpu_id,
                      _owner=frame)


class _Decoding:
    """What both NVDEC sources share: one decoder on one stream, and the step from a packet to the
    `NvdecFrame`s it completes. Subclasses set the attributes in `__init__`."""

    name: str
    gpu_id: int
    stream: Any
    time_base: Fraction | None
    matrix: Matrix | None
    full_range: bool
    frames: int
    _decoder: Any

    def _decode_packet(self, packet: Any) -> list[NvdecFrame]:
        """Decode one PacketData; every frame it completed, as views of the decoder's surfaces
        (valid until the next call). A source without a declared matrix takes the untagged one
        for its first frame's height."""
        try:
            with same_context():
                decoded = self._decoder.Decode(packet)  # [PG] "Basic Decoding Workflow"
        except Exception as e:
            raise InputError(f"NVDEC failed on '{self.name}' after {self.frames} frames: {_reason(e)}. "
                             f"{CPU_DECODE_FIX}") from e
        out = []
        for frame in decoded:
            if self.matrix is None:
                height = int(self._decoder.GetHeight()) if hasattr(self._decoder, "GetHeight") else 720
                self.matrix = untagged_matrix(height)
            out.append(_wrap_frame(frame, decoder=self._decoder, name=self.name, index=self.frames,
                                   stream=self.stream, gpu_id=self.gpu_id, time_base=self.time_base,
                                   matrix=self.matrix, full_range=self.full_range))
            self.frames += 1
        return out

    def _release_decoder(self) -> None:
        with same_context():  # the decoder's destructor runs here
            self._decoder = None


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


class NvdecAccessUnits(_Decoding):
    """Decodes H.264 or HEVC access units that our own code has demuxed (RTMP through PyAV, WebRTC
    through aiortc's depacketiser) on NVDEC, without PyNvVideoCodec's demuxer: each `decode(data,
    pts)` hands one Annex-B access unit (start codes, SPS/PPS in-band before keyframes) to the
    decoder and returns the frames it completed, in low-latency mode one per access unit.

    `max_size` (width, height): the largest picture the stream may step up to (see
    `_create_decoder`); without it, the first sequence's size.

    `low_latency` (LOW latency, each access unit marked as a whole picture) is for streams that
    never reorder; a stream that may have B-frames (its SPS allows reordering) needs
    `low_latency=False`, which returns frames in presentation order, a few access units later.
    Either way a picture can stay in the decoder until later access units arrive: call `flush` at
    the end of the stream.

    The frames are `NvdecFrame`s, valid until the next `decode`. Their colour matrix is what players
    assume for untagged video (`untagged_matrix`), limited range, unless `matrix`/`full_range` say
    otherwise. Errors raise `InputError` naming `name` and the fix.
    """

    def __init__(self, *, codec: str = "h264", gpu_id: int = 0, stream: Any = None,
                 time_base: Fraction | None = None, name: str = "<access units>",
                 matrix: Matrix | None = None, full_range: bool = False,
                 low_latency: bool = True, max_size: tuple[int, int] | None = None) -> None:
        self.low_latency = low_latency
        if codec not in ("h264", "hevc"):
            raise ValueError(f"codec must be 'h264' or 'hevc', not {codec!r}")
        self.codec = codec
        self.gpu_id = int(gpu_id)
        self.time_base = time_base
        self.name = name
        self.matrix = matrix
        self.full_range = full_range
        self.frames = 0
        self.access_units = 0
        self._nvc = nvc = _nvc_for(name)
        self.stream = _decoder_stream(self.gpu_id, stream)
        nv_codec = nvc.cudaVideoCodec.H264 if codec == "h264" else nvc.cudaVideoCodec.HEVC
        try:
            self._decoder = _create_decoder(nvc, self.gpu_id, nv_codec, self.stream, low_latency, max_size)
        except Exception as e:
            raise InputError(f"NVDEC cannot open a {codec} decoder for '{name}' ({_reason(e)}). "
                             f"{CPU_DECODE_FIX}") from e

    def _packet(self, data: Any, pts: int | None) -> Any:
        # [SRC] PacketData (PyNvDemuxer.cpp): `bsl_data` is the address of the bitstream and `bsl`
        # its length; the parser reads it during Decode, which copies it to the hardware before it
        # returns, so `data` only has to live until then. [PG] "Latency Modes": ENDOFPICTURE
        # makes the parser decode the picture at once instead of waiting for the next one's start.
        packet = self._nvc.PacketData()
        packet.bsl_data = int(data.ctypes.data) if len(data) else 0
        packet.bsl = int(len(data))
        packet.pts = _NOPTS if pts is None else int(pts)
        if self.low_latency:
            packet.decode_flag = self._nvc.VideoPacketFlag.ENDOFPICTURE
        return packet

    def decode(self, data: bytes | bytearray | memoryview, pts: int | None = None) -> list[NvdecFrame]:
        """Decode one access unit; the frames it completed (usually one; none before a keyframe)."""
        import numpy as np

        buf = np.frombuffer(data, dtype=np.uint8)
        if buf.size == 0:
            return []
        self.access_units += 1
        # `buf` lives until Decode has returned: the decoder has the bitstream by then.
        return self._decode_packet(self._packet(buf, pts))

    def flush(self) -> list[NvdecFrame]:
        """End of stream: the frames the decoder still holds."""
        import numpy as np

        return self._decode_packet(self._packet(np.empty(0, np.uint8), None))

    def close(self) -> None:
        """Release the decoder; frames still held become invalid. Safe to call twice."""
        self._release_decoder()


WARM_UP_PTS = -(2**62)
"""The pts `warm_nvdec` gives its picture (no stream's, and not FFmpeg's no-pts marker): a caller
drops decoded frames that carry it."""


def warm_nvdec(decoder: NvdecAccessUnits, width: int, height: int) -> None:
    """Decode one grey picture of `width` x `height` on `decoder` and convert it to RGB, before the
    stream it is for starts, so that the decoder's own set-up (its surfaces, the conversion kernel)
    is not paid at the stream's first frame. On the H200 a live stream's first real frame still
    took about 1 s after this (docs/performance.md): NVDEC's first picture was a suspect that this
    did not clear. The picture is encoded here with x264 (PyAV) and carries `WARM_UP_PTS`; a
    reordering decoder is flushed after it."""
    import av
    import cupy
    import numpy as np

    enc = av.CodecContext.create("libx264" if decoder.codec == "h264" else "libx265", "w")
    enc.width, enc.height, enc.pix_fmt = width, height, "yuv420p"
    enc.time_base = Fraction(1, 30)
    enc.options = {"preset": "ultrafast", "tune": "zerolatency"}
    frame = av.VideoFrame.from_ndarray(np.full((height, width, 3), 127, np.uint8), format="rgb24")
    frame.pts = 0
    data = b"".join(bytes(p) for p in [*enc.encode(frame.reformat(format="yuv420p")), *enc.encode(None)])
    with cupy.cuda.Device(decoder.gpu_id), decoder.stream:
        rgb = cupy.empty((height, width, 3), cupy.uint8)
    frames = decoder.decode(data, WARM_UP_PTS)
    if not decoder.low_latency:
        frames += decoder.flush()  # NATIVE holds the picture back; the next sequence starts afresh
    for f in frames:
        f.copy_to(rgb).synchronize()


# --------------------------------------------------------------------------------------------------
# Bytes out: access units


_H264_AU_START = frozenset({6, 7, 8, 9, 14, 15, 16, 17, 18})  # SEI, SPS, PPS, AUD, prefix, reserved
_HEVC_AU_START = frozenset({32, 33, 34, 35, 39, 41, 42, 43, 44, 48, 49, 50, 51, 52, 53, 54, 55})


def _nal_starts(data: bytes) -> list[tuple[int, int]]:
    """(start, header) of each NAL unit of an Annex B stream: where its start code begins (a 4-byte
    code's leading zero included) and where its header byte is."""
    out = []
    i = data.find(b"\x00\x00\x01")
    while i != -1:
        out.append((i - 1 if i > 0 and data[i - 1] == 0 else i, i + 3))
        i = data.find(b"\x00\x00\x01", i + 3)
    return out


def _nal_kind(data: bytes, h: int, codec: str) -> tuple[bool, bool, bool, bool]:
    """(is a slice, is the first slice of its picture, starts an access unit before slices, is IRAP)."""
    if h >= len(data):
        return False, False, False, False
    if codec == "h264":
        t = data[h] & 0x1F
        vcl = 1 <= t <= 5
        # first_mb_in_slice is ue(v); it is 0, the first slice of a picture, iff its first bit is 1.
        first = t in (1, 2, 5) and h + 1 < len(data) and bool(data[h + 1] & 0x80)
        return vcl, first, t in _H264_AU_START, t == 5
    t = (data[h] >> 1) & 0x3F
    vcl = t < 32
    first = vcl and h + 2 < len(data) and bool(data[h + 2] & 0x80)  # first_slice_segment_in_pic_flag
    return vcl, first, t in _HEVC_AU_START, 16 <= t <= 21


def split_access_units(data: bytes, codec: str) -> list[bytes]:
    """Cut an H.264 or HEVC Annex B byte stream into access units (one coded picture each).

    NVENC returns the bitstream of one or several pictures as one bytes object ([SRC]
    PyNvEncoder.cpp concatenates them), and a muxer wants one packet per picture. A new access unit
    begins, after the last slice of a picture, at the first NAL unit that must precede a picture
    (AUD, parameter sets, prefix SEI: H.264 7.4.1.2.3, HEVC 7.4.2.4.4) or at the first slice of the
    next picture. Bytes before the first start code stay with the first unit.
    """
    if codec not in ("h264", "hevc"):
        raise ValueError(f"codec must be 'h264' or 'hevc', got {codec!r}")
    data = bytes(data)
    if not data:
        return []
    cuts = [0]
    seen_slice = False
    for start, header in _nal_starts(data):
        vcl, first, starter, _ = _nal_kind(data, header, codec)
        if seen_slice and (starter or (vcl and first)):
            cuts.append(start)
            seen_slice = False
        seen_slice = seen_slice or vcl
    cuts.append(len(data))
    return [data[a:b] for a, b in zip(cuts, cuts[1:]) if b > a]


def is_keyframe(access_unit: bytes, codec: str) -> bool:
    """Whether an access unit holds an IDR (H.264) or IRAP (HEVC) picture: a point to start decoding."""
    return any(_nal_kind(access_unit, h, codec)[3] for _, h in _nal_starts(access_unit))


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


def nv12_encoder_interfaces(ptr: int, width: int, height: int) -> list[dict[str, Any]]:
    """The two CUDA array interfaces through which Encode reads an NV12 surface at `ptr`: a packed
    (height, width) luma plane followed directly by the interleaved chroma plane.

    Exactly the shapes and strides Encode checks ([SRC] PyCAIMemoryView.cpp, coerceToCudaArrayView:
    luma (H, W, 1) strides (W, 1, 1); chroma (H/2, W/2, 2) strides (W, 2, 1); chroma after luma),
    as NVIDIA's AppFrame builds them ([PG] "Encode API", [S:Utils.py]). No 'stream' key: the
    interface makes it optional, and Encode reads it only as an attribute.
    """
    return [
        {"shape": (height, width, 1), "strides": (width, 1, 1), "data": (int(ptr), False),
         "typestr": "|u1", "version": 3},
        {"shape": (height // 2, width // 2, 2), "strides": (width, 2, 1),
         "data": (int(ptr) + width * height, False), "typestr": "|u1", "version": 3},
    ]


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
            nvc = _import_nvc()
        except Exception as e:
            raise OutputError(f"cannot encode with NVENC: {_import_failure(e)}. {CPU_ENCODE_FIX}.") from e
        try:
            # [PG] "Encode API": CreateEncoder(width, height, "NV12", usecpuinputbuffer=False, **options).
            self._encoder = nvc.CreateEncoder(width, height, "NV12", False, **self.options)
        except Exception as e:
            raise OutputError(f"cannot encode with NVENC: {nvenc_failure_reason(e)}. "
                              f"{CPU_ENCODE_FIX}.") from e
        self.capabilities: dict[str, Any] = {}
        try:
            # [S:Encode.py] GetEncoderCaps(codec=...): num_encoder_engines, width_max, ...
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
