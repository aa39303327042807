// Decode-time matrix-vector products: y[r][o] = Σ_i W[o][i] · x[r][i] for
// a few activation rows r, with W in its GGUF format (quant.cuh).
//
// Why this shape: at small m the product is bound by reading W once, and
// the activations are f32, so the other cost is moving x from L1 into
// registers (m × 4 bytes per weight element, against ~0.6 bytes of Q4
// weight). A CTA therefore owns MV_ROWS output rows and splits the
// reduction (K) across its warps: every x value a lane loads serves all
// MV_ROWS weight rows, and every weight chunk it decodes serves up to
// MV_MAX_M activation rows (more rows are taken MV_MAX_M at a time, which
// rereads W, mostly from L2). Weights bypass L1 (QxLdStream) so that x,
// which all CTAs of the SM read, stays cached there.
//
// Determinism: each (activation row, output row) sum has a fixed order —
// per lane over its blocks in ascending order (run by run, a run's four
// products before its scale where the format has no offset), then a fixed
// butterfly across the 32 lanes, then warps 0..3 in order — that depends
// on n_in only, not on m, the row's place in the batch, or the CTA. The
// result differs from the CPU backend (which quantizes x to 8 bits per
// block) and from sl_gemm_* (f16 operands, see gemm.cu) within those
// formats' rounding.

#define MV_WARPS 4
#define MV_ROWS 4
#define MV_MAX_M 4

// Reduces 16 per-lane accumulators across the warp so that lanes l and
// l + 16 end with the warp total of accumulator l: each step exchanges the
// half a lane does not keep (16 shuffles for all 16 totals instead of
// 16 × 5). Every accumulator sees the same pairing of lanes (bit 3 first,
// bit 4 last), so its total does not depend on which slot it occupies.
template <int H>
__device__ __forceinline__ void mv_reduce_step(float (&v)[16], int lane) {
    const bool upper = (lane & H) != 0;
#pragma unroll
    for (int i = 0; i < H; ++i) {
        const float send = upper ? v[i] : v[i + H];
        const float keep = upper ? v[i + H] : v[i];
        v[i] = keep + __shfl_xor_sync(0xffffffffu, send, H);
    }
}

__device__ __forceinline__ float mv_reduce(float (&v)[16], int lane) {
    mv_reduce_step<8>(v, lane);
    mv_reduce_step<4>(v, lane);
    mv_reduce_step<2>(v, lane);
    mv_reduce_step<1>(v, lane);
    return v[0] + __shfl_xor_sync(0xffffffffu, v[0], 16);
}

// M activation rows (1..4) against the CTA's MV_ROWS weight rows from o0.
// Accumulator j·M + r holds weight row o0 + j against activation row r.
template <class F, int M>
__device__ __forceinline__ void mv_rows(const u8* __restrict__ w, const float* __restrict__ x, float* __restrict__ y,
                                        int n_in, int n_out, int o0, float* red) {
    constexpr int BLOCKS_PER_STEP = 32 / F::CHUNKS;
    const int lane = threadIdx.x % WARP;
    const int warp = threadIdx.x / WARP;
    const int nb = n_in / F::VALUES;
    const long long row_bytes = (long long)nb * F::BYTES;
    const int c = lane % F::CHUNKS;

    // Rows past n_out (the last CTA) reread the last row; their sums are
    // never stored. Offsets from row o0 fit in 32 bits (< 4 rows).
    const u8* row0 = w + (long long)o0 * row_bytes;
    int row_off[MV_ROWS];
#pragma unroll
    for (int j = 0; j < MV_ROWS; ++j) {
        row_off[j] = (min(o0 + j, n_out - 1) - o0) * (int)row_bytes;
    }

    // Padded to 16 whatever M is, so that the reduction tree is the same.
    float acc[16];
#pragma unroll
    for (int a = 0; a < 16; ++a) {
        acc[a] = 0.0f;
    }

    for (int step = warp; step * BLOCKS_PER_STEP < nb; step += MV_WARPS) {
        const int b = step * BLOCKS_PER_STEP + lane / F::CHUNKS;
        if (b < nb) {
            typename F::Raw raw[MV_ROWS];
#pragma unroll
            for (int j = 0; j < MV_ROWS; ++j) {
                F::template load<QxLdStream>(row0 + (row_off[j] + b * F::BYTES), c, raw[j]);
            }
#pragma unroll
            for (int k = 0; k < F::RUNS; ++k) {
                // Decode run k of every weight row, then stream the
                // activation rows past them one float4 at a time.
                float4 v[MV_ROWS];
                float sc[MV_ROWS];
#pragma unroll
                for (int j = 0; j < MV_ROWS; ++j) {
                    float off;
                    F::run(raw[j], c, k, v[j], sc[j], off);
                    if (F::OFFSET) {
                        // Dequantize once, then one FMA per activation row.
                        v[j] = make_float4(fmaf(v[j].x, sc[j], off), fmaf(v[j].y, sc[j], off),
                                           fmaf(v[j].z, sc[j], off), fmaf(v[j].w, sc[j], off));
                    }
                }
                const int xk = b * F::VALUES + F::pos(c, k);
#pragma unroll
                for (int r = 0; r < M; ++r) {
                    const float4 xv = __ldg(reinterpret_cast<const float4*>(x + (xk + r * n_in)));
#pragma unroll
                    for (int j = 0; j < MV_ROWS; ++j) {
                        float& s = acc[j * M + r];
                        if (F::OFFSET) {
                            s = fmaf(v[j].x, xv.x, s);
                            s = fmaf(v[j].y, xv.y, s);
                            s = fmaf(v[j].z, xv.z, s);
                            s = fmaf(v[j].w, xv.w, s);
                        } else {
                            // The scale is common to the run: dot the small
                            // integers first and scale the partial sum.
                            float p = v[j].x * xv.x;
                            p = fmaf(v[j].y, xv.y, p);
                            p = fmaf(v[j].z, xv.z, p);
                            p = fmaf(v[j].w, xv.w, p);
                            s = fmaf(sc[j], p, s);
                        }
                    }
                }
            }
        }
    }

    const float total = mv_reduce(acc, lane);
    if (lane < 16) {
        red[warp * 16 + lane] = total;
    }
    __syncthreads();
    if (threadIdx.x < MV_ROWS * M) {
        const int a = threadIdx.x;
        float s = red[a];
#pragma unroll
        for (int v = 1; v < MV_WARPS; ++v) {
            s += red[v * 16 + a];
        }
        const int j = a / M, r = a % M;
        if (o0 + j < n_out) {
            y[(long long)r * n_out + o0 + j] = s;
        }
    }
    // `red` is reused by the next group of activation rows.
    __syncthreads();
}

template <class F>
__device__ __forceinline__ void mv_kernel(const u8* __restrict__ w, const float* __restrict__ x, float* __restrict__ y,
                                          int n_in, int n_out, int m) {
    __shared__ float red[MV_WARPS * 16];
    const int o0 = blockIdx.x * MV_ROWS;
    // Groups of MV_MAX_M activation rows: the accumulators of more would
    // cost the registers that keep weight loads in flight.
    for (int r0 = 0; r0 < m; r0 += MV_MAX_M) {
        const float* xg = x + (long long)r0 * n_in;
        float* yg = y + (long long)r0 * n_out;
        switch (min(m - r0, MV_MAX_M)) {
        case 1: mv_rows<F, 1>(w, xg, yg, n_in, n_out, o0, red); break;
        case 2: mv_rows<F, 2>(w, xg, yg, n_in, n_out, o0, red); break;
        case 3: mv_rows<F, 3>(w, xg, yg, n_in, n_out, o0, red); break;
        default: mv_rows<F, 4>(w, xg, yg, n_in, n_out, o0, red); break;
        }
    }
}

// sl_matvec_<fmt>(const u8* w, const float* x, float* y, int n_in, int n_out, int m)
//
//   w      n_out rows of n_in elements in <fmt>, GGUF layout, rows packed
//          back to back (row bytes = n_in / block_elems × block_bytes);
//          16-byte aligned.
//   x      m rows of n_in f32, row-major, 16-byte aligned; not aliased by y.
//   y      m rows of n_out f32, row-major (written, never read).
//   n_in   a multiple of 32 (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
//          IQ4_NL, MXFP4)
//          or of 256 (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
//          IQ4_XS, TQ2_0, TQ1_0, IQ3_XXS, IQ3_S, IQ2_XXS,
//          IQ2_XS, IQ2_S, IQ1_S, IQ1_M).
//   n_out  >= 1; m >= 1 (meant for m <= 8: W is reread for every 4 rows).
//
// Launch: grid (ceil(n_out / 4), 1, 1), block (128, 1, 1), no dynamic
// shared memory (256 bytes static).
#define MV_ENTRY(name, F)                                                                                          \
    extern "C" __global__ void __launch_bounds__(MV_WARPS * WARP, 3)                                                \
        sl_matvec_##name(const u8* __restrict__ w, const float* __restrict__ x, float* __restrict__ y, int n_in,    \
                         int n_out, int m) {                                                                       \
        mv_kernel<F>(w, x, y, n_in, n_out, m);                                                                     \
    }

MV_ENTRY(f32, QxF32)
MV_ENTRY(f16, QxF16)
MV_ENTRY(bf16, QxBF16)
MV_ENTRY(q4_0, QxQ4_0)
MV_ENTRY(q4_1, QxQ4_1)
MV_ENTRY(q5_0, QxQ5_0)
MV_ENTRY(q5_1, QxQ5_1)
MV_ENTRY(q8_0, QxQ8_0)
MV_ENTRY(q4_k, QxQ4_K)
MV_ENTRY(q5_k, QxQ5_K)
MV_ENTRY(q6_k, QxQ6_K)
MV_ENTRY(iq4_nl, QxIQ4_NL)
MV_ENTRY(iq4_xs, QxIQ4_XS)
MV_ENTRY(mxfp4, QxMXFP4)
MV_ENTRY(q2_k, QxQ2_K)
MV_ENTRY(q3_k, QxQ3_K)
MV_ENTRY(tq2_0, QxTQ2_0)
MV_ENTRY(tq1_0, QxTQ1_0)
MV_ENTRY(iq3_xxs, QxIQ3_XXS)
MV_ENTRY(iq3_s, QxIQ3_S)
MV_ENTRY(iq2_xxs, QxIQ2_XXS)
MV_ENTRY(iq2_xs, QxIQ2_XS)
MV_ENTRY(iq2_s, QxIQ2_S)
MV_ENTRY(iq1_s, QxIQ1_S)
MV_ENTRY(iq1_m, QxIQ1_M)
