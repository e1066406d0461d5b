"""NV12 <-> packed RGB (uint8), the colour conversions at both ends of the GPU pipeline.

NV12 is what NVDEC hands over: a luma plane of H rows and an interleaved chroma plane (U, V, U, V, ...)
of ceil(H/2) rows, each with its own row pitch (>= the width). Both ops take the planes as 2-D uint8
arrays whose second dimension spans at least the width: a C-contiguous (rows, pitch) array, or a
(rows, >=width) view into a pitched buffer. The image width comes from the RGB array.

Chroma siting is NEAREST: chroma sample (i, j) covers the 2x2 luma block of rows 2i, 2i+1 and columns
2j, 2j+1. Decoding repeats it over that block (no interpolation), as OpenCV's COLOR_YUV2RGB_NV12 does;
encoding stores the mean of the block's four U (and V) values, computed in float32.

Coefficients: BT.601 (Kr=0.299, Kb=0.114) or BT.709 (Kr=0.2126, Kb=0.0722); limited ("video") range
puts Y in [16, 235] and Cb/Cr in [16, 240], full range uses [0, 255] with chroma centred on 128.
Results are rounded to nearest (half to even) and clipped to [0, 255].

The NumPy references (`nv12_to_rgb_ref`, `rgb_to_nv12_ref`) and the CUDA kernels in `cuda/nv12.cu`
perform the same float32 operations in the same order, without FMA contraction, so they agree bit for
bit.
"""

from __future__ import annotations

import functools
from typing import Any, Literal, NamedTuple

import numpy as np

from ._xp import check_array, get_xp, on_gpu

Matrix = Literal["bt601", "bt709"]

# (Kr, Kb) per ITU-R BT.601 and BT.709.
_KR_KB: dict[str, tuple[float, float]] = {"bt601": (0.299, 0.114), "bt709": (0.2126, 0.0722)}

_BLOCK = (32, 8, 1)  # threads per CUDA block, each thread handling one 2x2 pixel block


class Coefficients(NamedTuple):
    """float32 coefficients, exactly those that `nv12_coeffs<>()` in cuda/nv12.cu computes."""

    # decode: R = ys*(Y - yoff) + r_v*(V - 128); G = ys*(Y - yoff) - g_u*(U - 128) - g_v*(V - 128);
    #         B = ys*(Y - yoff) + b_u*(U - 128)
    yoff: np.float32
    ys: np.float32
    r_v: np.float32
    g_u: np.float32
    g_v: np.float32
    b_u: np.float32
    # encode: Y = yr*R + yg*G + yb*B + yoff; U = ur*R + ug*G + ub*B + 128; V = vr*R + vg*G + vb*B + 128
    yr: np.float32
    yg: np.float32
    yb: np.float32
    ur: np.float32
    ug: np.float32
    ub: np.float32
    vr: np.float32
    vg: np.float32
    vb: np.float32


@functools.cache
def coefficients(matrix: Matrix, full_range: bool) -> Coefficients:
    """The conversion coefficients, computed in float64 and rounded once to float32.

    Each expression is written exactly as in cuda/nv12.cu (same operations, same order), so the
    kernel's constexpr evaluation yields the same float32 values.
    """
    kr, kb = _KR_KB[matrix]
    kg = 1.0 - kr - kb
    full = bool(full_range)
    ys_dec = 1.0 if full else 255.0 / 219.0
    cs_dec = 1.0 if full else 255.0 / 224.0
    ys_enc = 1.0 if full else 219.0 / 255.0
    cs_enc = 1.0 if full else 224.0 / 255.0
    vals = (
        0.0 if full else 16.0,
        ys_dec,
        2.0 * (1.0 - kr) * cs_dec,
        2.0 * kb * (1.0 - kb) / kg * cs_dec,
        2.0 * kr * (1.0 - kr) / kg * cs_dec,
        2.0 * (1.0 - kb) * cs_dec,
        kr * ys_enc,
        kg * ys_enc,
        kb * ys_enc,
        -kr * cs_enc / (2.0 * (1.0 - kb)),
        -kg * cs_enc / (2.0 * (1.0 - kb)),
        0.5 * cs_enc,
        0.5 * cs_enc,
        -kg * cs_enc / (2.0 * (1.0 - kr)),
        -kb * cs_enc / (2.0 * (1.0 - kr)),
    )
    return Coefficients(*(np.float32(v) for v in vals))


def _kernel_name(op: str, matrix: Matrix, full_range: bool) -> str:
    return f"{op}_{matrix}_{'full' if full_range else 'limited'}"


def _check_options(matrix: Any, full_range: Any) -> None:
    if not isinstance(matrix, str) or matrix not in _KR_KB:
        raise ValueError(f"matrix must be one of {sorted(_KR_KB)}, got {matrix!r}")
    if not isinstance(full_range, (bool, np.bool_)):
        raise ValueError(f"full_range must be a bool, got {type(full_range).__name__}")


def _check_plane(name: str, a: Any, rows: int, min_cols: int) -> None:
    """A 2-D uint8 plane of exactly `rows` rows and at least `min_cols` columns."""
    check_array(name, a, ndim=2, dtype=np.uint8)
    if a.shape[0] != rows or a.shape[1] < min_cols:
        raise ValueError(f"{name} must have {rows} rows and at least {min_cols} columns (the row "
                         f"pitch may be larger), got shape {tuple(a.shape)}")




def _require_gpu_plane(name: str, a: Any) -> None:
    """On the GPU a plane is read through its row pitch: rows must be contiguous (unit column
    stride), on the current device, with a positive row stride of at least the row length."""
    import cupy

    if a.device.id != cupy.cuda.runtime.getDevice():
        raise ValueError(f"{name} is on GPU {a.device.id}, but the current device is "
                         f"{cupy.cuda.runtime.getDevice()}")
    if a.strides[1] != 1 or a.strides[0] < a.shape[1]:
        raise ValueError(f"{name} must have contiguous rows and a row pitch >= its row length, got "
                         f"strides {tuple(a.strides)} for shape {tuple(a.shape)}")


def _to_u8(xp: Any, v: Any) -> Any:
    return xp.clip(xp.rint(v), 0, 255).astype(xp.uint8)


# --------------------------------------------------------------------------------------------------
# NV12 -> RGB


def _check_nv12_to_rgb(y: Any, uv: Any, out: Any, matrix: Any, full_range: Any) -> None:
    check_array("out", out, ndim=3, dtype=np.uint8)
    h, w, c = out.shape
    if c != 3 or h < 1 or w < 1:
        raise ValueError(f"out must have shape HxWx3 with H, W >= 1, got {tuple(out.shape)}")
    _check_plane("y", y, h, w)
    # One U, V pair per 2x2 block; an odd width or height ends in a half block that still has one.
    _check_plane("uv", uv, (h + 1) // 2, 2 * ((w + 1) // 2))
    _check_options(matrix, full_range)


def nv12_to_rgb_ref(y: Any, uv: Any, out: Any, *, matrix: Matrix = "bt709",
                    full_range: bool = False) -> Any:
    """NumPy (or any `xp`) reference of `nv12_to_rgb`, with the same arguments."""
    _check_nv12_to_rgb(y, uv, out, matrix, full_range)
    xp = get_xp(y, uv, out)
    c = coefficients(matrix, bool(full_range))
    h, w = out.shape[:2]
    cw = (w + 1) // 2
    f32 = xp.float32
    lum = (y[:, :w].astype(f32) - c.yoff) * c.ys
    u = uv[:, 0:2 * cw:2].astype(f32) - f32(128)
    v = uv[:, 1:2 * cw:2].astype(f32) - f32(128)
    # Nearest siting: each chroma sample covers its 2x2 block.
    u = xp.repeat(xp.repeat(u, 2, axis=0), 2, axis=1)[:h, :w]
    v = xp.repeat(xp.repeat(v, 2, axis=0), 2, axis=1)[:h, :w]
    out[..., 0] = _to_u8(xp, lum + c.r_v * v)
    out[..., 1] = _to_u8(xp, lum - c.g_u * u - c.g_v * v)
    out[..., 2] = _to_u8(xp, lum + c.b_u * u)
    return out


def nv12_to_rgb(y: Any, uv: Any, out: Any, *, matrix: Matrix = "bt709",
                full_range: bool = False) -> Any:
    """Convert NV12 planes to packed RGB.

    y:   (H, pitch_y) uint8 luma, pitch_y >= W.
    uv:  (ceil(H/2), pitch_uv) uint8 interleaved U, V; pitch_uv >= 2*ceil(W/2).
    out: (H, W, 3) uint8 RGB, written in full and returned; it fixes H and W.

    CuPy inputs run the `nv12_to_rgb_<matrix>_<range>` kernel on the current stream (out must be
    C-contiguous; the planes need contiguous rows and are read through their row stride); NumPy
    inputs run `nv12_to_rgb_ref`.
    """
    _check_nv12_to_rgb(y, uv, out, matrix, full_range)
    if not on_gpu(y=y, uv=uv, out=out):
        return nv12_to_rgb_ref(y, uv, out, matrix=matrix, full_range=full_range)

    from .cuda_loader import grid, kernel, require_cupy

    require_cupy("out", out)
    _require_gpu_plane("y", y)
    _require_gpu_plane("uv", uv)
    h, w = out.shape[:2]
    fn = kernel("nv12.cu", _kernel_name("nv12_to_rgb", matrix, bool(full_range)))
    blocks = (grid((w + 1) // 2, _BLOCK[0])[0], grid((h + 1) // 2, _BLOCK[1])[0], 1)
    fn(blocks, _BLOCK, (y, uv, out, np.int32(h), np.int32(w), np.int32(y.strides[0]),
                        np.int32(uv.strides[0])))
    return out


# --------------------------------------------------------------------------------------------------
# RGB -> NV12


def _check_rgb_to_nv12(rgb: Any, y_out: Any, uv_out: Any, matrix: Any, full_range: Any) -> None:
    check_array("rgb", rgb, ndim=3, dtype=np.uint8)
    h, w, c = rgb.shape
    if c != 3:
        raise ValueError(f"rgb must have shape HxWx3, got {tuple(rgb.shape)}")
    if h < 2 or w < 2 or h % 2 or w % 2:
        raise ValueError(f"rgb must have an even height and width (4:2:0 chroma covers 2x2 "
                         f"blocks), got shape {tuple(rgb.shape)}")
    _check_plane("y_out", y_out, h, w)
    _check_plane("uv_out", uv_out, h // 2, w)
    _check_options(matrix, full_range)


def rgb_to_nv12_ref(rgb: Any, y_out: Any, uv_out: Any, *, matrix: Matrix = "bt709",
                    full_range: bool = False) -> Any:
    """NumPy (or any `xp`) reference of `rgb_to_nv12`, with the same arguments."""
    _check_rgb_to_nv12(rgb, y_out, uv_out, matrix, full_range)
    xp = get_xp(rgb, y_out, uv_out)
    c = coefficients(matrix, bool(full_range))
    w = rgb.shape[1]
    f = rgb.astype(xp.float32)
    r, g, b = f[..., 0], f[..., 1], f[..., 2]
    y_out[:, :w] = _to_u8(xp, c.yr * r + c.yg * g + c.yb * b + c.yoff)
    u = c.ur * r + c.ug * g + c.ub * b
    v = c.vr * r + c.vg * g + c.vb * b
    # Mean of each 2x2 block, summed in the kernel's order: (00 + 01) + 10 + 11.
    usum = u[0::2, 0::2] + u[0::2, 1::2] + u[1::2, 0::2] + u[1::2, 1::2]
    vsum = v[0::2, 0::2] + v[0::2, 1::2] + v[1::2, 0::2] + v[1::2, 1::2]
    quarter, mid = xp.float32(0.25), xp.float32(128)
    uv_out[:, 0:w:2] = _to_u8(xp, usum * quarter + mid)
    uv_out[:, 1:w:2] = _to_u8(xp, vsum * quarter + mid)
    return y_out, uv_out


def rgb_to_nv12(rgb: Any, y_out: Any, uv_out: Any, *, matrix: Matrix = "bt709",
                full_range: bool = False) -> Any:
    """Convert packed RGB to NV12 planes.

    rgb:    (H, W, 3) uint8, H and W even.
    y_out:  (H, pitch) uint8, pitch >= W; columns W.. are left untouched.
    uv_out: (H/2, pitch) uint8 interleaved U, V, pitch >= W; columns W.. are left untouched.

    Returns (y_out, uv_out). CuPy inputs run the `rgb_to_nv12_<matrix>_<range>` kernel on the current
    stream (rgb must be C-contiguous; the planes need contiguous rows and are written through their
    row stride); NumPy inputs run `rgb_to_nv12_ref`.
    """
    _check_rgb_to_nv12(rgb, y_out, uv_out, matrix, full_range)
    if not on_gpu(rgb=rgb, y_out=y_out, uv_out=uv_out):
        return rgb_to_nv12_ref(rgb, y_out, uv_out, matrix=matrix, full_range=full_range)

    from .cuda_loader import grid, kernel, require_cupy

    require_cupy("rgb", rgb)
    _require_gpu_plane("y_out", y_out)
    _require_gpu_plane("uv_out", uv_out)
    h, w = rgb.shape[:2]
    fn = kernel("nv12.cu", _kernel_name("rgb_to_nv12", matrix, bool(full_range)))
    blocks = (grid(w // 2, _BLOCK[0])[0], grid(h // 2, _BLOCK[1])[0], 1)
    fn(blocks, _BLOCK, (rgb, y_out, uv_out, np.int32(h), np.int32(w), np.int32(y_out.strides[0]),
                        np.int32(uv_out.strides[0])))
    return y_out, uv_out


def rgb_to_i420(rgb: Any, out: Any, uv_scratch: Any, *, matrix: Matrix = "bt709",
                full_range: bool = False) -> Any:
    """Convert packed RGB to planar 4:2:0 (I420, FFmpeg's `yuv420p`) in one buffer.

    rgb:        (H, W, 3) uint8, H and W even.
    out:        (H * 3/2, W) uint8, C-contiguous: the H rows of Y, then U as an (H/2, W/2) plane,
                then V, each contiguous (the layout `av.VideoFrame.from_ndarray(format="yuv420p")`
                takes, so x264 gets its input format without a conversion on the host).
    uv_scratch: (H/2, W) uint8: the interleaved chroma `rgb_to_nv12` writes before it is split.

    The same values as `rgb_to_nv12` (its kernel, or its reference for NumPy arrays), with the chroma
    de-interleaved by two strided copies on the current stream. Returns `out`.
    """
    h, w = rgb.shape[:2]
    check_array("out", out, dtype=np.uint8, shape=(h * 3 // 2, w))
    check_array("uv_scratch", uv_scratch, dtype=np.uint8, shape=(h // 2, w))
    if not out.flags.c_contiguous:
        raise ValueError("out must be C-contiguous: its U and V planes are read as flat runs")
    rgb_to_nv12(rgb, out[:h], uv_scratch, matrix=matrix, full_range=full_range)
    flat = out.reshape(-1)
    q = (h // 2) * (w // 2)
    flat[h * w:h * w + q].reshape(h // 2, w // 2)[...] = uv_scratch[:, 0::2]
    flat[h * w + q:].reshape(h // 2, w // 2)[...] = uv_scratch[:, 1::2]
    return out
