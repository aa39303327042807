// Per-element steps of a forward pass: SwiGLU, the residual add, the bias
// add and row gathers, each computing what the CPU backend computes
// (kernels/src/ops/row.rs) to the bit. Every product, sum and quotient uses
// an explicitly rounded intrinsic so that compiler flags (fast math, FMA
// contraction) cannot change a result.

// GGML's vector e^x, step for step as the CPU backend's `exp`
// (kernels/src/ops/simd.rs) computes it, so that SiLU matches it bit for
// bit: the exponent n is x·log2 e rounded by adding and subtracting
// 1.5 · 2^23, b = x − n·ln2 in two fused steps with ln2 split in two, a
// degree-5 polynomial in b, times 2^n. Outside [-87, 88] it gives 0 below
// and +inf above; NaN stays NaN.
__device__ __forceinline__ float ew_exp(float x) {
    const float lo = -87.0f;
    const float hi = 88.0f;
    const float round_shift = 12582912.0f;
    const float log2_e = __int_as_float(0x3fb8aa3b);
    const float ln2_hi = __int_as_float(0x3f317200);
    const float ln2_lo = __int_as_float(0x35bfbe8e);
    const float c0 = __int_as_float(0x3f7ffff6);
    const float c1 = __int_as_float(0x3efffedb);
    const float c2 = __int_as_float(0x3e2aaf33);
    const float c3 = __int_as_float(0x3d2b9f17);
    const float c4 = __int_as_float(0x3c072010);
    // The CPU's max then min, x86 MAXPS/MINPS semantics: NaN clamps to the
    // low end here and is restored below.
    float xc = x > lo ? x : lo;
    xc = xc < hi ? xc : hi;
    const float n = __fsub_rn(__fmaf_rn(xc, log2_e, round_shift), round_shift);
    const float minus_n = __fsub_rn(0.0f, n);
    const float b = __fmaf_rn(minus_n, ln2_lo, __fmaf_rn(minus_n, ln2_hi, xc));
    const float u = __fmul_rn(b, b);
    const float high = __fmaf_rn(__fmaf_rn(c4, b, c3), u, __fmaf_rn(c2, b, c1));
    const float p = __fmaf_rn(high, u, __fmaf_rn(c0, b, 1.0f));
    // n is a whole number in -126..=127 here, so 2^n is a normal float.
    const float two_to_n = __int_as_float(((int)n + 127) << 23);
    float e = __fmul_rn(p, two_to_n);
    // x − x: 0 for finite x, NaN for ±inf and NaN, which it carries into e.
    e = __fadd_rn(e, __fsub_rn(x, x));
    e = x < lo ? 0.0f : e;
    return hi < x ? __int_as_float(0x7f800000) : e;
}

// silu(g) × u with silu(g) = g / (1 + e^−g), as the CPU rounds it.
__device__ __forceinline__ float ew_swiglu(float gate, float up) {
    const float silu = __fdiv_rn(gate, __fadd_rn(1.0f, ew_exp(__fsub_rn(0.0f, gate))));
    return __fmul_rn(silu, up);
}

// out = silu(gate) × up, element by element.
//
// Launch: grid (min(ceil(n / 256), 65535)), block (256) — any grid and
// block work: threads stride over the n elements; no dynamic shared memory.
//   out  n floats, written (may be gate or up itself)
//   gate n floats
//   up   n floats
//   n    element count
extern "C" __global__ void sl_swiglu(float* out, const float* gate, const float* up, long long n) {
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        out[i] = ew_swiglu(gate[i], up[i]);
    }
}

// x += y, element by element (the residual connection).
//
// Launch: grid (min(ceil(n / 256), 65535)), block (256) — any grid and
// block work: threads stride over the n elements; no dynamic shared memory.
//   x n floats, updated
//   y n floats (may be x itself)
//   n element count
extern "C" __global__ void sl_add(float* x, const float* y, long long n) {
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        x[i] = __fadd_rn(x[i], y[i]);
    }
}

// bias added to every row of x.
//
// Launch: grid (n_rows), block (256) — any block size works, threads
// striding over the row; no dynamic shared memory. Block b updates row b.
//   x     n_rows × width floats, updated
//   bias  width floats
//   width the row width (bias's length)
extern "C" __global__ void sl_add_bias(float* __restrict__ x, const float* __restrict__ bias, int width) {
    float* row = x + (long long)blockIdx.x * width;
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        row[i] = __fadd_rn(row[i], bias[i]);
    }
}

// out row i = x row rows[i], in the order rows lists them.
//
// Launch: grid (n_rows_out), block (256) — any block size works, threads
// striding over the row; no dynamic shared memory. Block b writes row b.
//   out   n_rows_out × width floats, written (must not overlap x)
//   x     the source rows, width floats each
//   rows  n_rows_out row indices into x, each one a row x holds
//   width the row width
extern "C" __global__ void sl_gather(
    float* __restrict__ out,
    const float* __restrict__ x,
    const int* __restrict__ rows,
    int width) {
    const float* src = x + (long long)rows[blockIdx.x] * width;
    float* dst = out + (long long)blockIdx.x * width;
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        dst[i] = src[i];
    }
}

// x rounded to the nearest f16, or bf16 when `bf16` is non-zero (ties to
// even): the activations of a cuBLAS product of f16 or bf16 weights.
//
// Launch: grid (min(ceil(n / 256), 65535)), block (256) — any grid and
// block work: threads stride over the n elements; no dynamic shared memory.
//   out  n halves, written
//   x    n floats
//   n    element count
//   bf16 0: f16, else bf16
extern "C" __global__ void sl_round_half(u16* __restrict__ out, const float* __restrict__ x, long long n, int bf16) {
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        u16 bits;
        if (bf16) {
            asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(bits) : "f"(x[i]));
        } else {
            bits = f32_to_f16(x[i]);
        }
        out[i] = bits;
    }
}
