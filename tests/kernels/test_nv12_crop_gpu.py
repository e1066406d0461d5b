"""CUDA kernels of swapstream.kernels.nv12 and swapstream.kernels.crop against their NumPy references.

Run on a GPU machine with `pytest -m gpu`; the module skips where CuPy or a CUDA device is missing.

Every input is fresh random data (never zeros), every output is poisoned before each run, and every
element is compared with the NumPy reference run on the same inputs. The kernels perform the
reference's float32 (and, for crop coordinates, float64) operations in the same order through the
round-to-nearest intrinsics (__fmul_rn, __fadd_rn, __fdiv_rn, __dmul_rn, ...), which the compiler
never contracts into FMAs, and round with rintf / cvt.rn.f16.f32 as numpy.rint / astype(float16) do.
So the comparisons are exact: any difference is a bug, not rounding noise.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import cv2
import numpy as np
import pytest

cupy = pytest.importorskip("cupy")
try:
    if cupy.cuda.runtime.getDeviceCount() == 0:
        pytest.skip("no CUDA device", allow_module_level=True)
except Exception as exc:  # CUDARuntimeError without a driver, or a CUDA library that fails to load
    pytest.skip(f"no usable CUDA device: {exc}", allow_module_level=True)

from swapstream.kernels.crop import crop_batch, crop_batch_ref  # noqa: E402
from swapstream.kernels.nv12 import (nv12_to_rgb, nv12_to_rgb_ref, rgb_to_nv12,  # noqa: E402
                                     rgb_to_nv12_ref)

VARIANTS = [(m, fr) for m in ("bt601", "bt709") for fr in (False, True)]
POISONS_U8 = (0xAB, 0x54)  # an element left unwritten matches the reference under at most one


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng()


def smooth_image(rng: np.random.Generator, h: int, w: int, factor: int = 8) -> np.ndarray:
    small = rng.integers(0, 256, (h // factor + 2, w // factor + 2, 3), dtype=np.uint8)
    return cv2.resize(small, (w, h), interpolation=cv2.INTER_CUBIC)


def random_u8(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.integers(1, 256, shape, dtype=np.uint8)


def run_poisoned_u8(outs: list[Any], launch: Callable[[], Any]) -> list[list[np.ndarray]]:
    """Run `launch` once per poison value with every array in `outs` filled with it first; return
    the host copies of the outputs after each run."""
    results = []
    for p in POISONS_U8:
        for o in outs:
            o.fill(p)
        launch()
        cupy.cuda.get_current_stream().synchronize()
        results.append([cupy.asnumpy(o) for o in outs])
    return results


# ---------------------------------------------------------------------------------------------------
# NV12 -> RGB

# (height, width, y row length, uv row length, view): the planes are C-contiguous (rows, pitch)
# arrays, or with view=True (rows, width) views into wider buffers, read through their row stride.
NV12_LAYOUTS = [
    (64, 96, 96, 96, False),        # tight
    (64, 96, 109, 103, False),      # odd pitches, different per plane
    (37, 53, 61, 59, False),        # odd height and width: half blocks at the edges
    (37, 53, 61, 59, True),         # same, as strided views
    (1080, 1920, 2048, 2048, True),  # NVDEC-like 1080p surface with a 2048-byte pitch
]


@pytest.mark.gpu
@pytest.mark.parametrize("matrix,full_range", VARIANTS)
@pytest.mark.parametrize("h,w,py,puv,view", NV12_LAYOUTS)
def test_nv12_to_rgb_kernel_matches_reference(rng: np.random.Generator, matrix: str,
                                              full_range: bool, h: int, w: int, py: int, puv: int,
                                              view: bool) -> None:
    cw2 = 2 * ((w + 1) // 2)
    y_host = random_u8(rng, (h, py))
    uv_host = random_u8(rng, ((h + 1) // 2, puv))
    y_dev, uv_dev = cupy.asarray(y_host), cupy.asarray(uv_host)
    if view:
        y_dev, uv_dev = y_dev[:, :w], uv_dev[:, :cw2]
    out = cupy.empty((h, w, 3), dtype=cupy.uint8)
    ref = np.full((h, w, 3), 0xAB, dtype=np.uint8)
    nv12_to_rgb_ref(y_host, uv_host, ref, matrix=matrix, full_range=full_range)
    for (got,) in run_poisoned_u8([out], lambda: nv12_to_rgb(y_dev, uv_dev, out, matrix=matrix,
                                                             full_range=full_range)):
        # Exact: same float32 operations in the same order, no FMA contraction, rint on both sides.
        np.testing.assert_array_equal(got, ref)


# ---------------------------------------------------------------------------------------------------
# RGB -> NV12

RGB_LAYOUTS = [
    (64, 96, 96, 96, False),
    (64, 96, 107, 101, False),       # odd pitches: columns W.. must stay untouched
    (38, 54, 63, 57, True),          # views into wider buffers
    (1080, 1920, 2048, 2048, False),
]


@pytest.mark.gpu
@pytest.mark.parametrize("matrix,full_range", VARIANTS)
@pytest.mark.parametrize("h,w,py,puv,view", RGB_LAYOUTS)
def test_rgb_to_nv12_kernel_matches_reference(rng: np.random.Generator, matrix: str,
                                              full_range: bool, h: int, w: int, py: int, puv: int,
                                              view: bool) -> None:
    # Half noise, half smooth: noise exercises the 2x2 chroma means, smooth content the usual case.
    rgb_host = random_u8(rng, (h, w, 3))
    rgb_host[h // 2:] = smooth_image(rng, h - h // 2, w)
    rgb_dev = cupy.asarray(rgb_host)
    y_buf = cupy.empty((h, py), dtype=cupy.uint8)
    uv_buf = cupy.empty((h // 2, puv), dtype=cupy.uint8)
    y_arg, uv_arg = (y_buf[:, :w], uv_buf[:, :w]) if view else (y_buf, uv_buf)
    y_ref = np.full((h, w), 0xAB, dtype=np.uint8)
    uv_ref = np.full((h // 2, w), 0xAB, dtype=np.uint8)
    rgb_to_nv12_ref(rgb_host, y_ref, uv_ref, matrix=matrix, full_range=full_range)
    runs = run_poisoned_u8([y_buf, uv_buf], lambda: rgb_to_nv12(
        rgb_dev, y_arg, uv_arg, matrix=matrix, full_range=full_range))
    for poison, (y_got, uv_got) in zip(POISONS_U8, runs):
        # Exact, for the same reason as the decoder; the block sums run in the same order.
        np.testing.assert_array_equal(y_got[:, :w], y_ref)
        np.testing.assert_array_equal(uv_got[:, :w], uv_ref)
        assert np.all(y_got[:, w:] == poison) and np.all(uv_got[:, w:] == poison)


@pytest.mark.gpu
def test_nv12_round_trip_on_a_side_stream(rng: np.random.Generator) -> None:
    # The kernels launch on the current stream: run both directions on a non-blocking side stream
    # and compare with the CPU round trip.
    h, w = 270, 480
    rgb_host = smooth_image(rng, h, w)
    rgb_dev = cupy.asarray(rgb_host)
    y, uv = cupy.full((h, w + 5), 0xAB, cupy.uint8), cupy.full((h // 2, w + 5), 0xAB, cupy.uint8)
    back = cupy.full((h, w, 3), 0xAB, cupy.uint8)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        rgb_to_nv12(rgb_dev, y, uv, matrix="bt709")
        nv12_to_rgb(y, uv, back, matrix="bt709")
    stream.synchronize()
    y_h, uv_h = np.full((h, w), 1, np.uint8), np.full((h // 2, w), 1, np.uint8)
    back_h = np.full((h, w, 3), 1, np.uint8)
    rgb_to_nv12_ref(rgb_host, y_h, uv_h, matrix="bt709")
    nv12_to_rgb_ref(y_h, uv_h, back_h, matrix="bt709")
    np.testing.assert_array_equal(cupy.asnumpy(back), back_h)  # exact, as above


@pytest.mark.gpu
def test_nv12_gpu_errors_name_the_argument(rng: np.random.Generator) -> None:
    h, w = 8, 10
    y = cupy.asarray(random_u8(rng, (h, w)))
    uv = cupy.asarray(random_u8(rng, (h // 2, w)))
    out = cupy.empty((h, w, 3), cupy.uint8)
    rgb = cupy.asarray(random_u8(rng, (h, w, 3)))
    bad = [
        ("out", lambda: nv12_to_rgb(y, uv, np.empty((h, w, 3), np.uint8))),   # host vs device
        ("y", lambda: nv12_to_rgb(cupy.asnumpy(y), uv, out)),
        ("out", lambda: nv12_to_rgb(y, uv, cupy.empty((h, w, 3), cupy.float32))),
        ("out", lambda: nv12_to_rgb(y, uv, cupy.empty((h, 2 * w, 3), cupy.uint8)[:, ::2])),
        ("y", lambda: nv12_to_rgb(cupy.asarray(random_u8(rng, (h, 2 * w)))[:, ::2], uv, out)),
        ("uv", lambda: nv12_to_rgb(y, uv[:-1], out)),
        ("matrix", lambda: nv12_to_rgb(y, uv, out, matrix="BT709")),
        ("rgb", lambda: rgb_to_nv12(rgb[:, :-1], y, uv)),
        ("rgb", lambda: rgb_to_nv12(cupy.asarray(random_u8(rng, (h, 2 * w, 3)))[:, ::2], y, uv)),
        ("y_out", lambda: rgb_to_nv12(rgb, np.empty((h, w), np.uint8), uv)),
        ("uv_out", lambda: rgb_to_nv12(rgb, y, uv.astype(cupy.int16))),
    ]
    for name, call in bad:
        with pytest.raises(ValueError, match=rf"^{name}\b"):
            call()


# ---------------------------------------------------------------------------------------------------
# crop_batch


def face_mats(rng: np.random.Generator, n: int, size: int, h: int, w: int) -> np.ndarray:
    """Crop -> frame similarity transforms for n faces; some reach past the frame's edges."""
    mats = np.empty((n, 2, 3), dtype=np.float32)
    for i in range(n):
        a = rng.uniform(-0.7, 0.7)
        s = rng.uniform(0.4, 2.5)
        cx, cy = rng.uniform(-0.1 * w, 1.1 * w), rng.uniform(-0.1 * h, 1.1 * h)
        lin = s * np.array([[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]])
        t = np.array([cx, cy]) - lin @ np.array([size / 2, size / 2])
        mats[i] = np.hstack([lin, t[:, None]])
    return mats


MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 4])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("bgr", [False, True])
@pytest.mark.parametrize("mats_on_gpu", [True, False])
def test_crop_batch_kernel_matches_reference(rng: np.random.Generator, n: int, dtype: type,
                                             bgr: bool, mats_on_gpu: bool) -> None:
    h, w, size = 360, 641, 128  # odd frame width: rows are not 4-byte aligned
    frame_host = smooth_image(rng, h, w)
    frame_host[: h // 3] = random_u8(rng, (h // 3, w, 3))
    mats_host = face_mats(rng, n, size, h, w)
    mats_host[0, :, 2] += rng.uniform(-1e4, 1e4, 2).astype(np.float32)  # far outside the frame
    if n > 1:
        mats_host[1] = [[1, 0, 0.25], [0, 1, 0.75]]  # exact quarter-pixel weights
    mean, std = (MEAN[::-1], STD[::-1]) if bgr else (MEAN, STD)
    ref = np.full((n, 3, size, size), np.nan, dtype=dtype)
    crop_batch_ref(frame_host, mats_host, ref, bgr=bgr, mean=mean, std=std)
    out = cupy.full((n, 3, size, size), cupy.nan, dtype=dtype)  # the op never produces NaN
    mats = cupy.asarray(mats_host) if mats_on_gpu else mats_host
    crop_batch(cupy.asarray(frame_host), mats, out, bgr=bgr, mean=mean, std=std)
    got = cupy.asnumpy(out)
    # Exact: float64 coordinates and float32 weights/normalisation in the reference's order, no FMA
    # contraction, and fp16 stored with round-to-nearest-even like NumPy's cast.
    np.testing.assert_array_equal(got, ref)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_crop_batch_kernel_matches_opencv(rng: np.random.Generator, dtype: type) -> None:
    h, w, size, n = 480, 640, 112, 4
    frame_host = smooth_image(rng, h, w)
    mats_host = face_mats(rng, n, size, h, w)
    out = cupy.full((n, 3, size, size), cupy.nan, dtype=dtype)
    crop_batch(cupy.asarray(frame_host), cupy.asarray(mats_host), out, mean=MEAN, std=STD)
    got = cupy.asnumpy(out).astype(np.float64)
    f = frame_host.astype(np.int32)
    dx, dy = np.abs(np.diff(f, axis=1)).max(), np.abs(np.diff(f, axis=0)).max()
    # OpenCV rounds source coordinates to 1/32 px (after rounding to 1/1024): a sample moves by up to
    # 1/64 + 1/1024 px per axis, changing a bilinear value by at most that times the largest
    # neighbour difference; its 15-bit weights add < 0.03 level and its uint8 output 0.5. fp16
    # stores |values| < 4 within 2^-10, i.e. < 0.06 level after multiplying back by std * 255.
    tol = 0.5 + (dx + dy) * (1 / 64 + 1 / 1024) + 0.05 + (0.06 if dtype == np.float16 else 0.0)
    for i in range(n):
        c = cv2.warpAffine(frame_host, mats_host[i], (size, size),
                           flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
                           borderMode=cv2.BORDER_REPLICATE).astype(np.float64)
        want = c.transpose(2, 0, 1)
        levels = (got[i] * np.array(STD)[:, None, None] + np.array(MEAN)[:, None, None]) * 255
        assert np.abs(levels - want).max() <= tol


@pytest.mark.gpu
def test_crop_batch_gpu_errors_name_the_argument(rng: np.random.Generator) -> None:
    frame = cupy.asarray(random_u8(rng, (20, 30, 3)))
    mats_h = face_mats(rng, 2, 8, 20, 30)
    mats = cupy.asarray(mats_h)
    out = cupy.empty((2, 3, 8, 8), cupy.float32)
    bad = [
        ("out", lambda: crop_batch(frame, mats, np.empty((2, 3, 8, 8), np.float32))),  # host out
        ("out", lambda: crop_batch(cupy.asnumpy(frame), mats_h, out)),                 # host frame
        ("mats", lambda: crop_batch(cupy.asnumpy(frame), mats, np.empty((2, 3, 8, 8), np.float32))),
        ("out", lambda: crop_batch(frame, mats, cupy.empty((2, 3, 8, 8), cupy.float64))),
        ("out", lambda: crop_batch(frame, mats, cupy.empty((2, 3, 8, 16), cupy.float32)[..., ::2])),
        ("frame", lambda: crop_batch(cupy.asarray(random_u8(rng, (20, 60, 3)))[:, ::2], mats, out)),
        ("mats", lambda: crop_batch(frame, mats.astype(cupy.float64), out)),
        ("mats", lambda: crop_batch(frame, cupy.asarray(  # non-contiguous on the device
            np.ascontiguousarray(mats_h.transpose(0, 2, 1))).transpose(0, 2, 1), out)),
        ("std", lambda: crop_batch(frame, mats, out, std=(1, 1, 0))),
    ]
    for name, call in bad:
        with pytest.raises(ValueError, match=rf"^{name}\b"):
            call()


@pytest.mark.gpu
@pytest.mark.parametrize("matrix,full_range", VARIANTS)
def test_rgb_to_i420_matches_reference(rng: np.random.Generator, matrix: str, full_range: bool) -> None:
    from swapstream.kernels.nv12 import rgb_to_i420

    h, w = 360, 642  # a width that is even but not a multiple of 4: the chroma planes' rows are odd
    rgb_host = random_u8(rng, (h, w, 3))
    rgb_host[h // 2:] = smooth_image(rng, h - h // 2, w)
    ref = np.full((h * 3 // 2, w), 0xAB, np.uint8)
    rgb_to_i420(rgb_host, ref, np.empty((h // 2, w), np.uint8), matrix=matrix, full_range=full_range)
    out = cupy.empty((h * 3 // 2, w), cupy.uint8)
    scratch = cupy.empty((h // 2, w), cupy.uint8)
    stream = cupy.cuda.Stream(non_blocking=True)

    def launch() -> None:
        with stream:
            rgb_to_i420(cupy.asarray(rgb_host), out, scratch, matrix=matrix, full_range=full_range)
        stream.synchronize()

    for got, _scratch in run_poisoned_u8([out, scratch], launch):
        # Exact: the NV12 kernel matches its reference bit for bit, and the split is a copy.
        np.testing.assert_array_equal(got, ref)
