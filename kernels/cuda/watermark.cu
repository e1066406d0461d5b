// Watermark embedding: add a block-DCT spread-spectrum pattern to the luma of a packed RGB uint8
// frame, in place. The CUDA twin of kernels/watermark.py::embed_watermark_ref, which is the
// specification:
//
//     pattern(y, x) = sum_k s[by(y), bx(x), k] * (basis_y[k, y] * basis_x[k, x])   float32, k ascending
//     out(y, x, c)  = clip(frame(y, x, c) + rint(pattern(y, x)), 0, 255)           c = R, G, B
//
// Defines: WM_K (chips per block, so the loop unrolls) and WM_KERNEL (the kernel's name, which
// carries WM_K for profiles).
//
// Arithmetic mirrors the reference: each product basis_y * basis_x is rounded once (__fmul_rn, never
// contracted into an FMA with the sum), the chip's sign flips it exactly, sums are __fadd_rn in
// ascending k starting from 0, and rintf rounds half to even like np.rint. A chip of 0 adds nothing,
// as the reference's `acc + 0 * term` leaves acc unchanged. Kernel and reference agree bit for bit.
//
// One thread per pixel. The tables are small (K x (W + H) floats, a few KB of signs) and stay in
// cache; the frame is read and written once.

extern "C" __global__ void WM_KERNEL(
    unsigned char* __restrict__ frame, int height, int width,
    const signed char* __restrict__ signs, int blocks_x,
    const float* __restrict__ basis_x, const float* __restrict__ basis_y,
    const int* __restrict__ block_x, const int* __restrict__ block_y)
{
    const long long idx = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (idx >= static_cast<long long>(height) * width) return;
    const int y = static_cast<int>(idx / width);
    const int x = static_cast<int>(idx - static_cast<long long>(y) * width);
    const signed char* s = signs + (static_cast<long long>(block_y[y]) * blocks_x + block_x[x]) * WM_K;
    float acc = 0.0f;
#pragma unroll
    for (int k = 0; k < WM_K; ++k) {
        const float term = __fmul_rn(basis_y[k * height + y], basis_x[k * width + x]);
        if (s[k] > 0) acc = __fadd_rn(acc, term);
        else if (s[k] < 0) acc = __fadd_rn(acc, -term);
    }
    const int d = static_cast<int>(rintf(acc));
    unsigned char* p = frame + 3 * idx;
#pragma unroll
    for (int c = 0; c < 3; ++c) p[c] = static_cast<unsigned char>(min(max(static_cast<int>(p[c]) + d, 0), 255));
}
