// Device-side decoding of every weight format sluice reads (kernels/src/
// quant/mod.rs `DType`). The layouts and the value of each element follow
// the Rust scalar reference (kernels/src/quant/scalar.rs, blocks.rs); that
// code, not this file, defines them. Q2_K and Q3_K are in quant_low_k.cuh,
// the ternary formats in quant_ternary.cuh, IQ3_XXS and IQ3_S in
// quant_iq3.cuh, which follow this file in every program.
//
// A format is a struct of static functions, so the matvec, gemm and embed
// kernels are templates over it and no format is written twice:
//
//   VALUES, BYTES  elements and bytes of one block (the float formats use a
//                  pseudo-block of 32 values so that every format has one);
//   CHUNKS         a block is read as CHUNKS chunks, one per thread: each
//                  chunk is a handful of aligned loads (Raw) covering RUNS
//                  runs of 4 consecutive elements;
//   SPAN           chunks are numbered so that chunks c with equal
//                  c / (CHUNKS * SPAN / VALUES) cover exactly the SPAN
//                  consecutive elements of one span, spans in order; a
//                  kernel working on SPAN-aligned ranges of a row (gemm's
//                  k-steps) needs only the chunks of those spans;
//   OFFSET         whether values carry an additive term (Q4_1, Q5_1, Q4_K,
//                  Q5_K), which decides how matvec factors the scale out;
//   load<Ld>(block, c, raw)   the chunk's bytes, with the load policy Ld;
//   pos(c, k)      block-local index of the first element of run k;
//   run(raw, c, k, q, sc, off) run k as four floats q — small exact
//                  integers already offset by the zero point for the
//                  quantized formats, the values themselves (sc = 1) for
//                  the float ones — with the run's scale and offset:
//                  element = q × sc + off. Computed as
//                  __fadd_rn(__fmul_rn(q, sc), off) (or just the product
//                  where !OFFSET) this is bit for bit the reference
//                  `dequantize`; matvec and gemm use fused forms instead.
//
// k is always a compile-time constant after unrolling, c a runtime value.
//
// Alignment: weight pointers must be 16-byte aligned (cudaMalloc, or a GGUF
// tensor offset, which is a multiple of 32). Rows and blocks then sit at
// multiples of the block size, and each format reads its fields with the
// widest loads that alignment allows: 16 bytes for F32/F16/BF16/Q4_K/Q5_K
// (block sizes multiples of 16), 8 for Q5_1, 4 for Q4_1, 2 for Q4_0, Q5_0,
// Q8_0 and Q6_K (18, 22, 34 and 210 bytes). The table formats
// (quant_lut4.cuh) follow the same rule, MXFP4 reading bytes.

// ---- load policies ---------------------------------------------------------

// A load policy: read-only global loads of 1, 2, 4, 8 and 16 bytes with the
// cache qualifier Q, so that both policies below are the same code.
#define QX_LOAD_POLICY(NAME, Q)                                                                                        \
    struct NAME {                                                                                                      \
        static __device__ __forceinline__ u32 ld8(const u8* p) {                                                       \
            u32 v;                                                                                                     \
            asm("ld.global.nc" Q ".u8 %0, [%1];" : "=r"(v) : "l"(p));                                                  \
            return v;                                                                                                  \
        }                                                                                                              \
        static __device__ __forceinline__ u32 ld16(const u8* p) {                                                      \
            u32 v;                                                                                                     \
            asm("ld.global.nc" Q ".u16 %0, [%1];" : "=r"(v) : "l"(p));                                                 \
            return v;                                                                                                  \
        }                                                                                                              \
        static __device__ __forceinline__ u32 ld32(const u8* p) {                                                      \
            u32 v;                                                                                                     \
            asm("ld.global.nc" Q ".u32 %0, [%1];" : "=r"(v) : "l"(p));                                                 \
            return v;                                                                                                  \
        }                                                                                                              \
        static __device__ __forceinline__ uint2 ld64(const u8* p) {                                                    \
            uint2 v;                                                                                                   \
            asm("ld.global.nc" Q ".v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));                           \
            return v;                                                                                                  \
        }                                                                                                              \
        static __device__ __forceinline__ uint4 ld128(const u8* p) {                                                   \
            uint4 v;                                                                                                   \
            asm("ld.global.nc" Q ".v4.u32 {%0, %1, %2, %3}, [%4];"                                                     \
                : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)                                                           \
                : "l"(p));                                                                                             \
            return v;                                                                                                  \
        }                                                                                                              \
    };

// Weights streamed once per kernel (matvec): not allocated in L1, so that
// the activations, which every warp of the SM rereads, stay there.
QX_LOAD_POLICY(QxLdStream, ".L1::no_allocate")

// Weights whose bytes neighbouring loads share (gemm's k-steps reread a
// K-quant block's header, an embedding row is small): ordinary read-only
// loads through L1.
QX_LOAD_POLICY(QxLdCached, "")

// Four little-endian bytes at a 2-byte-aligned address.
template <class Ld>
__device__ __forceinline__ u32 qx_ld32_a2(const u8* p) {
    return Ld::ld16(p) | (Ld::ld16(p + 2) << 16);
}

// ---- integer-to-float helpers ----------------------------------------------

// The four bytes of `w` as floats, each minus BIAS. A byte b placed under
// the exponent of 2^23 is the float 2^23 + b exactly, so one byte permute
// and one subtraction (exact: both operands are integers below 2^24)
// replace an integer conversion, which issues at a quarter of the rate.
template <int BIAS>
__device__ __forceinline__ float4 qx_bytes(u32 w) {
    const float base = 8388608.0f + (float)BIAS;
    float4 f;
    f.x = __int_as_float(__byte_perm(w, 0x4B000000u, 0x7440)) - base;
    f.y = __int_as_float(__byte_perm(w, 0x4B000000u, 0x7441)) - base;
    f.z = __int_as_float(__byte_perm(w, 0x4B000000u, 0x7442)) - base;
    f.w = __int_as_float(__byte_perm(w, 0x4B000000u, 0x7443)) - base;
    return f;
}

// Bits 0..3 of `t` moved to bit 0 of bytes 0..3. The multiply adds copies
// of t shifted by 0, 7, 14 and 21, which never overlap (t < 16), so bit i
// lands at 8i without carries; the mask drops the other copies.
__device__ __forceinline__ u32 qx_spread4(u32 t) {
    return ((t & 0xFu) * 0x00204081u) & 0x01010101u;
}

__device__ __forceinline__ u32 qx_pick(uint4 v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// The (scale, min) 6-bit pair of sub-block j of a Q4_K/Q5_K block, from the
// 12 scale bytes as three little-endian words (blocks.rs `k_scales`):
// j < 4: low 6 bits of bytes j and j + 4; j >= 4: the nibbles of byte j + 4
// below the top 2 bits of bytes j - 4 and j.
__device__ __forceinline__ void qx_k_scale_min(u32 s0, u32 s1, u32 s2, int j, float& sc, float& mn) {
    const u32 sel = 0x4440u | (u32)(j & 3);
    const u32 b0 = __byte_perm(s0, 0u, sel);
    const u32 b1 = __byte_perm(s1, 0u, sel);
    const u32 b2 = __byte_perm(s2, 0u, sel);
    const u32 lo_sc = b0 & 63u;
    const u32 lo_mn = b1 & 63u;
    const u32 hi_sc = (b2 & 0xFu) | ((b0 >> 6) << 4);
    const u32 hi_mn = (b2 >> 4) | ((b1 >> 6) << 4);
    sc = (float)(j < 4 ? lo_sc : hi_sc);
    mn = (float)(j < 4 ? lo_mn : hi_mn);
}

// ---- float formats -----------------------------------------------------------

// A pseudo-block of 32 values in chunks of 8: two runs each.
struct QxF32 {
    enum : int { VALUES = 32, BYTES = 128, CHUNKS = 4, SPAN = 32, RUNS = 2, OFFSET = 0 };
    struct Raw {
        uint4 a, b;
    };
    template <class Ld>
    static __device__ __forceinline__ void load(const u8* block, int c, Raw& r) {
        r.a = Ld::ld128(block + 32 * c);
        r.b = Ld::ld128(block + 32 * c + 16);
    }
    static __device__ __forceinline__ int pos(int c, int k) { return 8 * c + 4 * k; }
    static __device__ __forceinline__ void run(const Raw& r, int, int k, float4& q, float& sc, float& off) {
        const uint4 v = k == 0 ? r.a : r.b;
        q = make_float4(__uint_as_float(v.x), __uint_as_float(v.y), __uint_as_float(v.z), __uint_as_float(v.w));
        sc = 1.0f;
        off = 0.0f;
    }
};

struct QxF16 {
    enum : int { VALUES = 32, BYTES = 64, CHUNKS = 4, SPAN = 32, RUNS = 2, OFFSET = 0 };
    struct Raw {
        uint4 v;
    };
    template <class Ld>
    static __device__ __forceinline__ void load(const u8* block, int c, Raw& r) {
        r.v = Ld::ld128(block + 16 * c);
    }
    static __device__ __forceinline__ int pos(int c, int k) { return 8 * c + 4 * k; }
    static __device__ __forceinline__ void run(const Raw& r, int, int k, float4& q, float& sc, float& off) {
        const u32 w0 = k == 0 ? r.v.x : r.v.z;
        const u32 w1 = k == 0 ? r.v.y : r.v.w;
        q = make_float4(f16_to_f32((u16)w0), f16_to_f32((u16)(w0 >> 16)), f16_to_f32((u16)w1),
                        f16_to_f32((u16)(w1 >> 16)));
        sc = 1.0f;
        off = 0.0f;
    }
};

struct QxBF16 {
    enum : int { VALUES = 32, BYTES = 64, CHUNKS = 4, SPAN = 32, RUNS = 2, OFFSET = 0 };
    struct Raw {
        uint4 v;
    };
    template <class Ld>
    static __device__ __forceinline__ void load(const u8* block, int c, Raw& r) {
        r.v = Ld::ld128(block + 16 * c);
    }
    static __device__ __forceinline__ int pos(int c, int k) { return 8 * c + 4 * k; }
    static __device__ __forceinline__ void run(const Raw& r, int, int k, float4& q, float& sc, float& off) {
        const u32 w0 = k == 0 ? r.v.x : r.v.z;
        const u32 w1 = k == 0 ? r.v.y : r.v.w;
        q = make_float4(__uint_as_float(w0 << 16), __uint_as_float(w0 & 0xFFFF0000u), __uint_as_float(w1 << 16),
                        __uint_as_float(w1 & 0xFFFF0000u));
        sc = 1.0f;
        off = 0.0f;
    }
};

// ---- legacy 32-element formats ----------------------------------------------
//
// Q4_0/Q4_1: f16 d (Q4_1: then f16 m), 16 bytes qs; element j < 16 is the
// low nibble of qs[j], element j + 16 its high nibble. Q5_0/Q5_1 add a
// little-endian u32 qh before qs whose bit j is bit 4 of element j.
// Q4_0 subtracts 8, Q5_0 16; Q4_1/Q5_1 add m instead. Q8_0: f16 d, 32 i8.
//
// Chunk c (0, 1) holds qs[8c .. 8c+8): runs 0, 1 are the low nibbles
// (elements 8c.., 8c+4..), runs 2, 3 the high ones (16 + 8c.., 20 + 8c..).

__device__ __forceinline__ int qx_legacy_pos(int c, int k) {
    return 16 * (k >> 1) + 8 * c + 4 * (k & 1);
}

__device__ __forceinline__ u32 qx_nibbles(u32 q0, u32 q1, int k) {
    const u32 w = (k & 1) ? q1 : q0;
    return (k >> 1) ? (w >> 4) & 0x0F0F0F0Fu : w & 0x0F0F0F0Fu;
}

struct QxQ4_0 {
    enum : int { VALUES = 32, BYTES = 18, CHUNKS = 2, SPAN = 32, RUNS = 4, OFFSET = 0 };
    struct Raw {
        u32 d, q0, q1;
    };
    template <class Ld>
    static __device__ __forceinline__ void load(const u8* block, int c, Raw& r) {
        r.d = Ld::ld16(block);
        r.q0 = qx_ld32_a2<Ld>(block + 2 + 8 * c);
        r.q1 = qx_ld32_a2<Ld>(block + 6 + 8 * c);
    }
    static __device__ __forceinline__ int pos(int c, int k) { return qx_legacy_pos(c, k); }
    static __device__ __forceinline__ void run(const Raw& r, int, int k, float4& q, float& sc, float& off) {
        q = qx_bytes<8>(qx_nibbles(r.q0, r.q1, k));
        sc = f16_to_f32((u16)r.d);
        off = 0.0f;
    }
};

struct QxQ4_1 {
    enum : int { VALUES = 32, BYTES = 20, CHUNKS = 2, SPAN = 32, RUNS = 4, OFFSET = 1 };
    struct Raw {
        u32 dm, q0, q1;
    };
    template <class Ld>
    static __device__ __forceinline__ void load(const u8* block, int c, Raw& r) {
        r.dm = Ld::ld32(block);
        r.q0 = Ld::ld32(block + 4 + 8 * c);
        r.q1 = Ld::ld32(block + 8 + 8 * c);
    }
    static __device__ __forceinline__ int pos(int c, int k) { return qx_legacy_pos(c, k); }
    static __device__ __forceinline__ void run(const Raw& r, int, int k, float4& q, float& sc, float& off) {
        q = qx_bytes<0>(qx_nibbles(r.q0, r.q1, k));
        sc = f16_to_f32((u16)r.dm);
        off = f16_to_f32((u16)(r.dm >> 16));
    }
};

// Bit 4 of the four elements from `first` on, from qh.
__device__ __forceinline__ u32 qx_high_bits(u32 qh, int first) {
    return qx_spread4(qh >> first) << 4;
}

struct QxQ5_0 {
    enum : int { VALUES = 32, BYTES = 22, CHUNKS = 2, SPAN = 32, RUNS = 4, OFFSET = 0 };
    struct Raw {
        u32 d, qh, q0, q1;
    };
    template <class Ld>
    static __device__ __forceinline__ void load(const u8* block, int c, Raw& r) {
        r.d = Ld::ld16(block);
        r.qh = qx_ld32_a2<Ld>(block + 2);
        r.q0 = qx_ld32_a2<Ld>(block + 6 + 8 * c);
        r.q1 = qx_ld32_a2<Ld>(block + 10 + 8 * c);
    }
    static __device__ __forceinline__ int pos(int c, int k) { return qx_legacy_pos(c, k); }
    static __device__ __forceinline__ void run(const Raw& r, int c, int k, float4& q, float& sc, float& off) {
        q = qx_bytes<16>(qx_nibbles(r.q0, r.q1, k) | qx_high_bits(r.qh, pos(c, k)));
        sc = f16_to_f32((u16)r.d);
        off = 0.0f;
    }
};

struct QxQ5_1 {
    enum : int { VALUES = 32, BYTES = 24, CHUNKS = 2, SPAN = 32, RUNS = 4, OFFSET = 1 };
    struct Raw {
        u32 dm, qh;
        uint2 q;
    };
    template <class Ld>
    static __device__ __forceinline__ void load(const u8* block, int c, Raw& r) {
        r.dm = Ld::ld32(block);
        r.qh = Ld::ld32(block + 4);
        r.q = Ld::ld64(block + 8 + 8 * c);
    }
    static __device__ __forceinline__ int pos(int c, int k) { return qx_legacy_pos(c, k); }
    static __device__ __forceinline__ void run(const Raw& r, int c, int k, float4& q, float& sc, float& off) {
        q = qx_bytes<0>(qx_nibbles(r.q.x, r.q.y, k) | qx_high_bits(r.qh, pos(c, k)));
        sc = f16_to_f32((u16)r.dm);
        off = f16_to_f32((u16)(r.dm >> 16));
    }
};

// Chunk c (0, 1): qs[16c .. 16c+16), four runs in order.
struct QxQ8_0 {
    enum : int { VALUES = 32, BYTES = 34, CHUNKS = 2, SPAN = 32, RUNS = 4, OFFSET = 0 };
    struct Raw {
        u32 d;
        uint4 q;
    };
    template <class Ld>
    static __device__ __forceinline__ void load(const u8* block, int c, Raw& r) {
        const u8* qs = block + 2 + 16 * c;
        r.d = Ld::ld16(block);
        r.q = make_uint4(qx_ld32_a2<Ld>(qs), qx_ld32_a2<Ld>(qs + 4), qx_ld32_a2<Ld>(qs + 8), qx_ld32_a2<Ld>(qs + 12));
    }
    static __device__ __forceinline__ int pos(int c, int k) { return 16 * c + 4 * k; }
    static __device__ __forceinline__ void run(const Raw& r, int, int k, float4& q, float& sc, float& off) {
        // Flipping the sign bit maps i8 v to the byte v + 128.
        q = qx_bytes<128>(qx_pick(r.q, k) ^ 0x80808080u);
        sc = f16_to_f32((u16)r.d);
        off = 0.0f;
    }
};

// ---- K-quants ----------------------------------------------------------------
//
// Q4_K (144 bytes): f16 d, f16 dmin, 12 scale bytes, 128 bytes qs. Byte l
// of the 32-byte group p of qs holds element 64p + l (low nibble, sub-block
// 2p) and 64p + 32 + l (high nibble, sub-block 2p + 1). Element =
// (d·sc_j)·q − dmin·m_j. Q5_K (176 bytes) puts 32 bytes qh between the
// scales and qs: bit j of qh[l] is bit 4 of element 32j + l.
//
// Chunk c = 4p + h holds qs bytes 8h .. 8h+8 of group p: runs 0, 1 the low
// nibbles (elements 64p + 8h, + 4), runs 2, 3 the high ones (+32). The
// 16-byte header (d, dmin, scales) is loaded whole with each chunk; the
// lanes of a block read it in the same instruction.

__device__ __forceinline__ int qx_k_pos(int c, int k) {
    return 64 * (c >> 2) + 32 * (k >> 1) + 8 * (c & 3) + 4 * (k & 1);
}

__device__ __forceinline__ void qx_k_scale(uint4 head, int j, float& sc, float& off) {
    float s, m;
    qx_k_scale_min(head.y, head.z, head.w, j, s, m);
    sc = f16_to_f32((u16)head.x) * s;
    off = -(f16_to_f32((u16)(head.x >> 16)) * m);
}

__device__ __forceinline__ u32 qx_k_nibbles(uint2 qs, int k) {
    const u32 w = (k & 1) ? qs.y : qs.x;
    return (k >> 1) ? (w >> 4) & 0x0F0F0F0Fu : w & 0x0F0F0F0Fu;
}

struct QxQ4_K {
    enum : int { VALUES = 256, BYTES = 144, CHUNKS = 16, SPAN = 64, RUNS = 4, OFFSET = 1 };
    struct Raw {
        uint4 head;
        uint2 qs;
    };
    template <class Ld>
    static __device__ __forceinline__ void load(const u8* block, int c, Raw& r) {
        r.head = Ld::ld128(block);
        r.qs = Ld::ld64(block + 16 + 8 * c);
    }
    static __device__ __forceinline__ int pos(int c, int k) { return qx_k_pos(c, k); }
    static __device__ __forceinline__ void run(const Raw& r, int c, int k, float4& q, float& sc, float& off) {
        q = qx_bytes<0>(qx_k_nibbles(r.qs, k));
        qx_k_scale(r.head, 2 * (c >> 2) + (k >> 1), sc, off);
    }
};

struct QxQ5_K {
    enum : int { VALUES = 256, BYTES = 176, CHUNKS = 16, SPAN = 64, RUNS = 4, OFFSET = 1 };
    struct Raw {
        uint4 head;
        uint2 qh, qs;
    };
    template <class Ld>
    static __device__ __forceinline__ void load(const u8* block, int c, Raw& r) {
        r.head = Ld::ld128(block);
        r.qh = Ld::ld64(block + 16 + 8 * (c & 3));
        r.qs = Ld::ld64(block + 48 + 8 * c);
    }
    static __device__ __forceinline__ int pos(int c, int k) { return qx_k_pos(c, k); }
    static __device__ __forceinline__ void run(const Raw& r, int c, int k, float4& q, float& sc, float& off) {
        const int j = 2 * (c >> 2) + (k >> 1);
        const u32 high = ((((k & 1) ? r.qh.y : r.qh.x) >> j) & 0x01010101u) << 4;
        q = qx_bytes<0>(qx_k_nibbles(r.qs, k) | high);
        qx_k_scale(r.head, j, sc, off);
    }
};

// Q6_K (210 bytes): ql[128], qh[64], i8 scales[16], f16 d. Half H of the
// block (elements 128H..) uses ql[64H..], qh[32H..]; for l < 32 its element
// 32j + l takes ql[64H + l + 32(j&1)], low nibble for j < 2 and high for
// j >= 2, with bits 2j, 2j+1 of qh[32H + l] above; element = (d·sc)·(q − 32)
// with sc = scales[8H + (32j + l) / 16].
//
// Chunk c = 8H + g holds l = 4g .. 4g+4 of half H for all four j: run j
// covers elements 128H + 32j + 4g... . The block is only 2-byte aligned, so
// its fields are read as u16s.
struct QxQ6_K {
    enum : int { VALUES = 256, BYTES = 210, CHUNKS = 16, SPAN = 128, RUNS = 4, OFFSET = 0 };
    struct Raw {
        u32 a, b, h, s0, s1, d;
    };
    template <class Ld>
    static __device__ __forceinline__ void load(const u8* block, int c, Raw& r) {
        const int half = c >> 3, l = 4 * (c & 7);
        const u8* ql = block + 64 * half + l;
        const u8* scales = block + 192 + 8 * half;
        r.a = qx_ld32_a2<Ld>(ql);
        r.b = qx_ld32_a2<Ld>(ql + 32);
        r.h = qx_ld32_a2<Ld>(block + 128 + 32 * half + l);
        r.s0 = qx_ld32_a2<Ld>(scales);
        r.s1 = qx_ld32_a2<Ld>(scales + 4);
        r.d = Ld::ld16(block + 208);
    }
    static __device__ __forceinline__ int pos(int c, int k) { return 128 * (c >> 3) + 32 * k + 4 * (c & 7); }
    static __device__ __forceinline__ void run(const Raw& r, int c, int k, float4& q, float& sc, float& off) {
        const u32 lowq = (k & 1) ? r.b : r.a;
        const u32 nib = k >= 2 ? (lowq >> 4) & 0x0F0F0F0Fu : lowq & 0x0F0F0F0Fu;
        // Bits 2k, 2k+1 of each qh byte moved to bits 4, 5.
        const u32 hb = (k == 0 ? r.h << 4 : k == 1 ? r.h << 2 : k == 2 ? r.h : r.h >> 2) & 0x30303030u;
        q = qx_bytes<32>(nib | hb);
        // Scale 8H + 2k + (l >= 16): byte 2(k&1) + (g >> 2) of the word
        // holding scales 8H + 4(k >> 1) .. + 4.
        const u32 sw = (k >> 1) ? r.s1 : r.s0;
        const int byte = 2 * (k & 1) + ((c & 7) >> 2);
        const float s = (float)(int)(i8)(u8)(sw >> (8 * byte));
        sc = f16_to_f32((u16)r.d) * s;
        off = 0.0f;
    }
};

// The exact reference value of one element from a run's parts.
template <class F>
__device__ __forceinline__ float qx_exact(float q, float sc, float off) {
    return F::OFFSET ? __fadd_rn(__fmul_rn(q, sc), off) : __fmul_rn(q, sc);
}
