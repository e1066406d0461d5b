// Fused paste-back of a swapped face crop into a packed RGB uint8 frame, in place, and the box mask
// it blends under: the CUDA twins of kernels/paste.py (box_mask_ref, paste_back_ref), which are the
// specification (conventions and choices are documented there).
//
// box_mask_h_f32 / box_mask_v_f32: FaceFusion's box mask, S x S. The box (ones, with `top`, `right`,
// `bottom`, `left` rows/columns zeroed) is evaluated on the fly, blurred horizontally into a scratch
// buffer and vertically into the mask, borders replicated (clamped indices), as mask.gaussian_blur
// does; the vertical pass also caps the mask at 1 and multiplies it by (1 - keep_out).
//
// paste_back_u8: one thread per frame pixel of the paste box. The frame -> crop matrix maps the pixel
// into the crop (float64); the mask (constant-0 border) and the crop (border replicated) are sampled
// bilinearly (float32 weights); the crop sample is optionally colour-corrected, then blended as
// frame*(1-m) + crop*m, rounded half to even and clipped. Pixels whose mask sample is 0 are not written.
//
// Every operation is rounded separately (__fmul_rn, __fadd_rn, __dmul_rn, ... are never contracted
// into FMAs), in the order NumPy evaluates the reference, so kernels and reference agree bit for bit.

__device__ __forceinline__ float lerp_rn(float a, float b, float t) {
    // a + (b - a) * t, as warp._sample_bilinear evaluates it in float32.
    return __fadd_rn(a, __fmul_rn(__fsub_rn(b, a), t));
}

extern "C" __global__ void box_mask_h_f32(
    int s, int top, int right, int bottom, int left, const float* __restrict__ taps, int r,
    float* __restrict__ scratch)
{
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= s * s) return;
    const int y = idx / s;
    const int x = idx - y * s;
    const bool row_on = y >= top && y < s - bottom;
    float acc = 0.0f;
    for (int i = 0; i <= 2 * r; ++i) {
        const int xx = min(max(x + i - r, 0), s - 1);
        const float v = (row_on && xx >= left && xx < s - right) ? 1.0f : 0.0f;
        acc = __fadd_rn(acc, __fmul_rn(taps[i], v));
    }
    scratch[idx] = acc;
}

extern "C" __global__ void box_mask_v_f32(
    int s, const float* __restrict__ taps, int r, const float* __restrict__ scratch,
    const float* __restrict__ keep_out, int has_keep, float* __restrict__ mask)
{
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= s * s) return;
    const int y = idx / s;
    const int x = idx - y * s;
    float acc = 0.0f;
    for (int i = 0; i <= 2 * r; ++i) {
        const int yy = min(max(y + i - r, 0), s - 1);
        acc = __fadd_rn(acc, __fmul_rn(taps[i], scratch[yy * s + x]));
    }
    acc = fminf(acc, 1.0f);
    if (has_keep) acc = __fmul_rn(acc, __fsub_rn(1.0f, keep_out[idx]));
    mask[idx] = acc;
}

extern "C" __global__ void paste_back_u8(
    unsigned char* __restrict__ frame, int width, const float* __restrict__ crop,
    const float* __restrict__ mask, int s,
    double m00, double m01, double m02, double m10, double m11, double m12,
    int x0, int y0, int bw, int bh, int color,
    float g0, float g1, float g2, float o0, float o1, float o2)
{
    const long long idx = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (idx >= static_cast<long long>(bw) * bh) return;
    const int by = static_cast<int>(idx / bw);
    const int bx = static_cast<int>(idx - static_cast<long long>(by) * bw);
    const int px = x0 + bx, py = y0 + by;
    const double gx = static_cast<double>(px);
    const double gy = static_cast<double>(py);
    const double sx = __dadd_rn(__dadd_rn(__dmul_rn(m00, gx), __dmul_rn(m01, gy)), m02);
    const double sy = __dadd_rn(__dadd_rn(__dmul_rn(m10, gx), __dmul_rn(m11, gy)), m12);
    // Outside the open square (-1, S)^2 every mask tap is outside the crop, so m == 0 and the pixel
    // keeps its value (the reference computes that 0; skipping here also keeps the int casts in range).
    const double ds = static_cast<double>(s);
    if (!(sx > -1.0 && sx < ds && sy > -1.0 && sy < ds)) return;
    const double x0f = floor(sx);
    const double y0f = floor(sy);
    const float fx = static_cast<float>(sx - x0f);  // exact in double, then rounded to float
    const float fy = static_cast<float>(sy - y0f);
    const int xi = static_cast<int>(x0f);  // in [-1, S-1]
    const int yi = static_cast<int>(y0f);

    // Mask, constant-0 border.
    const bool xa_in = xi >= 0, xb_in = xi + 1 < s;
    const bool ya_in = yi >= 0, yb_in = yi + 1 < s;
    const float q00 = (ya_in && xa_in) ? mask[yi * s + xi] : 0.0f;
    const float q01 = (ya_in && xb_in) ? mask[yi * s + xi + 1] : 0.0f;
    const float q10 = (yb_in && xa_in) ? mask[(yi + 1) * s + xi] : 0.0f;
    const float q11 = (yb_in && xb_in) ? mask[(yi + 1) * s + xi + 1] : 0.0f;
    float m = lerp_rn(lerp_rn(q00, q01, fx), lerp_rn(q10, q11, fx), fy);
    m = fminf(fmaxf(m, 0.0f), 1.0f);
    if (!(m > 0.0f)) return;

    // Crop, border replicated.
    const int xa = max(xi, 0), xb = min(xi + 1, s - 1);
    const int ya = max(yi, 0), yb = min(yi + 1, s - 1);
    const float* r0 = crop + static_cast<long long>(ya) * s * 3;
    const float* r1 = crop + static_cast<long long>(yb) * s * 3;
    const float gains[3] = {g0, g1, g2};
    const float offs[3] = {o0, o1, o2};
    const float om = __fsub_rn(1.0f, m);
    unsigned char* p = frame + (static_cast<long long>(py) * width + px) * 3;
#pragma unroll
    for (int c = 0; c < 3; ++c) {
        const float top = lerp_rn(r0[3 * xa + c], r0[3 * xb + c], fx);
        const float bot = lerp_rn(r1[3 * xa + c], r1[3 * xb + c], fx);
        float fg = lerp_rn(top, bot, fy);
        if (color) fg = fminf(fmaxf(__fadd_rn(__fmul_rn(fg, gains[c]), offs[c]), 0.0f), 255.0f);
        const float f = static_cast<float>(p[c]);
        const float v = __fadd_rn(__fmul_rn(f, om), __fmul_rn(fg, m));
        p[c] = static_cast<unsigned char>(fminf(fmaxf(rintf(v), 0.0f), 255.0f));
    }
}
