// Device-side decoding of the 3-bit grid formats (kernels/src/quant/iq3.rs):
// IQ3_XXS and IQ3_S. Same interface as the formats of quant.cuh (read its
// header); the Rust reference defines the values.
//
// The grids are data of the file format, GGML's iq3xxs_grid and iq3s_grid:
// each entry packs four unsigned magnitudes, little-endian, for four
// consecutive weights. They come before this file in every program,
// generated from the Rust tables (backend/cuda/programs.rs), as does
// quant_grid.cuh, whose sign helpers are used here.

// Both formats: chunk c covers half h = c & 1 of sub-block ib = c >> 1
// (16 weights: grid entries 4h .. 4h+4), run k is entry 4h + k, whose
// signs are bits 4k .. 4k+4 of the half's two sign bytes. Blocks are
// 2-byte aligned (98 and 110 bytes).

// IQ3_XXS (98 bytes): f16 d, 64 index bytes, eight words (s in bits
// 28..31, 7-bit sign fields at bits 7g, completed by their parity as bit
// 7); the weight is (d · (s + ½) · ½) · (±m).
struct QxIQ3_XXS {
    enum : int { VALUES = 256, BYTES = 98, CHUNKS = 16, SPAN = 32, RUNS = 4, OFFSET = 0 };
    struct Raw {
        u32 idx, aux, d;
    };
    template <class Ld>
    static __device__ __forceinline__ void load(const u8* block, int c, Raw& r) {
        r.idx = qx_ld32_a2<Ld>(block + 2 + 4 * c);
        r.aux = qx_ld32_a2<Ld>(block + 66 + 4 * (c >> 1));
        r.d = Ld::ld16(block);
    }
    static __device__ __forceinline__ int pos(int c, int k) { return 16 * c + 4 * k; }
    static __device__ __forceinline__ void run(const Raw& r, int c, int k, float4& q, float& sc, float& off) {
        const u32 field = (r.aux >> (7 * (2 * (c & 1) + (k >> 1)))) & 127u;
        const u32 entry = __ldg(&qx_iq3xxs_grid[(r.idx >> (8 * k)) & 0xFFu]);
        q = qx_signed4(entry, qx_ksigns(field) >> (4 * (k & 1)));
        sc = f16_to_f32((u16)r.d) * (0.5f + (float)(r.aux >> 28)) * 0.5f;
        off = 0.0f;
    }
};

// IQ3_S (110 bytes): f16 d, qs[64] (low index bits), qh[8] (bit k of qh[ib]:
// entry k's ninth bit), signs[32], scales[4] (nibble ib & 1 of byte ib / 2:
// s); the weight is (d · (2s + 1)) · (±m).
struct QxIQ3_S {
    enum : int { VALUES = 256, BYTES = 110, CHUNKS = 16, SPAN = 32, RUNS = 4, OFFSET = 0 };
    struct Raw {
        u32 idx, qh, signs, scale, d;
    };
    template <class Ld>
    static __device__ __forceinline__ void load(const u8* block, int c, Raw& r) {
        r.idx = qx_ld32_a2<Ld>(block + 2 + 4 * c);
        r.qh = Ld::ld8(block + 66 + (c >> 1));
        r.signs = Ld::ld16(block + 74 + 2 * c);
        r.scale = Ld::ld8(block + 106 + (c >> 2));
        r.d = Ld::ld16(block);
    }
    static __device__ __forceinline__ int pos(int c, int k) { return 16 * c + 4 * k; }
    static __device__ __forceinline__ void run(const Raw& r, int c, int k, float4& q, float& sc, float& off) {
        const u32 index = ((r.idx >> (8 * k)) & 0xFFu) | (((r.qh >> (4 * (c & 1) + k)) & 1u) << 8);
        q = qx_signed4(__ldg(&qx_iq3s_grid[index]), r.signs >> (4 * k));
        const u32 s = (r.scale >> (4 * ((c >> 1) & 1))) & 0xFu;
        sc = f16_to_f32((u16)r.d) * (float)(1u + 2u * s);
        off = 0.0f;
    }
};
