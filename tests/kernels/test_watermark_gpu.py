"""CUDA watermark embedding against its NumPy reference (run with `pytest -m gpu`).

Fresh random frames and chips every run (never zeros; chips include 0 as well as +-1). The op works
in place: the reference runs on a host copy of the same frame and EVERY element of the whole frame is
compared, so a pixel the kernel skipped or wrote twice fails. Before each launch the device frame is
filled from the host copy, never left from the previous run.

Tolerance: none. The kernel performs the reference's float32 operations in the same order with the
`_rn` intrinsics (each product basis_y * basis_x rounded once, never fused into the sum; a chip of
+-1 flips it exactly; a chip of 0 adds nothing, as the reference's acc + 0 * term leaves acc
unchanged), and rintf rounds half to even like np.rint; the tables are the reference's float32
values uploaded as they are. Every result is therefore expected bit for bit.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np
import pytest

from swapstream.kernels.watermark import block_pattern, embed_watermark, embed_watermark_ref

pytestmark = pytest.mark.gpu

COEFS = ((0, 2), (1, 1), (2, 0), (0, 3), (1, 2), (2, 1), (3, 0))


def _assert_frames_equal(got: np.ndarray, want: np.ndarray, what: str) -> None:
    d = np.abs(got.astype(int) - want.astype(int))
    assert d.max() == 0, (f"{what}: {int((d > 0).sum())} elements differ, max {int(d.max())}, "
                          f"first at {np.argwhere(d > 0)[:5].tolist()}")


@pytest.mark.parametrize("size", [(1080, 1920), (720, 1280), (480, 854), (1920, 1080), (37, 53)])
def test_embed_matches_reference(cp: ModuleType, size: tuple[int, int]) -> None:
    rng = np.random.default_rng()
    h, w = size
    grid = (64, 36) if w >= h else (36, 64)
    for strength in (7.0, float(rng.uniform(3.5, 14.0))):
        # Uniform random pixels put many pixels at 0 and 255, so clipping is exercised too.
        frame = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        signs = rng.choice(np.array([-1, 0, 1], np.int8), size=(grid[1], grid[0], len(COEFS)))
        pattern = block_pattern(h, w, grid, COEFS, strength)
        want = frame.copy()
        embed_watermark_ref(want, signs, pattern)
        got = cp.asarray(frame)
        embed_watermark(got, cp.asarray(signs), pattern.to(cp))
        assert not np.array_equal(want, frame)  # the reference did something
        _assert_frames_equal(got.get(), want, f"{w}x{h} strength {strength:.3f}")


def test_watermarker_on_the_gpu_matches_the_cpu(cp: ModuleType) -> None:
    """The product's embedder (swapstream.watermark) on a CuPy frame, inside a non-default stream
    as the GPU job runs it, gives the CPU pipeline's frame bit for bit, on random texture and on a
    demo frame; and the mark is found in the demo frame.

    Detection is checked on the demo frame only: on random texture magnified 16 times (every block
    busy at the chips' own frequencies) the detector misses 3% of freshly marked frames
    (`tools/watermark_texture.py`, docs/responsible_use.md), so a check there would fail at random
    for a reason that is the scheme's, not the GPU's (the frame is the CPU's bit for bit)."""
    import cv2

    from swapstream.demo import grace_hopper, render_target_frame
    from swapstream.watermark import PRODUCT_SWAPSTREAM, Payload, Watermarker, detect, luma_of

    rng = np.random.default_rng()
    wm = Watermarker(Payload(PRODUCT_SWAPSTREAM, int(rng.integers(0, 2 ** 32))))
    small = rng.integers(0, 256, (68, 120, 3), dtype=np.uint8)
    texture = cv2.resize(small, (1920, 1080), interpolation=cv2.INTER_CUBIC)
    demo = render_target_frame(grace_hopper(), float(rng.uniform(0.0, 4.0)), (1920, 1080))
    stream = cp.cuda.Stream(non_blocking=True)
    for what, frame in (("random texture", texture), ("demo frame", demo)):
        want = frame.copy()
        wm.embed(want)
        with stream:
            got = cp.asarray(frame)
            wm.embed(got)
            wm.embed(cp.asarray(frame))  # the second call reuses the device tables
        stream.synchronize()
        _assert_frames_equal(got.get(), want, f"Watermarker 1080p, {what}")
    d = detect(luma_of(got.get()))
    assert d.found and d.payload == wm.payload, (d.reason, d.score)


def test_host_arrays_with_a_device_frame_are_refused(cp: ModuleType) -> None:
    h, w = 72, 128
    grid = (64, 36)
    pattern = block_pattern(h, w, grid, COEFS, 7.0)
    signs = np.ones((grid[1], grid[0], len(COEFS)), np.int8)
    frame = cp.asarray(np.random.default_rng().integers(0, 256, (h, w, 3), dtype=np.uint8))
    with pytest.raises(ValueError, match="CuPy"):
        embed_watermark(frame, signs, pattern.to(cp))
    with pytest.raises(ValueError, match="CuPy"):
        embed_watermark(frame, cp.asarray(signs), pattern)


def test_label_and_mark_on_the_gpu_match_the_cpu(cp: ModuleType) -> None:
    """The pipeline's whole per-frame step (stream/disclosure.py: label blend in integer xp code,
    then the mark) on a CuPy frame equals the CPU's, bit for bit, for a live output at 1080p."""
    pytest.importorskip("pydantic")
    from swapstream.config import load_config
    from swapstream.disclosure import Disclosure

    rng = np.random.default_rng()
    cfg = load_config(overrides=[f"watermark.stream_id={int(rng.integers(0, 2 ** 32))}",
                                 "disclosure.position=top-right"])
    cpu, gpu = Disclosure(cfg, live=True), Disclosure(cfg, live=True)
    assert cpu.payload == gpu.payload
    frame = rng.integers(0, 256, (1080, 1920, 3), dtype=np.uint8)
    want = frame.copy()
    assert cpu.apply(want, swapped=False)          # labelled, hence marked
    got = cp.asarray(frame)
    assert gpu.apply(got, swapped=False)
    _assert_frames_equal(got.get(), want, "label + mark, 1080p")
