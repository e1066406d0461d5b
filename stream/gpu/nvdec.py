"""NVDEC decoding through PyNvVideoCodec, with the frames in GPU memory: what both decoders share,
and the decoder for access units that our own code demuxed.

`NvdecAccessUnits` takes one Annex-B access unit at a time (RTMP through PyAV, WebRTC through
aiortc's depacketiser); `nvdemux.NvdecSource` reads a file or a byte feed through PyNvVideoCodec's
own demuxer. Both return `NvdecFrame`s, zero-copy CuPy views of the decoder's NV12 surface;
`NvdecFrame.copy_to` converts one into one of our RGB buffers with `kernels.nv12.nv12_to_rgb`,
which is how a frame outlives the surface.

PyNvVideoCodec is imported inside the functions (through `pynvc`), so this module imports without
it; `pynvc.nvdec_available()` says whether NVDEC can run. The sources cited as [PG], [S:x] and [SRC]
are listed in `swapstream.gpu.pynvc`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from ..errors import InputError
from ..kernels.nv12 import Matrix, nv12_to_rgb
from . import pynvc
from .planes import _device_plane, nv12_planes_from_interface
from .pynvc import _enum_name, _import_failure, _reason, primary_context, same_context

log = logging.getLogger(__name__)

__all__ = [
    "NvdecAccessUnits",
    "NvdecFrame",
    "untagged_matrix",
    "WARM_UP_PTS",
    "warm_nvdec",
]

CPU_DECODE_FIX = "Decode it with PyAV instead (--set decoder=cpu)"

# FFmpeg's AV_NOPTS_VALUE: the packet or frame carries no timestamp (raw H.264, some AVI).
_NOPTS = -(2**63)


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


def untagged_matrix(height: int) -> Matrix:
    """The YUV matrix players assume for video that declares none: BT.709 for HD, BT.601 below 720
    lines."""
    return "bt709" if height >= 720 else "bt601"


def _nvc_for(name: str) -> Any:
    """PyNvVideoCodec, or the user's error for decoding `name` without it."""
    try:
        # Through the module, so that replacing `pynvc._import_nvc` (a test's fake) reaches here too.
        return pynvc._import_nvc()
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
