"""The face analysis' CPU product path: `warp.warp_affine` and `warp.box_downsample` on OpenCV.

The detector's letterbox (a 720p frame box-averaged, then warped to 128x128) and the landmark
model's 192x192 crop took about 30 ms of a 720p frame as the NumPy references; OpenCV does the
same in well under a millisecond. The references stay the specification: tests/kernels/
test_warp_cpu.py compares each function here with its reference, with the tolerance its docstring
states. Only NumPy arrays: CuPy frames take the CUDA kernels.
"""

from __future__ import annotations

import cv2
import numpy as np

from ._xp import check_array
from .warp import Border

_BORDERS = {"replicate": cv2.BORDER_REPLICATE, "constant": cv2.BORDER_CONSTANT}


def warp_affine_fast(src: np.ndarray, dst_to_src: np.ndarray, out: np.ndarray, *,
                     border: Border = "replicate", fill: float = 0.0) -> np.ndarray:
    """`warp.warp_affine` through cv2.warpAffine (WARP_INVERSE_MAP: the matrix maps output pixels
    to input pixels, as the reference's does). OpenCV quantises the interpolation position to 1/32
    pixel and, for uint8, the weights to 1/1024: a sample differs from the reference by at most
    1/64 of the local difference between neighbouring pixels in each axis, plus one level of
    rounding for uint8 outputs."""
    check_array("src", src, ndim=3)
    check_array("out", out, ndim=3, dtype=src.dtype)
    if out.shape[2] != src.shape[2]:
        raise ValueError(f"out must have {src.shape[2]} channels like src, got shape {tuple(out.shape)}")
    m = np.asarray(dst_to_src, dtype=np.float64)
    if m.shape != (2, 3):
        raise ValueError(f"dst_to_src must be a 2x3 matrix, got shape {m.shape}")
    h, w = out.shape[:2]
    # cv2 drops a trailing channel axis of 1 in its result: warp into a 2-D view of `out` then.
    dst = out[..., 0] if out.shape[2] == 1 else out
    res = cv2.warpAffine(np.ascontiguousarray(src), m, (w, h), dst=dst,
                         flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
                         borderMode=_BORDERS[border], borderValue=(fill,) * 4)
    if not np.shares_memory(res, dst):
        dst[...] = res.reshape(dst.shape)  # OpenCV reallocated: `out` was not a writable Mat view
    return out


def box_downsample_fast(src: np.ndarray, factor: int, out: np.ndarray) -> np.ndarray:
    """`warp.box_downsample` through cv2.resize(INTER_AREA), which for an integer factor averages
    the same `factor` x `factor` blocks. OpenCV rounds a mean that ends in exactly .5 up where the
    reference rounds it to even: at most one level apart, on those pixels only."""
    check_array("src", src, ndim=3, dtype=np.uint8)
    h, w = src.shape[0] // factor, src.shape[1] // factor
    check_array("out", out, dtype=np.uint8, shape=(h, w, src.shape[2]))
    region = src[: h * factor, : w * factor]
    res = cv2.resize(region, (w, h), dst=out, interpolation=cv2.INTER_AREA)
    if not np.shares_memory(res, out):
        out[...] = res.reshape(out.shape)  # OpenCV reallocated: `out` was not a writable Mat view
    return out
