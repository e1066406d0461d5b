// The occlusion mask's per-pixel step: the CUDA twin of kernels/occlusion.py:occluder_score. The
// NumPy function is the specification; float32 arithmetic here follows it operation by operation
// (__fmul_rn/__fadd_rn so that no product and sum is contracted into an FMA that rounds differently).

// score = clip((|W (rgb - m)| - lo) * inv, 0, 1) * allow, with inv = 1 / (hi - lo) from the host.
extern "C" __global__ void occluder_score_u8(
    const unsigned char* __restrict__ patch, const float* __restrict__ allow,
    float w00, float w01, float w02, float w10, float w11, float w12, float w20, float w21, float w22,
    float m0, float m1, float m2, float lo, float inv, int n, float* __restrict__ out)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x0 = __fsub_rn((float)patch[3 * i], m0);
    float x1 = __fsub_rn((float)patch[3 * i + 1], m1);
    float x2 = __fsub_rn((float)patch[3 * i + 2], m2);
    float z0 = __fadd_rn(__fadd_rn(__fmul_rn(w00, x0), __fmul_rn(w01, x1)), __fmul_rn(w02, x2));
    float z1 = __fadd_rn(__fadd_rn(__fmul_rn(w10, x0), __fmul_rn(w11, x1)), __fmul_rn(w12, x2));
    float z2 = __fadd_rn(__fadd_rn(__fmul_rn(w20, x0), __fmul_rn(w21, x1)), __fmul_rn(w22, x2));
    float d = __fsqrt_rn(__fadd_rn(__fadd_rn(__fmul_rn(z0, z0), __fmul_rn(z1, z1)), __fmul_rn(z2, z2)));
    float s = __fmul_rn(__fsub_rn(d, lo), inv);
    s = fminf(fmaxf(s, 0.0f), 1.0f);
    out[i] = __fmul_rn(s, allow[i]);
}
