// The occlusion mask's clean-up and temporal average on the GPU: the CUDA twins of
// kernels/occlusion.py:clean_occluder (3x3 median, square dilation, separable Gaussian blur) and
// ema_update, in three launches (the blur's row pass is blur.cu's), each float operation rounded in
// the reference's order (same bits).
// The loader defines OCCL_RADIUS and OCCL_TAPS (the blur's 2 OCCL_RADIUS + 1 float32 taps, as
// kernels/mask.py:gaussian_kernel gives them, written as exact hexadecimal literals).

__device__ __forceinline__ int clampi(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }

// The 3x3 median at (y, x) with the border replicated (kernels/occlusion.py:median3): an exact
// selection, so any method gives the reference's value.
__device__ __forceinline__ float median9(const float* __restrict__ src, int h, int w, int y, int x)
{
    float v[9];
    int n = 0;
    for (int dy = -1; dy <= 1; ++dy)
        for (int dx = -1; dx <= 1; ++dx)
            v[n++] = src[clampi(y + dy, 0, h - 1) * w + clampi(x + dx, 0, w - 1)];
    for (int a = 0; a < 5; ++a)          // partial selection sort: v[4] ends as the 5th smallest
        for (int b = a + 1; b < 9; ++b)
            if (v[b] < v[a]) { float t = v[a]; v[a] = v[b]; v[b] = t; }
    return v[4];
}

// median3, then the square dilation of radius r (kernels/occlusion.py:dilate): the maximum of the
// medians over the (2r + 1)^2 window, the window's coordinates clamped (border replicated).
extern "C" __global__ void occl_median_dilate(const float* __restrict__ src, int h, int w, int r,
                                              float* __restrict__ out)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= h * w) return;
    int y = i / w, x = i % w;
    float m = -3.40282347e+38f;   // -FLT_MAX: NVRTC has no <cmath> for INFINITY
    for (int dy = -r; dy <= r; ++dy)
        for (int dx = -r; dx <= r; ++dx)
            m = fmaxf(m, median9(src, h, w, clampi(y + dy, 0, h - 1), clampi(x + dx, 0, w - 1)));
    out[i] = m;
}

// The blur's taps for the column pass below (its row pass is cuda/blur.cu's blur_axis, the same
// sums): OCCL_TAPS (2 OCCL_RADIUS + 1 float32 values) is defined by the loader.
__constant__ float occl_taps[2 * OCCL_RADIUS + 1] = OCCL_TAPS;

// The column pass, and the track's moving average of the result in place (ema_update: state +=
// alpha * (new - state)), or, for a track's first mask (fresh != 0), the result itself.
extern "C" __global__ void occl_blur_cols_ema(const float* __restrict__ src, int h, int w, float alpha,
                                              int fresh, float* __restrict__ state)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= h * w) return;
    int y = i / w, x = i % w;
    float acc = 0.0f;
    for (int t = 0; t <= 2 * OCCL_RADIUS; ++t)
        acc = __fadd_rn(acc, __fmul_rn(occl_taps[t], src[clampi(y - OCCL_RADIUS + t, 0, h - 1) * w + x]));
    state[i] = fresh ? acc : __fadd_rn(state[i], __fmul_rn(alpha, __fsub_rn(acc, state[i])));
}

