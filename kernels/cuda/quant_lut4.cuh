// Device-side decoding of the table formats (kernels/src/quant/lut4.rs):
// IQ4_NL, IQ4_XS and MXFP4, whose 4-bit quants index a 16-entry table of
// signed values. Same interface as the formats of quant.cuh (read its
// header); the Rust reference defines the values.
//
// Tables, facts of the file formats: IQ4_NL's and IQ4_XS's is GGML's
// kvalues_iq4nl, MXFP4's the E2M1 values doubled (GGML's kvalues_mxfp4),
// each as four little-endian words of four i8.

#define QX_IQ4_TABLE 0xBFAD9881u, 0xF6EADDCFu, 0x26190D01u, 0x71594535u
#define QX_FP4_TABLE 0x03020100u, 0x0C080604u, 0xFDFEFF00u, 0xF4F8FAFCu

// The table bytes of the four nibbles in bytes 0..3 of `nib` (each < 16).
// A byte permute picks from eight bytes with the low three bits of each
// nibble, once from each half of the table; bit 3 chooses the half.
__device__ __forceinline__ u32 qx_lut4(u32 nib, u32 t0, u32 t1, u32 t2, u32 t3) {
    const u32 sel = (nib & 7u) | ((nib >> 4) & 0x70u) | ((nib >> 8) & 0x700u) | ((nib >> 12) & 0x7000u);
    const u32 upper = ((nib >> 3) & 0x01010101u) * 0xFFu;
    return (__byte_perm(t0, t1, sel) & ~upper) | (__byte_perm(t2, t3, sel) & upper);
}

// Four signed table bytes as floats (flipping the sign bit maps i8 v to
// the byte v + 128, as QxQ8_0 reads its quants).
__device__ __forceinline__ float4 qx_lut4_values(u32 nib, u32 t0, u32 t1, u32 t2, u32 t3) {
    return qx_bytes<128>(qx_lut4(nib, t0, t1, t2, t3) ^ 0x80808080u);
}

// IQ4_NL (18 bytes): Q4_0's layout (f16 d, 16 bytes of nibbles), so Q4_0's
// loads, chunks and runs; the element is d · table[q].
struct QxIQ4_NL : QxQ4_0 {
    static __device__ __forceinline__ void run(const Raw& r, int, int k, float4& q, float& sc, float& off) {
        q = qx_lut4_values(qx_nibbles(r.q0, r.q1, k), QX_IQ4_TABLE);
        sc = f16_to_f32((u16)r.d);
        off = 0.0f;
    }
};

// Four little-endian bytes at any address.
template <class Ld>
__device__ __forceinline__ u32 qx_ld32_a1(const u8* p) {
    return Ld::ld8(p) | (Ld::ld8(p + 1) << 8) | (Ld::ld8(p + 2) << 16) | (Ld::ld8(p + 3) << 24);
}

// MXFP4 (17 bytes, so no alignment): an E8M0 byte e, then Q4_0's nibbles;
// the element table[q] · 2^(e − 128), e = 0 and 1 giving the subnormals
// 2^−128 and 2^−127. Chunks and runs as Q4_0's, read bytewise.
struct QxMXFP4 {
    enum : int { VALUES = 32, BYTES = 17, CHUNKS = 2, SPAN = 32, RUNS = 4, OFFSET = 0 };
    struct Raw {
        u32 e, q0, q1;
    };
    template <class Ld>
    static __device__ __forceinline__ void load(const u8* block, int c, Raw& r) {
        r.e = Ld::ld8(block);
        r.q0 = qx_ld32_a1<Ld>(block + 1 + 8 * c);
        r.q1 = qx_ld32_a1<Ld>(block + 5 + 8 * c);
    }
    static __device__ __forceinline__ int pos(int c, int k) { return qx_legacy_pos(c, k); }
    static __device__ __forceinline__ void run(const Raw& r, int, int k, float4& q, float& sc, float& off) {
        q = qx_lut4_values(qx_nibbles(r.q0, r.q1, k), QX_FP4_TABLE);
        sc = __uint_as_float(r.e < 2u ? 0x00200000u << r.e : (r.e - 1u) << 23);
        off = 0.0f;
    }
};

// IQ4_XS (136 bytes): f16 d, u16 scales_h (bits 2j, 2j+1: the top of
// sub-block j's 6-bit scale), 4 bytes scales_l (nibble j: its low four
// bits), then eight sub-blocks of 32 elements laid out as IQ4_NL's 16
// bytes each; the element (d · (scale − 32)) · table[q].
//
// Chunk c = 2j + h holds bytes 8h .. 8h+8 of sub-block j's quants; runs as
// the legacy formats' within the sub-block. The 8-byte header is loaded
// with each chunk.
struct QxIQ4_XS {
    enum : int { VALUES = 256, BYTES = 136, CHUNKS = 16, SPAN = 32, RUNS = 4, OFFSET = 0 };
    struct Raw {
        uint2 head, qs;
    };
    template <class Ld>
    static __device__ __forceinline__ void load(const u8* block, int c, Raw& r) {
        r.head = Ld::ld64(block);
        r.qs = Ld::ld64(block + 8 + 8 * c);
    }
    static __device__ __forceinline__ int pos(int c, int k) { return 32 * (c >> 1) + qx_legacy_pos(c & 1, k); }
    static __device__ __forceinline__ void run(const Raw& r, int c, int k, float4& q, float& sc, float& off) {
        const int j = c >> 1;
        const u32 low = (r.head.y >> (4 * j)) & 0xFu;
        const u32 high = (r.head.x >> (16 + 2 * j)) & 3u;
        q = qx_lut4_values(qx_nibbles(r.qs.x, r.qs.y, k), QX_IQ4_TABLE);
        sc = f16_to_f32((u16)r.head.x) * (float)((int)(low | (high << 4)) - 32);
        off = 0.0f;
    }
};
