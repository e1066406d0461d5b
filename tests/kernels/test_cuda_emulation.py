"""The occlusion mask's, the blur's and the resize's CUDA kernels, compiled for the host with g++ through a small emulation of
CUDA's launch model (`cuda_emu.h`), against their NumPy references: every element, fresh random
inputs, poisoned outputs, the same bits required. It runs where no GPU is (CI); the GPU tests
(`test_occlusion_gpu.py`) run the same kernels through NVRTC on a device. Skips without g++."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from swapstream.kernels.cuda_loader import CUDA_DIR
from swapstream.kernels.mask import gaussian_blur, taps_defines
from swapstream.kernels.resize import resize_bilinear
from swapstream.kernels.occlusion import (canvas_sample, clean_and_average, occluder_part,
                                          occluder_score, visible_region)

from .test_occlusion_cpu import part_inputs, random_similarity

HERE = Path(__file__).resolve().parent
f32 = np.float32

_WRAPPERS = r'''
#include "cuda_emu.h"
#include "occlusion.cu"
#include "blur.cu"
namespace clean {
#include "occlusion_clean.cu"
}
extern "C" {
void canvas(const unsigned char* frame, int W, int bx0, int by0, int bw, int bh, int k, const double* a,
            int ch, int cw, unsigned char* out) {
  LAUNCH(ch * cw, occl_canvas_u8, frame, W, bx0, by0, bw, bh, k, a[0], a[1], a[2], a[3], a[4], a[5], ch, cw, out);
}
void part(const unsigned char* patch, const float* allow, int width, int y0, int x0, int bh, int bw,
          const float* weight, const float* w, const float* m, float lo, float inv, float* score) {
  LAUNCH(bh * bw, occl_part_u8, patch, allow, width, y0, x0, bh, bw, weight, w[0], w[1], w[2], w[3], w[4],
         w[5], w[6], w[7], w[8], m[0], m[1], m[2], lo, inv, score);
}
void score(const unsigned char* patch, const float* allow, const float* w, const float* m, float lo,
           float inv, int n, float* out) {
  LAUNCH(n, occluder_score_u8, patch, allow, w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7], w[8], m[0], m[1],
         m[2], lo, inv, n, out);
}
void clean_avg(const float* s, int h, int w, int grow, float alpha, int fresh, float* t1, float* t2,
               float* state) {
  LAUNCH(h * w, clean::occl_median_dilate, s, h, w, grow, t1);
  LAUNCH(h * w, blur_axis, t1, (long long)h * w, w, 1LL, t2);
  LAUNCH(h * w, clean::occl_blur_cols_ema, t2, h, w, alpha, fresh, state);
}
void to_region(const float* occ, int ch, int cw, const double* a, int h, int w, float* out) {
  LAUNCH(h * w, occl_to_region, occ, ch, cw, a[0], a[1], a[2], a[3], a[4], a[5], h, w, out);
}
}
'''


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ is not installed (the CUDA emulation compiles the kernels with it)")
    work = tmp_path_factory.mktemp("cuda_emu")
    return _build(gxx, work, _WRAPPERS, {**taps_defines(0.8, "OCCL"), **taps_defines(0.8)})


_BLUR_SIGMA = 5.0  # the face stack's MASK_SIGMA: 31 taps
_BLUR_WRAPPERS = r'''
#include "cuda_emu.h"
#include "blur.cu"
#include "resize.cu"
extern "C" {
void blur(const float* src, int h, int w, int c, float* tmp, float* out) {
  long long n = (long long)h * w * c;
  LAUNCH(n, blur_axis, src, n, w, (long long)c, tmp);
  LAUNCH(n, blur_axis, tmp, n, h, (long long)w * c, out);
}
void resize(const float* src, int n, int h, int w, int c, int size, float sy, float sx, float* out) {
  LAUNCH(n * size * size * c, resize_bilinear_f32, src, n, h, w, c, size, sy, sx, out);
}
}
'''


@pytest.fixture(scope="module")
def blur_lib(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ is not installed (the CUDA emulation compiles the kernels with it)")
    return _build(gxx, tmp_path_factory.mktemp("cuda_emu_blur"), _BLUR_WRAPPERS, taps_defines(_BLUR_SIGMA))


def _build(gxx: str, work: Path, wrappers: str, defs: dict[str, str]) -> ctypes.CDLL:
    (work / "emu.cpp").write_text(wrappers)
    cmd = [gxx, "-O1", "-std=c++17", "-ffp-contract=off", "-fPIC", "-shared", f"-I{HERE}", f"-I{CUDA_DIR}",
           *[f"-D{k}={v}" for k, v in defs.items()], "-o", str(work / "libemu.so"), str(work / "emu.cpp")]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    return ctypes.CDLL(str(work / "libemu.so"))


def ptr(a: np.ndarray) -> ctypes.c_void_p:
    assert a.flags.c_contiguous
    return a.ctypes.data_as(ctypes.c_void_p)


I, F = ctypes.c_int, ctypes.c_float


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_canvas_kernel(lib: ctypes.CDLL, k: int) -> None:
    rng = np.random.default_rng()
    frame = rng.integers(0, 256, (181, 243, 3), dtype=np.uint8)
    bw, bh = 200 // k, 170 // k
    x0, y0 = int(rng.integers(0, 243 - bw * k + 1)), int(rng.integers(0, 181 - bh * k + 1))
    a = random_similarity(rng, rng.uniform(0.3, 1.3), (bw / 2, bh / 2))
    a[:, 2] -= a[:, :2] @ np.array([30.0, 30.0])   # some canvas pixels fall past the blocks' edge
    ref = canvas_sample(frame, (x0, y0), (bw, bh), k, a, np.zeros((60, 60, 3), np.uint8))
    for poison in (0, 255):
        out = np.full((60, 60, 3), poison, np.uint8)
        lib.canvas(ptr(frame), I(243), I(x0), I(y0), I(bw), I(bh), I(k), ptr(np.ascontiguousarray(a)), I(60), I(60),
                   ptr(out))
        np.testing.assert_array_equal(out, ref)


def test_score_and_part_kernels(lib: ctypes.CDLL) -> None:
    patch, allow, score, weight, w, m = part_inputs(np.random.default_rng(), (160, 160), (37, 61))
    inv = f32(1.0) / (f32(5.0) - f32(2.0))
    ref = occluder_score(patch, allow, w, m, 2.0, 5.0, np.empty((160, 160), f32))
    got = np.full((160, 160), np.nan, f32)
    lib.score(ptr(patch), ptr(allow), ptr(w), ptr(m), F(2.0), F(inv), I(160 * 160), ptr(got))
    np.testing.assert_array_equal(got, ref)
    ref = occluder_part(patch, allow, w, m, 2.0, 5.0, weight, (83, 101), score.copy())
    lib.part(ptr(patch), ptr(allow), I(160), I(101), I(83), I(37), I(61), ptr(weight), ptr(w), ptr(m), F(2.0),
             F(inv), ptr(score))
    np.testing.assert_array_equal(score, ref)


@pytest.mark.parametrize("fresh", [True, False])
def test_clean_kernels(lib: ctypes.CDLL, fresh: bool) -> None:
    rng = np.random.default_rng()
    score = rng.uniform(0, 1, (160, 160)).astype(f32)
    score[rng.random((160, 160)) < 0.5] = 0.0
    state = rng.uniform(0, 1, (160, 160)).astype(f32)
    ref = clean_and_average(score, 1, 0.8, state.copy(), 0.5, fresh)
    got = np.full((160, 160), np.nan, f32) if fresh else state.copy()
    t1, t2 = np.full_like(score, np.nan), np.full_like(score, np.nan)
    lib.clean_avg(ptr(score), I(160), I(160), I(1), F(0.5), I(int(fresh)), ptr(t1), ptr(t2), ptr(got))
    np.testing.assert_array_equal(got, ref)


def test_region_kernel(lib: ctypes.CDLL) -> None:
    rng = np.random.default_rng()
    occ = rng.uniform(0, 1, (160, 160)).astype(f32)
    a = random_similarity(rng, rng.uniform(0.6, 0.8), (80.0, 80.0))   # corners >= 115 px out: past the canvas
    a[:, 2] -= a[:, :2] @ np.array([150.0, 120.0])   # the region reaches past the canvas
    ref = visible_region(occ, a, np.empty((240, 300), f32))
    got = np.full((240, 300), np.nan, f32)
    lib.to_region(ptr(occ), I(160), I(160), ptr(np.ascontiguousarray(a)), I(240), I(300), ptr(got))
    np.testing.assert_array_equal(got, ref)
    assert (ref == 1.0).any() and (ref < 1.0).any()


@pytest.mark.parametrize("shape", [(53, 71), (40, 37, 3), (128, 128, 4), (9, 300, 1)])
def test_blur_kernels(blur_lib: ctypes.CDLL, shape: tuple[int, ...]) -> None:
    """Planes and interleaved channels (the masker blurs (S, S, N) stacks), some narrower than the
    31 taps (every tap clamped at both borders): the reference's bits."""
    src = np.random.default_rng().uniform(-1, 2, shape).astype(f32)
    ref = gaussian_blur(src, _BLUR_SIGMA, np.empty(shape, f32))
    got, tmp = np.full(shape, np.nan, f32), np.full(shape, np.nan, f32)
    c = 1 if len(shape) == 2 else shape[2]
    blur_lib.blur(ptr(src), I(shape[0]), I(shape[1]), I(c), ptr(tmp), ptr(got))
    np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("n,h,w,c,size", [(1, 37, 37, 1, 16), (3, 128, 128, 3, 256), (2, 256, 256, 1, 128),
                                          (4, 128, 64, 2, 97), (1, 5, 7, 3, 512)])
def test_resize_kernel(blur_lib: ctypes.CDLL, n: int, h: int, w: int, c: int, size: int) -> None:
    """Up and down, square and not, and one axis kept: the reference's bits."""
    src = np.random.default_rng().uniform(0, 255, (n, h, w, c)).astype(f32)
    ref = resize_bilinear(src, size)
    got = np.full((n, size, size, c), np.nan, f32)
    # The scales as the CuPy path passes them (kernels/resize.py:_resize_cuda).
    blur_lib.resize(ptr(src), I(n), I(h), I(w), I(c), I(size), F(f32(h / size)), F(f32(w / size)), ptr(got))
    np.testing.assert_array_equal(got, ref)
