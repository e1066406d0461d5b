// NV12 <-> packed RGB, the colour conversions at both ends of the GPU pipeline.
//
// NV12 is a luma plane (H rows of `y_pitch` bytes) and an interleaved chroma plane ((H+1)/2 rows of
// `uv_pitch` bytes: U, V, U, V, ...), each with its own row pitch, as NVDEC hands them over.
// Chroma is 4:2:0 with NEAREST siting: chroma sample (i, j) covers the 2x2 luma block of rows 2i, 2i+1
// and columns 2j, 2j+1 (it is not interpolated). That is what OpenCV's COLOR_YUV2RGB_NV12 does too.
//
// The arithmetic mirrors the NumPy references in kernels/nv12.py operation for operation, in float32,
// with the IEEE round-to-nearest intrinsics (__fmul_rn, __fadd_rn, ...). Those are never contracted
// into FMAs, so kernel and reference produce the same bits and the tests compare them exactly.
// The coefficients are constexpr double expressions rounded once to float, written exactly as the
// Python side writes them (`_coefficients` in nv12.py).
//
// One thread per 2x2 block in both directions, so each chroma pair is read (or written) once.
// Four variants per direction, as separate extern "C" names: <op>_<bt601|bt709>_<limited|full>.

struct Nv12Coeffs {
    // decode: R = ys*(Y - yoff) + r_v*(V - 128), G = ys*(Y - yoff) - g_u*(U - 128) - g_v*(V - 128),
    //         B = ys*(Y - yoff) + b_u*(U - 128)
    float yoff, ys, r_v, g_u, g_v, b_u;
    // encode: Y = yr*R + yg*G + yb*B + yoff, U = ur*R + ug*G + ub*B + 128, V = vr*R + vg*G + vb*B + 128
    float yr, yg, yb, ur, ug, ub, vr, vg, vb;
};

template <bool BT709, bool FULL>
__host__ __device__ constexpr Nv12Coeffs nv12_coeffs() {
    constexpr double kr = BT709 ? 0.2126 : 0.299;
    constexpr double kb = BT709 ? 0.0722 : 0.114;
    constexpr double kg = 1.0 - kr - kb;
    // Limited ("video") range: Y in [16, 235] (219 steps), Cb/Cr in [16, 240] (224 steps).
    constexpr double ys_dec = FULL ? 1.0 : 255.0 / 219.0;
    constexpr double cs_dec = FULL ? 1.0 : 255.0 / 224.0;
    constexpr double ys_enc = FULL ? 1.0 : 219.0 / 255.0;
    constexpr double cs_enc = FULL ? 1.0 : 224.0 / 255.0;
    return Nv12Coeffs{
        static_cast<float>(FULL ? 0.0 : 16.0),
        static_cast<float>(ys_dec),
        static_cast<float>(2.0 * (1.0 - kr) * cs_dec),
        static_cast<float>(2.0 * kb * (1.0 - kb) / kg * cs_dec),
        static_cast<float>(2.0 * kr * (1.0 - kr) / kg * cs_dec),
        static_cast<float>(2.0 * (1.0 - kb) * cs_dec),
        static_cast<float>(kr * ys_enc),
        static_cast<float>(kg * ys_enc),
        static_cast<float>(kb * ys_enc),
        static_cast<float>(-kr * cs_enc / (2.0 * (1.0 - kb))),
        static_cast<float>(-kg * cs_enc / (2.0 * (1.0 - kb))),
        static_cast<float>(0.5 * cs_enc),
        static_cast<float>(0.5 * cs_enc),
        static_cast<float>(-kg * cs_enc / (2.0 * (1.0 - kr))),
        static_cast<float>(-kb * cs_enc / (2.0 * (1.0 - kr))),
    };
}

__device__ __forceinline__ unsigned char to_u8(float v) {
    // Round half to even (as numpy.rint), then clip to [0, 255].
    return static_cast<unsigned char>(fminf(fmaxf(rintf(v), 0.0f), 255.0f));
}

template <bool BT709, bool FULL>
__device__ __forceinline__ void nv12_to_rgb_impl(
        const unsigned char* __restrict__ y, const unsigned char* __restrict__ uv,
        unsigned char* __restrict__ out, int height, int width, int y_pitch, int uv_pitch) {
    constexpr Nv12Coeffs c = nv12_coeffs<BT709, FULL>();
    const int bx = blockIdx.x * blockDim.x + threadIdx.x;  // 2x2 block column
    const int by = blockIdx.y * blockDim.y + threadIdx.y;  // 2x2 block row
    const int x0 = 2 * bx;
    const int y0 = 2 * by;
    if (x0 >= width || y0 >= height) return;

    const unsigned char* uvp = uv + static_cast<long long>(by) * uv_pitch + 2 * bx;
    const float u = static_cast<float>(static_cast<int>(uvp[0]) - 128);
    const float v = static_cast<float>(static_cast<int>(uvp[1]) - 128);
    const float dr = __fmul_rn(c.r_v, v);
    const float dgu = __fmul_rn(c.g_u, u);
    const float dgv = __fmul_rn(c.g_v, v);
    const float db = __fmul_rn(c.b_u, u);

#pragma unroll
    for (int dy = 0; dy < 2; ++dy) {
        const int yy = y0 + dy;
        if (yy >= height) break;
        const unsigned char* yrow = y + static_cast<long long>(yy) * y_pitch;
        unsigned char* orow = out + static_cast<long long>(yy) * width * 3;
#pragma unroll
        for (int dx = 0; dx < 2; ++dx) {
            const int xx = x0 + dx;
            if (xx >= width) break;
            const float lum = __fmul_rn(__fsub_rn(static_cast<float>(yrow[xx]), c.yoff), c.ys);
            orow[3 * xx + 0] = to_u8(__fadd_rn(lum, dr));
            orow[3 * xx + 1] = to_u8(__fsub_rn(__fsub_rn(lum, dgu), dgv));
            orow[3 * xx + 2] = to_u8(__fadd_rn(lum, db));
        }
    }
}

template <bool BT709, bool FULL>
__device__ __forceinline__ void rgb_to_nv12_impl(
        const unsigned char* __restrict__ rgb, unsigned char* __restrict__ y_out,
        unsigned char* __restrict__ uv_out, int height, int width, int y_pitch, int uv_pitch) {
    // height and width are even (checked on the Python side).
    constexpr Nv12Coeffs c = nv12_coeffs<BT709, FULL>();
    const int bx = blockIdx.x * blockDim.x + threadIdx.x;
    const int by = blockIdx.y * blockDim.y + threadIdx.y;
    const int x0 = 2 * bx;
    const int y0 = 2 * by;
    if (x0 >= width || y0 >= height) return;

    float us[4], vs[4];
#pragma unroll
    for (int dy = 0; dy < 2; ++dy) {
        const unsigned char* irow = rgb + static_cast<long long>(y0 + dy) * width * 3;
        unsigned char* yrow = y_out + static_cast<long long>(y0 + dy) * y_pitch;
#pragma unroll
        for (int dx = 0; dx < 2; ++dx) {
            const int xx = x0 + dx;
            const float r = static_cast<float>(irow[3 * xx + 0]);
            const float g = static_cast<float>(irow[3 * xx + 1]);
            const float b = static_cast<float>(irow[3 * xx + 2]);
            const float lum = __fadd_rn(__fadd_rn(__fmul_rn(c.yr, r), __fmul_rn(c.yg, g)),
                                        __fmul_rn(c.yb, b));
            yrow[xx] = to_u8(__fadd_rn(lum, c.yoff));
            us[2 * dy + dx] = __fadd_rn(__fadd_rn(__fmul_rn(c.ur, r), __fmul_rn(c.ug, g)),
                                        __fmul_rn(c.ub, b));
            vs[2 * dy + dx] = __fadd_rn(__fadd_rn(__fmul_rn(c.vr, r), __fmul_rn(c.vg, g)),
                                        __fmul_rn(c.vb, b));
        }
    }
    // Mean of the block's four chroma values, in float, in the order (00 + 01) + 10 + 11.
    const float usum = __fadd_rn(__fadd_rn(__fadd_rn(us[0], us[1]), us[2]), us[3]);
    const float vsum = __fadd_rn(__fadd_rn(__fadd_rn(vs[0], vs[1]), vs[2]), vs[3]);
    unsigned char* uvp = uv_out + static_cast<long long>(by) * uv_pitch + x0;
    uvp[0] = to_u8(__fadd_rn(__fmul_rn(usum, 0.25f), 128.0f));
    uvp[1] = to_u8(__fadd_rn(__fmul_rn(vsum, 0.25f), 128.0f));
}

#define NV12_VARIANT(SUFFIX, BT709, FULL)                                                        \
    extern "C" __global__ void nv12_to_rgb_##SUFFIX(                                             \
            const unsigned char* __restrict__ y, const unsigned char* __restrict__ uv,           \
            unsigned char* __restrict__ out, int height, int width, int y_pitch, int uv_pitch) { \
        nv12_to_rgb_impl<BT709, FULL>(y, uv, out, height, width, y_pitch, uv_pitch);            \
    }                                                                                            \
    extern "C" __global__ void rgb_to_nv12_##SUFFIX(                                             \
            const unsigned char* __restrict__ rgb, unsigned char* __restrict__ y_out,            \
            unsigned char* __restrict__ uv_out, int height, int width, int y_pitch,              \
            int uv_pitch) {                                                                      \
        rgb_to_nv12_impl<BT709, FULL>(rgb, y_out, uv_out, height, width, y_pitch, uv_pitch);    \
    }

NV12_VARIANT(bt601_limited, false, false)
NV12_VARIANT(bt601_full, false, true)
NV12_VARIANT(bt709_limited, true, false)
NV12_VARIANT(bt709_full, true, true)
