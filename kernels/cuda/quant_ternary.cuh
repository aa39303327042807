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
