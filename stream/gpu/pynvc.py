"""PyNvVideoCodec for the NVDEC and NVENC modules: importing it, what this machine can do, and
keeping the calling thread's CUDA context around its calls.

PyNvVideoCodec is optional: it is imported inside the functions (`_import_nvc`), so every GPU codec
module imports without it, and the `*_available()` checks say why a path cannot run. Hopper and A100
GPUs have NVDEC but no NVENC; there `nvenc_available()` reports that and `NvencSink` raises an
`OutputError`.

The GPU codec code is split by what it does: this module; `planes` (NV12 planes from and to CUDA
array interfaces); `nvdec` (decoded frames, the decoder core, `NvdecAccessUnits`, `warm_nvdec`);
`nvdemux` (`NvdecSource`, through PyNvVideoCodec's demuxer); `bitstream` (H.264/HEVC access units
and keyframes); `nvenc` (encoding: `NvencSink`, `nvenc_options`).

Where each call comes from (cited at the call as [tag], here and in those modules):
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
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

log = logging.getLogger(__name__)

__all__ = [
    "nvdec_available",
    "nvenc_available",
    "nvenc_failure_reason",
    "primary_context",
    "same_context",
]

# The size `nvenc_available` opens its probe encoder at: small, and above the minimum frame size
# of every NVENC generation (the encoder caps width_min / height_min).
_PROBE_SIZE = (256, 256)


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
        # In `same_context`: a CreateEncoder that fails (a GPU without NVENC) left its own context
        # current in this thread, and this thread's next PyTorch convolution failed
        # (CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH) and CuPy's streams were invalid handles (H200).
        with same_context():
            encoder = nvc.CreateEncoder(_PROBE_SIZE[0], _PROBE_SIZE[1], "NV12", True, codec="h264",
                                        gpu_id=gpu_id)
            del encoder
    except Exception as e:
        return False, nvenc_failure_reason(e)
    return True, f"NVENC encodes H.264 on GPU {gpu_id} (PyNvVideoCodec {getattr(nvc, '__version__', '?')})"


# --------------------------------------------------------------------------------------------------
# CUDA contexts around PyNvVideoCodec's calls


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
        if after != before:
            # Also when none was current (0 unbinds): a thread that had not used CUDA yet would
            # otherwise keep PyNvVideoCodec's context, which a failed CreateEncoder leaves
            # current, and CuPy's next launch there failed with "invalid resource handle" (H200).
            # Setting NULL only pops the top of the thread's context stack: repeat while a context
            # pushed under it is uncovered.
            log.debug("PyNvVideoCodec left CUDA context %#x current; restoring %#x", after, before)
            for _ in range(4):
                cupy.cuda.driver.ctxSetCurrent(before)
                if int(cupy.cuda.driver.ctxGetCurrent()) == before:
                    break
            else:
                log.warning("could not restore CUDA context %#x after a PyNvVideoCodec call", before)


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
