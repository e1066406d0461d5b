// Unsharp mask inside a box of a packed RGB uint8 frame, in place: the CUDA twin of
// kernels/sharpen.py::sharpen_ref, which is the specification.
//
//     out = clip(rint(x + amount * (x - G(x))), 0, 255)
//
// G is separable: sharpen_h_u8 blurs the frame rows [sy0, sy0 + sh) horizontally over the box's
// columns into a float32 scratch buffer (sh x bw x 3), reading columns outside the box from the frame
// and replicating only at the frame's border; sharpen_v_u8 then blurs that buffer vertically (rows
// clamped to the frame, which the buffer covers), combines, rounds and writes the box back. The second
// kernel reads only its own pixel of the frame before writing it, and the first has finished by then
// (same stream), so working in place is safe.
//
// Arithmetic mirrors the reference step for step: float32 accumulators starting at 0, taps in
// ascending order, each product and sum rounded separately (__fmul_rn/__fadd_rn are never contracted
// into FMAs), rintf = NumPy's rint (round half to even). Kernel and reference agree bit for bit.
//
// One thread per pixel of the region, three channels each.

extern "C" __global__ void sharpen_h_u8(
    const unsigned char* __restrict__ frame, int height, int width, int x0, int bw, int sy0, int sh,
    const float* __restrict__ taps, int r, float* __restrict__ scratch)
{
    const long long idx = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (idx >= static_cast<long long>(sh) * bw) return;
    const int j = static_cast<int>(idx / bw);
    const int bx = static_cast<int>(idx - static_cast<long long>(j) * bw);
    const unsigned char* row = frame + static_cast<long long>(sy0 + j) * width * 3;
    const int xc = x0 + bx;
    float acc0 = 0.0f, acc1 = 0.0f, acc2 = 0.0f;
    for (int i = 0; i <= 2 * r; ++i) {
        const int xx = min(max(xc + i - r, 0), width - 1);
        const float k = taps[i];
        acc0 = __fadd_rn(acc0, __fmul_rn(k, static_cast<float>(row[3 * xx])));
        acc1 = __fadd_rn(acc1, __fmul_rn(k, static_cast<float>(row[3 * xx + 1])));
        acc2 = __fadd_rn(acc2, __fmul_rn(k, static_cast<float>(row[3 * xx + 2])));
    }
    float* o = scratch + 3 * idx;
    o[0] = acc0;
    o[1] = acc1;
    o[2] = acc2;
}

extern "C" __global__ void sharpen_v_u8(
    unsigned char* __restrict__ frame, int height, int width, int x0, int y0, int bw, int bh,
    int sy0, const float* __restrict__ taps, int r, const float* __restrict__ scratch, float amount)
{
    const long long idx = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (idx >= static_cast<long long>(bh) * bw) return;
    const int by = static_cast<int>(idx / bw);
    const int bx = static_cast<int>(idx - static_cast<long long>(by) * bw);
    const int y = y0 + by;
    float acc[3] = {0.0f, 0.0f, 0.0f};
    for (int i = 0; i <= 2 * r; ++i) {
        const int yy = min(max(y + i - r, 0), height - 1) - sy0;
        const float k = taps[i];
        const float* s = scratch + 3 * (static_cast<long long>(yy) * bw + bx);
#pragma unroll
        for (int c = 0; c < 3; ++c) acc[c] = __fadd_rn(acc[c], __fmul_rn(k, s[c]));
    }
    unsigned char* p = frame + (static_cast<long long>(y) * width + x0 + bx) * 3;
#pragma unroll
    for (int c = 0; c < 3; ++c) {
        const float x = static_cast<float>(p[c]);
        const float v = __fadd_rn(x, __fmul_rn(amount, __fsub_rn(x, acc[c])));
        p[c] = static_cast<unsigned char>(fminf(fmaxf(rintf(v), 0.0f), 255.0f));
    }
}
