// Fused mesh-swap steps: the CUDA twins of kernels/meshswap.py. The NumPy functions are the
// specification; float32 arithmetic here follows them operation by operation (__fmul_rn/__fadd_rn
// where the compiler could otherwise contract into an FMA and round differently).
//
// The loader prepends M_FWD and M_INV (the sRGB<->XYZ/white matrices as float32 initialiser lists)
// so that both sides use the very same constants.

#define LAB_EPS (216.0f / 24389.0f)
#define LAB_KAPPA (24389.0f / 27.0f)

__constant__ float c_fwd[9] = M_FWD;
__constant__ float c_inv[9] = M_INV;

__device__ __forceinline__ int clampi(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }

// Even-odd test of pixel centre (x, y) (ROI coordinates) against a polygon given in frame
// coordinates, with edges half-open in y exactly as fill_polygon computes them.
__device__ int inside_polygon(const float* poly, int n, double x, double y, double ox, double oy)
{
    int count = 0;
    for (int i = 0; i < n; ++i) {
        int j = (i + 1 == n) ? 0 : i + 1;
        double x0 = (double)poly[2 * i] - ox, y0 = (double)poly[2 * i + 1] - oy;
        double x1 = (double)poly[2 * j] - ox, y1 = (double)poly[2 * j + 1] - oy;
        if ((y0 <= y) != (y1 <= y)) {
            double dy = (y1 == y0) ? 1.0 : (y1 - y0);
            double xc = x0 + (y - y0) * (x1 - x0) / dy;
            if (xc < x) ++count;
        }
    }
    return count & 1;
}

// Channel 0: outline fill times mesh coverage. Channel 1: union of up to 4 keep-out polygons,
// stored one after another in `keep` with vertex counts k0..k3 (0 for unused).
extern "C" __global__ void mesh_mask_fill(
    const float* __restrict__ outline, int n_outline, const float* __restrict__ keep,
    int k0, int k1, int k2, int k3, const float* __restrict__ map_xy,
    int ox, int oy, int h, int w, float* __restrict__ two)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= h * w) return;
    double x = i % w, y = i / w;
    float mx = map_xy[2 * i], my = map_xy[2 * i + 1];
    int covered = isfinite(mx) && isfinite(my);
    float hard = (covered && inside_polygon(outline, n_outline, x, y, ox, oy)) ? 1.0f : 0.0f;
    int counts[4] = {k0, k1, k2, k3};
    int k = 0, start = 0;
    for (int p = 0; p < 4; ++p) {
        if (counts[p] > 0) k += inside_polygon(keep + 2 * start, counts[p], x, y, ox, oy);
        start += counts[p];
    }
    two[2 * i] = hard;
    two[2 * i + 1] = k > 0 ? 1.0f : 0.0f;
}

#define MAX_TAPS 512

// Gaussian taps exactly as mask.gaussian_kernel builds them: exp in double, normalised in
// double, rounded to float. Computed by the block into shared memory, so no host upload is needed.
__device__ void make_taps(double sigma, int r, float* taps, double* scratch)
{
    // Every thread computes some exponentials; one thread adds them up in tap order (a serial
    // loop of exp() calls per block would cost more than the blur itself).
    for (int t = threadIdx.x; t <= 2 * r; t += blockDim.x) {
        double v = (t - r) / sigma;
        scratch[t] = exp(-0.5 * v * v);
    }
    __syncthreads();
    __shared__ double total;
    if (threadIdx.x == 0) {
        double s = 0.0;
        for (int t = 0; t <= 2 * r; ++t) s += scratch[t];
        total = s;
    }
    __syncthreads();
    for (int t = threadIdx.x; t <= 2 * r; t += blockDim.x) taps[t] = (float)(scratch[t] / total);
    __syncthreads();
}

// Horizontal Gaussian of both channels (sigma_a for channel 0, sigma_b for channel 1), border
// replicated, summed in tap order like the reference.
extern "C" __global__ void blur2_rows(const float* __restrict__ in, int h, int w,
                                      double sigma_a, int ra, double sigma_b, int rb,
                                      float* __restrict__ out)
{
    __shared__ float ka[MAX_TAPS], kb[MAX_TAPS];
    __shared__ double scratch[MAX_TAPS];
    make_taps(sigma_a, ra, ka, scratch);
    make_taps(sigma_b, rb, kb, scratch);
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= h * w) return;
    int x = i % w, row = i - x;
    float a = 0.0f, b = 0.0f;
    for (int t = 0; t <= 2 * ra; ++t)
        a = __fadd_rn(a, __fmul_rn(ka[t], in[2 * (row + clampi(x - ra + t, 0, w - 1))]));
    for (int t = 0; t <= 2 * rb; ++t)
        b = __fadd_rn(b, __fmul_rn(kb[t], in[2 * (row + clampi(x - rb + t, 0, w - 1)) + 1]));
    out[2 * i] = a;
    out[2 * i + 1] = b;
}

// Vertical Gaussian of both channels, then mask = clip(2*a - 1, 0, 1) * (1 - b).
extern "C" __global__ void blur2_cols_combine(const float* __restrict__ in, int h, int w,
                                              double sigma_a, int ra, double sigma_b, int rb,
                                              int use_keep, float* __restrict__ mask)
{
    __shared__ float ka[MAX_TAPS], kb[MAX_TAPS];
    __shared__ double scratch[MAX_TAPS];
    make_taps(sigma_a, ra, ka, scratch);
    make_taps(sigma_b, rb, kb, scratch);
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= h * w) return;
    int x = i % w, y = i / w;
    float a = 0.0f, b = 0.0f;
    for (int t = 0; t <= 2 * ra; ++t)
        a = __fadd_rn(a, __fmul_rn(ka[t], in[2 * (clampi(y - ra + t, 0, h - 1) * w + x)]));
    float m = fminf(fmaxf(__fsub_rn(__fmul_rn(2.0f, a), 1.0f), 0.0f), 1.0f);
    if (use_keep) {
        for (int t = 0; t <= 2 * rb; ++t)
            b = __fadd_rn(b, __fmul_rn(kb[t], in[2 * (clampi(y - rb + t, 0, h - 1) * w + x) + 1]));
        m = __fmul_rn(m, __fsub_rn(1.0f, b));
    }
    mask[i] = m;
}

__device__ void rgb_to_lab(const float* rgb, float* lab)
{
    float lin[3], f[3];
    for (int c = 0; c < 3; ++c) {
        float v = __fdiv_rn(rgb[c], 255.0f);
        lin[c] = v <= 0.04045f ? __fdiv_rn(v, 12.92f) : powf(__fdiv_rn(__fadd_rn(v, 0.055f), 1.055f), 2.4f);
    }
    for (int r = 0; r < 3; ++r) {
        float xyz = __fadd_rn(__fadd_rn(__fmul_rn(lin[0], c_fwd[3 * r]), __fmul_rn(lin[1], c_fwd[3 * r + 1])),
                              __fmul_rn(lin[2], c_fwd[3 * r + 2]));
        f[r] = xyz > LAB_EPS ? cbrtf(xyz) : __fdiv_rn(__fadd_rn(__fmul_rn(LAB_KAPPA, xyz), 16.0f), 116.0f);
    }
    lab[0] = __fsub_rn(__fmul_rn(116.0f, f[1]), 16.0f);
    lab[1] = __fmul_rn(500.0f, __fsub_rn(f[0], f[1]));
    lab[2] = __fmul_rn(200.0f, __fsub_rn(f[1], f[2]));
}

__device__ void lab_to_rgb(const float* lab, float* rgb)
{
    float fy = __fdiv_rn(__fadd_rn(lab[0], 16.0f), 116.0f);
    float f[3] = {__fadd_rn(fy, __fdiv_rn(lab[1], 500.0f)), fy, __fsub_rn(fy, __fdiv_rn(lab[2], 200.0f))};
    float xyz[3];
    for (int c = 0; c < 3; ++c) {
        float f3 = __fmul_rn(__fmul_rn(f[c], f[c]), f[c]);
        xyz[c] = f3 > LAB_EPS ? f3 : __fdiv_rn(__fsub_rn(__fmul_rn(116.0f, f[c]), 16.0f), LAB_KAPPA);
    }
    for (int r = 0; r < 3; ++r) {
        float lin = __fadd_rn(__fadd_rn(__fmul_rn(xyz[0], c_inv[3 * r]), __fmul_rn(xyz[1], c_inv[3 * r + 1])),
                              __fmul_rn(xyz[2], c_inv[3 * r + 2]));
        lin = fminf(fmaxf(lin, 0.0f), 1.0f);
        float v = lin <= 0.0031308f ? __fmul_rn(12.92f, lin)
                                    : __fsub_rn(__fmul_rn(1.055f, powf(lin, 1.0f / 2.4f)), 0.055f);
        rgb[r] = fminf(fmaxf(__fmul_rn(v, 255.0f), 0.0f), 255.0f);
    }
}

template <int LAB>
__device__ void color_stats(const float* __restrict__ warped, const unsigned char* __restrict__ frame,
                            int frame_w, const float* __restrict__ mask, int ox, int oy, int h, int w,
                            double* __restrict__ out)
{
    double acc[13];
    for (int k = 0; k < 13; ++k) acc[k] = 0.0;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < h * w; i += gridDim.x * blockDim.x) {
        if (!(mask[i] > 0.5f)) continue;
        int x = i % w, y = i / w;
        const unsigned char* t = frame + 3 * ((size_t)(y + oy) * frame_w + (x + ox));
        float s[3] = {warped[3 * i], warped[3 * i + 1], warped[3 * i + 2]};
        float d[3] = {(float)t[0], (float)t[1], (float)t[2]};
        if (LAB) {
            float ls[3], ld[3];
            rgb_to_lab(s, ls);
            rgb_to_lab(d, ld);
            for (int c = 0; c < 3; ++c) { s[c] = ls[c]; d[c] = ld[c]; }
        }
        acc[0] += 1.0;
        for (int c = 0; c < 3; ++c) {
            acc[1 + c] += s[c];
            acc[4 + c] += (double)s[c] * s[c];
            acc[7 + c] += d[c];
            acc[10 + c] += (double)d[c] * d[c];
        }
    }
    // Warp reduction, then across the block's warps in shared memory, then one atomic per block
    // and statistic: atomics on 13 shared addresses from every warp serialise in L2 and cost more
    // than the whole conversion.
    __shared__ double part[32][13];
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    for (int k = 0; k < 13; ++k) {
        double v = acc[k];
        for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
        if (lane == 0) part[wid][k] = v;
    }
    __syncthreads();
    if (threadIdx.x < 13) {
        double v = 0.0;
        for (int i = 0; i < nw; ++i) v += part[i][threadIdx.x];
        if (v != 0.0) atomicAdd(out + threadIdx.x, v);
    }
}

extern "C" __global__ void color_stats_lab(const float* warped, const unsigned char* frame, int frame_w,
                                           const float* mask, int ox, int oy, int h, int w, double* out)
{
    color_stats<1>(warped, frame, frame_w, mask, ox, oy, h, w, out);
}

extern "C" __global__ void color_stats_rgb(const float* warped, const unsigned char* frame, int frame_w,
                                           const float* mask, int ox, int oy, int h, int w, double* out)
{
    color_stats<0>(warped, frame, frame_w, mask, ox, oy, h, w, out);
}

// Gain and offset exactly as meshswap.gain_offset: double precision, then rounded to float.
__device__ void gain_offset(const double* st, double strength, float* g, float* o)
{
    double n = st[0];
    for (int c = 0; c < 3; ++c) {
        if (n <= 0.0) { g[c] = 1.0f; o[c] = 0.0f; continue; }
        double ms = st[1 + c] / n, md = st[7 + c] / n;
        double ss = sqrt(fmax(st[4 + c] / n - ms * ms, 0.0));
        double sd = sqrt(fmax(st[10 + c] / n - md * md, 0.0));
        double gain = fmax(sd, 1.0) / fmax(ss, 1.0);
        gain = 1.0 + strength * (gain - 1.0);
        double tm = ms + strength * (md - ms);
        g[c] = (float)gain;
        o[c] = (float)(tm - ms * gain);
    }
}

// meshswap.chroma_weight (times the strength), in double, rounded to float like the reference.
__device__ float chroma_weight(const double* st, double strength)
{
    double n = st[0];
    if (n <= 0.0) return 0.0f;
    double var[3];
    for (int c = 1; c < 3; ++c) {
        double m = st[1 + c] / n;
        var[c] = fmax(st[4 + c] / n - m * m, 0.0);
    }
    double spread = sqrt(var[1] + var[2]);
    double k = fmin(fmax((CHROMA_FULL - spread) / (CHROMA_FULL - CHROMA_GREY), 0.0), 1.0);
    return (float)(k * strength);
}

template <int SPACE>  // 0 none, 1 rgb, 2 lab
__device__ void transfer_blend(unsigned char* __restrict__ frame, int fh, int fw,
                               const float* __restrict__ warped, const float* __restrict__ mask,
                               const double* __restrict__ stats, double strength, int ox, int oy,
                               int h, int w)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= h * w) return;
    float m = mask[i];
    if (!(m > 0.0f)) return;  // untouched pixels keep their exact value
    int x = i % w + ox, y = i / w + oy;
    if (x < 0 || y < 0 || x >= fw || y >= fh) return;
    float fg[3] = {warped[3 * i], warped[3 * i + 1], warped[3 * i + 2]};
    if (SPACE > 0) {
        float g[3], o[3];
        gain_offset(stats, strength, g, o);
        if (SPACE == 2) {
            float lab[3];
            rgb_to_lab(fg, lab);
            for (int c = 0; c < 3; ++c) lab[c] = __fadd_rn(__fmul_rn(lab[c], g[c]), o[c]);
            float k = chroma_weight(stats, strength);
            if (k > 0.0f) {  // a greyscale source: a*, b* from the target pixel
                const unsigned char* q = frame + 3 * ((size_t)y * fw + x);
                float t[3] = {(float)q[0], (float)q[1], (float)q[2]}, tl[3];
                rgb_to_lab(t, tl);
                float keep = __fsub_rn(1.0f, k);
                for (int c = 1; c < 3; ++c) lab[c] = __fadd_rn(__fmul_rn(lab[c], keep), __fmul_rn(tl[c], k));
            }
            lab_to_rgb(lab, fg);
        } else {
            for (int c = 0; c < 3; ++c)
                fg[c] = fminf(fmaxf(__fadd_rn(__fmul_rn(fg[c], g[c]), o[c]), 0.0f), 255.0f);
        }
    }
    unsigned char* p = frame + 3 * ((size_t)y * fw + x);
    for (int c = 0; c < 3; ++c) {
        float r = (float)p[c];
        float v = rintf(__fadd_rn(r, __fmul_rn(__fsub_rn(fg[c], r), m)));
        p[c] = (unsigned char)fminf(fmaxf(v, 0.0f), 255.0f);
    }
}

extern "C" __global__ void transfer_blend_none(unsigned char* f, int fh, int fw, const float* wp,
                                               const float* m, const double* st, double s, int ox,
                                               int oy, int h, int w)
{ transfer_blend<0>(f, fh, fw, wp, m, st, s, ox, oy, h, w); }

extern "C" __global__ void transfer_blend_rgb(unsigned char* f, int fh, int fw, const float* wp,
                                              const float* m, const double* st, double s, int ox,
                                              int oy, int h, int w)
{ transfer_blend<1>(f, fh, fw, wp, m, st, s, ox, oy, h, w); }

extern "C" __global__ void transfer_blend_lab(unsigned char* f, int fh, int fw, const float* wp,
                                              const float* m, const double* st, double s, int ox,
                                              int oy, int h, int w)
{ transfer_blend<2>(f, fh, fw, wp, m, st, s, ox, oy, h, w); }
