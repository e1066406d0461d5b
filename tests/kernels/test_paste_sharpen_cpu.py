"""NumPy references of paste-back, its box mask, and sharpen: against OpenCV, FaceFusion's formulas
and direct evaluation.

Inputs are fresh random data for every test (never zeros; smooth images where interpolation matters).
The ops work in place, so every test compares the WHOLE frame, which catches writes outside the box.
"""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from swapstream.kernels.mask import gaussian_blur
from swapstream.kernels.paste import box_mask, box_mask_ref, paste_back, paste_back_ref, paste_box
from swapstream.kernels.sharpen import sharpen, sharpen_ref


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng()


# ----------------------------------------------------------------------------------------------
# helpers, shared with test_paste_sharpen_gpu.py


def smooth_image(rng: np.random.Generator, h: int, w: int, cell: int = 8) -> np.ndarray:
    """Random but locally smooth uint8 RGB content (bicubic upsampling of random cells)."""
    small = rng.integers(0, 256, (h // cell + 2, w // cell + 2, 3), dtype=np.uint8)
    return cv2.resize(small, (w, h), interpolation=cv2.INTER_CUBIC)


def smooth_crop(rng: np.random.Generator, s: int) -> np.ndarray:
    """A smooth float32 face crop in [0, 255], not integer-valued (a model's output is not)."""
    c = smooth_image(rng, s, s).astype(np.float32) + rng.uniform(-0.5, 0.5, (s, s, 3)).astype(np.float32)
    return np.clip(c, 0, 255).astype(np.float32)


def crop_to_frame_affine(rng: np.random.Generator, s: int, h: int, w: int, *,
                         scale: tuple[float, float] = (0.5, 3.0),
                         outside: bool = False) -> np.ndarray:
    """A random similarity (any rotation, scale in `scale`) from crop pixels to frame pixels that
    puts the crop's centre inside the frame, or near an edge so that part of it hangs outside."""
    k = rng.uniform(*scale)
    a = rng.uniform(-np.pi, np.pi)
    r = np.array([[k * np.cos(a), -k * np.sin(a)], [k * np.sin(a), k * np.cos(a)]])
    if outside:
        # The crop's half-extent along either axis is >= k*s/2 for any rotation: a centre within
        # 0.4*k*s of an edge leaves part of the crop on each side of it.
        off = rng.uniform(-0.4, 0.4) * k * s
        edge = rng.integers(4)
        cx = [off, w + off, rng.uniform(0, w), rng.uniform(0, w)][edge]
        cy = [rng.uniform(0, h), rng.uniform(0, h), off, h + off][edge]
    else:
        cx, cy = rng.uniform(0.3 * w, 0.7 * w), rng.uniform(0.3 * h, 0.7 * h)
    centre = np.array([(s - 1) / 2, (s - 1) / 2])
    t = np.array([cx, cy]) - r @ centre
    return np.hstack([r, t[:, None]])


def random_padding(rng: np.random.Generator) -> tuple[float, float, float, float]:
    return tuple(float(v) for v in rng.uniform(0, 25, 4))  # type: ignore[return-value]


def facefusion_box_mask(s: int, blur: float, padding: tuple[float, ...]) -> np.ndarray:
    """FaceFusion's create_static_box_mask, written out with OpenCV."""
    blur_amount = int(s * 0.5 * blur)
    blur_area = max(blur_amount // 2, 1)
    m = np.ones((s, s), np.float32)
    m[:max(blur_area, int(s * padding[0] / 100)), :] = 0
    m[-max(blur_area, int(s * padding[2] / 100)):, :] = 0
    m[:, :max(blur_area, int(s * padding[3] / 100))] = 0
    m[:, -max(blur_area, int(s * padding[1] / 100)):] = 0
    if blur_amount > 0:
        m = cv2.GaussianBlur(m, (0, 0), blur_amount * 0.25)
    return m


def opencv_paste(frame: np.ndarray, crop: np.ndarray, crop_to_frame: np.ndarray,
                 mask: np.ndarray) -> np.ndarray:
    """The host-bound composition: warp crop and mask over the whole frame with the forward matrix
    (OpenCV inverts it), blend, round; pixels with m == 0 keep their value."""
    h, w = frame.shape[:2]
    fg = cv2.warpAffine(crop, crop_to_frame, (w, h), flags=cv2.INTER_LINEAR,
                        borderMode=cv2.BORDER_REPLICATE)
    m = cv2.warpAffine(mask, crop_to_frame, (w, h), flags=cv2.INTER_LINEAR,
                       borderMode=cv2.BORDER_CONSTANT, borderValue=0)
    m = np.clip(m, 0, 1)[..., None]
    mixed = frame.astype(np.float32) * (1 - m) + fg * m
    return np.where(m > 0, np.clip(np.rint(mixed), 0, 255), frame).astype(np.uint8)


# ----------------------------------------------------------------------------------------------
# box mask


@pytest.mark.parametrize("s", [128, 256])
@pytest.mark.parametrize("blur", [0.0, 0.1, 0.3, 0.5])
def test_box_mask_matches_facefusion(rng: np.random.Generator, s: int, blur: float) -> None:
    pad = random_padding(rng)
    out = np.full((s, s), np.nan, np.float32)
    box_mask(out, blur=blur, padding=pad)
    ref = facefusion_box_mask(s, blur, pad)
    d = np.abs(out - ref)
    if blur == 0:
        assert np.array_equal(out, ref)  # no blur: the same zeroed box, exactly
        return
    r = int(np.ceil(3 * 0.25 * int(s * 0.5 * blur)))
    # Inside the outer band of r pixels only the kernel radius differs (ours 3 sigma, OpenCV's
    # 4 sigma): the tail mass beyond 3 sigma is 0.27%, renormalised away, so < 5e-3.
    assert d[r:s - r, r:s - r].max() < 5e-3
    # In the outer band OpenCV's BORDER_REFLECT_101 folds the ones back onto the edge where we
    # replicate the zeros: the zeroed band is >= 2 sigma wide, so the folded mass is ~Phi(-2) ~ 2.3%,
    # plus truncation. Measured <= 0.045 (at sigma = 1.5), never above FaceFusion's value by more
    # than the 5e-3 truncation difference.
    assert d.max() < 0.05
    assert np.all(out <= ref + 5e-3)


def test_box_mask_keep_out_and_range(rng: np.random.Generator) -> None:
    s = 128
    keep = rng.uniform(0, 1, (s, s)).astype(np.float32)
    base = box_mask_ref(np.full((s, s), -1.0, np.float32), blur=0.3, padding=random_padding(rng))
    out = np.full((s, s), -1.0, np.float32)
    box_mask(out, blur=0.3, padding=(0, 0, 0, 0), keep_out=keep)
    plain = box_mask_ref(np.empty((s, s), np.float32), blur=0.3)
    assert np.array_equal(out, plain * (1 - keep))  # same float32 operations
    # Capped at 1; the float32 taps sum to 1 only within a few ulps, so the interior is 1 - O(1e-7).
    assert base.min() >= 0 and base.max() <= 1 and plain.max() > 1 - 1e-6


def test_box_mask_rejects_bad_arguments() -> None:
    ok = np.zeros((8, 8), np.float32)
    with pytest.raises(ValueError, match="out"):
        box_mask(np.zeros((8, 9), np.float32))
    with pytest.raises(ValueError, match="out"):
        box_mask(np.zeros((8, 8), np.float64))
    with pytest.raises(ValueError, match="blur"):
        box_mask(ok, blur=-0.1)
    with pytest.raises(ValueError, match="padding"):
        box_mask(ok, padding=(0, 0, 0))
    with pytest.raises(ValueError, match="padding"):
        box_mask(ok, padding=(0, 0, 0, 101))
    with pytest.raises(ValueError, match="keep_out"):
        box_mask(ok, keep_out=np.zeros((8, 7), np.float32))


# ----------------------------------------------------------------------------------------------
# paste-back


@pytest.mark.parametrize("s", [128, 256])
@pytest.mark.parametrize("blur", [0.0, 0.3])
def test_paste_back_matches_opencv_composition(rng: np.random.Generator, s: int, blur: float) -> None:
    h, w = 300, 400
    for i in range(4):
        frame = smooth_image(rng, h, w)
        crop = smooth_crop(rng, s)
        m = crop_to_frame_affine(rng, s, h, w, scale=(0.5, 2.0) if s == 256 else (0.5, 3.0),
                                 outside=i % 2 == 1)
        pad = random_padding(rng)
        mask = box_mask_ref(np.empty((s, s), np.float32), blur=blur, padding=pad)
        ref = opencv_paste(frame, crop, m, mask)
        out = frame.copy()
        box = paste_back(out, crop, m, blur=blur, padding=pad)
        d = np.abs(out.astype(int) - ref.astype(int))
        # OpenCV 5 samples float32 images at unsnapped positions (the 1/32-pixel INTER_BITS snapping
        # applies to 8-bit images only), but computes the inverse map and the bilinear weights in
        # its own float order: positions agree to ~1e-4 px, results to < 0.05 level even across
        # the hard mask edge of blur 0 (slope <= 1/px times a difference <= 255). Rounding can then
        # differ only where a value sits that close to a .5: one level, on a few pixels in 10^4
        # (measured: <= 2e-4 of the frame's elements).
        assert d.max() <= 1, (i, d.max())
        assert (d > 0).mean() < 2e-3
        x0, y0, x1, y1 = box
        # The box covers every pixel that OpenCV's composition changed.
        changed = np.argwhere(np.any(ref != frame, axis=2))
        if changed.size:
            assert changed[:, 1].min() >= x0 and changed[:, 1].max() < x1
            assert changed[:, 0].min() >= y0 and changed[:, 0].max() < y1


def test_paste_back_direct_formula(rng: np.random.Generator) -> None:
    s, h, w = 128, 260, 310
    frame = smooth_image(rng, h, w)
    crop = smooth_crop(rng, s)
    m = crop_to_frame_affine(rng, s, h, w)
    gain = rng.uniform(0.8, 1.2, 3).astype(np.float32)
    offset = rng.uniform(-10, 10, 3).astype(np.float32)
    keep = rng.uniform(0, 1, (s, s)).astype(np.float32)
    out = frame.copy()
    x0, y0, x1, y1 = paste_back(out, crop, m, blur=0.3, padding=(5, 0, 10, 3), keep_out=keep,
                                color_gain=gain, color_offset=offset)
    mask = box_mask_ref(np.empty((s, s), np.float32), blur=0.3, padding=(5, 0, 10, 3), keep_out=keep)
    inv = np.linalg.inv(np.vstack([m, [0, 0, 1]]))
    for _ in range(400):
        px, py = int(rng.integers(x0, x1)), int(rng.integers(y0, y1))
        sx, sy, _ = inv @ [px, py, 1.0]
        ix, iy = int(np.floor(sx)), int(np.floor(sy))
        fx, fy = sx - ix, sy - iy

        def tap(a: np.ndarray, yy: int, xx: int, replicate: bool) -> np.ndarray:
            if replicate:
                return a[min(max(yy, 0), s - 1), min(max(xx, 0), s - 1)].astype(np.float64)
            inside = 0 <= yy < s and 0 <= xx < s
            return np.float64(a[yy, xx]) if inside else np.float64(0.0)

        def bil(a: np.ndarray, replicate: bool) -> np.ndarray:
            return ((tap(a, iy, ix, replicate) * (1 - fx) + tap(a, iy, ix + 1, replicate) * fx)
                    * (1 - fy)
                    + (tap(a, iy + 1, ix, replicate) * (1 - fx) + tap(a, iy + 1, ix + 1, replicate)
                       * fx) * fy)

        mv = float(np.clip(bil(mask, False), 0, 1))
        if mv == 0:
            assert np.array_equal(out[py, px], frame[py, px])
            continue
        fg = np.clip(bil(crop, True) * gain + offset, 0, 255)
        want = frame[py, px] * (1 - mv) + fg * mv
        # float32 against float64 arithmetic: the results differ by ~1e-4 levels, so rounding may
        # only differ where the exact value is within that of a .5: at most one level.
        assert np.abs(out[py, px].astype(float) - want).max() <= 0.5 + 1e-3
    assert np.array_equal(out[:y0], frame[:y0]) and np.array_equal(out[y1:], frame[y1:])
    assert np.array_equal(out[:, :x0], frame[:, :x0]) and np.array_equal(out[:, x1:], frame[:, x1:])


def test_paste_back_integer_translation_copies_the_crop(rng: np.random.Generator) -> None:
    s, h, w = 128, 200, 220
    frame = rng.integers(1, 255, (h, w, 3), dtype=np.uint8)
    crop = rng.uniform(0, 255, (s, s, 3)).astype(np.float32)
    tx, ty = int(rng.integers(-20, 80)), int(rng.integers(-20, 60))
    m = np.array([[1.0, 0, tx], [0, 1.0, ty]])
    out = frame.copy()
    box = paste_back(out, crop, m, blur=0.0)
    # The footprint (-1, S) mapped by the translation, clipped to the frame.
    assert box == (max(tx - 1, 0), max(ty - 1, 0), min(tx + s, w), min(ty + s, h))
    # blur 0: the mask is 1 inside a 1-pixel zero border (FaceFusion's blur_area minimum), so the
    # interior is the crop, rounded; everything else is untouched.
    want = frame.copy()
    ys = slice(max(ty + 1, 0), min(ty + s - 1, h))
    xs = slice(max(tx + 1, 0), min(tx + s - 1, w))
    cys = slice(ys.start - ty, ys.stop - ty)
    cxs = slice(xs.start - tx, xs.stop - tx)
    want[ys, xs] = np.rint(crop[cys, cxs]).astype(np.uint8)
    assert np.array_equal(out, want)
    # Colour correction and a constant keep_out of 0.25 (m = 0.75) on the same placement.
    gain = np.array([1.1, 0.9, 1.3], np.float32)
    offset = np.array([-20, 5, 30], np.float32)
    keep = np.full((s, s), 0.25, np.float32)
    out = frame.copy()
    paste_back(out, crop, m, blur=0.0, keep_out=keep, color_gain=gain, color_offset=offset)
    fg = np.clip(crop[cys, cxs] * gain + offset, 0, 255)
    mixed = frame[ys, xs].astype(np.float32) * np.float32(0.25) + fg * np.float32(0.75)
    want[ys, xs] = np.rint(mixed).astype(np.uint8)
    assert np.array_equal(out, want)


def test_paste_back_keep_out_everywhere_and_off_frame_change_nothing(rng: np.random.Generator) -> None:
    s, h, w = 128, 180, 240
    frame = smooth_image(rng, h, w)
    crop = smooth_crop(rng, s)
    m = crop_to_frame_affine(rng, s, h, w, outside=True)
    out = frame.copy()
    paste_back(out, crop, m, keep_out=np.ones((s, s), np.float32))
    assert np.array_equal(out, frame)
    far = m.copy()
    far[:, 2] += (5 * w, 0)
    out = frame.copy()
    x0, y0, x1, y1 = paste_back(out, crop, far)
    assert x1 == x0 == w and np.array_equal(out, frame)


def test_paste_back_gain_only_and_offset_only(rng: np.random.Generator) -> None:
    s, h, w = 128, 200, 200
    frame = smooth_image(rng, h, w)
    crop = smooth_crop(rng, s)
    m = crop_to_frame_affine(rng, s, h, w)
    gain = rng.uniform(0.7, 1.3, 3).astype(np.float32)
    offset = rng.uniform(-30, 30, 3).astype(np.float32)
    a, b = frame.copy(), frame.copy()
    paste_back(a, crop, m, color_gain=gain)
    paste_back(b, crop, m, color_gain=gain, color_offset=np.zeros(3, np.float32))
    assert np.array_equal(a, b)
    a, b = frame.copy(), frame.copy()
    paste_back(a, crop, m, color_offset=offset)
    paste_back(b, crop, m, color_gain=np.ones(3, np.float32), color_offset=offset)
    assert np.array_equal(a, b)


def test_paste_box_matches_facefusion_plus_footprint(rng: np.random.Generator) -> None:
    s = 128
    m = crop_to_frame_affine(rng, s, 1000, 1000)
    corners = np.array([[0, 0], [s, 0], [s, s], [0, s]], np.float64) @ m[:, :2].T + m[:, 2]
    x0, y0, x1, y1 = paste_box((1000, 1000), s, m)
    # FaceFusion's box (corners 0 and S) lies inside ours; ours grows it by one crop pixel mapped.
    assert x0 <= np.floor(corners[:, 0].min()) and x1 >= np.ceil(corners[:, 0].max())
    assert y0 <= np.floor(corners[:, 1].min()) and y1 >= np.ceil(corners[:, 1].max())
    grow = 2 * np.abs(m[:, :2]).sum(axis=1).max() + 2
    assert x1 - x0 <= np.ptp(corners[:, 0]) + grow and y1 - y0 <= np.ptp(corners[:, 1]) + grow


def test_paste_back_rejects_bad_arguments() -> None:
    frame = np.zeros((50, 60, 3), np.uint8)
    crop = np.zeros((16, 16, 3), np.float32)
    m = np.array([[1.0, 0, 5], [0, 1.0, 5]])
    cases = [
        ("frame", dict(frame=np.zeros((50, 60, 4), np.uint8))),
        ("frame", dict(frame=np.zeros((50, 60, 3), np.float32))),
        ("crop", dict(crop=np.zeros((16, 15, 3), np.float32))),
        ("crop", dict(crop=np.zeros((16, 16, 3), np.uint8))),
        ("crop_to_frame", dict(crop_to_frame=np.eye(3))),
        ("crop_to_frame", dict(crop_to_frame=np.zeros((2, 3)))),
        ("crop_to_frame", dict(crop_to_frame=np.array([[1.0, 0, np.nan], [0, 1, 0]]))),
        ("blur", dict(blur=-1.0)),
        ("blur", dict(blur=float("inf"))),
        ("padding", dict(padding=(1, 2, 3))),
        ("padding", dict(padding=(1, 2, 3, -4))),
        ("keep_out", dict(keep_out=np.zeros((16, 16), np.float64))),
        ("keep_out", dict(keep_out=np.zeros((15, 16), np.float32))),
        ("color_gain", dict(color_gain=np.ones(4, np.float32))),
        ("color_gain", dict(color_gain=np.ones(3, np.float64))),
        ("color_offset", dict(color_offset=np.array([0, np.inf, 0], np.float32))),
    ]
    for name, kw in cases:
        args = dict(frame=frame, crop=crop, crop_to_frame=m)
        args.update({k: v for k, v in kw.items() if k in args})
        opts = {k: v for k, v in kw.items() if k not in args}
        for fn in (paste_back, paste_back_ref):
            with pytest.raises(ValueError, match=name):
                fn(args["frame"], args["crop"], args["crop_to_frame"], **opts)
    assert not frame.any()


# ----------------------------------------------------------------------------------------------
# sharpen


def unsharp_whole_frame(frame: np.ndarray, amount: float, radius: float) -> np.ndarray:
    """The specification, written with mask.gaussian_blur (replicated border) over the whole frame."""
    x = frame.astype(np.float32)
    g = gaussian_blur(x, radius, np.empty_like(x))
    return np.clip(np.rint(x + np.float32(amount) * (x - g)), 0, 255).astype(np.uint8)


@pytest.mark.parametrize("radius", [0.8, 1.5, 3.0])
def test_sharpen_box_equals_whole_frame_sharpen_cropped(rng: np.random.Generator,
                                                         radius: float) -> None:
    h, w = 90, 120
    frame = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    amount = float(rng.uniform(0.2, 1.5))
    whole = unsharp_whole_frame(frame, amount, radius)
    boxes = [(0, 0, w, h),                                         # the whole frame
             (int(rng.integers(5, 40)), int(rng.integers(5, 30)), int(rng.integers(60, 110)),
              int(rng.integers(50, 85))),                          # inside, away from the edges
             (0, int(rng.integers(0, 40)), int(rng.integers(20, 60)), h),  # touching left + bottom
             (int(rng.integers(60, 110)), -15, w + 30, int(rng.integers(10, 40)))]  # hanging over
    for box in boxes:
        out = frame.copy()
        x0, y0, x1, y1 = sharpen(out, box, amount=amount, radius=radius)
        assert (x0, y0, x1, y1) == (max(box[0], 0), max(box[1], 0), min(box[2], w), min(box[3], h))
        want = frame.copy()
        want[y0:y1, x0:x1] = whole[y0:y1, x0:x1]
        assert np.array_equal(out, want), box  # same float32 operations in the same order


def test_sharpen_matches_opencv(rng: np.random.Generator) -> None:
    frame = smooth_image(rng, 80, 100, cell=3)
    for radius in (0.8, 1.5, 3.0):
        out = frame.copy()
        sharpen(out, (0, 0, 100, 80), amount=0.7, radius=radius)
        r = int(np.ceil(3 * radius))
        x = frame.astype(np.float32)
        g = cv2.GaussianBlur(x, (2 * r + 1, 2 * r + 1), radius, borderType=cv2.BORDER_REPLICATE)
        ref = np.clip(np.rint(x + 0.7 * (x - g)), 0, 255).astype(np.uint8)
        d = np.abs(out.astype(int) - ref.astype(int))
        # Same taps (OpenCV's getGaussianKernel with this ksize), summed in another order and with
        # OpenCV's own float rounding: the blurs differ by ~1e-4, so a result only changes where
        # the exact value sits within that of a .5: one level, on a tiny fraction of pixels.
        assert d.max() <= 1 and (d > 0).mean() < 1e-2


def test_sharpen_edge_cases(rng: np.random.Generator) -> None:
    frame = rng.integers(0, 256, (40, 50, 3), dtype=np.uint8)
    out = frame.copy()
    sharpen(out, (3, 4, 30, 33), amount=0.0)
    assert np.array_equal(out, frame)  # x + 0 * (x - g) == x exactly
    assert sharpen(out, (60, 10, 80, 20)) == (50, 10, 50, 20)  # off-frame: empty, untouched
    assert sharpen(out, (10, 10, 10, 20)) == (10, 10, 10, 20)
    assert np.array_equal(out, frame)
    a, b = frame.copy(), frame.copy()
    assert sharpen(a, (2, 3, 40, 30), radius=1.2) == sharpen_ref(b, (2, 3, 40, 30), radius=1.2)
    assert np.array_equal(a, b)


def test_sharpen_rejects_bad_arguments() -> None:
    frame = np.zeros((20, 20, 3), np.uint8)
    for fn in (sharpen, sharpen_ref):
        with pytest.raises(ValueError, match="frame"):
            fn(np.zeros((20, 20), np.uint8), (0, 0, 5, 5))
        with pytest.raises(ValueError, match="frame"):
            fn(np.zeros((20, 20, 3), np.float32), (0, 0, 5, 5))
        with pytest.raises(ValueError, match="box"):
            fn(frame, (0, 0, 5))
        with pytest.raises(ValueError, match="box"):
            fn(frame, (0, 0, 5.5, 5))
        with pytest.raises(ValueError, match="box"):
            fn(frame, (6, 0, 5, 5))
        with pytest.raises(ValueError, match="amount"):
            fn(frame, (0, 0, 5, 5), amount=float("nan"))
        with pytest.raises(ValueError, match="radius"):
            fn(frame, (0, 0, 5, 5), radius=0.0)
