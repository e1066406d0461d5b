// kernels/mask.py:gaussian_blur on the GPU: the separable Gaussian blur of an (h, w, c) float32
// array (channels interleaved; c = 1 for a plane), borders replicated, in two launches instead of
// the reference's two array operations per tap. Each pass is acc = 0; acc += tap[t] * src[clamped]
// for t = 0..2R in float32, every product and sum rounded as NumPy rounds it (same bits).
// The loader defines BLUR_RADIUS and BLUR_TAPS (the 2 BLUR_RADIUS + 1 float32 taps that
// kernels/mask.py:gaussian_kernel gives, as exact hexadecimal literals).

__constant__ float blur_taps[2 * BLUR_RADIUS + 1] = BLUR_TAPS;

__device__ __forceinline__ int blur_clamp(int v, int hi) { return v < 0 ? 0 : (v > hi ? hi : v); }

extern "C" __global__ void blur_rows(const float* __restrict__ src, int h, int w, int c,
                                     float* __restrict__ out)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)h * w * c) return;
    int ch = (int)(i % c);
    long long p = i / c;
    int x = (int)(p % w);
    long long row = (p / w) * w;
    float acc = 0.0f;
    for (int t = 0; t <= 2 * BLUR_RADIUS; ++t)
        acc = __fadd_rn(acc, __fmul_rn(blur_taps[t], src[(row + blur_clamp(x - BLUR_RADIUS + t, w - 1)) * c + ch]));
    out[i] = acc;
}

extern "C" __global__ void blur_cols(const float* __restrict__ src, int h, int w, int c,
                                     float* __restrict__ out)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)h * w * c) return;
    int ch = (int)(i % c);
    long long p = i / c;
    int x = (int)(p % w);
    int y = (int)(p / w);
    float acc = 0.0f;
    for (int t = 0; t <= 2 * BLUR_RADIUS; ++t)
        acc = __fadd_rn(acc, __fmul_rn(blur_taps[t], src[((long long)blur_clamp(y - BLUR_RADIUS + t, h - 1) * w + x) * c + ch]));
    out[i] = acc;
}
