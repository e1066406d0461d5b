// The occlusion mask's per-pixel step: the CUDA twin of kernels/occlusion.py:occluder_score. The
// NumPy function is the specification; float32 arithmetic here follows it operation by operation
// (__fmul_rn/__fadd_rn so that no product and sum is contracted into an FMA that rounds differently).

// clip((|W (rgb - m)| - lo) * inv, 0, 1) for the pixel at `px`, with inv = 1 / (hi - lo) from the host.
__device__ __forceinline__ float ramp_score(const unsigned char* px, float w00, float w01, float w02, float w10,
                                            float w11, float w12, float w20, float w21, float w22, float m0,
                                            float m1, float m2, float lo, float inv)
{
    float x0 = __fsub_rn((float)px[0], m0);
    float x1 = __fsub_rn((float)px[1], m1);
    float x2 = __fsub_rn((float)px[2], m2);
    float z0 = __fadd_rn(__fadd_rn(__fmul_rn(w00, x0), __fmul_rn(w01, x1)), __fmul_rn(w02, x2));
    float z1 = __fadd_rn(__fadd_rn(__fmul_rn(w10, x0), __fmul_rn(w11, x1)), __fmul_rn(w12, x2));
    float z2 = __fadd_rn(__fadd_rn(__fmul_rn(w20, x0), __fmul_rn(w21, x1)), __fmul_rn(w22, x2));
    float d = __fsqrt_rn(__fadd_rn(__fadd_rn(__fmul_rn(z0, z0), __fmul_rn(z1, z1)), __fmul_rn(z2, z2)));
    return fminf(fmaxf(__fmul_rn(__fsub_rn(d, lo), inv), 0.0f), 1.0f);
}

// score = ramp_score * allow.
extern "C" __global__ void occluder_score_u8(
    const unsigned char* __restrict__ patch, const float* __restrict__ allow,
    float w00, float w01, float w02, float w10, float w11, float w12, float w20, float w21, float w22,
    float m0, float m1, float m2, float lo, float inv, int n, float* __restrict__ out)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    out[i] = __fmul_rn(ramp_score(patch + 3 * i, w00, w01, w02, w10, w11, w12, w20, w21, w22, m0, m1, m2, lo, inv),
                       allow[i]);
}

// ---- The rest of the mask's per-face GPU work, fused (issue 20: GPU time per face) --------------
// Each kernel below is the CUDA twin of a composition of reference ops named in
// kernels/occlusion.py, with every float operation rounded in the reference's order, so that the
// results are the same bits. Before these, the generic CuPy array code of those references took
// about 230 launches per face.

__device__ __forceinline__ int clampi(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }

// Output pixel i of a (.., w) grid through a 2x3 output -> input matrix, as kernels/warp.py's
// warp_affine computes it: the position in double, its floor, and the fractions in float32. The
// floor is clamped in double before the int conversion, so that a coordinate far off the input
// cannot overflow it.
struct Cell { int x0, y0; float fx, fy; };

__device__ __forceinline__ Cell affine_cell(int i, int w, double a00, double a01, double a02, double a10,
                                            double a11, double a12)
{
    double gx = (double)(i % w), gy = (double)(i / w);
    double x = __dadd_rn(__dadd_rn(__dmul_rn(a00, gx), __dmul_rn(a01, gy)), a02);
    double y = __dadd_rn(__dadd_rn(__dmul_rn(a10, gx), __dmul_rn(a11, gy)), a12);
    double x0f = floor(x), y0f = floor(y);
    Cell c;
    c.fx = (float)(x - x0f);
    c.fy = (float)(y - y0f);
    c.x0 = (int)fmax(fmin(x0f, 1e9), -1e9);
    c.y0 = (int)fmax(fmin(y0f, 1e9), -1e9);
    return c;
}

// One channel of the box-averaged image (kernels/warp.py:box_downsample) at block (bx, by):
// rint(float32 sum / (k * k)); the sum of at most 64 * 64 bytes is exact in float32 in any order.
__device__ __forceinline__ float box_tap(const unsigned char* __restrict__ frame, int W, int bx0, int by0,
                                         int k, int bx, int by, int c)
{
    if (k == 1) return (float)frame[((by0 + by) * W + (bx0 + bx)) * 3 + c];
    float s = 0.0f;
    for (int i = 0; i < k; ++i) {
        const unsigned char* row = frame + ((by0 + by * k + i) * W + (bx0 + bx * k)) * 3 + c;
        for (int j = 0; j < k; ++j) s = __fadd_rn(s, (float)row[3 * j]);
    }
    return rintf(__fdiv_rn(s, (float)(k * k)));
}

// canvas_sample: the face's frame area, box-averaged by k (bw x bh blocks from (bx0, by0)), then
// warped onto the (ch, cw) canvas through a (canvas pixel -> block) 2x3 matrix with bilinear
// sampling and a replicated border (kernels/warp.py:warp_affine), rounded to uint8.
extern "C" __global__ void occl_canvas_u8(
    const unsigned char* __restrict__ frame, int W, int bx0, int by0, int bw, int bh, int k,
    double a00, double a01, double a02, double a10, double a11, double a12,
    int ch, int cw, unsigned char* __restrict__ out)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= ch * cw) return;
    const Cell g = affine_cell(i, cw, a00, a01, a02, a10, a11, a12);
    const int x0 = g.x0, y0 = g.y0;
    const float fx = g.fx, fy = g.fy;
    int xa = clampi(x0, 0, bw - 1), xb = clampi(x0 + 1, 0, bw - 1);
    int ya = clampi(y0, 0, bh - 1), yb = clampi(y0 + 1, 0, bh - 1);
    for (int c = 0; c < 3; ++c) {
        float p00 = box_tap(frame, W, bx0, by0, k, xa, ya, c), p01 = box_tap(frame, W, bx0, by0, k, xb, ya, c);
        float p10 = box_tap(frame, W, bx0, by0, k, xa, yb, c), p11 = box_tap(frame, W, bx0, by0, k, xb, yb, c);
        float top = __fadd_rn(p00, __fmul_rn(__fsub_rn(p01, p00), fx));
        float bot = __fadd_rn(p10, __fmul_rn(__fsub_rn(p11, p10), fx));
        float v = rintf(__fadd_rn(top, __fmul_rn(__fsub_rn(bot, top), fy)));
        out[3 * i + c] = (unsigned char)fminf(fmaxf(v, 0.0f), 255.0f);
    }
}

// occluder_part: inside a box of the canvas, a pixel is an occluder only if it is unlike the part's
// own model too: sub = occluder_score(patch, allow) with the part's model; score -= weight *
// max(score - sub, 0). `weight` is the box's (bh, bw) soft part mask.
extern "C" __global__ void occl_part_u8(
    const unsigned char* __restrict__ patch, const float* __restrict__ allow, int width,
    int y0, int x0, int bh, int bw, const float* __restrict__ weight,
    float w00, float w01, float w02, float w10, float w11, float w12, float w20, float w21, float w22,
    float m0, float m1, float m2, float lo, float inv, float* __restrict__ score)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= bh * bw) return;
    int p = (y0 + i / bw) * width + (x0 + i % bw);
    float sub = __fmul_rn(ramp_score(patch + 3 * p, w00, w01, w02, w10, w11, w12, w20, w21, w22, m0, m1, m2, lo, inv),
                          allow[p]);
    float s = score[p];
    score[p] = __fsub_rn(s, __fmul_rn(weight[i], fmaxf(__fsub_rn(s, sub), 0.0f)));
}

// visible_region: 1 - the canvas mask sampled at the swap region's pixels through a (region pixel
// -> canvas) 2x3 matrix, bilinear with a constant 0 border (warp_affine(border="constant")).
extern "C" __global__ void occl_to_region(const float* __restrict__ occ, int ch, int cw,
                                          double a00, double a01, double a02, double a10, double a11,
                                          double a12, int h, int w, float* __restrict__ out)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= h * w) return;
    const Cell g = affine_cell(i, w, a00, a01, a02, a10, a11, a12);
    const int x0 = g.x0, y0 = g.y0;
    const float fx = g.fx, fy = g.fy;
    float p[4];
    for (int t = 0; t < 4; ++t) {
        int xx = x0 + (t & 1), yy = y0 + (t >> 1);
        p[t] = (xx >= 0 && xx < cw && yy >= 0 && yy < ch) ? occ[yy * cw + xx] : 0.0f;
    }
    float top = __fadd_rn(p[0], __fmul_rn(__fsub_rn(p[1], p[0]), fx));
    float bot = __fadd_rn(p[2], __fmul_rn(__fsub_rn(p[3], p[2]), fx));
    out[i] = __fsub_rn(1.0f, __fadd_rn(top, __fmul_rn(__fsub_rn(bot, top), fy)));
}
