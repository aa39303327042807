// Device-side decoding of the grid i-quants (kernels/src/quant/grid.rs,
// iq2.rs, iq1.rs): IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S and IQ1_M. Same interface
// as the formats of quant.cuh (read its header); the Rust reference
// defines the values. The grids themselves
// come before this file in every program, generated from the Rust tables
// (backend/cuda/programs.rs): qx_<name>_grid holds entry i as the two
// little-endian words 2i, 2i + 1 (elements 0..4, 4..8).
//
// Every element is (d · ls / 8) · q with q a small signed integer and ls
// an odd integer per 16 elements; d · ls and the factor 1/8 are exact, and
// so is the product with q, so these are the reference's bits.

// The sign byte of a 7-bit sign field: the eighth sign is the parity of
// the seven (GGML's ksigns_iq2xs, quant/iq_signs.rs).
__device__ __forceinline__ u32 qx_ksigns(u32 seven) {
    return seven | ((__popc(seven) & 1u) << 7);
}

// Four magnitudes (bytes of `mag`) negated where bits 0..3 of `signs` are
// set ((m ^ −1) − (−1) = −m per byte), as floats.
__device__ __forceinline__ float4 qx_signed4(u32 mag, u32 signs) {
    const u32 m = qx_spread4(signs) * 0xFFu;
    return qx_bytes<128>(__vsub4(mag ^ m, m) ^ 0x80808080u);
}

// (d · ls) / 8 for the f16 `d` and a stored scale s (ls = 2s + 1).
__device__ __forceinline__ float qx_grid_scale(u32 d, u32 s) {
    return f16_to_f32((u16)d) * (float)(2u * s + 1u) * 0.125f;
}

// IQ2_XXS (66 bytes, 2-byte aligned): f16 d, then per sub-block of 32
// elements four grid indices (one per group of 8) and a little-endian
// word: bits 7l..7l+7 group l's sign field, bits 28..32 the scale.
// Chunk c is half c & 1 (groups 2(c & 1), 2(c & 1) + 1) of sub-block
// c >> 1; run k is elements 4(k & 1) .. of group 2(c & 1) + (k >> 1).
struct QxIQ2_XXS {
    enum : int { VALUES = 256, BYTES = 66, CHUNKS = 16, SPAN = 32, RUNS = 4, OFFSET = 0 };
    struct Raw {
        u32 d, idx, aux;
    };
    template <class Ld>
    static __device__ __forceinline__ void load(const u8* block, int c, Raw& r) {
        const u8* sub = block + 2 + 8 * (c >> 1);
        r.d = Ld::ld16(block);
        r.idx = qx_ld32_a2<Ld>(sub);
        r.aux = qx_ld32_a2<Ld>(sub + 4);
    }
    static __device__ __forceinline__ int pos(int c, int k) { return 16 * c + 4 * k; }
    static __device__ __forceinline__ void run(const Raw& r, int c, int k, float4& q, float& sc, float& off) {
        const int l = 2 * (c & 1) + (k >> 1);
        const u32 mag = qx_iq2xxs_grid[2 * ((r.idx >> (8 * l)) & 0xFFu) + (k & 1)];
        q = qx_signed4(mag, qx_ksigns((r.aux >> (7 * l)) & 127u) >> (4 * (k & 1)));
        sc = qx_grid_scale(r.d, r.aux >> 28);
        off = 0.0f;
    }
};

// IQ2_XS (74 bytes, 2-byte aligned): f16 d, per group of 8 a u16 (low 9
// bits the grid index, high 7 the sign field), per sub-block a scale byte
// (low nibble for elements 0..16, high for 16..32). Chunks and runs as
// IQ2_XXS's: chunk c holds the words of groups 2c, 2c + 1.
struct QxIQ2_XS {
    enum : int { VALUES = 256, BYTES = 74, CHUNKS = 16, SPAN = 32, RUNS = 4, OFFSET = 0 };
    struct Raw {
        u32 d, words, s;
    };
    template <class Ld>
    static __device__ __forceinline__ void load(const u8* block, int c, Raw& r) {
        r.d = Ld::ld16(block);
        r.words = qx_ld32_a2<Ld>(block + 2 + 4 * c);
        r.s = Ld::ld8(block + 66 + (c >> 1));
    }
    static __device__ __forceinline__ int pos(int c, int k) { return 16 * c + 4 * k; }
    static __device__ __forceinline__ void run(const Raw& r, int c, int k, float4& q, float& sc, float& off) {
        const u32 word = (r.words >> (16 * (k >> 1))) & 0xFFFFu;
        const u32 mag = qx_iq2xs_grid[2 * (word & 511u) + (k & 1)];
        q = qx_signed4(mag, qx_ksigns(word >> 9) >> (4 * (k & 1)));
        sc = qx_grid_scale(r.d, (r.s >> (4 * (c & 1))) & 0xFu);
        off = 0.0f;
    }
};

// IQ2_S (82 bytes, 2-byte aligned): f16 d, the 32 index bytes, the 32 sign
// bytes, per sub-block a byte of index tops (bits 2l, 2l + 1 for group l),
// then IQ2_XS's scale bytes. Chunks and runs as IQ2_XXS's.
struct QxIQ2_S {
    enum : int { VALUES = 256, BYTES = 82, CHUNKS = 16, SPAN = 32, RUNS = 4, OFFSET = 0 };
    struct Raw {
        u32 d, idx, signs, qh, s;
    };
    template <class Ld>
    static __device__ __forceinline__ void load(const u8* block, int c, Raw& r) {
        r.d = Ld::ld16(block);
        r.idx = Ld::ld16(block + 2 + 2 * c);
        r.signs = Ld::ld16(block + 34 + 2 * c);
        r.qh = Ld::ld8(block + 66 + (c >> 1));
        r.s = Ld::ld8(block + 74 + (c >> 1));
    }
    static __device__ __forceinline__ int pos(int c, int k) { return 16 * c + 4 * k; }
    static __device__ __forceinline__ void run(const Raw& r, int c, int k, float4& q, float& sc, float& off) {
        const int l = 2 * (c & 1) + (k >> 1);
        const u32 index = ((r.idx >> (8 * (k >> 1))) & 0xFFu) | (((r.qh >> (2 * l)) & 3u) << 8);
        const u32 mag = qx_iq2s_grid[2 * index + (k & 1)];
        q = qx_signed4(mag, r.signs >> (8 * (k >> 1) + 4 * (k & 1)));
        sc = qx_grid_scale(r.d, (r.s >> (4 * (c & 1))) & 0xFu);
        off = 0.0f;
    }
};

// The IQ1 formats' four integers 8 · value ± 1 from a grid word of values
// −1, 0, 1 (bytes 0xFF, 0, 1): shifting the word by 3 makes each byte
// 8 · value with the carries of the −1s in the next byte's low three bits,
// which the mask drops; then ±1 bytewise.
__device__ __forceinline__ float4 qx_offset4(u32 values, bool negative) {
    const u32 eight = (values << 3) & 0xF8F8F8F8u;
    return qx_bytes<128>(__vadd4(eight, negative ? 0xFFFFFFFFu : 0x01010101u) ^ 0x80808080u);
}

// IQ1_S (50 bytes, 2-byte aligned): f16 d, the 32 index bytes, per
// sub-block a u16: bits 3l .. 3l + 3 the top of group l's 11-bit index,
// bits 12..15 the scale, bit 15 the offset's sign. Chunk c holds groups
// 2c, 2c + 1; runs as IQ2_XXS's.
struct QxIQ1_S {
    enum : int { VALUES = 256, BYTES = 50, CHUNKS = 16, SPAN = 32, RUNS = 4, OFFSET = 0 };
    struct Raw {
        u32 d, idx, qh;
    };
    template <class Ld>
    static __device__ __forceinline__ void load(const u8* block, int c, Raw& r) {
        r.d = Ld::ld16(block);
        r.idx = Ld::ld16(block + 2 + 2 * c);
        r.qh = Ld::ld16(block + 34 + 2 * (c >> 1));
    }
    static __device__ __forceinline__ int pos(int c, int k) { return 16 * c + 4 * k; }
    static __device__ __forceinline__ void run(const Raw& r, int c, int k, float4& q, float& sc, float& off) {
        const int l = 2 * (c & 1) + (k >> 1);
        const u32 index = ((r.idx >> (8 * (k >> 1))) & 0xFFu) | (((r.qh >> (3 * l)) & 7u) << 8);
        q = qx_offset4(qx_iq1s_grid[2 * index + (k & 1)], (r.qh & 0x8000u) != 0u);
        sc = qx_grid_scale(r.d, (r.qh >> 12) & 7u);
        off = 0.0f;
    }
};

// IQ1_M (56 bytes, 8-byte aligned): the 32 index bytes, per pair of groups
// a byte (a nibble per group: bits 0..3 the index's top, bit 3 the
// offset's sign), then four u16 words: sub-block ib's two 3-bit scales at
// bit 6 (ib % 2) of word ib / 2 (groups 0–1, then 2–3), the f16 d in the
// words' top nibbles (word k's as bits 4k .. 4k + 4). Chunk c holds groups
// 2c, 2c + 1; runs as IQ2_XXS's.
struct QxIQ1_M {
    enum : int { VALUES = 256, BYTES = 56, CHUNKS = 16, SPAN = 32, RUNS = 4, OFFSET = 0 };
    struct Raw {
        u32 idx, qh;
        uint2 sc;
    };
    template <class Ld>
    static __device__ __forceinline__ void load(const u8* block, int c, Raw& r) {
        r.idx = Ld::ld16(block + 2 * c);
        r.qh = Ld::ld8(block + 32 + c);
        r.sc = Ld::ld64(block + 48);
    }
    static __device__ __forceinline__ int pos(int c, int k) { return 16 * c + 4 * k; }
    static __device__ __forceinline__ void run(const Raw& r, int c, int k, float4& q, float& sc, float& off) {
        const u32 nibble = r.qh >> (4 * (k >> 1));
        const u32 index = ((r.idx >> (8 * (k >> 1))) & 0xFFu) | ((nibble & 7u) << 8);
        q = qx_offset4(qx_iq1s_grid[2 * index + (k & 1)], (nibble & 8u) != 0u);
        const u32 d = ((r.sc.x >> 12) & 0xFu) | ((r.sc.x >> 24) & 0xF0u) | ((r.sc.y >> 4) & 0xF00u) |
                      ((r.sc.y >> 16) & 0xF000u);
        const int ib = c >> 1;
        const u32 word = (ib & 4) ? r.sc.y : r.sc.x;
        const u32 field = (word >> (16 * ((ib >> 1) & 1) + 6 * (ib & 1) + 3 * (c & 1))) & 7u;
        sc = qx_grid_scale(d, field);
        off = 0.0f;
    }
};
