"""NVDEC and NVENC through PyNvVideoCodec (`swapstream.gpu`: `pynvc`, `planes`, `nvdec`, `nvdemux`,
`bitstream`, `nvenc`).

Always run: the modules import without PyNvVideoCodec or CuPy; the availability checks say why not;
the pure pieces (plane layout from array interfaces, the encoder's surface interfaces, the option
builder, the access-unit splitter checked against libx264/libx265 output, the byte feeder, the
packetizer); and the error paths, driven by a small fake PyNvVideoCodec module.

`-m gpu` tests need PyNvVideoCodec, CuPy, a GPU and PyAV (to write the clips and decode the
reference): NVDEC's planes must equal FFmpeg's bit for bit, `copy_to`'s RGB must be within 40 dB of
PyAV's own RGB, and the pts lists must be equal. The NVENC round trip runs only where
`nvenc_available()`; on GPUs without an encoder (the H200) the refusal is checked instead.
"""

from __future__ import annotations

import importlib.util
import io
import re
import subprocess
import sys
import types
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from swapstream.errors import ConfigError, InputError, InputNotFoundError, OutputError
from swapstream.gpu import nvenc
from swapstream.gpu.bitstream import is_keyframe, split_access_units
from swapstream.gpu.nvdemux import ByteFeeder, NvdecSource, bytes_source
from swapstream.gpu.nvenc import EncodedPacket, NvencSink, nvenc_options
from swapstream.gpu.planes import PlaneView, nv12_encoder_interfaces, nv12_planes_from_interface
from swapstream.gpu.pynvc import nvdec_available, nvenc_available
from swapstream.kernels.nv12 import nv12_to_rgb_ref

from .measures import psnr

HERE = Path(__file__).parent


# --------------------------------------------------------------------------------------------------
# Without PyNvVideoCodec


def test_modules_import_without_pynvvideocodec_or_cupy() -> None:
    # A fresh interpreter in which both imports fail, wherever the test runs (the GPU machine too).
    code = ("import sys; sys.modules['PyNvVideoCodec'] = None; sys.modules['cupy'] = None\n"
            "import swapstream.gpu.bitstream, swapstream.gpu.nvdec, swapstream.gpu.nvdemux\n"
            "import swapstream.gpu.nvenc, swapstream.gpu.planes\n"
            "import swapstream.gpu.pynvc as m\n"
            "print(m.nvdec_available()); print(m.nvenc_available())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == [
        "(False, \"PyNvVideoCodec is not installed (pip install 'swapstream[gpu]')\")",
        "(False, \"PyNvVideoCodec is not installed (pip install 'swapstream[gpu]')\")",
    ]


def test_availability_says_why_not_here() -> None:
    if importlib.util.find_spec("PyNvVideoCodec") is not None:
        pytest.skip("PyNvVideoCodec is installed here")
    for ok, reason in (nvdec_available(), nvenc_available()):
        assert ok is False
        assert reason == "PyNvVideoCodec is not installed (pip install 'swapstream[gpu]')"


# --------------------------------------------------------------------------------------------------
# Plane views from array interfaces


def nv12_surface(width: int, height: int, pitch: int, seed: int = 0) -> np.ndarray:
    """A pitched NV12 surface: height luma rows, then ceil(height/2) chroma rows, `pitch` bytes each."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (height + (height + 1) // 2, pitch), dtype=np.uint8)


def host_view(plane: PlaneView, base: np.ndarray) -> np.ndarray:
    """The NumPy view a PlaneView describes, for a plane inside `base` (as CuPy's would be on the GPU)."""
    offset = plane.ptr - base.ctypes.data
    assert 0 <= offset and offset + plane.nbytes <= base.nbytes
    return np.lib.stride_tricks.as_strided(base.reshape(-1)[offset:], shape=(plane.rows, plane.row_bytes),
                                           strides=(plane.pitch, 1), writeable=False)


def cai(ptr: int, shape: tuple[int, ...], strides: tuple[int, ...] | None, typestr: str = "|u1") -> dict:
    return {"shape": shape, "strides": strides, "data": (ptr, False), "typestr": typestr, "version": 3}


def interfaces(kind: str, base: np.ndarray, width: int, height: int) -> list[dict]:
    """The array interfaces a decoder could expose for the surface `base`."""
    ptr, pitch = base.ctypes.data, base.shape[1]
    chroma = ptr + height * pitch
    if kind == "pynvvideocodec-2.0":  # [SRC] PyNvVideoCodecUtils.hpp, dense: pitch == width
        assert pitch == width
        return [cai(ptr, (height, width, 1), (width, 1, 1)),
                cai(chroma, (height // 2, width // 2, 2), (width, 2, 1))]
    if kind == "pitched-2d":
        return [cai(ptr, (height, width), (pitch, 1)), cai(chroma, ((height + 1) // 2, width), (pitch, 1))]
    if kind == "c-contiguous":  # strides None means packed rows
        assert pitch == width
        return [cai(ptr, (height, width), None), cai(chroma, ((height + 1) // 2, width), None)]
    if kind == "one-surface":  # the DLPack-style (H * 3/2, W) description
        return [cai(ptr, base.shape, (pitch, 1))]
    raise AssertionError(kind)


@pytest.mark.parametrize("kind, width, height, pitch", [
    ("pynvvideocodec-2.0", 12, 8, 12),
    ("pitched-2d", 10, 6, 16),
    ("pitched-2d", 10, 7, 16),  # odd height: ceil(7/2) = 4 chroma rows
    ("c-contiguous", 8, 4, 8),
    ("one-surface", 12, 8, 32),
])
def test_plane_views_read_the_surface(kind: str, width: int, height: int, pitch: int) -> None:
    base = nv12_surface(width, height, pitch)
    layout = nv12_planes_from_interface(interfaces(kind, base, width, height), width, height)
    assert (layout.width, layout.height) == (width, height)
    assert layout.luma == PlaneView(base.ctypes.data, height, width, pitch)
    assert layout.chroma == PlaneView(base.ctypes.data + height * pitch, (height + 1) // 2, width, pitch)
    assert layout.luma.nbytes == (height - 1) * pitch + width
    y, uv = host_view(layout.luma, base), host_view(layout.chroma, base)
    np.testing.assert_array_equal(y, base[:height, :width])
    np.testing.assert_array_equal(uv, base[height:, :width])
    # The strided views convert exactly like packed copies of the same planes.
    out_views = nv12_to_rgb_ref(y, uv, np.empty((height, width, 3), np.uint8))
    out_packed = nv12_to_rgb_ref(y.copy(), uv.copy(), np.empty((height, width, 3), np.uint8))
    np.testing.assert_array_equal(out_views, out_packed)


def test_plane_size_defaults_to_the_luma_plane() -> None:
    base = nv12_surface(12, 8, 12)
    layout = nv12_planes_from_interface(interfaces("pynvvideocodec-2.0", base, 12, 8))
    assert (layout.width, layout.height) == (12, 8)
    one = nv12_planes_from_interface(interfaces("one-surface", base, 12, 8))
    assert (one.width, one.height) == (12, 8) and one.chroma.ptr == base.ctypes.data + 8 * 12


@pytest.mark.parametrize("planes, size, message", [
    ([cai(4096, (8, 12, 1), (12, 1, 1), "<u2"), cai(4192, (4, 6, 2), (12, 2, 1))], (12, 8), "16-bit"),
    ([cai(4096, (8, 12, 1), (12, 1, 1)), cai(4192, (4, 6, 2), (12, 4, 1))], (12, 8), "not packed"),
    ([cai(4096, (8, 12), (12, 1)), cai(4192, (4, 12), (12, 1))], (14, 8), "luma plane is 8 rows of 12"),
    ([cai(4096, (7, 12), (12, 1)), cai(4180, (3, 12), (12, 1))], (12, 7), "needs 4 rows of 12"),
    ([cai(4096, (8, 12), (8, 1)), cai(4192, (4, 12), (12, 1))], (12, 8), "pitch 8 is shorter"),
    ([cai(0, (8, 12), (12, 1)), cai(4192, (4, 12), (12, 1))], (12, 8), "null data pointer"),
    ([cai(4096, (12, 12), (12, 1))] * 3, (12, 8), "1 or 2 plane interfaces"),
    ([{"shape": (8, 12)}], (12, 8), "not a CUDA array interface"),
])
def test_plane_views_reject_what_is_not_nv12(planes: list, size: tuple[int, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        nv12_planes_from_interface(planes, *size)


def test_encoder_surface_interfaces_are_what_encode_checks() -> None:
    # [SRC] PyCAIMemoryView.cpp: luma (H, W, 1) strides (W, 1, 1), chroma (H/2, W/2, 2) strides
    # (W, 2, 1), chroma right after luma; the same dicts NVIDIA's AppFrame builds.
    assert nv12_encoder_interfaces(0x1000, 8, 4) == [
        {"shape": (4, 8, 1), "strides": (8, 1, 1), "data": (0x1000, False), "typestr": "|u1", "version": 3},
        {"shape": (2, 4, 2), "strides": (8, 2, 1), "data": (0x1000 + 32, False), "typestr": "|u1",
         "version": 3},
    ]
    # And they describe the packed surface that input_planes() hands out.
    layout = nv12_planes_from_interface(nv12_encoder_interfaces(0x1000, 8, 4))
    assert layout == (8, 4, PlaneView(0x1000, 4, 8, 8), PlaneView(0x1020, 2, 8, 8))


# --------------------------------------------------------------------------------------------------
# Encoder options, access units, packets


def test_nvenc_options_exact() -> None:
    assert nvenc_options(codec="h264", preset="P1", tuning="ultra_low_latency", rate_control="cbr",
                         bitrate=4_000_000, max_bitrate=None, fps=Fraction(30), gop=60, gpu_id=0) == {
        "codec": "h264", "preset": "P1", "tuning_info": "ultra_low_latency", "rc": "cbr",
        "bitrate": 4_000_000, "fps": 30, "bf": 0, "gop": 60, "idrperiod": 60, "repeatspspps": 1,
        "gpu_id": 0}
    vbr = nvenc_options(codec="hevc", preset="P4", tuning="low_latency", rate_control="vbr",
                        bitrate=3_000_000, max_bitrate=None, fps=Fraction(30000, 1001), gop=120, gpu_id=1)
    assert vbr["rc"] == "vbr" and vbr["maxbitrate"] == 6_000_000
    assert vbr["fps"] == "29.97" and vbr["gpu_id"] == 1 and vbr["codec"] == "hevc"


@pytest.fixture(scope="module")
def pyav() -> types.ModuleType:
    return pytest.importorskip("av")  # the GPU machine has PyAV only where it is carried


def annexb_packets(av: types.ModuleType, codec: str, options: dict[str, str], frames: int = 12,
                   size: tuple[int, int] = (128, 96)) -> list[tuple[bytes, bool]]:
    """(bytes, keyframe) of each packet an FFmpeg encoder writes: Annex B, parameter sets in-band."""
    width, height = size
    ctx = av.CodecContext.create(codec, "w")
    ctx.width, ctx.height, ctx.pix_fmt = width, height, "yuv420p"
    ctx.time_base, ctx.framerate = Fraction(1, 30), Fraction(30)
    ctx.options = options
    base = np.random.default_rng(1).integers(0, 256, (height, width, 3), dtype=np.uint8)
    packets = []
    for i in range(frames):
        frame = av.VideoFrame.from_ndarray(np.roll(base, 4 * i, axis=1), format="rgb24")
        frame.pts = i
        packets += ctx.encode(frame)
    packets += ctx.encode(None)
    return [(bytes(p), bool(p.is_keyframe)) for p in packets]


STREAMS = {
    "h264": ("libx264", "h264", {"preset": "ultrafast", "tune": "zerolatency", "x264-params": "keyint=5"}),
    "h264-4-slices": ("libx264", "h264", {"preset": "ultrafast", "tune": "zerolatency",
                                          "x264-params": "keyint=5:slices=4"}),
    "hevc": ("libx265", "hevc", {"preset": "ultrafast", "x265-params": "log-level=none:keyint=5:bframes=0"}),
    "hevc-aud-3-slices": ("libx265", "hevc", {
        "preset": "ultrafast", "x265-params": "log-level=none:keyint=5:bframes=0:aud=1:slices=3"}),
}


@pytest.mark.parametrize("stream", sorted(STREAMS))
def test_access_units_split_like_the_encoders_packets(pyav: types.ModuleType, stream: str) -> None:
    encoder, codec, options = STREAMS[stream]
    packets = annexb_packets(pyav, encoder, options)
    units = split_access_units(b"".join(data for data, _ in packets), codec)
    assert units == [data for data, _ in packets]
    assert [is_keyframe(u, codec) for u in units] == [key for _, key in packets]
    assert sum(is_keyframe(u, codec) for u in units) == 3  # frames 0, 5, 10


def test_access_unit_edge_cases() -> None:
    assert split_access_units(b"", "h264") == []
    assert split_access_units(b"\x01\x02\x03", "h264") == [b"\x01\x02\x03"]  # no start code: one unit
    idr = b"\x00\x00\x00\x01\x65\x88\x84"  # IDR slice, first_mb_in_slice = 0
    second_slice = b"\x00\x00\x01\x65\x10\x84"  # same picture, first_mb_in_slice != 0
    p_frame = b"\x00\x00\x00\x01\x41\x9a\x00"
    assert split_access_units(b"\xff" + idr + second_slice + p_frame, "h264") == \
        [b"\xff" + idr + second_slice, p_frame]
    assert is_keyframe(idr, "h264") and not is_keyframe(p_frame, "h264")
    with pytest.raises(ValueError, match="'h264' or 'hevc'"):
        split_access_units(idr, "av1")


def test_packetizer_times_delayed_and_batched_output(pyav: types.ModuleType) -> None:
    # NVENC holds 3 frames back, then Encode returns one picture per call and EndEncode the rest in
    # one bytes object ([SRC] PyNvEncoder.cpp): each unit must get the pts of its own frame.
    packets = annexb_packets(pyav, *[STREAMS["h264"][i] for i in (0, 2)])
    units = [data for data, _ in packets]
    tb = Fraction(1, 15360)
    packer = nvenc._Packetizer("h264", tb)
    sent = [512 * i + 7 for i in range(len(units))]
    out: list[EncodedPacket] = []
    for i, pts in enumerate(sent):
        packer.submitted(pts)
        out += packer.packets(units[i - 3] if i >= 3 else b"")
    out += packer.packets(bytearray(b"".join(units[-3:])))
    assert [p.data for p in out] == units
    assert [p.pts for p in out] == [p.dts for p in out] == sent
    assert [p.key for p in out] == [key for _, key in packets]
    assert {p.time_base for p in out} == {tb}
    assert not packer.waiting
    with pytest.raises(RuntimeError, match="more pictures than frames"):
        packer.packets(units[0])


def test_bitstream_results_of_every_shape() -> None:
    chunks = nvenc._bitstream_bytes
    assert chunks(b"") == [] and chunks(None) == []
    assert chunks(b"ab") == [b"ab"] and chunks(bytearray(b"ab")) == [b"ab"]
    assert chunks([b"a", bytearray(b""), memoryview(b"b")]) == [b"a", b"b"]
    assert chunks(np.frombuffer(b"xyz", np.uint8)) == [b"xyz"]


# --------------------------------------------------------------------------------------------------
# Bytes in


def test_byte_feeder_fills_the_demuxers_buffer() -> None:
    calls: list[int] = []
    chunks = iter([b"abcdefghij", b"k", b""])

    def read(n: int) -> bytes:
        calls.append(n)
        return next(chunks)

    feed = bytes_source(read)
    buf = bytearray(4)
    got = []
    for _ in range(5):
        n = feed(buf)
        assert len(buf) == 4  # filled in place: the demuxer copies back from this bytearray
        got.append(bytes(buf[:n]))
    assert got == [b"abcd", b"efgh", b"ij", b"k", b""]
    assert calls == [4, 4, 4]  # a longer read is kept for later calls, not read again
    assert feed(buf) == 0 and feed.bytes_fed == 11 and feed.error is None


def test_byte_feeder_keeps_a_read_error() -> None:
    def read(n: int) -> bytes:
        raise ConnectionResetError("peer went away")

    feed = ByteFeeder(read)
    assert feed(bytearray(8)) == 0
    assert isinstance(feed.error, ConnectionResetError)


# --------------------------------------------------------------------------------------------------
# Error paths, with a fake PyNvVideoCodec


class Named:
    def __init__(self, name: str) -> None:
        self.name = name


class FakeDemuxer:
    def __init__(self, codec: str = "H264", size: tuple[int, int] = (1280, 720), bit_depth: int = 8,
                 chroma: str = "420") -> None:
        self.codec, self.size, self.bit_depth, self.chroma = codec, size, bit_depth, chroma

    def GetNvCodecId(self) -> Named:  # noqa: N802 - PyNvVideoCodec's names
        return Named(self.codec)

    def Width(self) -> int:  # noqa: N802
        return self.size[0]

    def Height(self) -> int:  # noqa: N802
        return self.size[1]

    def BitDepth(self) -> int:  # noqa: N802
        return self.bit_depth

    def ChromaFormat(self) -> Named:  # noqa: N802
        return Named(self.chroma)

    def FrameRate(self) -> float:  # noqa: N802
        return 30.0


def fake_nvc(monkeypatch: pytest.MonkeyPatch, *, demuxer: Callable[..., Any] = FakeDemuxer,
             supported: int = 1, create_encoder: Callable[..., Any] | None = None) -> types.ModuleType:
    nvc = types.ModuleType("PyNvVideoCodec")
    nvc.__version__ = "0.fake"
    nvc.encoder_calls = []

    def create_demuxer(*args: Any, **kwargs: Any) -> Any:
        return demuxer(*args, **kwargs)

    def get_decoder_caps(**kwargs: Any) -> dict:
        return {"supported": supported, "width_min": 48, "height_min": 16, "width_max": 4096,
                "height_max": 4096, "mb_num_max": 65536, "num_decoder_engines": 7}

    def default_encoder(*args: Any, **kwargs: Any) -> object:
        nvc.encoder_calls.append((args, kwargs))
        return object()

    nvc.CreateDemuxer = create_demuxer
    nvc.GetDecoderCaps = get_decoder_caps
    nvc.CreateEncoder = create_encoder or default_encoder
    nvc.cudaVideoCodec = types.SimpleNamespace(H264=Named("H264"))
    monkeypatch.setitem(sys.modules, "PyNvVideoCodec", nvc)
    return nvc


NO_NVENC = RuntimeError("PyNvEncoder constructor failed: m_nvenc.nvEncOpenEncodeSessionEx("
                        "&encodeSessionExParams, &hEncoder) returned error 2")


def test_nvenc_refusal_names_the_missing_encoder(monkeypatch: pytest.MonkeyPatch) -> None:
    def create_encoder(*args: Any, **kwargs: Any) -> object:
        raise NO_NVENC

    fake_nvc(monkeypatch, create_encoder=create_encoder)
    ok, reason = nvenc_available()
    assert ok is False
    assert reason == ("this GPU has no NVENC (CreateEncoder failed: PyNvEncoder constructor failed: "
                      "m_nvenc.nvEncOpenEncodeSessionEx(&encodeSessionExParams, &hEncoder) returned error 2)")
    with pytest.raises(OutputError, match=r"cannot encode with NVENC: this GPU has no NVENC \(CreateEncoder"):
        NvencSink(1280, 720, fps=30, bitrate=4_000_000, gop=60)


def test_nvenc_other_failures_are_not_called_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    def create_encoder(*args: Any, **kwargs: Any) -> object:
        raise RuntimeError("CUDA driver API error CUDA_ERROR_OUT_OF_MEMORY")

    fake_nvc(monkeypatch, create_encoder=create_encoder)
    assert nvenc_available() == (False, "NVENC cannot be used here (CreateEncoder failed: CUDA driver API "
                                        "error CUDA_ERROR_OUT_OF_MEMORY)")


def test_nvenc_probe_opens_a_small_host_input_encoder(monkeypatch: pytest.MonkeyPatch) -> None:
    nvc = fake_nvc(monkeypatch)
    ok, reason = nvenc_available(gpu_id=0)
    assert ok is True and "PyNvVideoCodec 0.fake" in reason
    assert nvc.encoder_calls == [((256, 256, "NV12", True), {"codec": "h264", "gpu_id": 0})]


def test_nvdec_available_reports_the_hardware_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_nvc(monkeypatch)
    ok, reason = nvdec_available()
    assert ok is True and "4096x4096" in reason and "7 decoder engines" in reason
    fake_nvc(monkeypatch, supported=0)
    assert nvdec_available() == (False, "this GPU's NVDEC cannot decode 8-bit 4:2:0 H.264 (GPU 0)")


@pytest.mark.parametrize("kwargs, message", [
    ({"width": 1281}, "even width and height"),
    ({"codec": "av1"}, "codec must be one of h264, hevc"),
    ({"preset": "p1"}, "P1 .fastest. to P7"),
    ({"tuning": "fast"}, "tuning must be one of"),
    ({"rate_control": "cqp"}, "'cbr' or 'vbr'"),
    ({"bitrate": 0}, "must be positive"),
])
def test_nvenc_settings_are_checked_first(kwargs: dict, message: str) -> None:
    args = {"width": 1280, "height": 720, "fps": 30, "bitrate": 4_000_000, "gop": 60} | kwargs
    width, height = args.pop("width"), args.pop("height")
    with pytest.raises(ConfigError, match=message):
        NvencSink(width, height, **args)


@pytest.fixture()
def video_file(tmp_path: Path) -> Path:
    path = tmp_path / "in.mp4"
    path.write_bytes(b"not opened by the fake")
    return path


@pytest.mark.parametrize("demuxer, message", [
    (lambda *a, **k: FakeDemuxer(codec="VP9"), "NVDEC on this GPU cannot decode VP9 video"),
    (lambda *a, **k: FakeDemuxer(bit_depth=10),
     "is 10-bit 420 H264 video; the GPU path takes 8-bit 4:2:0 only"),
    (lambda *a, **k: FakeDemuxer(chroma="444"), "is 8-bit 444 H264 video"),
    (lambda *a, **k: FakeDemuxer(size=(8192, 4320)),
     "is 8192x4320; NVDEC on this GPU decodes H264 from 48x16 to 4096x4096"),
])
def test_nvdec_refusals_name_the_file_and_the_fix(monkeypatch: pytest.MonkeyPatch, video_file: Path,
                                                 demuxer: Callable[..., Any], message: str) -> None:
    fake_nvc(monkeypatch, demuxer=demuxer, supported=0 if "cannot decode" in message else 1)
    with pytest.raises(InputError) as err:
        NvdecSource(video_file)
    text = str(err.value)
    assert message in text and "Decode it with PyAV instead" in text
    assert "\n" not in text


def test_nvdec_open_failure_is_an_input_error(monkeypatch: pytest.MonkeyPatch, video_file: Path) -> None:
    def demuxer(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("avformat_open_input(&ctx, szFilePath, NULL, NULL) returned error \" Invalid data "
                           "found when processing input\"")

    fake_nvc(monkeypatch, demuxer=demuxer)
    with pytest.raises(InputError, match=rf"cannot open '{re.escape(str(video_file))}' for NVDEC: "
                                         r"avformat_open_input.*Invalid data found.*Decode it with PyAV instead"):
        NvdecSource(video_file)


def test_nvdec_reports_the_byte_streams_own_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def demuxer(callback: Callable[[bytearray], int]) -> Any:
        while callback(bytearray(4096)):  # what FFmpeg does while probing the stream
            pass
        raise RuntimeError("avformat_open_input returned error \"End of file\"")

    def read(n: int) -> bytes:
        raise ConnectionResetError("RTMP peer went away")

    fake_nvc(monkeypatch, demuxer=demuxer)
    with pytest.raises(InputError, match="reading 'rtmp://in/live' failed: RTMP peer went away"):
        NvdecSource(read, name="rtmp://in/live")


def test_nvdec_missing_inputs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with pytest.raises(InputNotFoundError, match="does not exist"):
        NvdecSource(tmp_path / "nope.mp4")
    with pytest.raises(InputError, match="is a directory"):
        NvdecSource(tmp_path)
    monkeypatch.setitem(sys.modules, "PyNvVideoCodec", None)
    (tmp_path / "a.mp4").write_bytes(b"x")
    with pytest.raises(InputError, match=r"PyNvVideoCodec is not installed .*Decode it with PyAV instead"):
        NvdecSource(tmp_path / "a.mp4")


# --------------------------------------------------------------------------------------------------
# The tolerance the GPU test uses, shown on the CPU


def scene(width: int, height: int) -> np.ndarray:
    """A colourful test picture made with NumPy alone (the GPU machine has no scikit-image): smooth
    colour gradients, saturated blocks with sharp edges, and fine noise, so that chroma varies
    within 2x2 blocks as in real video."""
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    rgb = np.stack([128 + 100 * np.sin(xx / 9.0), 128 + 100 * np.cos(yy / 7.0),
                    128 + 100 * np.sin((xx + yy) / 13.0)], axis=-1)
    rgb[height // 4: height // 2, width // 5: width // 2] = (230, 30, 40)
    rgb[height // 2: 3 * height // 4, width // 2: 4 * width // 5] = (20, 60, 220)
    rgb += np.random.default_rng(2).normal(0, 6, rgb.shape)
    return np.clip(rgb, 0, 255).astype(np.uint8)


def write_h264(av: types.ModuleType, path: Path, *, bframes: bool, frames: int = 12,
               size: tuple[int, int] = (128, 96), container: str | None = None) -> None:
    """A short H.264 clip of a moving picture, tagged BT.709 limited range (as our writer tags)."""
    from av.video.reformatter import ColorRange, Colorspace

    width, height = size
    image = scene(width, height)
    out = av.open(str(path), "w", format=container)
    stream = out.add_stream("libx264", rate=30)
    stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
    stream.codec_context.colorspace = Colorspace.ITU709
    stream.codec_context.color_range = ColorRange.MPEG
    # Forced B-frames, or none with tune=zerolatency (what live encoders send).
    stream.options = ({"preset": "ultrafast", "x264-params": "bframes=2:b-adapt=0"} if bframes
                      else {"preset": "ultrafast", "tune": "zerolatency"})
    for i in range(frames):
        frame = av.VideoFrame.from_ndarray(np.roll(image, 3 * i, axis=1), format="rgb24")
        frame.pts, frame.time_base = i, Fraction(1, 30)
        out.mux(stream.encode(frame))
    out.mux(stream.encode(None))
    out.close()


def pyav_reference(av: types.ModuleType, path: Path) -> list[tuple[int, np.ndarray, np.ndarray, np.ndarray]]:
    """(pts, luma, interleaved chroma, PyAV's own RGB) of every frame FFmpeg decodes."""
    out = []
    with av.open(str(path)) as container:
        for frame in container.decode(video=0):
            h, w = frame.height, frame.width
            yuv = frame.to_ndarray(format="yuv420p")
            u = yuv[h: h + h // 4].reshape(h // 2, w // 2)
            v = yuv[h + h // 4:].reshape(h // 2, w // 2)
            uv = np.empty((h // 2, w), np.uint8)
            uv[:, 0::2], uv[:, 1::2] = u, v
            out.append((int(frame.pts), yuv[:h].copy(), uv, frame.to_ndarray(format="rgb24")))
    return out


def test_our_conversion_is_within_40db_of_pyavs_rgb(pyav: types.ModuleType, tmp_path: Path) -> None:
    # NVDEC's planes equal FFmpeg's bit for bit (H.264 decoding is exactly specified; the GPU test
    # asserts it), so what separates copy_to's RGB from PyAV's is only the YUV->RGB step: both
    # repeat each chroma sample over its 2x2 block with BT.709 limited-range coefficients, ours in
    # float32 rounded to nearest, swscale in fixed point. That differs by a few levels (about
    # 46 dB); 40 dB leaves room for other content while any real fault (a wrong matrix, swapped
    # U/V, a pitch error, a frame off by one) falls far below it.
    clip = tmp_path / "clip.mp4"
    write_h264(pyav, clip, bframes=True)
    for pts, y, uv, rgb in pyav_reference(pyav, clip):
        ours = nv12_to_rgb_ref(y, uv, np.empty_like(rgb), matrix="bt709", full_range=False)
        print(f"pts {pts}: {psnr(ours, rgb):.1f} dB, max difference {np.abs(ours.astype(int) - rgb).max()}")
        assert psnr(ours, rgb) >= 40.0
        # The faults the tolerance is there to catch land far below it.
        swapped = uv.reshape(uv.shape[0], -1, 2)[:, :, ::-1].reshape(uv.shape)
        assert psnr(nv12_to_rgb_ref(y, swapped, np.empty_like(rgb)), rgb) < 30.0
        assert psnr(nv12_to_rgb_ref(y, uv, np.empty_like(rgb), matrix="bt601"), rgb) < 35.0


# --------------------------------------------------------------------------------------------------
# On the GPU (-m gpu)


@pytest.fixture(scope="module")
def nvc(cp: types.ModuleType) -> types.ModuleType:
    module = pytest.importorskip("PyNvVideoCodec")
    ok, reason = nvdec_available()
    if not ok:
        pytest.skip(reason)
    return module


Decoded = list[tuple[int | None, np.ndarray, np.ndarray, np.ndarray]]


def decode_all(cp: types.ModuleType, source: NvdecSource) -> Decoded:
    out = []
    for frame in source:
        rgb = cp.empty((frame.height, frame.width, 3), cp.uint8)
        frame.copy_to(rgb).synchronize()
        source.stream.synchronize()  # the views are read on the decoder's stream's terms
        out.append((frame.pts, cp.asnumpy(frame.y), cp.asnumpy(frame.uv), cp.asnumpy(rgb)))
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("bframes, low_latency", [(True, False), (False, True)])
def test_nvdec_matches_pyav(cp: types.ModuleType, nvc: types.ModuleType, pyav: types.ModuleType,
                            tmp_path: Path, bframes: bool, low_latency: bool) -> None:
    clip = tmp_path / "clip.mp4"
    write_h264(pyav, clip, bframes=bframes)
    ref = pyav_reference(pyav, clip)
    with NvdecSource(clip, low_latency=low_latency, time_base=Fraction(1, 15360)) as source:
        caps = source.capabilities()
        got = decode_all(cp, source)
    print(f"NVDEC capabilities: {caps}; colour: {source.matrix}, full range {source.full_range}")
    assert caps["codec"] == "H264" and caps["surface_format"] == "NV12"
    assert (caps.get("width"), caps.get("height")) in ((128, 96), (None, None))
    assert [g[0] for g in got] == [r[0] for r in ref]  # every pts, in presentation order
    for (_, y, uv, rgb), (_, ry, ruv, rrgb) in zip(got, ref):
        np.testing.assert_array_equal(y, ry)
        np.testing.assert_array_equal(uv, ruv)
        # The kernel is bit-exact to its NumPy reference, with the colour the source chose.
        np.testing.assert_array_equal(rgb, nv12_to_rgb_ref(ry, ruv, np.empty_like(rgb), matrix=source.matrix,
                                                           full_range=source.full_range))
        if source.matrix == "bt709":
            # PyAV converts with the clip's BT.709 tag: within the tolerance above.
            assert psnr(rgb, rrgb) >= 40.0
    # The demuxer of PyNvVideoCodec 2.2.4 may not report an H.264 stream's VUI colour tags (it
    # did not on the H200 run): then the source falls back to what players assume for untagged
    # video, BT.601 below 720 lines.
    assert source.matrix in ("bt709", "bt601")


@pytest.mark.gpu
def test_nvdec_low_latency_refuses_b_frames(cp: types.ModuleType, nvc: types.ModuleType,
                                            pyav: types.ModuleType, tmp_path: Path) -> None:
    clip = tmp_path / "b.mp4"
    write_h264(pyav, clip, bframes=True)
    with NvdecSource(clip, low_latency=True) as source, pytest.raises(InputError, match="low_latency=False"):
        for _ in source:
            pass


@pytest.mark.gpu
@pytest.mark.parametrize("chunk", [1 << 20, 1000])
def test_nvdec_from_bytes_flv(cp: types.ModuleType, nvc: types.ModuleType, pyav: types.ModuleType,
                             tmp_path: Path, chunk: int) -> None:
    # The way in for RTMP: FLV bytes handed over by our own code, in pieces of any size.
    clip = tmp_path / "clip.flv"
    write_h264(pyav, clip, bframes=False, container="flv")
    ref = pyav_reference(pyav, clip)
    data = io.BytesIO(clip.read_bytes())
    source = NvdecSource(lambda n: data.read(min(n, chunk)), name="flv bytes", time_base=Fraction(1, 1000))
    with source:
        got = decode_all(cp, source)
    assert [g[0] for g in got] == [r[0] for r in ref]
    for (_, y, uv, _), (_, ry, ruv, _) in zip(got, ref):
        np.testing.assert_array_equal(y, ry)
        np.testing.assert_array_equal(uv, ruv)


@pytest.mark.gpu
@pytest.mark.parametrize("container", ["flv", "mp4"])
def test_nvdec_access_units_from_our_demuxer(cp: types.ModuleType, nvc: types.ModuleType,
                                             pyav: types.ModuleType, tmp_path: Path, container: str) -> None:
    # The way in for the GPU live job and WebRTC: Annex-B access units from our own demuxing
    # (LiveReader's mp4toannexb filter), handed to NVDEC one by one with their pts.
    from swapstream.gpu.nvdec import NvdecAccessUnits
    from swapstream.live.streams import LiveReader, VideoPacket

    clip = tmp_path / f"clip.{container}"
    write_h264(pyav, clip, bframes=False, container=container)
    ref = pyav_reference(pyav, clip)
    units = [x for x in LiveReader(str(clip), packets=True) if isinstance(x, VideoPacket)]
    dec = NvdecAccessUnits(codec="h264", time_base=units[0].time_base, name=str(clip))
    got = []
    for u in units:
        for frame in dec.decode(u.data, u.pts):
            dec.stream.synchronize()
            got.append((frame.pts, cp.asnumpy(frame.y), cp.asnumpy(frame.uv)))
    for frame in dec.flush():
        dec.stream.synchronize()
        got.append((frame.pts, cp.asnumpy(frame.y), cp.asnumpy(frame.uv)))
    assert dec.access_units == len(units) == len(ref)
    # Low latency: each access unit's picture comes out of its own decode call, with its pts.
    assert [g[0] for g in got] == [u.pts for u in units]
    for (_, y, uv), (_, ry, ruv, _) in zip(got, ref):
        # H.264 decoding is exact: NVDEC and FFmpeg give the same samples.
        np.testing.assert_array_equal(y, ry)
        np.testing.assert_array_equal(uv, ruv)


@pytest.mark.gpu
def test_nvdec_leaves_the_threads_cuda_context_alone(cp: types.ModuleType, nvc: types.ModuleType,
                                                      pyav: types.ModuleType, tmp_path: Path) -> None:
    # PyNvVideoCodec switches CUDA contexts inside its calls; one left current made a later
    # PyTorch graph capture in the same thread fail with "invalid resource handle" on the H200.
    import gc

    from swapstream.gpu.nvdec import NvdecAccessUnits
    from swapstream.gpu.pynvc import primary_context
    from swapstream.live.streams import LiveReader, VideoPacket

    primary = primary_context(0)
    clip = tmp_path / "clip.mp4"
    write_h264(pyav, clip, bframes=False)
    steps: list[tuple[str, int]] = []
    nvdec_available()
    steps.append(("nvdec_available", int(cp.cuda.driver.ctxGetCurrent())))
    with NvdecSource(clip) as source:
        decode_all(cp, source)
        steps.append(("NvdecSource decoding", int(cp.cuda.driver.ctxGetCurrent())))
    steps.append(("NvdecSource closed", int(cp.cuda.driver.ctxGetCurrent())))
    units = [x for x in LiveReader(str(clip), packets=True) if isinstance(x, VideoPacket)]
    dec = NvdecAccessUnits()
    frames = [f for u in units for f in dec.decode(u.data, u.pts)] + dec.flush()
    dec.stream.synchronize()
    steps.append(("NvdecAccessUnits decoding", int(cp.cuda.driver.ctxGetCurrent())))
    del frames
    dec.close()
    gc.collect()  # the decoded frames' owners go too
    steps.append(("NvdecAccessUnits closed", int(cp.cuda.driver.ctxGetCurrent())))
    assert all(ctx == primary for _, ctx in steps), [(n, hex(c)) for n, c in steps]
    torch = pytest.importorskip("torch")
    stream = cp.cuda.Stream(non_blocking=True)
    with torch.cuda.stream(torch.cuda.ExternalStream(stream.ptr)):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())  # what failed: an event on a stream of ours
        x = torch.arange(10, device="cuda").sum()
    assert int(x) == 45


@pytest.mark.gpu
def test_nvenc_absence_is_reported(cp: types.ModuleType) -> None:
    pytest.importorskip("PyNvVideoCodec")
    ok, reason = nvenc_available()
    if ok:
        pytest.skip("this GPU has NVENC; the round trip covers it")
    print(f"nvenc_available: {reason}")
    assert reason.startswith("this GPU has no NVENC (CreateEncoder failed: ")
    with pytest.raises(OutputError, match=r"this GPU has no NVENC"):
        NvencSink(256, 144, fps=30, bitrate=2_000_000, gop=30)


@pytest.mark.gpu
@pytest.mark.parametrize("codec", ["h264", "hevc"])
def test_nvenc_round_trip(cp: types.ModuleType, pyav: types.ModuleType, tmp_path: Path, codec: str) -> None:
    pytest.importorskip("PyNvVideoCodec")
    ok, reason = nvenc_available()
    if not ok:
        pytest.skip(reason)
    sys.path.insert(0, str(HERE))
    from clips import number_of, numbered_frame

    from swapstream.kernels.nv12 import rgb_to_nv12

    width, height, frames = 256, 144, 20
    tb = Fraction(1, 15360)
    sent = [512 * i for i in range(frames)]
    packets: list[EncodedPacket] = []
    with NvencSink(width, height, fps=30, bitrate=4_000_000, gop=10, codec=codec, time_base=tb) as sink:
        for i, pts in enumerate(sent):
            y, uv = sink.input_planes()
            rgb_to_nv12(cp.asarray(numbered_frame(i, width, height)), y, uv)
            packets += sink.encode(y, uv, pts=pts)
        packets += sink.flush()
    assert [p.pts for p in packets] == [p.dts for p in packets] == sent
    assert packets[0].key and [p.key for p in packets].count(True) == frames // 10
    stream = tmp_path / f"out.{codec}"
    stream.write_bytes(b"".join(p.data for p in packets))
    with pyav.open(str(stream), format=codec) as container:
        decoded = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    assert [number_of(f) for f in decoded] == list(range(frames))
    assert min(psnr(f, numbered_frame(i, width, height)) for i, f in enumerate(decoded)) >= 30.0
