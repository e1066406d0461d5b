// kernels/mask.py:gaussian_blur on the GPU: the separable Gaussian blur of an (h, w, c) float32
// array (channels interleaved; c = 1 for a plane), borders replicated, in two launches of one kernel
// (rows, then columns) instead of the reference's two array operations per tap. Each pass is
// acc = 0; acc += tap[t] * src[clamped] for t = 0..2R in float32, every product and sum rounded as
// NumPy rounds it (same bits). The loader defines BLUR_RADIUS and BLUR_TAPS (the 2 BLUR_RADIUS + 1
// float32 taps that kernels/mask.py:gaussian_kernel gives, as exact hexadecimal literals).

__constant__ float blur_taps[2 * BLUR_RADIUS + 1] = BLUR_TAPS;

// One pass along an axis of `len` elements spaced `step` apart in memory (rows: len = w, step = c;
// columns: len = h, step = w * c), over all n = h * w * c elements.
extern "C" __global__ void blur_axis(const float* __restrict__ src, long long n, int len, long long step,
                                     float* __restrict__ out)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int pos = (int)((i / step) % len);
    long long base = i - (long long)pos * step;
    float acc = 0.0f;
    for (int t = 0; t <= 2 * BLUR_RADIUS; ++t) {
        int j = pos - BLUR_RADIUS + t;
        j = j < 0 ? 0 : (j > len - 1 ? len - 1 : j);
        acc = __fadd_rn(acc, __fmul_rn(blur_taps[t], src[base + (long long)j * step]));
    }
    out[i] = acc;
}
