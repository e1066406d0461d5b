// Host emulation of the CUDA constructs that our element-wise kernels use (tests/kernels/
// test_cuda_emulation.py): each kernel becomes a plain C++ function and a launch loops over every
// (block, thread) in turn. The float intrinsics are the IEEE round-to-nearest operations they name,
// compiled with -ffp-contract=off so that nothing is fused, as on the GPU. This checks a kernel's
// arithmetic and indexing against its NumPy reference on a machine without a GPU; it cannot check
// what needs real threads (shared memory, atomics, races), nor NVRTC itself: the GPU tests still do.
#include <cmath>
#include <cstdint>
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__
#define __constant__
struct dim3 { unsigned x, y, z; };
static dim3 blockIdx, blockDim, threadIdx;
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
using std::floor; using std::fmax; using std::fmin;
inline float floorf(float a) { return std::floor(a); }
inline float fminf(float a, float b) { return std::fmin(a, b); }
inline float fmaxf(float a, float b) { return std::fmax(a, b); }
#define LAUNCH(n, f, ...) do { blockDim.x = 256; for (unsigned _blk = 0; _blk < ((n) + 255) / 256; ++_blk) { \
    blockIdx.x = _blk; for (unsigned _thr = 0; _thr < 256; ++_thr) { threadIdx.x = _thr; f(__VA_ARGS__); } } } while (0)
