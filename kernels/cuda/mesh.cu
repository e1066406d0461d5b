// Piecewise-affine mesh mapping and bilinear remap: the CUDA twins of kernels/mesh.py and
// kernels/warp.py::remap_bilinear. The NumPy functions are the specification; the arithmetic here
// follows them step for step (double precision for the barycentric coordinates, float32 for the
// sampling) so that results agree to rounding.

#define EDGE_EPS 1e-6

// One block per triangle: its threads stride over the triangle's pixel bounding box. Faces have
// ~900 small triangles, so this keeps every thread busy without a prefix sum over box sizes.
extern "C" __global__ void rasterize_mesh_f32(
    const float* __restrict__ dst_pts, const float* __restrict__ src_pts,
    const int* __restrict__ tris, int n_tris, int x0, int y0, int h, int w, int cull,
    float* __restrict__ out_map)
{
    int t = blockIdx.x;
    if (t >= n_tris) return;
    int i0 = tris[3 * t], i1 = tris[3 * t + 1], i2 = tris[3 * t + 2];
    double ax = (double)dst_pts[2 * i0] - x0, ay = (double)dst_pts[2 * i0 + 1] - y0;
    double bx = (double)dst_pts[2 * i1] - x0, by = (double)dst_pts[2 * i1 + 1] - y0;
    double cx = (double)dst_pts[2 * i2] - x0, cy = (double)dst_pts[2 * i2 + 1] - y0;
    double s0x = src_pts[2 * i0], s0y = src_pts[2 * i0 + 1];
    double s1x = src_pts[2 * i1], s1y = src_pts[2 * i1 + 1];
    double s2x = src_pts[2 * i2], s2y = src_pts[2 * i2 + 1];
    double area_d = (bx - ax) * (cy - ay) - (cx - ax) * (by - ay);
    double area_s = (s1x - s0x) * (s2y - s0y) - (s2x - s0x) * (s1y - s0y);
    if (fabs(area_d) <= 1e-9) return;
    if (cull && area_d * area_s <= 0.0) return;  // faces away from the camera
    int bx0 = (int)fmin(fmax(ceil(fmin(ax, fmin(bx, cx))), 0.0), (double)w);
    int bx1 = (int)fmin(fmax(floor(fmax(ax, fmax(bx, cx))) + 1.0, 0.0), (double)w);
    int by0 = (int)fmin(fmax(ceil(fmin(ay, fmin(by, cy))), 0.0), (double)h);
    int by1 = (int)fmin(fmax(floor(fmax(ay, fmax(by, cy))) + 1.0, 0.0), (double)h);
    int bw = bx1 - bx0, bh = by1 - by0;
    if (bw <= 0 || bh <= 0) return;
    double inv_area = 1.0 / area_d;
    for (int k = threadIdx.x; k < bw * bh; k += blockDim.x) {
        int px = bx0 + k % bw, py = by0 + k / bw;
        double l1 = ((px - ax) * (cy - ay) - (cx - ax) * (py - ay)) * inv_area;
        double l2 = ((bx - ax) * (py - ay) - (px - ax) * (by - ay)) * inv_area;
        double l0 = 1.0 - l1 - l2;
        if (l0 >= -EDGE_EPS && l1 >= -EDGE_EPS && l2 >= -EDGE_EPS) {
            size_t o = 2 * ((size_t)py * w + px);
            out_map[o] = (float)(l0 * s0x + l1 * s1x + l2 * s2x);
            out_map[o + 1] = (float)(l0 * s0y + l1 * s1y + l2 * s2y);
        }
    }
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
