// Device-side decoding of the ternary formats (kernels/src/quant/ternary.rs):
// TQ2_0 and TQ1_0, whose fields q (0..2, TQ2_0's 2-bit fields up to 3)
// stand for q − 1 under one f16 scale per block of 256. Same interface as
// the formats of quant.cuh (read its header); the Rust reference defines
// the values. Both blocks are 2-byte aligned (66 and 54 bytes).

// TQ2_0 (66 bytes): qs[64] as Q2_K's quant bytes, then f16 d; the element
// is (q − 1) · d. Chunks and runs as Q2_K's.
struct QxTQ2_0 {
    enum : int { VALUES = 256, BYTES = 66, CHUNKS = 16, SPAN = 64, RUNS = 4, OFFSET = 0 };
    struct Raw {
        u32 q0, q1, d;
    };
    template <class Ld>
    static __device__ __forceinline__ void load(const u8* block, int c, Raw& r) {
        const u8* qs = block + 32 * (c >> 3) + 8 * (c & 3);
        r.q0 = qx_ld32_a2<Ld>(qs);
        r.q1 = qx_ld32_a2<Ld>(qs + 4);
        r.d = Ld::ld16(block + 64);
    }
    static __device__ __forceinline__ int pos(int c, int k) { return qx_k_pos(c, k); }
    static __device__ __forceinline__ void run(const Raw& r, int c, int k, float4& q, float& sc, float& off) {
        q = qx_bytes<1>(qx_two_bit_run(r.q0, r.q1, c, k));
        sc = f16_to_f32((u16)r.d);
        off = 0.0f;
    }
};

// Trit n of each of the four bytes of w, pow = 3^n (ternary.rs `trit`):
// even and odd bytes in the two 16-bit halves of a word each, where the
// products (at most 255 · 81 and 255 · 3) do not reach the other half.
__device__ __forceinline__ u32 qx_trits4(u32 w, u32 pow) {
    const u32 m = 0x00FF00FFu;
    const u32 even = ((((w & m) * pow) & m) * 3u >> 8) & m;
    const u32 odd = (((((w >> 8) & m) * pow) & m) * 3u >> 8) & m;
    return even | (odd << 8);
}

// TQ1_0 (54 bytes): qs[48] with five trits per byte, qh[4] with four,
// f16 d; the element is (t − 1) · d. Chunk c covers elements 16c .. 16c+16,
// run k elements 16c + 4k ..: for c < 10 trit c / 2 of bytes
// 16(c & 1) + 4k .. of qs; for c < 15 trit c − 10 of bytes 32 + 4k ..; for
// c = 15 trit k of qh's four bytes.
struct QxTQ1_0 {
    enum : int { VALUES = 256, BYTES = 54, CHUNKS = 16, SPAN = 32, RUNS = 4, OFFSET = 0 };
    struct Raw {
        u32 w[4];
        u32 d;
    };
    template <class Ld>
    static __device__ __forceinline__ void load(const u8* block, int c, Raw& r) {
        const u8* p = block + (c < 10 ? 16 * (c & 1) : c < 15 ? 32 : 48);
        const int step = c < 15 ? 4 : 0;
#pragma unroll
        for (int i = 0; i < 4; i++) r.w[i] = qx_ld32_a2<Ld>(p + step * i);
        r.d = Ld::ld16(block + 52);
    }
    static __device__ __forceinline__ int pos(int c, int k) { return 16 * c + 4 * k; }
    static __device__ __forceinline__ void run(const Raw& r, int c, int k, float4& q, float& sc, float& off) {
        const int n = c < 10 ? c >> 1 : c < 15 ? c - 10 : k;
        const u32 pow = n == 0 ? 1u : n == 1 ? 3u : n == 2 ? 9u : n == 3 ? 27u : 81u;
        q = qx_bytes<1>(qx_trits4(r.w[k], pow));
        sc = f16_to_f32((u16)r.d);
        off = 0.0f;
    }
};
