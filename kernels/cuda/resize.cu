// kernels/resize.py:resize_bilinear on the GPU, in one launch where the reference takes a dozen array
// operations: (n, h, w, c) float32 into (n, size, size, c), half-pixel centres and clamped edges (as
// cv2.resize's INTER_LINEAR samples), rows first, then columns, each weight, product and sum rounded
// in the reference's float32 order (same bits).

__device__ __forceinline__ void bl_axis(int o, int src, float scale, int* lo, int* hi, float* f)
{
    float pos = __fsub_rn(__fmul_rn(__fadd_rn((float)o, 0.5f), scale), 0.5f);
    pos = fminf(fmaxf(pos, 0.0f), (float)(src - 1));
    int l = (int)floorf(pos);
    *lo = l;
    *hi = l + 1 < src - 1 ? l + 1 : src - 1;
    *f = __fsub_rn(pos, (float)l);
}

extern "C" __global__ void resize_bilinear_f32(const float* __restrict__ src, int n, int h, int w, int c,
                                               int size, float sy, float sx, float* __restrict__ out)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)n * size * size * c) return;
    int ch = (int)(i % c);
    long long p = i / c;
    int ox = (int)(p % size);
    p /= size;
    int oy = (int)(p % size);
    long long b = p / size;
    int y0, y1, x0, x1;
    float fy, fx;
    bl_axis(oy, h, sy, &y0, &y1, &fy);
    bl_axis(ox, w, sx, &x0, &x1, &fx);
    const float* img = src + b * h * w * c;
    float gy = __fsub_rn(1.0f, fy), gx = __fsub_rn(1.0f, fx);
    float t0 = __fadd_rn(__fmul_rn(img[((long long)y0 * w + x0) * c + ch], gy),
                         __fmul_rn(img[((long long)y1 * w + x0) * c + ch], fy));
    float t1 = __fadd_rn(__fmul_rn(img[((long long)y0 * w + x1) * c + ch], gy),
                         __fmul_rn(img[((long long)y1 * w + x1) * c + ch], fy));
    out[i] = __fadd_rn(__fmul_rn(t0, gx), __fmul_rn(t1, fx));
}
