"""CUDA paste-back, box mask and sharpen against their NumPy references (run with `pytest -m gpu`).

Fresh random inputs every run (smooth images where interpolation matters). paste_back and sharpen
work in place: the reference runs on a host copy of the same frame and EVERY element of the whole
frame is compared, so a write outside the box fails. box_mask writes a separate output, which is
poisoned with NaN first.

Tolerances: the kernels perform the reference's operations in the same order with the `_rn`
intrinsics (never contracted into FMAs; coordinates in float64, the rest in float32), rintf rounds half
to even like np.rint, and the Gaussian taps are the reference's float32 values uploaded as they are.
Every result is therefore expected bit for bit, and the comparisons are exact (tolerance 0).
"""

from __future__ import annotations

from types import ModuleType

import numpy as np
import pytest

from swapstream.kernels.paste import box_mask, box_mask_ref, paste_back, paste_back_ref
from swapstream.kernels.sharpen import sharpen, sharpen_ref

from .test_paste_sharpen_cpu import (crop_to_frame_affine, random_padding, smooth_crop,
                                     smooth_image)

pytestmark = pytest.mark.gpu


def _assert_frames_equal(got: np.ndarray, want: np.ndarray, what: str) -> None:
    d = np.abs(got.astype(int) - want.astype(int))
    assert d.max() == 0, (f"{what}: {int((d > 0).sum())} elements differ, max {int(d.max())}, "
                          f"first at {np.argwhere(d > 0)[:5].tolist()}")


@pytest.mark.parametrize("s", [128, 256])
def test_box_mask_matches_reference(cp: ModuleType, s: int) -> None:
    rng = np.random.default_rng()
    for blur in (0.0, 0.3, 0.7):
        for with_keep in (False, True):
            pad = random_padding(rng)
            keep = rng.uniform(0, 1, (s, s)).astype(np.float32) if with_keep else None
            ref = box_mask_ref(np.full((s, s), -3.0, np.float32), blur=blur, padding=pad,
                               keep_out=keep)
            out = cp.full((s, s), np.nan, cp.float32)  # poison: every element must be written
            box_mask(out, blur=blur, padding=pad, keep_out=None if keep is None else cp.asarray(keep))
            # Exact: same float32 multiply-adds in the same order (see the module docstring).
            np.testing.assert_array_equal(out.get(), ref)


@pytest.mark.parametrize("s", [128, 256])
def test_paste_back_matches_reference(cp: ModuleType, s: int) -> None:
    rng = np.random.default_rng()
    h, w = 540, 720
    configs = [(blur, keep, color) for blur in (0.0, 0.3) for keep in (False, True)
               for color in (False, True)]
    for i, (blur, with_keep, with_color) in enumerate(configs):
        frame = smooth_image(rng, h, w)
        crop = smooth_crop(rng, s)
        # Any rotation, scale 0.5-3, and every other placement hanging over a frame edge.
        m = crop_to_frame_affine(rng, s, h, w, scale=(0.5, 3.0), outside=i % 2 == 1)
        pad = random_padding(rng) if i % 3 else (0.0, 0.0, 0.0, 0.0)
        keep = rng.uniform(0, 1, (s, s)).astype(np.float32) if with_keep else None
        gain = rng.uniform(0.7, 1.3, 3).astype(np.float32) if with_color else None
        offset = rng.uniform(-25, 25, 3).astype(np.float32) if with_color else None
        want = frame.copy()
        box_ref = paste_back_ref(want, crop, m, blur=blur, padding=pad, keep_out=keep,
                                 color_gain=gain, color_offset=offset)
        got = cp.asarray(frame)
        box = paste_back(got, cp.asarray(crop), m, blur=blur, padding=pad,
                         keep_out=None if keep is None else cp.asarray(keep),
                         color_gain=gain, color_offset=offset)
        assert box == box_ref
        x0, y0, x1, y1 = box
        assert x1 > x0 and y1 > y0
        assert not np.array_equal(want, frame)  # the paste did something
        # Exact (tolerance 0), over the whole frame: see the module docstring.
        _assert_frames_equal(got.get(), want, f"config {i}: blur={blur} keep={with_keep} "
                                              f"color={with_color} box={box}")


def test_paste_back_1080p_large_scale_and_off_frame(cp: ModuleType) -> None:
    rng = np.random.default_rng()
    h, w, s = 1080, 1920, 256
    frame = smooth_image(rng, h, w)
    crop = smooth_crop(rng, s)
    for m in (crop_to_frame_affine(rng, s, h, w, scale=(2.5, 3.0)),
              crop_to_frame_affine(rng, s, h, w, scale=(2.5, 3.0), outside=True)):
        want = frame.copy()
        box_ref = paste_back_ref(want, crop, m, blur=0.3, padding=(3, 8, 12, 5))
        got = cp.asarray(frame)
        assert paste_back(got, cp.asarray(crop), m, blur=0.3, padding=(3, 8, 12, 5)) == box_ref
        _assert_frames_equal(got.get(), want, f"box={box_ref}")  # exact, as above
    far = np.array([[1.0, 0.0, -3 * w], [0.0, 1.0, 10.0]])
    got = cp.asarray(frame)
    x0, y0, x1, y1 = paste_back(got, cp.asarray(crop), far)
    assert x0 == x1 == 0
    _assert_frames_equal(got.get(), frame, "crop off the frame")


@pytest.mark.parametrize("radius", [0.8, 1.5, 3.0])
def test_sharpen_matches_reference(cp: ModuleType, radius: float) -> None:
    rng = np.random.default_rng()
    h, w = 300, 420
    boxes = [(int(rng.integers(10, 100)), int(rng.integers(10, 80)), int(rng.integers(200, 400)),
              int(rng.integers(150, 280))),                                 # interior
             (0, int(rng.integers(0, 100)), int(rng.integers(50, 300)), h),  # left + bottom edges
             (int(rng.integers(200, 400)), -20, w + 17, int(rng.integers(30, 200))),  # overhang
             (0, 0, w, h)]                                                  # the whole frame
    for box in boxes:
        frame = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        amount = float(rng.uniform(0.2, 1.5))
        want = frame.copy()
        box_ref = sharpen_ref(want, box, amount=amount, radius=radius)
        got = cp.asarray(frame)
        assert sharpen(got, box, amount=amount, radius=radius) == box_ref
        # Exact (tolerance 0), over the whole frame: see the module docstring.
        _assert_frames_equal(got.get(), want, f"radius={radius} box={box}")


def test_gpu_ops_reject_bad_and_host_arrays(cp: ModuleType) -> None:
    frame = cp.zeros((64, 64, 3), cp.uint8)
    crop = cp.zeros((32, 32, 3), cp.float32)
    m = np.array([[1.0, 0, 4], [0, 1.0, 4]])
    with pytest.raises(ValueError, match="crop"):
        paste_back(frame, np.zeros((32, 32, 3), np.float32), m)           # host crop
    with pytest.raises(ValueError, match="crop"):
        paste_back(frame, cp.zeros((32, 32, 3), cp.float64), m)           # wrong dtype
    with pytest.raises(ValueError, match="crop"):
        paste_back(frame, cp.zeros((32, 30, 3), cp.float32), m)           # not square
    with pytest.raises(ValueError, match="keep_out"):
        paste_back(frame, crop, m, keep_out=np.zeros((32, 32), np.float32))  # host keep_out
    with pytest.raises(ValueError, match="keep_out"):
        paste_back(frame, crop, m, keep_out=cp.zeros((32, 31), cp.float32))
    with pytest.raises(ValueError, match="crop_to_frame"):
        paste_back(frame, crop, cp.asarray(m))                            # matrix on the GPU
    with pytest.raises(ValueError, match="color_gain"):
        paste_back(frame, crop, m, color_gain=cp.ones(3, cp.float32))
    with pytest.raises(ValueError, match="color_offset"):
        paste_back(frame, crop, m, color_offset=np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="frame"):
        paste_back(cp.zeros((64, 128, 3), cp.uint8)[:, ::2], crop, m)    # not C-contiguous
    with pytest.raises(ValueError, match="frame"):
        paste_back(np.zeros((64, 64, 3), np.uint8), crop, m)              # host frame, GPU crop
    with pytest.raises(ValueError, match="frame"):
        sharpen(cp.zeros((64, 128, 3), cp.uint8)[:, ::2], (0, 0, 8, 8))
    with pytest.raises(ValueError, match="frame"):
        sharpen(cp.zeros((64, 64, 3), cp.float32), (0, 0, 8, 8))
    with pytest.raises(ValueError, match="box"):
        sharpen(frame, (0, 0, 8))
    with pytest.raises(ValueError, match="keep_out"):
        box_mask(cp.zeros((32, 32), cp.float32), keep_out=np.zeros((32, 32), np.float32))
    with pytest.raises(ValueError, match="out"):
        box_mask(cp.zeros((32, 32), cp.float64))
    assert not frame.any()
