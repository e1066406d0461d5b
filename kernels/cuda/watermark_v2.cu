// Watermark v2 embedding: add a float32 luma pattern, scaled per 8x8 block by the block's texture, to
// a packed RGB uint8 frame in place. The CUDA twin of kernels/watermark_v2.py::embed_masked_ref,
// which is the specification:
//
//     Y(y, x)    = (9798 R + 19235 G + 3735 B + 16384) >> 15
//     act(b)     = sum of |Y(p) - Y(q)| over horizontal and vertical neighbour pairs inside block b
//     m(b)       = min(max((float)act / (float)n * inv_act, m_lo), m_hi)     n: b's pixels in frame
//     out(y,x,c) = clip(frame(y,x,c) + rint(m(b) * pattern(y, x)), 0, 255)
//
// One 8x8 thread block per 8x8 pixel block: each thread computes its pixel's differences to its
// right and lower neighbours inside the block (0 past the block or the frame), the block sums them
// in shared memory (integers: exact in any order), thread 0 forms m with __fdiv_rn and __fmul_rn
// (no FMA contraction), and after a barrier each thread adds rintf(m * pattern) to its own pixel.
// No thread reads a pixel of another thread block, so marking in place has no race.

__device__ __forceinline__ int luma_at(const unsigned char* p)
{
    return (9798 * static_cast<int>(p[0]) + 19235 * static_cast<int>(p[1]) + 3735 * static_cast<int>(p[2]) + 16384) >> 15;
}

extern "C" __global__ void watermark_v2_embed(
    unsigned char* __restrict__ frame, int height, int width,
    const float* __restrict__ pattern, float inv_act, float m_lo, float m_hi)
{
    __shared__ int s_act[64];
    __shared__ int s_n[64];
    __shared__ float s_m;
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int x = blockIdx.x * 8 + tx;
    const int y = blockIdx.y * 8 + ty;
    const int t = ty * 8 + tx;
    const bool inside = x < width && y < height;
    int a = 0;
    int yv = 0;
    if (inside) {
        const unsigned char* p = frame + 3 * (static_cast<long long>(y) * width + x);
        yv = luma_at(p);
        if (tx < 7 && x + 1 < width) a += abs(yv - luma_at(p + 3));
        if (ty < 7 && y + 1 < height) a += abs(yv - luma_at(p + 3LL * width));
    }
    s_act[t] = a;
    s_n[t] = inside ? 1 : 0;
    __syncthreads();
    for (int step = 32; step > 0; step >>= 1) {
        if (t < step) {
            s_act[t] += s_act[t + step];
            s_n[t] += s_n[t + step];
        }
        __syncthreads();
    }
    if (t == 0) {
        const float mean = __fdiv_rn(static_cast<float>(s_act[0]), static_cast<float>(s_n[0]));
        s_m = fminf(fmaxf(__fmul_rn(mean, inv_act), m_lo), m_hi);
    }
    __syncthreads();
    if (!inside) return;
    const long long idx = static_cast<long long>(y) * width + x;
    const int d = static_cast<int>(rintf(__fmul_rn(s_m, pattern[idx])));
    unsigned char* p = frame + 3 * idx;
#pragma unroll
    for (int c = 0; c < 3; ++c) p[c] = static_cast<unsigned char>(min(max(static_cast<int>(p[c]) + d, 0), 255));
}
