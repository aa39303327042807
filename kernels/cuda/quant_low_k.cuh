// Q2_K and Q3_K as quant.cuh formats (see there for VALUES, CHUNKS, SPAN,
// load, pos and run). The layouts and values follow the Rust reference
// (kernels/src/quant/low_k.rs), which defines them.
//
// Both keep 2-bit fields four to a byte: element 128h + 32j + l (half h,
// l < 32) is bits 2j, 2j+1 of qs[32h + l]; one scale per 16 consecutive
// elements. Q2_K (84 bytes): scales[16] (low nibble scale, high nibble min),
// qs[64], f16 d, f16 dmin; element = (d·sc)·q − dmin·m. Q3_K (110 bytes):
// hmask[32], qs[64], scales[12], f16 d; bit 4h + j of hmask[l] is bit 2 of
// the element, element = (d·(s − 32))·(q − 4) with s the 6-bit scale.
//
// Chunks are numbered as Q4_K's (qx_k_pos): chunk c = 4p + g covers the
// 64 elements of span p, bytes l = 8g .. 8g+8 of its half's quant bytes;
// runs 0, 1 are shift step j = 2(p & 1) (l = 8g, 8g + 4), runs 2, 3 the
// next step. The blocks are 4-byte (Q2_K) and 2-byte (Q3_K) aligned, so
// fields are read in u32s and pairs of u16s.

// Run k of chunk c's 2-bit fields (q0, q1: the chunk's 8 quant bytes),
// one per byte; shared with TQ2_0 (quant_ternary.cuh), which stores its
// fields so.
__device__ __forceinline__ u32 qx_two_bit_run(u32 q0, u32 q1, int c, int k) {
    const int j = 2 * ((c >> 2) & 1) + (k >> 1);
    return (((k & 1) ? q1 : q0) >> (2 * j)) & 0x03030303u;
}

struct QxQ2_K {
    enum : int { VALUES = 256, BYTES = 84, CHUNKS = 16, SPAN = 64, RUNS = 4, OFFSET = 1 };
    struct Raw {
        u32 scales, dm, q0, q1;
    };
    template <class Ld>
    static __device__ __forceinline__ void load(const u8* block, int c, Raw& r) {
        const int p = c >> 2;
        const u8* qs = block + 16 + 32 * (p >> 1) + 8 * (c & 3);
        r.scales = Ld::ld32(block + 4 * p);
        r.dm = Ld::ld32(block + 80);
        r.q0 = Ld::ld32(qs);
        r.q1 = Ld::ld32(qs + 4);
    }
    static __device__ __forceinline__ int pos(int c, int k) { return qx_k_pos(c, k); }
    static __device__ __forceinline__ void run(const Raw& r, int c, int k, float4& q, float& sc, float& off) {
        q = qx_bytes<0>(qx_two_bit_run(r.q0, r.q1, c, k));
        // Group 4p + 2(k >> 1) + (g >> 1): byte 2(k >> 1) + (g >> 1) of the
        // span's four scale bytes.
        const u32 s = (r.scales >> (8 * (2 * (k >> 1) + ((c & 3) >> 1)))) & 0xFFu;
        sc = f16_to_f32((u16)r.dm) * (float)(s & 0xFu);
        off = -(f16_to_f32((u16)(r.dm >> 16)) * (float)(s >> 4));
    }
};

struct QxQ3_K {
    enum : int { VALUES = 256, BYTES = 110, CHUNKS = 16, SPAN = 64, RUNS = 4, OFFSET = 0 };
    struct Raw {
        u32 h0, h1, q0, q1, lo, top, d;
    };
    template <class Ld>
    static __device__ __forceinline__ void load(const u8* block, int c, Raw& r) {
        const int p = c >> 2, l = 8 * (c & 3);
        const u8* qs = block + 32 + 32 * (p >> 1) + l;
        r.h0 = qx_ld32_a2<Ld>(block + l);
        r.h1 = qx_ld32_a2<Ld>(block + l + 4);
        r.q0 = qx_ld32_a2<Ld>(qs);
        r.q1 = qx_ld32_a2<Ld>(qs + 4);
        // Scales 4p .. 4p+4: low nibbles (p < 2) or high nibbles of bytes
        // 4(p & 1) .., their top bits at bits 2p, 2p+1 of bytes 8 .. 12.
        r.lo = qx_ld32_a2<Ld>(block + 96 + 4 * (p & 1));
        r.top = qx_ld32_a2<Ld>(block + 104);
        r.d = Ld::ld16(block + 108);
    }
    static __device__ __forceinline__ int pos(int c, int k) { return qx_k_pos(c, k); }
    static __device__ __forceinline__ void run(const Raw& r, int c, int k, float4& q, float& sc, float& off) {
        const int p = c >> 2;
        const u32 low = qx_two_bit_run(r.q0, r.q1, c, k);
        // Bit 4(p >> 1) + j = 2p + (k >> 1) of each hmask byte, as bit 2.
        const u32 high = ((((k & 1) ? r.h1 : r.h0) >> (2 * p + (k >> 1))) & 0x01010101u) << 2;
        q = qx_bytes<4>(low | high);
        const int i = 2 * (k >> 1) + ((c & 3) >> 1);
        const u32 six = ((r.lo >> (8 * i + 4 * (p >> 1))) & 0xFu) | (((r.top >> (8 * i + 2 * p)) & 3u) << 4);
        sc = f16_to_f32((u16)r.d) * (float)((int)six - 32);
        off = 0.0f;
    }
};
