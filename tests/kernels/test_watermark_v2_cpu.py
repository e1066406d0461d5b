"""The v2 embedding's NumPy reference (kernels/watermark_v2.py) against direct per-block loops.

Fresh random frames every run, sizes that cut blocks at the frame's edge. Every element of every
result is compared, without tolerance: the reference is integer arithmetic up to one float32
division, one product and one rounding, which the loops below perform with the same float32 values.
"""

from __future__ import annotations

import numpy as np
import pytest

from swapstream.kernels.watermark_v2 import (MASK_BLOCK, CpuScratch, MaskParams, block_scale_ref, embed_masked,
                                             embed_masked_cpu, embed_masked_ref, integer_luma, luma_u8,
                                             masked_delta_ref)

SIZES = [(37, 53), (8, 8), (16, 24), (9, 17), (1, 1), (64, 40)]


def _luma_direct(frame: np.ndarray) -> np.ndarray:
    f = frame.astype(np.int64)
    return (9798 * f[..., 0] + 19235 * f[..., 1] + 3735 * f[..., 2] + 16384) // 32768


def _scale_direct(frame: np.ndarray, p: MaskParams) -> np.ndarray:
    """m(b) block by block, as the module doc defines it, with Python loops."""
    y = _luma_direct(frame)
    h, w = y.shape
    bh, bw = -(-h // MASK_BLOCK), -(-w // MASK_BLOCK)
    out = np.empty((bh, bw), np.float32)
    for by in range(bh):
        for bx in range(bw):
            y0, x0 = by * MASK_BLOCK, bx * MASK_BLOCK
            blk = y[y0:y0 + MASK_BLOCK, x0:x0 + MASK_BLOCK]
            act = int(np.abs(np.diff(blk, axis=1)).sum() + np.abs(np.diff(blk, axis=0)).sum())
            mean = np.float32(act) / np.float32(blk.size)
            m = np.float32(mean * np.float32(p.inv_act))
            out[by, bx] = min(max(m, np.float32(p.m_lo)), np.float32(p.m_hi))
    return out


def _params(rng: np.random.Generator) -> MaskParams:
    lo = float(rng.uniform(0.0, 1.0))
    return MaskParams(inv_act=float(rng.uniform(0.02, 0.5)), m_lo=lo, m_hi=lo + float(rng.uniform(0.0, 2.0)))


def test_integer_luma_is_the_documented_formula() -> None:
    rng = np.random.default_rng()
    frame = rng.integers(0, 256, (23, 31, 3), dtype=np.uint8)
    got = integer_luma(frame)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, _luma_direct(frame))
    # The corners of the cube: black, white, and each primary at full scale.
    corners = np.array([[[0, 0, 0], [255, 255, 255], [255, 0, 0], [0, 255, 0], [0, 0, 255]]], np.uint8)
    np.testing.assert_array_equal(integer_luma(corners), [[0, 255, 76, 150, 29]])


def test_opencv_luma_is_the_integer_luma_for_every_colour() -> None:
    """The CPU path's one-pass luma (OpenCV's RGB-to-grey) against the integer formula, on all 2^24
    colours and on frames of every width up to 40 (OpenCV's vector loops leave a scalar tail): its
    exactness rests on OpenCV's arithmetic, so every input is checked."""
    i = np.arange(1 << 24, dtype=np.uint32)
    frame = np.stack([(i >> 16) & 255, (i >> 8) & 255, i & 255], axis=-1).astype(np.uint8).reshape(4096, 4096, 3)
    got = luma_u8(frame)
    assert got.dtype == np.uint8 and got.shape == (4096, 4096)
    np.testing.assert_array_equal(got, integer_luma(frame))
    rng = np.random.default_rng()
    for w in range(1, 41):
        small = rng.integers(0, 256, (3, w, 3), dtype=np.uint8)
        np.testing.assert_array_equal(luma_u8(small), integer_luma(small), err_msg=f"width {w}")


def test_cpu_path_rounds_ties_half_to_even() -> None:
    """m fixed at 1 (inv_act = 0, m_lo = m_hi = 1): the delta is the pattern's rounding, ties
    included, as np.rint and the CUDA kernel's rintf do."""
    rng = np.random.default_rng()
    frame = rng.integers(60, 196, (16, 16, 3), dtype=np.uint8)
    pattern = (rng.integers(-60, 61, (16, 16)) / 2).astype(np.float32)   # every value a tie or whole
    p = MaskParams(0.0, 1.0, 1.0)
    want, got = frame.copy(), frame.copy()
    embed_masked_ref(want, pattern, p)
    embed_masked_cpu(got, pattern, p)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("size", SIZES)
def test_block_scale_matches_direct_loops(size: tuple[int, int]) -> None:
    rng = np.random.default_rng()
    h, w = size
    for _ in range(3):
        frame = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        # Some blocks flat, some busy, so both clamps and the middle are reached.
        frame[: h // 2] = rng.integers(0, 256, 3, dtype=np.uint8)
        p = _params(rng)
        got = block_scale_ref(frame, p)
        want = _scale_direct(frame, p)
        assert got.dtype == np.float32 and got.shape == want.shape
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("size", SIZES)
def test_embed_matches_its_definition_on_every_element(size: tuple[int, int]) -> None:
    rng = np.random.default_rng()
    h, w = size
    frame = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    pattern = rng.uniform(-40.0, 40.0, (h, w)).astype(np.float32)  # large: clipping at 0 and 255 happens
    p = _params(rng)
    m = np.repeat(np.repeat(_scale_direct(frame, p), MASK_BLOCK, 0), MASK_BLOCK, 1)[:h, :w]
    d = np.rint(m * pattern).astype(np.int64)
    want = np.clip(frame.astype(np.int64) + d[..., None], 0, 255).astype(np.uint8)
    np.testing.assert_array_equal(masked_delta_ref(frame, pattern, p), d)
    got = frame.copy()
    embed_masked(got, pattern, p)         # NumPy frame: the reference
    np.testing.assert_array_equal(got, want)
    again = frame.copy()
    embed_masked_ref(again, pattern, p)
    np.testing.assert_array_equal(again, want)


@pytest.mark.parametrize("size", [(8, 8), (48, 8), (64, 96), (720, 1280)])
def test_cpu_path_is_the_reference_bit_for_bit(size: tuple[int, int]) -> None:
    """The OpenCV path the CPU pipeline runs against the reference, on fresh random frames: noise
    (busy blocks, clipping at 0 and 255), a smooth half (flat blocks at m_lo) and random params."""
    import cv2

    rng = np.random.default_rng()
    h, w = size
    frame = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    small = rng.integers(0, 256, (max(1, h // 16), max(1, w // 16), 3), dtype=np.uint8)
    frame[h // 2:] = cv2.resize(small, (w, h), interpolation=cv2.INTER_CUBIC)[h // 2:]
    pattern = rng.uniform(-40.0, 40.0, (h, w)).astype(np.float32)
    pattern[0, :4] = [0.5, 1.5, -0.5, -2.5]  # ties, where rounding modes differ
    scratch = CpuScratch(h, w)  # kept between frames, as WatermarkerV2 keeps it
    for i in range(3):
        p = _params(rng)
        want, got = frame.copy(), frame.copy()
        embed_masked_ref(want, pattern, p)
        embed_masked_cpu(got, pattern, p, scratch if i else None)
        np.testing.assert_array_equal(got, want)
        frame = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)  # the next frame: nothing carried over


def test_rounding_is_half_to_even() -> None:
    """With m fixed at 1, the delta is rint(pattern): ties go to the even integer, as rintf does."""
    frame = np.full((8, 8, 3), 100, np.uint8)
    pattern = np.full((8, 8), 0.0, np.float32)
    pattern[0, :6] = [0.5, 1.5, 2.5, -0.5, -1.5, -2.5]
    embed_masked_ref(frame, pattern, MaskParams(1.0, 1.0, 1.0))
    np.testing.assert_array_equal(frame[0, :6, 0], [100, 102, 102, 100, 98, 98])


def test_cpu_path_rounds_the_float32_product_not_the_exact_one() -> None:
    """Products m x pattern whose float32 value is a tie (k + 1/2) while the exact product is not:
    the reference rounds the float32 product, so must both of the CPU path's uint8 multiplies (the
    positive part, and the negative part with its factor -1). Random ties rarely land there, so
    these are made: pattern = the float32 next to (k + 1/2) / m, kept where the tie appears."""
    rng = np.random.default_rng()
    # About one m in five gives no such tie at all (every product lands off k + 1/2, or on it exactly
    # in double precision too), and the others about half of the made values: draw m until one does.
    for _ in range(50):
        m = np.float32(rng.uniform(0.3, 1.0))
        k = rng.integers(-4, 5, 200_000)
        p = ((k + 0.5) / np.float64(m)).astype(np.float32)
        p = np.nextafter(p, p + rng.choice([-1, 1], p.size).astype(np.float32))
        prod = m * p  # float32
        tie = (prod - np.floor(prod) == 0.5) & (prod.astype(np.float64) != np.float64(m) * p.astype(np.float64))
        ties = p[tie][: 64 * 64]
        if ties.size == 64 * 64:
            break
    assert ties.size == 64 * 64, ties.size  # 50 draws without one: the making is broken, not unlucky
    pattern = ties.reshape(64, 64)
    params = MaskParams(inv_act=0.0, m_lo=float(m), m_hi=float(m))  # m everywhere
    frame = rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)
    frame[:8] = rng.choice([0, 1, 254, 255], (8, 64, 3)).astype(np.uint8)  # clipping on both sides
    want, got = frame.copy(), frame.copy()
    embed_masked_ref(want, pattern, params)
    embed_masked_cpu(got, pattern, params, CpuScratch(64, 64))
    np.testing.assert_array_equal(got, want)


def test_flat_blocks_get_little_and_busy_blocks_get_more() -> None:
    rng = np.random.default_rng()
    frame = np.full((64, 64, 3), 128, np.uint8)
    frame[:, 32:] = rng.integers(0, 256, (64, 32, 3), dtype=np.uint8)
    p = MaskParams(inv_act=1 / 6, m_lo=0.3, m_hi=1.0)
    m = block_scale_ref(frame, p)
    np.testing.assert_array_equal(m[:, :4], np.float32(0.3))   # flat: the floor
    np.testing.assert_array_equal(m[:, 4:], np.float32(1.0))   # noise: the ceiling


@pytest.mark.parametrize("bad", [
    dict(frame=np.zeros((8, 8), np.uint8), pattern=np.zeros((8, 8), np.float32), what="frame"),
    dict(frame=np.zeros((8, 8, 4), np.uint8), pattern=np.zeros((8, 8), np.float32), what="frame"),
    dict(frame=np.zeros((8, 8, 3), np.float32), pattern=np.zeros((8, 8), np.float32), what="frame"),
    dict(frame=np.zeros((8, 8, 3), np.uint8), pattern=np.zeros((8, 9), np.float32), what="pattern"),
    dict(frame=np.zeros((8, 8, 3), np.uint8), pattern=np.zeros((8, 8), np.float64), what="pattern"),
])
def test_bad_arguments_name_the_argument(bad: dict) -> None:
    with pytest.raises(ValueError, match=bad["what"]):
        embed_masked(bad["frame"], bad["pattern"], MaskParams(0.1, 0.3, 1.0))


def test_mask_params_are_checked() -> None:
    with pytest.raises(ValueError, match="m_lo"):
        MaskParams(0.1, 2.0, 1.0)
    with pytest.raises(ValueError, match="inv_act"):
        MaskParams(float("nan"), 0.1, 1.0)
