// Batched face crop with fused pre-processing: for N faces, in ONE launch, sample the frame through
// each face's 2x3 output->input affine matrix (bilinear, border replicate), optionally reorder the
// channels to BGR, normalise as (x/255 - mean[c]) / std[c] and store NCHW (N, 3, S, S) in fp32 or fp16.
//
// Conventions as in kernels/warp.py: pixel centres at integer coordinates, matrices map OUTPUT pixels
// to INPUT pixels (OpenCV's WARP_INVERSE_MAP). mean and std are indexed by OUTPUT channel, i.e. after
// the optional swap to BGR.
//
// The arithmetic mirrors `crop_batch_ref` in kernels/crop.py (which samples through
// warp._sample_bilinear) operation for operation: coordinates in float64, bilinear weights and
// normalisation in float32, using the round-to-nearest intrinsics that are never contracted into
// FMAs. Kernel and reference therefore produce the same bits; the tests compare them exactly.
//
// fp16 is stored through the PTX conversion cvt.rn.f16.f32 (round to nearest even, as NumPy's
// float32 -> float16 cast), so the module needs no <cuda_fp16.h> on NVRTC's include path.
//
// One thread per output pixel of one face; it writes that pixel's three channel planes.

__device__ __forceinline__ void store_out(float* out, long long i, float v) { out[i] = v; }

__device__ __forceinline__ void store_out(unsigned short* out, long long i, float v) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    out[i] = h;
}

__device__ __forceinline__ float lerp_rn(float a, float b, float t) {
    // a + (b - a) * t, rounded after each operation, as NumPy evaluates it in float32.
    return __fadd_rn(a, __fmul_rn(__fsub_rn(b, a), t));
}

template <typename T>
__device__ __forceinline__ void crop_batch_impl(
        const unsigned char* __restrict__ frame, int height, int width,
        const float* __restrict__ mats, T* __restrict__ out, int n_faces, int size, int bgr,
        float mean0, float mean1, float mean2, float std0, float std1, float std2) {
    const long long plane = static_cast<long long>(size) * size;
    const long long idx = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (idx >= plane * n_faces) return;
    const int n = static_cast<int>(idx / plane);
    const int rem = static_cast<int>(idx - static_cast<long long>(n) * plane);
    const int oy = rem / size;
    const int ox = rem - oy * size;

    const float* m = mats + 6 * n;
    const double gx = static_cast<double>(ox);
    const double gy = static_cast<double>(oy);
    const double sx = __dadd_rn(__dadd_rn(__dmul_rn(static_cast<double>(m[0]), gx),
                                          __dmul_rn(static_cast<double>(m[1]), gy)),
                                static_cast<double>(m[2]));
    const double sy = __dadd_rn(__dadd_rn(__dmul_rn(static_cast<double>(m[3]), gx),
                                          __dmul_rn(static_cast<double>(m[4]), gy)),
                                static_cast<double>(m[5]));
    const double x0f = floor(sx);
    const double y0f = floor(sy);
    const float fx = static_cast<float>(sx - x0f);  // exact in double, then rounded to float
    const float fy = static_cast<float>(sy - y0f);
    // Clamp before the int conversion (far-away coordinates must not overflow); clamping floor() to
    // [-1, width-1] and then both taps to [0, width-1] is the same as clipping the taps directly.
    const int xi = static_cast<int>(fmin(fmax(x0f, -1.0), static_cast<double>(width - 1)));
    const int yi = static_cast<int>(fmin(fmax(y0f, -1.0), static_cast<double>(height - 1)));
    const int xa = max(xi, 0);
    const int xb = min(xi + 1, width - 1);
    const int ya = max(yi, 0);
    const int yb = min(yi + 1, height - 1);
    const unsigned char* r0 = frame + static_cast<long long>(ya) * width * 3;
    const unsigned char* r1 = frame + static_cast<long long>(yb) * width * 3;

    const float means[3] = {mean0, mean1, mean2};
    const float stds[3] = {std0, std1, std2};
    T* o = out + static_cast<long long>(n) * 3 * plane + rem;
#pragma unroll
    for (int c = 0; c < 3; ++c) {
        const int ic = bgr ? 2 - c : c;
        const float p00 = static_cast<float>(r0[3 * xa + ic]);
        const float p01 = static_cast<float>(r0[3 * xb + ic]);
        const float p10 = static_cast<float>(r1[3 * xa + ic]);
        const float p11 = static_cast<float>(r1[3 * xb + ic]);
        const float top = lerp_rn(p00, p01, fx);
        const float bot = lerp_rn(p10, p11, fx);
        const float val = lerp_rn(top, bot, fy);
        const float norm = __fdiv_rn(__fsub_rn(__fdiv_rn(val, 255.0f), means[c]), stds[c]);
        store_out(o, c * plane, norm);
    }
}

#define CROP_VARIANT(SUFFIX, T)                                                                  \
    extern "C" __global__ void crop_batch_##SUFFIX(                                              \
            const unsigned char* __restrict__ frame, int height, int width,                      \
            const float* __restrict__ mats, T* __restrict__ out, int n_faces, int size, int bgr, \
            float mean0, float mean1, float mean2, float std0, float std1, float std2) {         \
        crop_batch_impl<T>(frame, height, width, mats, out, n_faces, size, bgr, mean0, mean1,    \
                           mean2, std0, std1, std2);                                             \
    }

CROP_VARIANT(f32, float)
CROP_VARIANT(f16, unsigned short)
