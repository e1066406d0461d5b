"""The label blend kernel against its NumPy reference (run with `pytest -m gpu`).

Fresh random frames and patches every run (coverage includes 0 and 255, so both untouched and
fully covered pixels occur). The blend works in place on a strided view of the frame: the reference
runs on a host copy of the same frame and EVERY element of the whole frame is compared, so a pixel
outside the patch that the kernel touched fails too.

Tolerance: none. Both sides do the same int32 arithmetic with a floor division of non-negative
values; there is no rounding that could differ.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np
import pytest

from swapstream.kernels.label import blend_patch, blend_patch_ref

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("frame_hw, patch_hw", [((720, 1280), (29, 151)), ((1080, 1920), (43, 226)),
                                                ((37, 53), (37, 53))])
def test_blend_matches_reference(cp: ModuleType, frame_hw: tuple[int, int], patch_hw: tuple[int, int]) -> None:
    rng = np.random.default_rng()
    (h, w), (ph, pw) = frame_hw, patch_hw
    frame = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    alpha = rng.integers(0, 256, (ph, pw), dtype=np.uint8)
    alpha[0, :] = 0
    alpha[-1, :] = 255
    premul = (rng.integers(0, 256, (ph, pw, 1)) * alpha[..., None] // 255).astype(np.uint8)
    # Also colours above their coverage (no label renders them), where the result passes 255 and
    # both sides wrap it the same way (a C cast to unsigned char, NumPy's astype(uint8)).
    premul[ph // 2:] = rng.integers(0, 256, (ph - ph // 2, pw, 1), dtype=np.uint8)
    y0, x0 = int(rng.integers(0, h - ph + 1)), int(rng.integers(0, w - pw + 1))
    want = frame.copy()
    blend_patch_ref(want[y0:y0 + ph, x0:x0 + pw], alpha, premul)
    assert not np.array_equal(want, frame)  # the reference did something
    got = cp.asarray(frame)  # filled from the host copy before the launch, never left over
    blend_patch(got[y0:y0 + ph, x0:x0 + pw], cp.asarray(alpha), cp.asarray(premul))
    d = np.abs(got.get().astype(int) - want.astype(int))
    assert d.max() == 0, f"{int((d > 0).sum())} elements differ, first at {np.argwhere(d > 0)[:5].tolist()}"


def test_mixed_host_and_device_arrays_are_refused(cp: ModuleType) -> None:
    frame = cp.zeros((8, 8, 3), cp.uint8) + 7
    with pytest.raises(ValueError, match="alpha must be a CuPy array"):
        blend_patch(frame, np.zeros((8, 8), np.uint8), cp.zeros((8, 8, 1), cp.uint8))
