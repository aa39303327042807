// RMSNorm, as the CPU backend computes it (kernels/src/ops/row.rs):
// out = (x × scale) × weight with scale = 1 / sqrt(mean(x²) + eps).
//
// The CPU sums the f32-rounded squares in f64 and rounds the mean to f32
// before the f32 steps. Here each square is rounded to f32 the same way and
// summed in f64 too, only in a different order; an f64 sum of f32 squares
// is within ~1e-16 of any other order's, so the f32 mean (and with it every
// output) is almost always the CPU's to the bit. The f32 steps use the
// explicitly rounded intrinsics so that compiler flags (fast math, FMA
// contraction) cannot change them.

#define NORM_FULL_MASK 0xffffffffu

__device__ __forceinline__ double norm_warp_sum(double value) {
#pragma unroll
    for (int offset = WARP / 2; offset > 0; offset /= 2) {
        // a + b and b + a are the same bits, so every lane ends with the
        // same total.
        value += __shfl_xor_sync(NORM_FULL_MASK, value, offset);
    }
    return value;
}

// Sum over the block; every thread gets the total. `scratch` holds one
// double per warp; the block calls it together.
__device__ __forceinline__ double norm_block_sum(double value, double* scratch) {
    const int lane = threadIdx.x % WARP;
    const int warp = threadIdx.x / WARP;
    value = norm_warp_sum(value);
    if (lane == 0) {
        scratch[warp] = value;
    }
    __syncthreads();
    const int warps = (blockDim.x + WARP - 1) / WARP;
    value = lane < warps ? scratch[lane] : 0.0;
    return norm_warp_sum(value);
}

// The sum of squares this thread's share of `x` contributes: elements
// first, first + step, … below width.
__device__ __forceinline__ double norm_partial_squares(const float* x, int width, int first, int step) {
    double sum = 0.0;
    for (int i = first; i < width; i += step) {
        const float value = x[i];
        sum += (double)__fmul_rn(value, value);
    }
    return sum;
}

// 1 / sqrt(mean + eps) from the total, in the CPU's roundings: the mean
// divided in f64 and rounded to f32, the rest in f32.
__device__ __forceinline__ float norm_scale(double sum_of_squares, int width, float eps) {
    const float mean = __double2float_rn(__ddiv_rn(sum_of_squares, (double)width));
    return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, eps)));
}

// RMSNorm of every row of x into out (not in place: x and out must not
// overlap; use sl_rms_norm_in_place for that).
//
// Launch: grid (n_rows), block (256) — any multiple of 32 up to 1024 works;
// no dynamic shared memory. Block b normalizes row b.
//   out    n_rows × width floats, written
//   x      n_rows × width floats
//   weight width floats
//   width  the row width (weight's length), ≥ 1
//   eps    added to the mean of squares
extern "C" __global__ void sl_rms_norm(
    float* __restrict__ out,
    const float* __restrict__ x,
    const float* __restrict__ weight,
    int width,
    float eps) {
    __shared__ double scratch[WARP];
    const long long row = blockIdx.x;
    const float* in = x + row * width;
    float* dst = out + row * width;
    const double total = norm_block_sum(norm_partial_squares(in, width, threadIdx.x, blockDim.x), scratch);
    const float scale = norm_scale(total, width, eps);
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        dst[i] = __fmul_rn(__fmul_rn(in[i], scale), weight[i]);
    }
}

// RMSNorm of every `width`-long piece of x in place (per-head q/k norms:
// pieces are heads, typically 64 to 256 wide, so one warp takes a piece).
//
// Launch: grid (ceil(n_pieces / 8)), block (256) — any multiple of 32 up to
// 1024 works, each warp of it taking one piece: piece = blockIdx.x ×
// (blockDim.x / 32) + warp; no dynamic shared memory.
//   x        n_pieces × width floats, normalized in place
//   weight   width floats
//   width    the piece width (weight's length), ≥ 1
//   n_pieces how many pieces x holds (rows × heads)
//   eps      added to the mean of squares
extern "C" __global__ void sl_rms_norm_in_place(
    float* __restrict__ x,
    const float* __restrict__ weight,
    int width,
    long long n_pieces,
    float eps) {
    const int lane = threadIdx.x % WARP;
    const long long piece = (long long)blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    // Whole warps leave together, so the shuffles below see full warps.
    if (piece >= n_pieces) {
        return;
    }
    float* values = x + piece * width;
    const double total = norm_warp_sum(norm_partial_squares(values, width, lane, WARP));
    const float scale = norm_scale(total, width, eps);
    for (int i = lane; i < width; i += WARP) {
        values[i] = __fmul_rn(__fmul_rn(values[i], scale), weight[i]);
    }
}
