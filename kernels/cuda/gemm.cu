// Prefill matrix products: y[r][o] = Σ_i W[o][i] · x[r][i] for many
// activation rows, W in its GGUF format (quant.cuh), on tensor cores.
//
// A CTA owns a tile of GEMM_BM activation rows × GEMM_BN output features
// and walks K in steps of BK (64, or Q6_K's span of 128). Each step it
// dequantizes the weight tile and converts the activation tile to f16 in
// shared memory, then its 8 warps multiply them with
// mma.m16n8k16.f32.f16.f16.f32 (f32 accumulation), each warp a 32 × 32
// block of the tile. Where registers allow (GemmShape::PREFETCH), the next
// step's weight bytes and activations are loaded while the current one is
// multiplied.
//
// Why 128 features × 64 rows: activations are f32 and are reread once per
// 128 output features, weights (~0.6 bytes per element for Q4) once per 64
// rows; the wider side goes to the operand that costs more to reread.
//
// Shared tiles hold rows of BK halves in 16-byte units, unit u of row r
// stored at u ^ (r & 7), so that the eight rows an ldmatrix phase reads hit
// eight different bank groups without padding (Q6_K's tiles fill exactly
// 48 KB).
//
// Numerics: weights and activations are rounded to f16 (11 significant
// bits) and their products summed in f32 by the tensor cores, so y differs
// from sl_matvec_* (f32 operands) by up to ~2^-11 relative per term, about
// 1e-4 of Σ|w·x| on random data; an activation beyond ±65504 becomes
// infinite. Every output's sum is the same sequence of mma steps over K,
// whatever m is and wherever its row falls in a tile, so a row's result
// does not depend on the batch it is part of.

#define GEMM_BM 64
#define GEMM_BN 128
#define GEMM_THREADS 256

// ---- PTX wrappers --------------------------------------------------------------

// f16 pair {lo, hi}, lo in the low half (the lower k), rounded to nearest.
__device__ __forceinline__ u32 gemm_pack(float lo, float hi) {
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// Four 8 × 8 f16 matrices; lane l supplies the address of row l % 8 of
// matrix l / 8 and receives, of each, row l / 4, columns 2(l % 4) .. +1.
__device__ __forceinline__ void gemm_ldmatrix_x4(const void* p, u32 (&r)[4]) {
    const u32 a = (u32)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
}

// c += A·B for one m16n8k16 tile: A's rows are activation rows, B's
// columns output features (fragments as ldmatrix leaves them).
__device__ __forceinline__ void gemm_mma(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ---- tile geometry ----------------------------------------------------------------

template <class F>
struct GemmShape {
    enum : int {
        // K per step: at least 64 (four m16n8k16 steps between barriers),
        // and whole spans so that a step needs whole chunks.
        BK = F::SPAN > 64 ? F::SPAN : 64,
        CHUNKS_PER_SPAN = F::CHUNKS * F::SPAN / F::VALUES,
        CHUNKS_PER_ROW = BK / F::SPAN * CHUNKS_PER_SPAN,
        W_CHUNKS = GEMM_BN * CHUNKS_PER_ROW / GEMM_THREADS,
        X_VECS = GEMM_BM * BK / 4 / GEMM_THREADS,
        // Holding the next step's bytes in registers across the multiply
        // costs this many registers; past ~40 (F32's 8 floats per chunk,
        // Q6_K's 128-wide steps) it spills at 2 CTAs per SM, and those
        // formats load after the barrier instead, leaving the overlap to
        // the other CTA.
        PREFETCH = sizeof(typename F::Raw) * W_CHUNKS / 4 + 4 * X_VECS <= 40,
    };
    static_assert(GEMM_BN * CHUNKS_PER_ROW % GEMM_THREADS == 0, "weight chunks split evenly");
    static_assert(GEMM_BM * BK / 4 % GEMM_THREADS == 0, "activation vectors split evenly");
    static_assert(BK % 64 == 0, "the swizzle needs 8 units per row");
};

// Byte offset of element k of row r in a swizzled tile of BK halves per row.
template <int BK>
__device__ __forceinline__ int gemm_swz(int r, int k) {
    return r * (BK * 2) + ((((k >> 3) ^ (r & 7))) << 4) + ((k & 7) << 1);
}

__device__ __forceinline__ void gemm_store4(u8* tile, int offset, float4 v) {
    *reinterpret_cast<uint2*>(tile + offset) = make_uint2(gemm_pack(v.x, v.y), gemm_pack(v.z, v.w));
}

// ---- the kernel -------------------------------------------------------------------

template <class F>
__device__ __forceinline__ void gemm_kernel(const u8* __restrict__ w, const float* __restrict__ x,
                                            float* __restrict__ y, int n_in, int n_out, int m) {
    using S = GemmShape<F>;
    constexpr int BK = S::BK;
    __shared__ __align__(16) u8 ws[GEMM_BN * BK * 2];
    __shared__ __align__(16) u8 xs[GEMM_BM * BK * 2];

    const int tid = threadIdx.x;
    const int lane = tid % WARP;
    const int warp = tid / WARP;
    const int n0 = blockIdx.x * GEMM_BN;
    const int m0 = blockIdx.y * GEMM_BM;
    const int nb = n_in / F::VALUES;
    const long long row_bytes = (long long)nb * F::BYTES;
    const int steps = (n_in + BK - 1) / BK;

    typename F::Raw raw[S::W_CHUNKS];
    float4 xv[S::X_VECS];

    // Thread tid takes chunks tid, tid + 256, ... of the tile's rows, in
    // row-major order, so neighbouring threads read neighbouring bytes.
    // Features past n_out reread the last row (their columns are never
    // stored); blocks past the row's end (a final partial step of the
    // 32-element formats) decode from zero bytes, which every format maps
    // to zeros.
    auto load_w = [&](int step) {
        const int k0 = step * BK;
#pragma unroll
        for (int i = 0; i < S::W_CHUNKS; ++i) {
            const int idx = i * GEMM_THREADS + tid;
            const int row = idx / S::CHUNKS_PER_ROW;
            const int g = k0 / F::SPAN * S::CHUNKS_PER_SPAN + idx % S::CHUNKS_PER_ROW;
            const int block = g / F::CHUNKS;
            raw[i] = typename F::Raw{};
            if (block < nb) {
                const u8* p = w + (long long)min(n0 + row, n_out - 1) * row_bytes + (long long)block * F::BYTES;
                F::template load<QxLdCached>(p, g % F::CHUNKS, raw[i]);
            }
        }
    };
    auto load_x = [&](int step) {
        const int k0 = step * BK;
#pragma unroll
        for (int i = 0; i < S::X_VECS; ++i) {
            const int idx = i * GEMM_THREADS + tid;
            const int row = idx / (BK / 4);
            const int k = k0 + 4 * (idx % (BK / 4));
            xv[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (k < n_in) {
                // Rows past m reread the last one; their outputs are not stored.
                const long long r = min(m0 + row, m - 1);
                xv[i] = __ldg(reinterpret_cast<const float4*>(x + r * n_in + k));
            }
        }
    };

    auto store_w = [&](int step) {
        const int k0 = step * BK;
#pragma unroll
        for (int i = 0; i < S::W_CHUNKS; ++i) {
            const int idx = i * GEMM_THREADS + tid;
            const int row = idx / S::CHUNKS_PER_ROW;
            const int g = k0 / F::SPAN * S::CHUNKS_PER_SPAN + idx % S::CHUNKS_PER_ROW;
            const int c = g % F::CHUNKS;
            const int kb = (g / F::CHUNKS) * F::VALUES - k0;
#pragma unroll
            for (int k = 0; k < F::RUNS; ++k) {
                float4 q;
                float sc, off;
                F::run(raw[i], c, k, q, sc, off);
                const float4 v = F::OFFSET ? make_float4(fmaf(q.x, sc, off), fmaf(q.y, sc, off), fmaf(q.z, sc, off),
                                                         fmaf(q.w, sc, off))
                                           : make_float4(q.x * sc, q.y * sc, q.z * sc, q.w * sc);
                gemm_store4(ws, gemm_swz<BK>(row, kb + F::pos(c, k)), v);
            }
        }
    };
    auto store_x = [&]() {
#pragma unroll
        for (int i = 0; i < S::X_VECS; ++i) {
            const int idx = i * GEMM_THREADS + tid;
            gemm_store4(xs, gemm_swz<BK>(idx / (BK / 4), 4 * (idx % (BK / 4))), xv[i]);
        }
    };

    // Warp (wm, wn) multiplies activation rows 32wm.. by features 32wn..:
    // two m16 tiles by four n8 tiles.
    const int wm = warp & 1;
    const int wn = warp >> 1;
    float acc[2][4][4];
#pragma unroll
    for (int a = 0; a < 2; ++a) {
#pragma unroll
        for (int b = 0; b < 4; ++b) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                acc[a][b][e] = 0.0f;
            }
        }
    }

    if (S::PREFETCH && steps > 0) {
        load_w(0);
        load_x(0);
    }
    for (int step = 0; step < steps; ++step) {
        if (S::PREFETCH) {
            store_w(step);
            store_x();
        } else {
            // Weights, then activations, so that only one of them is held
            // in registers next to the accumulators.
            load_w(step);
            store_w(step);
            load_x(step);
            store_x();
        }
        __syncthreads();
        if (S::PREFETCH && step + 1 < steps) {
            load_w(step + 1);
            load_x(step + 1);
        }
#pragma unroll 2
        for (int kk = 0; kk < BK; kk += 16) {
            // A (activations, row-major m16 × k16): lanes 0-15 address rows
            // 0-15 at k kk, lanes 16-31 the same rows at kk + 8.
            u32 a[2][4];
#pragma unroll
            for (int mi = 0; mi < 2; ++mi) {
                const int r = 32 * wm + 16 * mi + (lane & 15);
                gemm_ldmatrix_x4(xs + gemm_swz<BK>(r, kk + 8 * (lane >> 4)), a[mi]);
            }
            // B (weights, k16 × n8 "col" = features as rows, k contiguous):
            // one x4 covers two n8 tiles, matrices (n 0-7, k lo), (n 0-7,
            // k hi), (n 8-15, k lo), (n 8-15, k hi).
            u32 b[4][2];
#pragma unroll
            for (int nj = 0; nj < 2; ++nj) {
                const int r = 32 * wn + 16 * nj + (lane & 7) + 8 * (lane >> 4);
                u32 t[4];
                gemm_ldmatrix_x4(ws + gemm_swz<BK>(r, kk + 8 * ((lane >> 3) & 1)), t);
                b[2 * nj][0] = t[0];
                b[2 * nj][1] = t[1];
                b[2 * nj + 1][0] = t[2];
                b[2 * nj + 1][1] = t[3];
            }
#pragma unroll
            for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
                for (int ni = 0; ni < 4; ++ni) {
                    gemm_mma(acc[mi][ni], a[mi], b[ni][0], b[ni][1]);
                }
            }
        }
        __syncthreads();
    }

    // Accumulator e of tile (mi, ni): row g (+8 for e >= 2), feature
    // 2t + (e & 1), with g = lane / 4 and t = lane % 4.
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
        for (int ni = 0; ni < 4; ++ni) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int row = m0 + 32 * wm + 16 * mi + g + 8 * (e >> 1);
                const int col = n0 + 32 * wn + 8 * ni + 2 * t + (e & 1);
                if (row < m && col < n_out) {
                    y[(long long)row * n_out + col] = acc[mi][ni][e];
                }
            }
        }
    }
}

// sl_gemm_<fmt>(const u8* w, const float* x, float* y, int n_in, int n_out, int m)
//
//   w      n_out rows of n_in elements in <fmt>, GGUF layout, rows packed
//          back to back; 16-byte aligned.
//   x      m rows of n_in f32, row-major, 16-byte aligned; not aliased by y.
//   y      m rows of n_out f32, row-major (written, never read).
//   n_in   a multiple of 32 (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
//          IQ4_NL, MXFP4)
//          or of 256 (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
//          IQ4_XS, TQ2_0, TQ1_0, IQ3_XXS, IQ3_S, IQ2_XXS, IQ2_XS, IQ2_S,
//          IQ1_S, IQ1_M); n_out >= 1, m >= 1, any values.
//
// Launch: grid (ceil(n_out / 128), ceil(m / 64), 1), block (256, 1, 1), no
// dynamic shared memory (static: 24 KB, 48 KB for Q6_K).
#define GEMM_ENTRY(name, F)                                                                                        \
    extern "C" __global__ void __launch_bounds__(GEMM_THREADS, 2)                                                  \
        sl_gemm_##name(const u8* __restrict__ w, const float* __restrict__ x, float* __restrict__ y, int n_in,      \
                       int n_out, int m) {                                                                         \
        gemm_kernel<F>(w, x, y, n_in, n_out, m);                                                                   \
    }

GEMM_ENTRY(f32, QxF32)
GEMM_ENTRY(f16, QxF16)
GEMM_ENTRY(bf16, QxBF16)
GEMM_ENTRY(q4_0, QxQ4_0)
GEMM_ENTRY(q4_1, QxQ4_1)
GEMM_ENTRY(q5_0, QxQ5_0)
GEMM_ENTRY(q5_1, QxQ5_1)
GEMM_ENTRY(q8_0, QxQ8_0)
GEMM_ENTRY(q4_k, QxQ4_K)
GEMM_ENTRY(q5_k, QxQ5_K)
GEMM_ENTRY(q6_k, QxQ6_K)
GEMM_ENTRY(iq4_nl, QxIQ4_NL)
GEMM_ENTRY(iq4_xs, QxIQ4_XS)
GEMM_ENTRY(mxfp4, QxMXFP4)
GEMM_ENTRY(q2_k, QxQ2_K)
GEMM_ENTRY(q3_k, QxQ3_K)
GEMM_ENTRY(tq2_0, QxTQ2_0)
GEMM_ENTRY(tq1_0, QxTQ1_0)
GEMM_ENTRY(iq3_xxs, QxIQ3_XXS)
GEMM_ENTRY(iq3_s, QxIQ3_S)
GEMM_ENTRY(iq2_xxs, QxIQ2_XXS)
GEMM_ENTRY(iq2_xs, QxIQ2_XS)
GEMM_ENTRY(iq2_s, QxIQ2_S)
GEMM_ENTRY(iq1_s, QxIQ1_S)
GEMM_ENTRY(iq1_m, QxIQ1_M)
