"""NV12 planes described by CUDA array interfaces, in both directions.

`nv12_planes_from_interface` finds where a decoded surface's luma and chroma planes lie from the
interfaces its views expose (`nvdec` then wraps them as CuPy views with `_device_plane`);
`nv12_encoder_interfaces` builds the interfaces through which NVENC's Encode reads one of our
surfaces (`nvenc`). Neither needs PyNvVideoCodec or CuPy. The sources cited as [PG], [S:x] and
[SRC] are listed in `swapstream.gpu.pynvc`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

__all__ = [
    "Nv12Layout",
    "PlaneView",
    "nv12_encoder_interfaces",
    "nv12_planes_from_interface",
]


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
# Encoder input: from a surface to array interfaces


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
