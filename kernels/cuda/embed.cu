// Token embedding lookup: out[r][:] = the dequantized row tokens[r] of a
// table in any weight format (quant.cuh).
//
// Values are exactly those of the CPU reference `dequantize_row`: each
// element is computed with the reference's roundings (product, then sum,
// never fused), so a GPU-embedded prompt starts from the same bits as a
// CPU-embedded one.

#define EMBED_THREADS 128

template <class F>
__device__ __forceinline__ void embed_kernel(const u8* __restrict__ table, const u32* __restrict__ tokens,
                                             float* __restrict__ out, int width, int n_tokens) {
    const int r = blockIdx.x;
    if (r >= n_tokens) {
        return;
    }
    const long long row_bytes = (long long)(width / F::VALUES) * F::BYTES;
    const u8* row = table + (long long)tokens[r] * row_bytes;
    float* dst = out + (long long)r * width;
    const int chunks = width / F::VALUES * F::CHUNKS;
    for (int g = threadIdx.x; g < chunks; g += blockDim.x) {
        const int b = g / F::CHUNKS, c = g % F::CHUNKS;
        typename F::Raw raw;
        F::template load<QxLdCached>(row + (long long)b * F::BYTES, c, raw);
#pragma unroll
        for (int k = 0; k < F::RUNS; ++k) {
            float4 q;
            float sc, off;
            F::run(raw, c, k, q, sc, off);
            const float4 v = make_float4(qx_exact<F>(q.x, sc, off), qx_exact<F>(q.y, sc, off),
                                         qx_exact<F>(q.z, sc, off), qx_exact<F>(q.w, sc, off));
            *reinterpret_cast<float4*>(dst + b * F::VALUES + F::pos(c, k)) = v;
        }
    }
}

// sl_embed_<fmt>(const u8* table, const u32* tokens, float* out, int width, int n_tokens)
//
//   table     the embedding matrix: rows of `width` elements in <fmt>, GGUF
//             layout, packed back to back; 16-byte aligned.
//   tokens    n_tokens row indices, each < the table's row count (the host
//             checks; nothing here does).
//   out       n_tokens rows of `width` f32, row-major, 16-byte aligned.
//   width     a multiple of 32 (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
//             IQ4_NL, MXFP4)
//             or of 256 (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
//             IQ4_XS, TQ2_0, TQ1_0, IQ3_XXS, IQ3_S, IQ2_XXS,
//             IQ2_XS, IQ2_S, IQ1_S, IQ1_M).
//
// Launch: grid (n_tokens, 1, 1), block (128, 1, 1) (any multiple of 32
// works), no shared memory.
#define EMBED_ENTRY(name, F)                                                                                       \
    extern "C" __global__ void __launch_bounds__(EMBED_THREADS)                                                    \
        sl_embed_##name(const u8* __restrict__ table, const u32* __restrict__ tokens, float* __restrict__ out,     \
                        int width, int n_tokens) {                                                                 \
        embed_kernel<F>(table, tokens, out, width, n_tokens);                                                      \
    }

EMBED_ENTRY(f32, QxF32)
EMBED_ENTRY(f16, QxF16)
EMBED_ENTRY(bf16, QxBF16)
EMBED_ENTRY(q4_0, QxQ4_0)
EMBED_ENTRY(q4_1, QxQ4_1)
EMBED_ENTRY(q5_0, QxQ5_0)
EMBED_ENTRY(q5_1, QxQ5_1)
EMBED_ENTRY(q8_0, QxQ8_0)
EMBED_ENTRY(q4_k, QxQ4_K)
EMBED_ENTRY(q5_k, QxQ5_K)
EMBED_ENTRY(q6_k, QxQ6_K)
EMBED_ENTRY(iq4_nl, QxIQ4_NL)
EMBED_ENTRY(iq4_xs, QxIQ4_XS)
EMBED_ENTRY(mxfp4, QxMXFP4)
EMBED_ENTRY(q2_k, QxQ2_K)
EMBED_ENTRY(q3_k, QxQ3_K)
EMBED_ENTRY(tq2_0, QxTQ2_0)
EMBED_ENTRY(tq1_0, QxTQ1_0)
EMBED_ENTRY(iq3_xxs, QxIQ3_XXS)
EMBED_ENTRY(iq3_s, QxIQ3_S)
EMBED_ENTRY(iq2_xxs, QxIQ2_XXS)
EMBED_ENTRY(iq2_xs, QxIQ2_XS)
EMBED_ENTRY(iq2_s, QxIQ2_S)
EMBED_ENTRY(iq1_s, QxIQ1_S)
EMBED_ENTRY(iq1_m, QxIQ1_M)
