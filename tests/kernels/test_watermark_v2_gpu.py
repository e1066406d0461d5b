"""CUDA v2 watermark embedding against its NumPy reference (run with `pytest -m gpu`).

Fresh random frames, patterns and mask parameters every run, sizes that cut 8x8 blocks at the
frame's edge. The op works in place: the reference runs on a host copy of the same frame and EVERY
element of the whole frame is compared, so a pixel the kernel skipped or wrote twice fails. The
device frame is uploaded from the host copy before each launch.

Tolerance: none. Luma and texture are integers (exact in any order of summation); the kernel then
performs the reference's float32 division and products with __fdiv_rn/__fmul_rn (no FMA
contraction) and rounds with rintf (half to even, as np.rint): every result is expected bit for bit.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np
import pytest

from swapstream.kernels.watermark_v2 import MaskParams, embed_masked, embed_masked_ref

pytestmark = pytest.mark.gpu


def _assert_equal(got: np.ndarray, want: np.ndarray, what: str) -> None:
    d = np.abs(got.astype(int) - want.astype(int))
    assert d.max() == 0, (f"{what}: {int((d > 0).sum())} elements differ, max {int(d.max())}, "
                          f"first at {np.argwhere(d > 0)[:5].tolist()}")


@pytest.mark.parametrize("size", [(1080, 1920), (720, 1280), (480, 854), (1920, 1080), (37, 53), (1, 1)])
def test_embed_matches_reference(cp: ModuleType, size: tuple[int, int]) -> None:
    rng = np.random.default_rng()
    h, w = size
    lo = float(rng.uniform(0.0, 1.0))
    cases = [MaskParams(1 / 2.5, 0.3, 1.0),  # the shipped mask (swapstream.watermark_v2.MASK)
             MaskParams(1 / 6, 0.3, 1.0),    # the mask before dac0555
             MaskParams(float(rng.uniform(0.02, 0.5)), lo, lo + float(rng.uniform(0.0, 2.0))),
             # m fixed at 1: the delta is rint(pattern), and the pattern holds exact halves (ties).
             MaskParams(1.0, 1.0, 1.0)]
    for p in cases:
        frame = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        frame[: h // 3] = rng.integers(0, 256, 3, dtype=np.uint8)       # flat blocks too
        pattern = rng.uniform(-12.0, 12.0, (h, w)).astype(np.float32)
        pattern.flat[::7] = np.rint(pattern.flat[::7]) + 0.5              # ties every 7th pixel
        want = frame.copy()
        embed_masked_ref(want, pattern, p)
        got = cp.asarray(frame)
        embed_masked(got, cp.asarray(pattern), p)
        assert not np.array_equal(want, frame)  # the reference changed something
        _assert_equal(got.get(), want, f"{w}x{h} {p}")


def test_watermarker_v2_on_the_gpu_matches_the_cpu(cp: ModuleType) -> None:
    """The product's v2 embedder on a CuPy frame, in a non-default stream as the GPU job runs it,
    gives the CPU's frame bit for bit, and the mark is found in it."""
    from swapstream.demo import grace_hopper, render_target_frame
    from swapstream.watermark import Payload, luma_of
    from swapstream.watermark_v2 import WatermarkerV2, detect_v2

    rng = np.random.default_rng()
    payload = Payload(0x5353, int(rng.integers(0, 2 ** 32)))
    wm = WatermarkerV2(payload)
    frame = np.ascontiguousarray(render_target_frame(grace_hopper(), float(rng.uniform(0, 3)), (1280, 720)))
    want = frame.copy()
    wm.embed(want)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        got = cp.asarray(frame)
        wm.embed(got)
    stream.synchronize()
    _assert_equal(got.get(), want, "WatermarkerV2 720p")
    d = detect_v2(luma_of(got.get()))
    assert d.found and d.detection.payload == payload, d
