"""NumPy references of swapstream.kernels.nv12 and swapstream.kernels.crop, against OpenCV and against
the textbook formulas evaluated in float64.

Inputs are fresh random data for every test (never zeros) and outputs are poisoned before each call,
so an element the op forgot to write shows up as a failure.
"""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from swapstream.kernels.crop import crop_batch, crop_batch_ref
from swapstream.kernels.nv12 import (coefficients, nv12_to_rgb, nv12_to_rgb_ref, rgb_to_nv12,
                                     rgb_to_nv12_ref)

VARIANTS = [(m, fr) for m in ("bt601", "bt709") for fr in (False, True)]
KR_KB = {"bt601": (0.299, 0.114), "bt709": (0.2126, 0.0722)}


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng()


def smooth_image(rng: np.random.Generator, h: int, w: int, factor: int = 8) -> np.ndarray:
    """Random but locally smooth content (random colours every `factor` pixels, cubic in between)."""
    small = rng.integers(0, 256, (h // factor + 2, w // factor + 2, 3), dtype=np.uint8)
    return cv2.resize(small, (w, h), interpolation=cv2.INTER_CUBIC)


def blocky_image(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """Random colours, constant over each 2x2 block: 4:2:0 subsampling loses nothing on it."""
    small = rng.integers(0, 256, (h // 2, w // 2, 3), dtype=np.uint8)
    return np.repeat(np.repeat(small, 2, axis=0), 2, axis=1)


# ---------------------------------------------------------------------------------------------------
# Textbook float64 models (written from the standards' definitions, not from nv12.py's coefficients)


def decode_model(y: np.ndarray, uv: np.ndarray, h: int, w: int, matrix: str,
                 full_range: bool) -> np.ndarray:
    """NV12 -> RGB in float64, unrounded, unclipped; chroma sample (i, j) covers its 2x2 block."""
    kr, kb = KR_KB[matrix]
    kg = 1 - kr - kb
    rows, cols = np.mgrid[0:h, 0:w]
    yy = y[:h, :w].astype(np.float64)
    cb = uv[rows // 2, 2 * (cols // 2)].astype(np.float64) - 128
    cr = uv[rows // 2, 2 * (cols // 2) + 1].astype(np.float64) - 128
    if full_range:
        ey, pb, pr = yy / 255, cb / 255, cr / 255
    else:
        ey, pb, pr = (yy - 16) / 219, cb / 224, cr / 224
    r = ey + 2 * (1 - kr) * pr
    b = ey + 2 * (1 - kb) * pb
    g = (ey - kr * r - kb * b) / kg
    return np.stack([r, g, b], axis=-1) * 255


def encode_model(rgb: np.ndarray, matrix: str, full_range: bool
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """RGB -> (Y, Cb, Cr) in float64, unrounded; chroma is the mean over each 2x2 block."""
    kr, kb = KR_KB[matrix]
    f = rgb.astype(np.float64) / 255
    ey = kr * f[..., 0] + (1 - kr - kb) * f[..., 1] + kb * f[..., 2]
    pb = (f[..., 2] - ey) / (2 * (1 - kb))
    pr = (f[..., 0] - ey) / (2 * (1 - kr))
    if full_range:
        y, cb, cr = 255 * ey, 128 + 255 * pb, 128 + 255 * pr
    else:
        y, cb, cr = 16 + 219 * ey, 128 + 224 * pb, 128 + 224 * pr

    def block_mean(a: np.ndarray) -> np.ndarray:
        return (a[0::2, 0::2] + a[0::2, 1::2] + a[1::2, 0::2] + a[1::2, 1::2]) / 4

    return y, block_mean(cb), block_mean(cr)


def assert_rounded(got: np.ndarray, model: np.ndarray) -> None:
    """`got` (uint8) is the exact `model`, clipped and rounded to nearest: within 0.5 level. The op
    evaluates in float32 (error < 1e-4 level on these magnitudes), so where the exact value lies
    that close to a .5 it may round the other way: hence 0.5 + 1e-3."""
    diff = np.abs(got.astype(np.float64) - np.clip(model, 0, 255))
    assert diff.max() <= 0.5 + 1e-3, diff.max()


# ---------------------------------------------------------------------------------------------------
# NV12 -> RGB


@pytest.mark.parametrize("matrix,full_range", VARIANTS)
def test_nv12_to_rgb_matches_textbook_formula(rng: np.random.Generator, matrix: str,
                                              full_range: bool) -> None:
    h, w = 48, 70
    y = rng.integers(0, 256, (h, w), dtype=np.uint8)
    uv = rng.integers(0, 256, (h // 2, w), dtype=np.uint8)
    out = np.full((h, w, 3), 0xAB, dtype=np.uint8)
    assert nv12_to_rgb(y, uv, out, matrix=matrix, full_range=full_range) is out
    assert_rounded(out, decode_model(y, uv, h, w, matrix, full_range))


def test_nv12_to_rgb_odd_size_and_pitched_planes(rng: np.random.Generator) -> None:
    # Odd height and width end in half blocks, which still own a chroma pair; odd pitches on both
    # planes (a C-contiguous (rows, pitch) array, and a (rows, width) view into a wider buffer).
    h, w = 37, 53
    y_buf = rng.integers(0, 256, (h, w + 13), dtype=np.uint8)
    uv_buf = rng.integers(0, 256, (h // 2 + 1, 2 * (w // 2 + 1) + 7), dtype=np.uint8)
    out = np.full((h, w, 3), 0xAB, dtype=np.uint8)
    nv12_to_rgb(y_buf, uv_buf[:, : 2 * (w // 2 + 1)], out, matrix="bt709")
    assert_rounded(out, decode_model(y_buf, uv_buf, h, w, "bt709", False))
    dense = np.full_like(out, 0x54)
    nv12_to_rgb(np.ascontiguousarray(y_buf[:, :w]),
                np.ascontiguousarray(uv_buf[:, : 2 * (w // 2 + 1)]), dense, matrix="bt709")
    np.testing.assert_array_equal(out, dense)


def test_nv12_to_rgb_matches_opencv(rng: np.random.Generator) -> None:
    # OpenCV's COLOR_YUV2RGB_NV12 is BT.601 limited range with nearest chroma, in 20-bit fixed point.
    # It clamps Y - 16 at 0 (so Y < 16 decodes as 16); we decode footroom as the standard says, so
    # luma is drawn from [16, 255] here. Chroma covers the full [0, 255].
    h, w = 64, 96
    for _ in range(3):
        y = rng.integers(16, 256, (h, w), dtype=np.uint8)
        uv = rng.integers(0, 256, (h // 2, w), dtype=np.uint8)
        out = np.full((h, w, 3), 0xAB, dtype=np.uint8)
        nv12_to_rgb(y, uv, out, matrix="bt601", full_range=False)
        ref = cv2.cvtColorTwoPlane(y, uv.reshape(h // 2, w // 2, 2), cv2.COLOR_YUV2RGB_NV12)
        # Its coefficients are rounded to 2^-20 (error <= 2^-21 * 255 * 3 terms ~ 4e-4 levels) and
        # it rounds once: the results differ only where the exact value is within that of a .5,
        # so by at most 1 level.
        assert np.abs(out.astype(int) - ref.astype(int)).max() <= 1


# ---------------------------------------------------------------------------------------------------
# RGB -> NV12


@pytest.mark.parametrize("matrix,full_range", VARIANTS)
def test_rgb_to_nv12_matches_textbook_formula(rng: np.random.Generator, matrix: str,
                                              full_range: bool) -> None:
    h, w = 40, 66
    rgb = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)  # noise: the 2x2 means matter
    y_out = np.full((h, w), 0xAB, dtype=np.uint8)
    uv_out = np.full((h // 2, w), 0xAB, dtype=np.uint8)
    res = rgb_to_nv12(rgb, y_out, uv_out, matrix=matrix, full_range=full_range)
    assert res[0] is y_out and res[1] is uv_out
    ym, cbm, crm = encode_model(rgb, matrix, full_range)
    assert_rounded(y_out, ym)
    assert_rounded(uv_out[:, 0::2], cbm)
    assert_rounded(uv_out[:, 1::2], crm)


@pytest.mark.parametrize("matrix,yuv", [("bt601", (81, 90, 240)), ("bt709", (63, 102, 240))])
def test_rgb_to_nv12_reference_colours(matrix: str, yuv: tuple[int, int, int]) -> None:
    # Published limited-range values for pure red, white and black.
    for rgb, want in [((255, 0, 0), yuv), ((255, 255, 255), (235, 128, 128)),
                      ((0, 0, 0), (16, 128, 128))]:
        img = np.empty((2, 4, 3), dtype=np.uint8)
        img[...] = rgb
        y_out = np.full((2, 4), 0xAB, dtype=np.uint8)
        uv_out = np.full((1, 4), 0xAB, dtype=np.uint8)
        rgb_to_nv12(img, y_out, uv_out, matrix=matrix)
        assert np.all(y_out == want[0]) and np.all(uv_out[:, 0::2] == want[1])
        assert np.all(uv_out[:, 1::2] == want[2])


def test_rgb_to_nv12_matches_opencv(rng: np.random.Generator) -> None:
    # OpenCV's COLOR_RGB2YUV_I420 is BT.601 limited range in fixed point (coefficients rounded to
    # 2^-20 or 2^-14, one rounding at the end), so values agree within 1 level. Its chroma is the
    # top-left pixel's of each 2x2 block, not the block mean, so chroma is compared on images that
    # are constant over each block (where both are the same); luma on a smooth and a noise image.
    h, w = 64, 96
    for blocky, rgb in ((True, blocky_image(rng, h, w)), (False, smooth_image(rng, h, w)),
                        (False, rng.integers(0, 256, (h, w, 3), dtype=np.uint8))):
        y_out = np.full((h, w), 0xAB, dtype=np.uint8)
        uv_out = np.full((h // 2, w), 0xAB, dtype=np.uint8)
        rgb_to_nv12(rgb, y_out, uv_out, matrix="bt601", full_range=False)
        i420 = cv2.cvtColor(rgb, cv2.COLOR_RGB2YUV_I420)
        assert np.abs(y_out.astype(int) - i420[:h].astype(int)).max() <= 1
        if blocky:
            u = i420[h: h + h // 4].reshape(h // 2, w // 2)
            v = i420[h + h // 4:].reshape(h // 2, w // 2)
            assert np.abs(uv_out[:, 0::2].astype(int) - u.astype(int)).max() <= 1
            assert np.abs(uv_out[:, 1::2].astype(int) - v.astype(int)).max() <= 1


def test_rgb_to_nv12_pitched_outputs_keep_padding(rng: np.random.Generator) -> None:
    h, w = 34, 50
    rgb = smooth_image(rng, h, w)
    y_pad = np.full((h, w + 11), 0xAB, dtype=np.uint8)  # odd pitches
    uv_pad = np.full((h // 2, w + 5), 0xAB, dtype=np.uint8)
    rgb_to_nv12(rgb, y_pad, uv_pad, matrix="bt709", full_range=True)
    assert np.all(y_pad[:, w:] == 0xAB) and np.all(uv_pad[:, w:] == 0xAB)
    y_out = np.full((h, w), 0x54, dtype=np.uint8)
    uv_out = np.full((h // 2, w), 0x54, dtype=np.uint8)
    rgb_to_nv12(rgb, y_out, uv_out, matrix="bt709", full_range=True)
    np.testing.assert_array_equal(y_pad[:, :w], y_out)
    np.testing.assert_array_equal(uv_pad[:, :w], uv_out)


# ---------------------------------------------------------------------------------------------------
# Round trip


def quantisation_bound(matrix: str, full_range: bool) -> float:
    """Worst-case |rgb_to_nv12 -> nv12_to_rgb - exact 4:2:0 model| in RGB levels.

    Y and each chroma code are rounded to nearest (error <= 0.5 code each); a Y code is worth ys RGB
    levels and a chroma code at most max(r_v, g_u + g_v, b_u); the final RGB rounding adds 0.5.
    float32 evaluation adds < 1e-3.
    """
    c = coefficients(matrix, full_range)
    return float(0.5 * c.ys + 0.5 * max(c.r_v, c.g_u + c.g_v, c.b_u) + 0.5 + 1e-3)


@pytest.mark.parametrize("matrix,full_range", VARIANTS)
def test_round_trip(rng: np.random.Generator, matrix: str, full_range: bool) -> None:
    h, w = 96, 128
    bound = quantisation_bound(matrix, full_range)  # 1.64 to 2.14 levels, depending on the variant
    # 1. On images constant over 2x2 blocks, 4:2:0 loses nothing: the only error is quantisation.
    rgb = blocky_image(rng, h, w)
    y_out = np.full((h, w), 0xAB, dtype=np.uint8)
    uv_out = np.full((h // 2, w), 0xAB, dtype=np.uint8)
    back = np.full((h, w, 3), 0xAB, dtype=np.uint8)
    rgb_to_nv12(rgb, y_out, uv_out, matrix=matrix, full_range=full_range)
    nv12_to_rgb(y_out, uv_out, back, matrix=matrix, full_range=full_range)
    assert np.abs(back.astype(int) - rgb.astype(int)).max() <= bound

    # 2. On smooth images each pixel keeps its own luma and gets its block's mean chroma. The exact
    # model of that (float64, no quantisation) is decoding the unrounded encode; the round trip
    # must stay within the quantisation bound of it.
    rgb = smooth_image(rng, h, w, factor=16)
    rgb_to_nv12(rgb, y_out, uv_out, matrix=matrix, full_range=full_range)
    nv12_to_rgb(y_out, uv_out, back, matrix=matrix, full_range=full_range)
    ym, cbm, crm = encode_model(rgb, matrix, full_range)
    kr, kb = KR_KB[matrix]
    cb = np.repeat(np.repeat(cbm, 2, 0), 2, 1) - 128
    cr = np.repeat(np.repeat(crm, 2, 0), 2, 1) - 128
    ey = ym / 255 if full_range else (ym - 16) / 219
    pb, pr = (cb / 255, cr / 255) if full_range else (cb / 224, cr / 224)
    r = ey + 2 * (1 - kr) * pr
    b = ey + 2 * (1 - kb) * pb
    g = (ey - kr * r - kb * b) / (1 - kr - kb)
    model = np.clip(np.stack([r, g, b], axis=-1) * 255, 0, 255)
    assert np.abs(back - model).max() <= bound
    # ... and, for scale, the subsampling itself costs these smooth images only a few levels.
    assert np.abs(back.astype(int) - rgb.astype(int)).mean() < 5


# ---------------------------------------------------------------------------------------------------
# Argument checks


def test_nv12_errors_name_the_argument(rng: np.random.Generator) -> None:
    h, w = 8, 10
    y = rng.integers(0, 256, (h, w), dtype=np.uint8)
    uv = rng.integers(0, 256, (h // 2, w), dtype=np.uint8)
    out = np.full((h, w, 3), 0xAB, dtype=np.uint8)
    bad = [
        ("y", lambda: nv12_to_rgb(y[:, :-1], uv, out)),
        ("y", lambda: nv12_to_rgb(y.astype(np.int16), uv, out)),
        ("uv", lambda: nv12_to_rgb(y, uv[:-1], out)),
        ("uv", lambda: nv12_to_rgb(y, uv[:, :-1], out)),
        ("out", lambda: nv12_to_rgb(y, uv, out[..., :2])),
        ("out", lambda: nv12_to_rgb(y, uv, out.astype(np.float32))),
        ("matrix", lambda: nv12_to_rgb(y, uv, out, matrix="bt2020")),
        ("full_range", lambda: nv12_to_rgb(y, uv, out, full_range="yes")),
        ("rgb", lambda: rgb_to_nv12(out[:-1], y, uv)),
        ("rgb", lambda: rgb_to_nv12(out[:, :-1], y, uv)),
        ("y_out", lambda: rgb_to_nv12(out, y[:-2], uv)),
        ("y_out", lambda: rgb_to_nv12(out, y[:, :-1], uv)),
        ("uv_out", lambda: rgb_to_nv12(out, y, uv[:-1])),
        ("uv_out", lambda: rgb_to_nv12(out, y, uv.astype(np.float32))),
        ("matrix", lambda: rgb_to_nv12(out, y, uv, matrix=709)),
    ]
    for name, call in bad:
        with pytest.raises(ValueError, match=rf"^{name}\b"):
            call()


def test_refs_are_the_cpu_path(rng: np.random.Generator) -> None:
    h, w = 16, 22
    rgb = smooth_image(rng, h, w)
    a = (np.full((h, w + 3), 1, np.uint8), np.full((h // 2, w + 1), 1, np.uint8))
    b = (np.full((h, w + 3), 2, np.uint8), np.full((h // 2, w + 1), 2, np.uint8))
    rgb_to_nv12(rgb, *a, matrix="bt601")
    rgb_to_nv12_ref(rgb, *b, matrix="bt601")
    np.testing.assert_array_equal(a[0][:, :w], b[0][:, :w])
    np.testing.assert_array_equal(a[1][:, :w], b[1][:, :w])
    o1, o2 = np.full((h, w, 3), 1, np.uint8), np.full((h, w, 3), 2, np.uint8)
    nv12_to_rgb(a[0], a[1], o1, matrix="bt601", full_range=True)
    nv12_to_rgb_ref(a[0], a[1], o2, matrix="bt601", full_range=True)
    np.testing.assert_array_equal(o1, o2)


# ---------------------------------------------------------------------------------------------------
# crop_batch


def face_mats(rng: np.random.Generator, n: int, size: int, h: int, w: int) -> np.ndarray:
    """Crop -> frame similarity transforms for n faces; some reach past the frame's edges."""
    mats = np.empty((n, 2, 3), dtype=np.float32)
    for i in range(n):
        a = rng.uniform(-0.7, 0.7)
        s = rng.uniform(0.4, 2.5)  # frame pixels per crop pixel
        cx, cy = rng.uniform(-0.1 * w, 1.1 * w), rng.uniform(-0.1 * h, 1.1 * h)
        lin = s * np.array([[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]])
        t = np.array([cx, cy]) - lin @ np.array([size / 2, size / 2])
        mats[i] = np.hstack([lin, t[:, None]])
    return mats


def opencv_crops(frame: np.ndarray, mats: np.ndarray, size: int, bgr: bool, mean: np.ndarray,
                 std: np.ndarray) -> np.ndarray:
    crops = []
    for m in mats:
        c = cv2.warpAffine(frame, m, (size, size), flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
                           borderMode=cv2.BORDER_REPLICATE).astype(np.float64)
        if bgr:
            c = c[..., ::-1]
        crops.append(((c / 255 - mean) / std).transpose(2, 0, 1))
    return np.stack(crops)


def opencv_tolerance(frame: np.ndarray) -> float:
    """How far OpenCV's warpAffine may be from exact bilinear sampling, in 0..255 levels.

    It rounds each source coordinate to 1/32 pixel (INTER_BITS=5; the coordinate itself is first
    rounded to 1/1024, AB_BITS=10), so a sample is taken up to 1/64 + 1/1024 px off in x and in y.
    The bilinear value changes by at most the largest neighbour difference (dx, dy) per pixel moved.
    Its 15-bit weights add < 255 * 4 / 32768 ~ 0.03 and it rounds to uint8 (0.5).
    """
    f = frame.astype(np.int32)
    dx = np.abs(np.diff(f, axis=1)).max()
    dy = np.abs(np.diff(f, axis=0)).max()
    return 0.5 + (dx + dy) * (1 / 64 + 1 / 1024) + 0.05


@pytest.mark.parametrize("n", [1, 4])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_crop_batch_matches_opencv(rng: np.random.Generator, n: int, dtype: type) -> None:
    h, w, size = 120, 160, 64
    mean = np.array([0.485, 0.456, 0.406])
    std = np.array([0.229, 0.224, 0.225])
    for frame in (smooth_image(rng, h, w), rng.integers(0, 256, (h, w, 3), dtype=np.uint8)):
        mats = face_mats(rng, n, size, h, w)
        for bgr in (False, True):
            out = np.full((n, 3, size, size), np.nan, dtype=dtype)
            assert crop_batch(frame, mats, out, bgr=bgr, mean=tuple(mean),
                              std=tuple(std)) is out
            assert np.all(np.isfinite(out))
            ref = opencv_crops(frame, mats, size, bgr, mean, std)
            s = std[::-1] if bgr else std
            # Back from normalised units to 0..255 levels.
            levels = np.abs(out.astype(np.float64) - ref) * s[None, :, None, None] * 255
            # fp16 keeps 11 significant bits: values up to |(1 - 0.406) / 0.225| ~ 2.6 are stored
            # within 2^-10 (relative 2^-11 of 2 to 4), i.e. 2^-10 * 0.229 * 255 ~ 0.06 level.
            tol = opencv_tolerance(frame) + (0.06 if dtype == np.float16 else 0.0)
            assert levels.max() <= tol, (levels.max(), tol)


def test_crop_batch_bgr_fp16_and_exact_bilinear(rng: np.random.Generator) -> None:
    h, w, size, n = 50, 70, 24, 3
    frame = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    mats = face_mats(rng, n, size, h, w)
    mean, std = (0.1, 0.5, 0.9), (0.3, 0.6, 1.2)
    rgb = np.full((n, 3, size, size), np.nan, dtype=np.float32)
    crop_batch(frame, mats, rgb, mean=mean, std=std)
    bgr = np.full((n, 3, size, size), np.nan, dtype=np.float32)
    crop_batch(frame, mats, bgr, bgr=True, mean=mean[::-1], std=std[::-1])
    # The swap only reorders channels (mean and std are per output channel): bit-identical.
    np.testing.assert_array_equal(bgr, rgb[:, ::-1])
    half = np.full((n, 3, size, size), np.nan, dtype=np.float16)
    crop_batch_ref(frame, mats, half, mean=mean, std=std)
    np.testing.assert_array_equal(half, rgb.astype(np.float16))
    # Direct float64 bilinear with replicated borders at a few pixels of each face.
    for i in range(n):
        m = mats[i].astype(np.float64)
        for oy, ox in rng.integers(0, size, (6, 2)):
            sx = m[0, 0] * ox + m[0, 1] * oy + m[0, 2]
            sy = m[1, 0] * ox + m[1, 1] * oy + m[1, 2]
            x0, y0 = int(np.floor(sx)), int(np.floor(sy))
            fx, fy = sx - x0, sy - y0

            def px(yy: int, xx: int) -> np.ndarray:
                return frame[min(max(yy, 0), h - 1), min(max(xx, 0), w - 1)].astype(np.float64)

            v = ((px(y0, x0) * (1 - fx) + px(y0, x0 + 1) * fx) * (1 - fy)
                 + (px(y0 + 1, x0) * (1 - fx) + px(y0 + 1, x0 + 1) * fx) * fy)
            want = (v / 255 - np.array(mean)) / np.array(std)
            # float32 weights and arithmetic on values up to 255: ~1e-4 level, /255/0.3 ~ 2e-6.
            np.testing.assert_allclose(rgb[i, :, oy, ox], want, atol=1e-5)


def test_crop_batch_errors_name_the_argument(rng: np.random.Generator) -> None:
    frame = rng.integers(0, 256, (20, 30, 3), dtype=np.uint8)
    mats = face_mats(rng, 2, 8, 20, 30)
    out = np.full((2, 3, 8, 8), np.nan, dtype=np.float32)
    bad = [
        ("frame", lambda: crop_batch(frame[..., :2], mats, out)),
        ("frame", lambda: crop_batch(frame.astype(np.float32), mats, out)),
        ("mats", lambda: crop_batch(frame, mats.astype(np.float64), out)),
        ("mats", lambda: crop_batch(frame, mats[:, :, :2], out)),
        ("out", lambda: crop_batch(frame, mats[:1], out)),
        ("out", lambda: crop_batch(frame, mats, out.astype(np.float64))),
        ("out", lambda: crop_batch(frame, mats, out[..., :7])),
        ("out", lambda: crop_batch(frame, mats, out[:, :2])),
        ("bgr", lambda: crop_batch(frame, mats, out, bgr=1)),
        ("mean", lambda: crop_batch(frame, mats, out, mean=(0.5, 0.5))),
        ("mean", lambda: crop_batch(frame, mats, out, mean=(0.5, float("nan"), 0.5))),
        ("std", lambda: crop_batch(frame, mats, out, std=(1.0, 0.0, 1.0))),
        ("std", lambda: crop_batch(frame, mats, out, std="abc")),
    ]
    for name, call in bad:
        with pytest.raises(ValueError, match=rf"^{name}\b"):
            call()


def test_rgb_to_i420_is_nv12_with_split_chroma(rng: np.random.Generator) -> None:
    from swapstream.kernels.nv12 import rgb_to_i420

    h, w = 48, 70
    rgb = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    y, uv = np.empty((h, w), np.uint8), np.empty((h // 2, w), np.uint8)
    rgb_to_nv12_ref(rgb, y, uv, matrix="bt709")
    out = np.full((h * 3 // 2, w), 7, np.uint8)
    rgb_to_i420(rgb, out, np.empty((h // 2, w), np.uint8), matrix="bt709")
    q = (h // 2) * (w // 2)
    flat = out.reshape(-1)
    np.testing.assert_array_equal(out[:h], y)
    np.testing.assert_array_equal(flat[h * w:h * w + q].reshape(h // 2, w // 2), uv[:, 0::2])
    np.testing.assert_array_equal(flat[h * w + q:].reshape(h // 2, w // 2), uv[:, 1::2])
    # The layout FFmpeg's yuv420p has: PyAV reads it back as the same planes.
    import av

    frame = av.VideoFrame.from_ndarray(out, format="yuv420p")
    np.testing.assert_array_equal(frame.to_ndarray(format="yuv420p"), out)
    with pytest.raises(ValueError, match="out must have shape"):
        rgb_to_i420(rgb, np.empty((h, w), np.uint8), np.empty((h // 2, w), np.uint8))
