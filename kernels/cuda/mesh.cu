// Piecewise-affine mesh mapping and bilinear remap: the CUDA twins of kernels/mesh.py and
// kernels/warp.py::remap_bilinear. The NumPy functions are the specification; the arithmetic here
// follows them step for step (exact 64-bit edge functions on vertices snapped to 1/256 px, double
// precision barycentrics without FMA contraction, float32 for the sampling) so that coverage is
// identical and values agree to the last bit.

#define SUB_ONE 256  // 1 << SUBPIXEL_BITS in mesh.py

__device__ __forceinline__ long long floor_div(long long a, long long b)  // b > 0
{
    return a >= 0 ? a / b : -((-a + b - 1) / b);
}

struct Tri {
    long long x[3], y[3];  // snapped target vertices relative to the map origin, wound positively
    double sx[3], sy[3];   // the source vertices sampled, in the same order
    long long area;        // doubled area, > 0
    int tl[3];             // edge k (vertex k -> k+1) is a top or left edge
};

// Triangle t as mesh.py::_setup builds it; false when it is degenerate or culled.
__device__ bool setup_tri(const float* __restrict__ dst_pts, const float* __restrict__ src_pts,
                          const int* __restrict__ tris, const int* __restrict__ src_tris, int t,
                          int x0, int y0, int cull, int front, Tri& T)
{
    double wx[3], wy[3];
    for (int k = 0; k < 3; ++k) {
        int i = tris[3 * t + k], j = src_tris[3 * t + k];
        T.x[k] = (long long)rint(__dmul_rn(__dsub_rn((double)dst_pts[2 * i], (double)x0), (double)SUB_ONE));
        T.y[k] = (long long)rint(__dmul_rn(__dsub_rn((double)dst_pts[2 * i + 1], (double)y0), (double)SUB_ONE));
        T.sx[k] = src_pts[2 * j];
        T.sy[k] = src_pts[2 * j + 1];
        wx[k] = src_pts[2 * i];
        wy[k] = src_pts[2 * i + 1];
    }
    long long area = (T.x[1] - T.x[0]) * (T.y[2] - T.y[0]) - (T.y[1] - T.y[0]) * (T.x[2] - T.x[0]);
    double area_s = __dsub_rn(__dmul_rn(__dsub_rn(wx[1], wx[0]), __dsub_rn(wy[2], wy[0])),
                              __dmul_rn(__dsub_rn(wy[1], wy[0]), __dsub_rn(wx[2], wx[0])));
    if (area == 0) return false;
    if (cull && front != 0 && ((area > 0) != (front > 0))) return false;  // the caller's winding
    if (cull && front == 0 && ((area > 0) != (area_s > 0.0))) return false;  // the source's
    if (area < 0) {  // wind positively: swap vertices 1 and 2
        long long tx = T.x[1], ty = T.y[1];
        T.x[1] = T.x[2]; T.y[1] = T.y[2]; T.x[2] = tx; T.y[2] = ty;
        double ux = T.sx[1], uy = T.sy[1];
        T.sx[1] = T.sx[2]; T.sy[1] = T.sy[2]; T.sx[2] = ux; T.sy[2] = uy;
        area = -area;
    }
    T.area = area;
    for (int k = 0; k < 3; ++k) {
        int n = (k + 1) % 3;
        long long ex = T.x[n] - T.x[k], ey = T.y[n] - T.y[k];
        T.tl[k] = (ey < 0) || (ey == 0 && ex > 0);
    }
    return true;
}

// Edge function of edge (a -> b) at pixel centre (X, Y), exact.
__device__ __forceinline__ long long edge_fn(const Tri& T, int a, int b, long long X, long long Y)
{
    return (T.x[b] - T.x[a]) * (Y - T.y[a]) - (T.y[b] - T.y[a]) * (X - T.x[a]);
}

// Pass 1, one block per triangle: its threads stride over the triangle's pixel-centre bounding box
// and claim each covered pixel with atomicMax, so the highest covering index wins whatever the
// order the blocks run in (the reference's rule).
extern "C" __global__ void mesh_owner(
    const float* __restrict__ dst_pts, const float* __restrict__ src_pts,
    const int* __restrict__ tris, const int* __restrict__ src_tris, int n_tris, int x0, int y0,
    int h, int w, int cull, int front, int* __restrict__ owner)
{
    int t = blockIdx.x;
    if (t >= n_tris) return;
    Tri T;
    if (!setup_tri(dst_pts, src_pts, tris, src_tris, t, x0, y0, cull, front, T)) return;
    long long lox = min(T.x[0], min(T.x[1], T.x[2])), hix = max(T.x[0], max(T.x[1], T.x[2]));
    long long loy = min(T.y[0], min(T.y[1], T.y[2])), hiy = max(T.y[0], max(T.y[1], T.y[2]));
    long long bx0 = min(max(-floor_div(-lox, SUB_ONE), 0LL), (long long)w);
    long long by0 = min(max(-floor_div(-loy, SUB_ONE), 0LL), (long long)h);
    long long bx1 = min(max(floor_div(hix, SUB_ONE) + 1, 0LL), (long long)w);
    long long by1 = min(max(floor_div(hiy, SUB_ONE) + 1, 0LL), (long long)h);
    int bw = (int)(bx1 - bx0), bh = (int)(by1 - by0);
    if (bw <= 0 || bh <= 0) return;
    for (int k = threadIdx.x; k < bw * bh; k += blockDim.x) {
        int px = (int)bx0 + k % bw, py = (int)by0 + k / bw;
        long long X = (long long)px * SUB_ONE, Y = (long long)py * SUB_ONE;
        bool in = true;
        for (int e = 0; e < 3; ++e)
            in = in && (edge_fn(T, e, (e + 1) % 3, X, Y) - (T.tl[e] ? 0 : 1) >= 0);
        if (in) atomicMax(owner + (size_t)py * w + px, t);
    }
}

// Pass 2, one thread per pixel: source coordinates from the owner's barycentric weights, NaN where
// no triangle covers.
extern "C" __global__ void mesh_map_from_owner(
    const float* __restrict__ dst_pts, const float* __restrict__ src_pts,
    const int* __restrict__ tris, const int* __restrict__ src_tris, int n_tris, int x0, int y0,
    int h, int w, int cull, int front, const int* __restrict__ owner, float* __restrict__ out_map)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= h * w) return;
    int t = owner[i];
    Tri T;
    if (t < 0 || !setup_tri(dst_pts, src_pts, tris, src_tris, t, x0, y0, cull, front, T)) {
        out_map[2 * i] = nanf("");
        out_map[2 * i + 1] = nanf("");
        return;
    }
    long long X = (long long)(i % w) * SUB_ONE, Y = (long long)(i / w) * SUB_ONE;
    double l[3];
    for (int k = 0; k < 3; ++k)  // vertex k's weight: the opposite edge's function over the area
        l[k] = __ddiv_rn((double)edge_fn(T, (k + 1) % 3, (k + 2) % 3, X, Y), (double)T.area);
    double sx = __dadd_rn(__dadd_rn(__dmul_rn(l[0], T.sx[0]), __dmul_rn(l[1], T.sx[1])), __dmul_rn(l[2], T.sx[2]));
    double sy = __dadd_rn(__dadd_rn(__dmul_rn(l[0], T.sy[0]), __dmul_rn(l[1], T.sy[1])), __dmul_rn(l[2], T.sy[2]));
    out_map[2 * i] = (float)sx;
    out_map[2 * i + 1] = (float)sy;
}

// One thread per output pixel; C channels of uint8 source, float32 output, border replicated,
// NaN map entries produce `fill`.
extern "C" __global__ void remap_bilinear_u8_f32(
    const unsigned char* __restrict__ src, int sh, int sw, int C,
    const float* __restrict__ map, int n, float fill, float* __restrict__ out)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = map[2 * i], y = map[2 * i + 1];
    if (!isfinite(x) || !isfinite(y)) {
        for (int c = 0; c < C; ++c) out[(size_t)i * C + c] = fill;
        return;
    }
    float x0f = floorf(x), y0f = floorf(y);
    float fx = x - x0f, fy = y - y0f;
    int x0 = (int)x0f, y0 = (int)y0f;
    int xa = min(max(x0, 0), sw - 1), xb = min(max(x0 + 1, 0), sw - 1);
    int ya = min(max(y0, 0), sh - 1), yb = min(max(y0 + 1, 0), sh - 1);
    const unsigned char* r0 = src + (size_t)ya * sw * C;
    const unsigned char* r1 = src + (size_t)yb * sw * C;
    for (int c = 0; c < C; ++c) {
        float p00 = r0[xa * C + c], p01 = r0[xb * C + c];
        float p10 = r1[xa * C + c], p11 = r1[xb * C + c];
        // __fmaf_rn would change rounding versus NumPy's separate multiply and add; keep them
        // separate so the kernel matches the reference to float32 rounding.
        float top = __fadd_rn(p00, __fmul_rn(__fsub_rn(p01, p00), fx));
        float bot = __fadd_rn(p10, __fmul_rn(__fsub_rn(p11, p10), fx));
        out[(size_t)i * C + c] = __fadd_rn(top, __fmul_rn(__fsub_rn(bot, top), fy));
    }
}
