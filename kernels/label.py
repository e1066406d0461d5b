"""Blend a pre-rendered label patch (the visible "AI-modified" disclosure) into an RGB frame, in place.

    out = (x * (255 - a) + p * 255 + 127) // 255        (int32 arithmetic, per channel)

`a` is the patch's coverage (0..255) and `p` its colour already multiplied by coverage. The NumPy
reference (`blend_patch_ref`) spells the formula with array ops; on the GPU one CuPy elementwise
kernel does the same integer arithmetic per element (the array-op version launched about ten
kernels, three of them dtype conversions, per frame: 0.2-0.3 ms of host time per frame under
cProfile in a many-stream worker, docs/performance.md). Both give the same integers: there is no rounding to differ.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from ._xp import check_array, on_gpu


def _check(region: Any, alpha: Any, premul: Any) -> None:
    check_array("region", region, ndim=3, dtype=np.uint8)
    h, w = region.shape[:2]
    check_array("alpha", alpha, dtype=np.uint8, shape=(h, w))
    check_array("premul", premul, dtype=np.uint8, shape=(h, w, 1))
    if region.shape[2] != 3:
        raise ValueError(f"region must be (h, w, 3) RGB, got shape {tuple(region.shape)}")


def blend_patch_ref(region: Any, alpha: Any, premul: Any) -> None:
    """Reference of `blend_patch`, written against NumPy or CuPy array ops; same arguments."""
    _check(region, alpha, premul)
    a = alpha[..., None].astype("int32")
    v = (region.astype("int32") * (255 - a) + premul.astype("int32") * 255 + 127) // 255
    region[...] = v.astype("uint8")


@functools.cache
def _blend_kernel() -> Any:
    import cupy

    # x is both read and written: each element depends only on itself, a and p.
    return cupy.ElementwiseKernel(
        "uint8 a, uint8 p", "uint8 x",
        "x = (unsigned char)(((int)x * (255 - (int)a) + (int)p * 255 + 127) / 255)",
        "swapstream_blend_label_u8")


def blend_patch(region: Any, alpha: Any, premul: Any) -> None:
    """Blend into `region`, an (h, w, 3) uint8 view of the frame (any strides), in place.

    alpha:  (h, w) uint8 coverage.
    premul: (h, w, 1) uint8 colour times coverage.
    All NumPy, or all CuPy on the current device (one kernel on the current stream).
    """
    if not on_gpu(region=region, alpha=alpha, premul=premul):
        blend_patch_ref(region, alpha, premul)
        return
    _check(region, alpha, premul)
    _blend_kernel()(alpha[..., None], premul, region)
