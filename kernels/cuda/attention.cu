// Attention of a pass's query rows over a layer's paged KV store, with the
// visibility the CPU backend gives (kernels/src/ops/attention.rs): row r
// of the pass sees cells 0..visible[r] of its sequence except the
// sequence's hidden ranges, and query head h reads KV head
// h / (n_head / n_kv_head). Scores are (q · k) × scale, soft-capped when
// `softcap` > 0 (cap × tanh(score / cap), Gemma 2), softmax over the
// visible cells, and the output is the probability-weighted sum of v. With
// a sliding window (`window` > 0) a row sees only the last `window` of its
// cells 0..visible[r]; the cells before them are never read (their blocks
// may have gone back to the pool).
//
// The CPU matches llama.cpp's roundings step by step (an f16 running sum
// of v, among others); here the math is f32 throughout, with two of the
// CPU's steps kept because they are free: q is rounded to f16 first, and a
// Q8_0 value enters as d × q, exact in f32. Results agree with the CPU to
// f16-level tolerance, not to the bit. Nothing depends on other rows or on
// how cells are split, but split counts change the summation order.
//
// Store layout (see kv.cu): a layer's keys and its values are each an
// arena of n_cells cells of kv_dim = n_kv_head × head_dim values; cell c
// of a sequence whose block table is T lives in slot
// T[c / block_tokens] × block_tokens + c % block_tokens. An f16 cell is
// 2 × kv_dim bytes; a Q8_0 cell is kv_dim / 32 blocks of 34 bytes, so a
// head of a Q8_0 arena is head_dim / 32 whole blocks (the host checks
// head_dim % 32 == 0 for a Q8_0 arena, as KvShape::cell_bytes does).
// Arenas must start 16-byte aligned.
//
// The pass layout, prepared once per pass (u32 everywhere):
//   row_seq[r], row_visible[r]   per pass row: its sequence and how many
//                                of its sequence's cells it sees
//   block_start[s], block_count[s]
//                                per sequence: its block table is
//                                blocks[block_start[s] ..][.. block_count[s]]
//   hidden_start[s], hidden_count[s]
//                                per sequence: its hidden ranges are pairs
//                                (start, end), cells start..end, at
//                                hidden[2 × hidden_start[s] ..], sorted and
//                                disjoint
// A cell past its table or whose slot is not below n_cells counts as
// hidden rather than being read out of bounds. A row that sees no cell at
// all gets zeros.
//
// Kernels, instantiated per D, the largest head_dim they take (64, 128 or
// 256; shorter heads are padded with zeros), with the key and value types
// as arguments (k_type, v_type: 0 = f16, 1 = q8_0):
//   sl_attend_decode_d<D>_l<L>  split-K attention, one CTA per (row, group
//       of query heads, split of the cells), for rows that are few per
//       sequence (decoding, speculative drafts); L = lanes per query head
//   sl_attend_merge             merges the splits
//   sl_attend_prefill_d<D>      tiled attention for runs of rows of one
//       sequence (prompts), no splits
// Either kernel computes any row correctly; they differ in speed only.

#define ATTN_F16 0
#define ATTN_Q8_0 1
#define ATTN_NO_SLOT 0xffffffffu
#define ATTN_WARPS 4
#define ATTN_THREADS (ATTN_WARPS * WARP)
#define ATTN_LOG2E 1.4426950408889634f

__device__ __forceinline__ float attn_neg_inf() {
    return -__int_as_float(0x7f800000);
}

__device__ __forceinline__ u32 attn_min(u32 a, u32 b) {
    return a < b ? a : b;
}

// Where a sequence's cells are and which it hides.
struct attn_seq {
    const u32* table;
    u32 table_len;
    const u32* hidden;
    u32 n_hidden;
};

__device__ __forceinline__ attn_seq attn_load_seq(
    u32 seq,
    const u32* block_start,
    const u32* block_count,
    const u32* blocks,
    const u32* hidden_start,
    const u32* hidden_count,
    const u32* hidden) {
    attn_seq s;
    s.table = blocks + block_start[seq];
    s.table_len = block_count[seq];
    s.hidden = hidden + 2ull * hidden_start[seq];
    s.n_hidden = hidden_count[seq];
    return s;
}

// The slot of the sequence's cell `cell`, or ATTN_NO_SLOT when no row of
// the caller reads it: at or past `end`, hidden, past the block table or
// outside the arena.
__device__ __forceinline__ u32 attn_slot(const attn_seq& s, u32 cell, u32 end, u32 block_tokens, u32 n_cells) {
    if (cell >= end) {
        return ATTN_NO_SLOT;
    }
    const u32 b = cell / block_tokens;
    if (b >= s.table_len) {
        return ATTN_NO_SLOT;
    }
    // 64 bits: a corrupt table entry must not wrap into the arena.
    const unsigned long long slot = (unsigned long long)s.table[b] * block_tokens + (cell - b * block_tokens);
    if (slot >= n_cells) {
        return ATTN_NO_SLOT;
    }
    // The first range ending after the cell hides it if it starts at or
    // before it; a binary search, since an image's draft may hide many.
    u32 lo = 0, hi = s.n_hidden;
    while (lo < hi) {
        const u32 mid = (lo + hi) / 2;
        if (s.hidden[2 * mid + 1] <= cell) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    if (lo < s.n_hidden && s.hidden[2 * lo] <= cell) {
        return ATTN_NO_SLOT;
    }
    return (u32)slot;
}

// Bytes of one cell, and where KV head `kv_head` starts in it.
__device__ __forceinline__ unsigned long long attn_cell_bytes(int kind, int kv_dim) {
    return kind == ATTN_F16 ? 2ull * kv_dim : (unsigned long long)(kv_dim / Q8_0_VALUES) * Q8_0_BYTES;
}

__device__ __forceinline__ u32 attn_head_offset(int kind, int kv_head, int head_dim) {
    return kind == ATTN_F16 ? 2u * kv_head * head_dim : (u32)(kv_head * (head_dim / Q8_0_VALUES) * Q8_0_BYTES);
}

// Eight values of a head as stored, d0..d0 + 8 (d0 a multiple of 8), of
// the head starting at `head`: f16 as its 16 bytes; Q8_0 as the quants in
// x and y and the block's scale bits in z.
__device__ __forceinline__ uint4 attn_load_raw(int kind, const u8* __restrict__ head, int d0) {
    if (kind == ATTN_F16) {
        // 16-byte aligned: the arena is, and head_dim and d0 are multiples
        // of 8 on this path.
        return *(const uint4*)(head + 2 * d0);
    }
    // A Q8_0 block is only 2-byte aligned (34 bytes): 16-bit loads.
    const u8* block = head + (d0 / Q8_0_VALUES) * Q8_0_BYTES;
    const u16* quants = (const u16*)(block + 2 + d0 % Q8_0_VALUES);
    uint4 raw;
    raw.x = (u32)quants[0] | ((u32)quants[1] << 16);
    raw.y = (u32)quants[2] | ((u32)quants[3] << 16);
    raw.z = *(const u16*)block;
    raw.w = 0;
    return raw;
}

// The eight values of attn_load_raw as f32. A Q8_0 value is d × q, exact
// in f32 (11 + 8 significant bits): the value the CPU dequantizes. Zero
// bits are zeros in both types.
__device__ __forceinline__ void attn_store_raw(int kind, uint4 raw, float* dst) {
    float v[8];
    if (kind == ATTN_F16) {
        const u32 words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            v[2 * i] = f16_to_f32((u16)(words[i] & 0xffffu));
            v[2 * i + 1] = f16_to_f32((u16)(words[i] >> 16));
        }
    } else {
        const float d = f16_to_f32((u16)raw.z);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            v[i] = d * (float)(i8)(raw.x >> (8 * i));
            v[4 + i] = d * (float)(i8)(raw.y >> (8 * i));
        }
    }
    float4* at = (float4*)dst;
    at[0] = make_float4(v[0], v[1], v[2], v[3]);
    at[1] = make_float4(v[4], v[5], v[6], v[7]);
}

// Where the K and V heads of the cells being attended live.
struct attn_arenas {
    const u8* k;
    const u8* v;
    int k_type;
    int v_type;
    unsigned long long k_cell;
    unsigned long long v_cell;
    u32 k_offset;
    u32 v_offset;
};

// Copy the K and V heads of the N cells named by `slots` into rows of D
// floats of `ks` and `vs`, as f32: zeros for the columns past head_dim and
// for cells marked ATTN_NO_SLOT (their probability is 0, but 0 × a
// never-written NaN would not be). Threads t of NTH share the work, every
// load of a thread issued before the first store so that they are in
// flight together. The element types are a uniform branch, not template
// parameters: everything after staging is f32, and instantiating per type
// pair quadrupled NVRTC's compile time for nothing.
template <int D, int N, int NTH>
__device__ __forceinline__ void attn_stage(
    float* ks,
    float* vs,
    const u32* slots,
    const attn_arenas& a,
    int head_dim,
    int t) {
    if (a.k_type == ATTN_Q8_0 || head_dim % 8 == 0) {
        if (a.v_type == ATTN_Q8_0 || head_dim % 8 == 0) {
            constexpr int GROUPS = D / 8;
            constexpr int ITER = (N * GROUPS + NTH - 1) / NTH;
            uint4 k_raw[ITER];
            uint4 v_raw[ITER];
#pragma unroll
            for (int it = 0; it < ITER; it++) {
                const int i = t + it * NTH;
                const int c = i / GROUPS;
                const int d0 = (i % GROUPS) * 8;
                k_raw[it] = make_uint4(0, 0, 0, 0);
                v_raw[it] = make_uint4(0, 0, 0, 0);
                if ((N * GROUPS % NTH == 0 || i < N * GROUPS) && d0 < head_dim) {
                    const u32 slot = slots[c];
                    if (slot != ATTN_NO_SLOT) {
                        k_raw[it] = attn_load_raw(a.k_type, a.k + slot * a.k_cell + a.k_offset, d0);
                        v_raw[it] = attn_load_raw(a.v_type, a.v + slot * a.v_cell + a.v_offset, d0);
                    }
                }
            }
#pragma unroll
            for (int it = 0; it < ITER; it++) {
                const int i = t + it * NTH;
                if (N * GROUPS % NTH == 0 || i < N * GROUPS) {
                    attn_store_raw(a.k_type, k_raw[it], ks + i * 8);
                    attn_store_raw(a.v_type, v_raw[it], vs + i * 8);
                }
            }
            return;
        }
    }
    // f16 heads of a length not a multiple of 8: a value at a time.
    for (int i = t; i < N * D; i += NTH) {
        const int c = i / D;
        const int d = i % D;
        const u32 slot = slots[c];
        float k = 0.0f;
        float v = 0.0f;
        if (d < head_dim && slot != ATTN_NO_SLOT) {
            const u8* k_head = a.k + slot * a.k_cell + a.k_offset;
            const u8* v_head = a.v + slot * a.v_cell + a.v_offset;
            k = a.k_type == ATTN_F16 ? f16_to_f32(((const u16*)k_head)[d])
                                     : q8_0_value(k_head + d / Q8_0_VALUES * Q8_0_BYTES, d % Q8_0_VALUES);
            v = a.v_type == ATTN_F16 ? f16_to_f32(((const u16*)v_head)[d])
                                     : q8_0_value(v_head + d / Q8_0_VALUES * Q8_0_BYTES, d % Q8_0_VALUES);
        }
        ks[i] = k;
        vs[i] = v;
    }
}

__device__ __forceinline__ attn_arenas attn_make_arenas(
    const u8* k_arena,
    const u8* v_arena,
    int k_type,
    int v_type,
    int n_kv_head,
    int kv_head,
    int head_dim) {
    attn_arenas a;
    a.k = k_arena;
    a.v = v_arena;
    a.k_type = k_type;
    a.v_type = v_type;
    a.k_cell = attn_cell_bytes(k_type, n_kv_head * head_dim);
    a.v_cell = attn_cell_bytes(v_type, n_kv_head * head_dim);
    a.k_offset = attn_head_offset(k_type, kv_head, head_dim);
    a.v_offset = attn_head_offset(v_type, kv_head, head_dim);
    return a;
}

// How a warp's lanes share its query heads ("items"): L lanes per item,
// lane part p of an item holding dims j × VW × L + p × VW + e of q and of
// the output accumulator (e < VW), so that at each j the L parts read one
// contiguous run of a tile row and the items read the same run (a
// broadcast).
// (An enum, not static constexpr members, which NVRTC emits as globals.)
template <int D, int L>
struct attn_lanes {
    enum { VW = D / L >= 4 ? 4 : D / L, J = D / (VW * L), PER = D / L };
};

template <int VW>
__device__ __forceinline__ void attn_lds(const float* at, float* v) {
    if constexpr (VW == 4) {
        const float4 x = *(const float4*)at;
        v[0] = x.x;
        v[1] = x.y;
        v[2] = x.z;
        v[3] = x.w;
    } else if constexpr (VW == 2) {
        const float2 x = *(const float2*)at;
        v[0] = x.x;
        v[1] = x.y;
    } else {
        v[0] = *at;
    }
}

// How a query scores the cells it sees: q is multiplied by `q_factor` as
// it is loaded; without soft-capping (cap = 0) that is scale × log2(e), so
// that scores come out in base 2 and the softmax takes exp2; with it, q
// takes scale / softcap and a score is cap × tanh(q · k) for cap =
// softcap × log2(e), the CPU's cap × tanh(dot × (scale / cap)) in base 2.
struct attn_scores {
    float q_factor;
    float cap;
    u32 window;
};

__device__ __forceinline__ attn_scores attn_make_scores(float scale, float softcap, u32 window) {
    attn_scores s;
    s.q_factor = softcap > 0.0f ? scale / softcap : scale * ATTN_LOG2E;
    s.cap = softcap > 0.0f ? softcap * ATTN_LOG2E : 0.0f;
    s.window = window;
    return s;
}

// The first cell a row seeing cells 0..visible attends to.
__device__ __forceinline__ u32 attn_first_seen(u32 visible, u32 window) {
    return window > 0 && visible > window ? visible - window : 0;
}

// This lane's share of a query head, rounded to f16 as the CPU rounds q,
// and times `factor` (attn_scores::q_factor).
template <int D, int L>
__device__ __forceinline__ void attn_load_q(
    const float* __restrict__ q_head,
    bool active,
    int head_dim,
    float factor,
    float* q) {
    typedef attn_lanes<D, L> lanes;
    const int part = threadIdx.x % L;
#pragma unroll
    for (int j = 0; j < lanes::J; j++) {
#pragma unroll
        for (int e = 0; e < lanes::VW; e++) {
            const int d = j * lanes::VW * L + part * lanes::VW + e;
            q[j * lanes::VW + e] = active && d < head_dim ? f16_to_f32(f32_to_f16(q_head[d])) * factor : 0.0f;
        }
    }
}

// One tile of N cells for the warp's items: scores against the K rows in
// `ks`, the online-softmax step of the running max `m` (base 2), sum `l`
// and accumulator `o`, weighted by the V rows in `vs`. Cell c of the tile
// counts for this lane's item when bit c of `mask` is set and
// skip <= c < seen; `cap` soft-caps the scores (0: none). Every lane must
// call it (the score sums are shuffles).
template <int D, int L, int N>
__device__ __forceinline__ void attn_tile(
    const float* ks,
    const float* vs,
    u32 mask,
    int skip,
    int seen,
    float cap,
    const float* q,
    float& m,
    float& l,
    float* o) {
    static_assert(N <= 32, "a tile's mask is one word");
    typedef attn_lanes<D, L> lanes;
    const int part = threadIdx.x % L;
    float s[N];
#pragma unroll
    for (int c = 0; c < N; c++) {
        const float* k = ks + c * D + part * lanes::VW;
        float dot = 0.0f;
#pragma unroll
        for (int j = 0; j < lanes::J; j++) {
            float kv[lanes::VW];
            attn_lds<lanes::VW>(k + j * lanes::VW * L, kv);
#pragma unroll
            for (int e = 0; e < lanes::VW; e++) {
                dot = fmaf(q[j * lanes::VW + e], kv[e], dot);
            }
        }
#pragma unroll
        for (int offset = L / 2; offset > 0; offset /= 2) {
            dot += __shfl_xor_sync(0xffffffffu, dot, offset);
        }
        if (cap > 0.0f) {
            dot = cap * tanhf(dot);
        }
        s[c] = (mask >> c & 1u) && c >= skip && c < seen ? dot : attn_neg_inf();
    }
    float top = m;
#pragma unroll
    for (int c = 0; c < N; c++) {
        top = fmaxf(top, s[c]);
    }
    // Nothing seen yet: the sums stay empty (and -inf - -inf would be NaN).
    if (top == attn_neg_inf()) {
        return;
    }
    const float alpha = exp2f(m - top);
    l *= alpha;
#pragma unroll
    for (int i = 0; i < lanes::PER; i++) {
        o[i] *= alpha;
    }
#pragma unroll
    for (int c = 0; c < N; c++) {
        const float p = exp2f(s[c] - top);
        // A cell this item does not see (p is 0) is skipped, not added as
        // 0 × v: a cell past a row's end may hold an infinite value that a
        // later row of the prompt wrote, and 0 × inf is NaN.
        if (p == 0.0f) {
            continue;
        }
        l += p;
        const float* v = vs + c * D + part * lanes::VW;
#pragma unroll
        for (int j = 0; j < lanes::J; j++) {
            float vv[lanes::VW];
            attn_lds<lanes::VW>(v + j * lanes::VW * L, vv);
#pragma unroll
            for (int e = 0; e < lanes::VW; e++) {
                o[j * lanes::VW + e] = fmaf(p, vv[e], o[j * lanes::VW + e]);
            }
        }
    }
    m = top;
}

// ---- decode: split-K ------------------------------------------------------

// Per (row, query-head group, split): each of the CTA's four warps streams
// its own tiles of the split's cells (tile t of the split goes to warp
// t % 4) through its own shared memory, every KV value read once for the
// group's query heads; then the warps' softmax states merge in shared
// memory. A decoding row has few heads per KV head, so warps split cells,
// not heads; L (lanes per head) trades shuffles for idle lanes: the host
// takes the smallest power of two P ≥ min(G, 8), G = n_head / n_kv_head,
// and L = 32 / P, so a CTA holds P query heads of one KV head.
template <int D, int L>
__device__ __forceinline__ void attn_decode(
    const float* __restrict__ q,
    float* __restrict__ out,
    float* __restrict__ part_o,
    float* __restrict__ part_ml,
    const u8* __restrict__ k_arena,
    const u8* __restrict__ v_arena,
    int k_type,
    int v_type,
    const u32* __restrict__ row_seq,
    const u32* __restrict__ row_visible,
    const u32* __restrict__ block_start,
    const u32* __restrict__ block_count,
    const u32* __restrict__ blocks,
    const u32* __restrict__ hidden_start,
    const u32* __restrict__ hidden_count,
    const u32* __restrict__ hidden,
    int n_head,
    int n_kv_head,
    int head_dim,
    u32 block_tokens,
    u32 n_cells,
    int n_splits,
    u32 split_cells,
    float scale,
    float softcap,
    u32 window) {
    typedef attn_lanes<D, L> lanes;
    // Tile rows per warp: 8 KiB of K and V per warp whatever D.
    constexpr int N = 1024 / D;
    constexpr int P = WARP / L;
    __shared__ __align__(16) float tiles[ATTN_WARPS][2][N * D];
    __shared__ u32 slots[ATTN_WARPS][N];
    __shared__ float merge_ml[ATTN_WARPS][P][2];

    const u32 row = blockIdx.x;
    const int split = blockIdx.z;
    const u32 visible = row_visible[row];
    const attn_scores scores = attn_make_scores(scale, softcap, window);
    // The splits divide the cells the row sees: its window's.
    const u32 lo = attn_first_seen(visible, window) + split * split_cells;
    const u32 hi = attn_min(visible, lo + split_cells);
    // The merge reads only the splits that hold cells; split 0 always runs,
    // so that a single split writes `out` even for a row that sees nothing.
    if (split > 0 && lo >= hi) {
        return;
    }
    const int group = n_head / n_kv_head;
    const int chunks = (group + P - 1) / P;
    const int kv_head = blockIdx.y / chunks;
    const int chunk = blockIdx.y - kv_head * chunks;
    const int warp = threadIdx.x / WARP;
    const int lane = threadIdx.x % WARP;
    const int item = lane / L;
    const int part = lane % L;
    const int in_group = chunk * P + item;
    const bool active = in_group < group;
    const int head = kv_head * group + in_group;
    const int q_dim = n_head * head_dim;

    float qr[lanes::PER];
    float o[lanes::PER];
    attn_load_q<D, L>(q + (unsigned long long)row * q_dim + head * head_dim, active, head_dim, scores.q_factor, qr);
#pragma unroll
    for (int i = 0; i < lanes::PER; i++) {
        o[i] = 0.0f;
    }
    float m = attn_neg_inf();
    float l = 0.0f;

    const attn_seq seq =
        attn_load_seq(row_seq[row], block_start, block_count, blocks, hidden_start, hidden_count, hidden);
    const attn_arenas arenas = attn_make_arenas(k_arena, v_arena, k_type, v_type, n_kv_head, kv_head, head_dim);
    float* ks = tiles[warp][0];
    float* vs = tiles[warp][1];
    for (u32 c0 = lo + warp * N; c0 < hi; c0 += ATTN_WARPS * N) {
        const u32 slot = lane < N ? attn_slot(seq, c0 + lane, hi, block_tokens, n_cells) : ATTN_NO_SLOT;
        if (lane < N) {
            slots[warp][lane] = slot;
        }
        const u32 mask = __ballot_sync(0xffffffffu, slot != ATTN_NO_SLOT);
        __syncwarp();
        attn_stage<D, N, WARP>(ks, vs, slots[warp], arenas, head_dim, lane);
        __syncwarp();
        attn_tile<D, L, N>(ks, vs, mask, 0, N, scores.cap, qr, m, l, o);
        // The next tile's staging overwrites what this one read.
        __syncwarp();
    }

    // Merge the warps: their accumulators go where the tiles were.
    __syncthreads();
    float* merge_o = &tiles[0][0][0];
#pragma unroll
    for (int j = 0; j < lanes::J; j++) {
#pragma unroll
        for (int e = 0; e < lanes::VW; e++) {
            merge_o[(warp * P + item) * D + j * lanes::VW * L + part * lanes::VW + e] = o[j * lanes::VW + e];
        }
    }
    if (part == 0) {
        merge_ml[warp][item][0] = m;
        merge_ml[warp][item][1] = l;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < P * head_dim; i += ATTN_THREADS) {
        const int it = i / head_dim;
        const int d = i - it * head_dim;
        const int g = chunk * P + it;
        if (g >= group) {
            break;
        }
        float top = attn_neg_inf();
#pragma unroll
        for (int w = 0; w < ATTN_WARPS; w++) {
            top = fmaxf(top, merge_ml[w][it][0]);
        }
        float sum = 0.0f;
        float acc = 0.0f;
        if (top != attn_neg_inf()) {
#pragma unroll
            for (int w = 0; w < ATTN_WARPS; w++) {
                const float weight = exp2f(merge_ml[w][it][0] - top);
                sum = fmaf(merge_ml[w][it][1], weight, sum);
                acc = fmaf(merge_o[(w * P + it) * D + d], weight, acc);
            }
        }
        const int h = kv_head * group + g;
        if (n_splits == 1) {
            out[(unsigned long long)row * q_dim + h * head_dim + d] = sum > 0.0f ? acc / sum : 0.0f;
        } else {
            const unsigned long long at = ((unsigned long long)row * n_head + h) * n_splits + split;
            part_o[at * head_dim + d] = acc;
            if (d == 0) {
                part_ml[2 * at] = top;
                part_ml[2 * at + 1] = sum;
            }
        }
    }
}

// The launch of every sl_attend_decode_d<D>_l<L>:
//
// Launch: grid (n_rows, n_kv_head × ceil(G / P), n_splits), block (128), no
// dynamic shared memory; G = n_head / n_kv_head, P = 32 / L, the host
// picking L = 32 / P for P the smallest power of two ≥ min(G, 8) (L = 4
// for G ≥ 5), and D the smallest of 64, 128, 256 ≥ head_dim. Block
// (r, y, s) attends row r's query heads c·P.. (c = y mod ceil(G/P)) of KV
// head y / ceil(G/P) over cells s × split_cells.. of its visible cells.
//   q          n_rows × n_head × head_dim floats
//   out        same shape; written only when n_splits is 1
//   part_o     n_rows × n_head × n_splits × head_dim floats: per split, the
//              sum of exp2(score − max) × v (unnormalized); written when
//              n_splits > 1, for the splits that hold cells (those below
//              ceil(visible / split_cells)), then read by sl_attend_merge
//   part_ml    n_rows × n_head × n_splits × 2 floats: per split, the
//              maximum score in base 2 (score × log2 e) and the sum of
//              exp2(score − max)
//   k_arena, v_arena
//              the layer's key and value arenas
//   k_type, v_type
//              their element types: 0 = f16, 1 = q8_0
//   row_seq, row_visible, block_start, block_count, blocks, hidden_start,
//   hidden_count, hidden
//              the pass layout (see the top of the file)
//   n_head, n_kv_head, head_dim
//              head shape; n_kv_head divides n_head, head_dim ≤ D
//   block_tokens, n_cells
//              cells per block, cells per arena
//   n_splits, split_cells
//              cells per split; the host picks them so that rows × heads ×
//              splits fill the GPU (any split_cells ≥ 1 is correct; a
//              multiple of 4 × 1024 / D keeps the warps even)
//   scale      the softmax scale
//   softcap    the soft-cap of the scores, 0 for none
//   window     the sliding window in cells, 0 for none; split s covers the
//              row's cells first + s × split_cells.. for first its
//              window's first cell
#define ATTN_DECODE(D, L)                                                                                              \
    extern "C" __global__ void __launch_bounds__(ATTN_THREADS, 1) sl_attend_decode_d##D##_l##L(                        \
        const float* __restrict__ q, float* __restrict__ out, float* __restrict__ part_o,                              \
        float* __restrict__ part_ml, const u8* __restrict__ k_arena, const u8* __restrict__ v_arena, int k_type,       \
        int v_type, const u32* __restrict__ row_seq, const u32* __restrict__ row_visible,                              \
        const u32* __restrict__ block_start, const u32* __restrict__ block_count, const u32* __restrict__ blocks,      \
        const u32* __restrict__ hidden_start, const u32* __restrict__ hidden_count, const u32* __restrict__ hidden,    \
        int n_head, int n_kv_head, int head_dim, u32 block_tokens, u32 n_cells, int n_splits, u32 split_cells,         \
        float scale, float softcap, u32 window) {                                                                      \
        attn_decode<D, L>(q, out, part_o, part_ml, k_arena, v_arena, k_type, v_type, row_seq, row_visible,             \
                          block_start, block_count, blocks, hidden_start, hidden_count, hidden, n_head, n_kv_head,     \
                          head_dim, block_tokens, n_cells, n_splits, split_cells, scale, softcap, window);             \
    }

#define ATTN_DECODE_ALL_L(D) ATTN_DECODE(D, 4) ATTN_DECODE(D, 8) ATTN_DECODE(D, 16) ATTN_DECODE(D, 32)

// Every D by default. NVRTC takes seconds per D (each kernel is unrolled
// for its D), so a host that knows the model's head size may compile with
// -DSL_ATTN_D=64 (or 128, 256) to get that D's kernels alone, same names.
#if !defined(SL_ATTN_D) || SL_ATTN_D == 64
ATTN_DECODE_ALL_L(64)
#endif
#if !defined(SL_ATTN_D) || SL_ATTN_D == 128
ATTN_DECODE_ALL_L(128)
#endif
#if !defined(SL_ATTN_D) || SL_ATTN_D == 256
ATTN_DECODE_ALL_L(256)
#endif

// Merge the splits of sl_attend_decode: per (row, head), the splits' sums
// rescaled to the largest maximum, added in split order (deterministic),
// and divided by the total.
//
// Launch: grid (n_rows, n_head), block (128) — any multiple of 32 works,
// threads striding over the head's dims; no dynamic shared memory.
//   part_o, part_ml  what sl_attend_decode wrote
//   row_visible      the pass layout's, to know which splits hold cells
//   out              n_rows × n_head × head_dim floats
//   n_head, head_dim, n_splits, split_cells, window
//                    as given to sl_attend_decode
extern "C" __global__ void sl_attend_merge(
    const float* __restrict__ part_o,
    const float* __restrict__ part_ml,
    const u32* __restrict__ row_visible,
    float* __restrict__ out,
    int n_head,
    int head_dim,
    int n_splits,
    u32 split_cells,
    u32 window) {
    const u32 row = blockIdx.x;
    const int head = blockIdx.y;
    const u32 seen = row_visible[row] - attn_first_seen(row_visible[row], window);
    const int used = (int)attn_min((u32)n_splits, seen / split_cells + (seen % split_cells != 0));
    const unsigned long long first = ((unsigned long long)row * n_head + head) * n_splits;
    const float* ml = part_ml + 2 * first;
    float top = attn_neg_inf();
    for (int s = 0; s < used; s++) {
        top = fmaxf(top, ml[2 * s]);
    }
    float* dst = out + ((unsigned long long)row * n_head + head) * head_dim;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float sum = 0.0f;
        float acc = 0.0f;
        if (top != attn_neg_inf()) {
            for (int s = 0; s < used; s++) {
                const float weight = exp2f(ml[2 * s] - top);
                sum = fmaf(ml[2 * s + 1], weight, sum);
                acc = fmaf(part_o[(first + s) * head_dim + d], weight, acc);
            }
        }
        dst[d] = sum > 0.0f ? acc / sum : 0.0f;
    }
}

// ---- prefill: tiled --------------------------------------------------------

// Per (tile of rows, KV head, chunk of its query heads): the CTA's items
// are (row, query head) pairs, four lanes each, eight per warp, 32 in all:
// rows i / H and query heads chunk × H + i % H for H = min(G, 32) heads
// per chunk. The visible cells stream through shared memory in tiles of
// N = min(32, 4096 / D), staged once for all 32 items (up to 16 KiB of K
// and 16 of V).
template <int D>
__device__ __forceinline__ void attn_prefill(
    const float* __restrict__ q,
    float* __restrict__ out,
    const u8* __restrict__ k_arena,
    const u8* __restrict__ v_arena,
    int k_type,
    int v_type,
    const u32* __restrict__ tiles,
    const u32* __restrict__ row_seq,
    const u32* __restrict__ row_visible,
    const u32* __restrict__ block_start,
    const u32* __restrict__ block_count,
    const u32* __restrict__ blocks,
    const u32* __restrict__ hidden_start,
    const u32* __restrict__ hidden_count,
    const u32* __restrict__ hidden,
    int n_head,
    int n_kv_head,
    int head_dim,
    u32 block_tokens,
    u32 n_cells,
    float scale,
    float softcap,
    u32 window) {
    constexpr int L = 4;
    typedef attn_lanes<D, L> lanes;
    constexpr int N = D <= 128 ? 32 : 4096 / D;
    constexpr int ITEMS = ATTN_WARPS * (WARP / L);
    __shared__ __align__(16) float ks[N * D];
    __shared__ __align__(16) float vs[N * D];
    __shared__ u32 slots[N];
    __shared__ u32 mask_shared;
    __shared__ u32 end_shared;
    __shared__ u32 begin_shared;

    const u32 first_row = tiles[2 * blockIdx.x];
    const u32 n_rows = tiles[2 * blockIdx.x + 1];
    const int group = n_head / n_kv_head;
    const int per_chunk = group < ITEMS ? group : ITEMS;
    const int chunks = (group + per_chunk - 1) / per_chunk;
    const int kv_head = blockIdx.y / chunks;
    const int chunk = blockIdx.y - kv_head * chunks;
    const int warp = threadIdx.x / WARP;
    const int lane = threadIdx.x % WARP;
    const int item = warp * (WARP / L) + lane / L;
    const u32 row_in_tile = item / per_chunk;
    const int in_group = chunk * per_chunk + item % per_chunk;
    const bool active = row_in_tile < n_rows && in_group < group;
    const u32 row = first_row + row_in_tile;
    const int head = kv_head * group + in_group;
    const int q_dim = n_head * head_dim;
    const u32 visible = active ? row_visible[row] : 0;
    const attn_scores scores = attn_make_scores(scale, softcap, window);
    const u32 first_seen = attn_first_seen(visible, window);

    float qr[lanes::PER];
    float o[lanes::PER];
    attn_load_q<D, L>(q + (unsigned long long)row * q_dim + head * head_dim, active, head_dim, scores.q_factor, qr);
#pragma unroll
    for (int i = 0; i < lanes::PER; i++) {
        o[i] = 0.0f;
    }
    float m = attn_neg_inf();
    float l = 0.0f;

    // The tile streams from the first cell any of its rows sees to the
    // last.
    if (warp == 0) {
        const u32 seen = lane < (int)n_rows ? row_visible[first_row + lane] : 0;
        u32 most = seen;
        u32 begin = lane < (int)n_rows ? attn_first_seen(seen, window) : 0xffffffffu;
#pragma unroll
        for (int offset = WARP / 2; offset > 0; offset /= 2) {
            const u32 other = __shfl_xor_sync(0xffffffffu, most, offset);
            most = other > most ? other : most;
            const u32 other_begin = __shfl_xor_sync(0xffffffffu, begin, offset);
            begin = other_begin < begin ? other_begin : begin;
        }
        if (lane == 0) {
            end_shared = most;
            begin_shared = begin;
        }
    }
    __syncthreads();
    const u32 end = end_shared;

    const attn_seq seq =
        attn_load_seq(row_seq[first_row], block_start, block_count, blocks, hidden_start, hidden_count, hidden);
    const attn_arenas arenas = attn_make_arenas(k_arena, v_arena, k_type, v_type, n_kv_head, kv_head, head_dim);
    for (u32 c0 = begin_shared; c0 < end; c0 += N) {
        // Warp 0 whole, for the ballot.
        if (warp == 0) {
            const u32 slot = lane < N ? attn_slot(seq, c0 + lane, end, block_tokens, n_cells) : ATTN_NO_SLOT;
            if (lane < N) {
                slots[lane] = slot;
            }
            const u32 mask = __ballot_sync(0xffffffffu, slot != ATTN_NO_SLOT);
            if (lane == 0) {
                mask_shared = mask;
            }
        }
        __syncthreads();
        attn_stage<D, N, ATTN_THREADS>(ks, vs, slots, arenas, head_dim, threadIdx.x);
        __syncthreads();
        const int seen = visible > c0 ? (int)attn_min(visible - c0, N) : 0;
        const int skip = first_seen > c0 ? (int)attn_min(first_seen - c0, N) : 0;
        attn_tile<D, L, N>(ks, vs, mask_shared, skip, seen, scores.cap, qr, m, l, o);
        // The next tile's staging overwrites what this one read.
        __syncthreads();
    }

    if (active) {
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        float* dst = out + (unsigned long long)row * q_dim + head * head_dim;
        const int part = lane % L;
#pragma unroll
        for (int j = 0; j < lanes::J; j++) {
#pragma unroll
            for (int e = 0; e < lanes::VW; e++) {
                const int d = j * lanes::VW * L + part * lanes::VW + e;
                if (d < head_dim) {
                    dst[d] = o[j * lanes::VW + e] * inv;
                }
            }
        }
    }
}

// The launch of every sl_attend_prefill_d<D>:
//
// Launch: grid (n_tiles, n_kv_head × ceil(G / H)), block (128), no dynamic
// shared memory; G = n_head / n_kv_head, H = min(G, 32), D the smallest of
// 64, 128, 256 ≥ head_dim. Block (t, y) attends the rows of tile t with
// query heads c·H.. (c = y mod ceil(G/H)) of KV head y / ceil(G/H).
//   q, out     n_rows × n_head × head_dim floats each
//   k_arena, v_arena, k_type, v_type
//              as for sl_attend_decode
//   tiles      n_tiles pairs (first_row, n_rows): consecutive pass rows, all
//              of one sequence, 1 ≤ n_rows ≤ 32 / H (rounded down); every
//              row to attend in exactly one tile. Rows of a tile that see
//              about as many cells waste the least (the tile streams up to
//              the most any of them sees)
//   row_seq, row_visible, block_start, block_count, blocks, hidden_start,
//   hidden_count, hidden
//              the pass layout (see the top of the file)
//   n_head, n_kv_head, head_dim, block_tokens, n_cells, scale, softcap,
//   window     as for sl_attend_decode
#define ATTN_PREFILL(D)                                                                                                \
    extern "C" __global__ void __launch_bounds__(ATTN_THREADS, 1) sl_attend_prefill_d##D(                              \
        const float* __restrict__ q, float* __restrict__ out, const u8* __restrict__ k_arena,                          \
        const u8* __restrict__ v_arena, int k_type, int v_type, const u32* __restrict__ tiles,                         \
        const u32* __restrict__ row_seq, const u32* __restrict__ row_visible, const u32* __restrict__ block_start,     \
        const u32* __restrict__ block_count, const u32* __restrict__ blocks, const u32* __restrict__ hidden_start,     \
        const u32* __restrict__ hidden_count, const u32* __restrict__ hidden, int n_head, int n_kv_head,               \
        int head_dim, u32 block_tokens, u32 n_cells, float scale, float softcap, u32 window) {                         \
        attn_prefill<D>(q, out, k_arena, v_arena, k_type, v_type, tiles, row_seq, row_visible, block_start,            \
                        block_count, blocks, hidden_start, hidden_count, hidden, n_head, n_kv_head, head_dim,          \
                        block_tokens, n_cells, scale, softcap, window);                                                \
    }

#if !defined(SL_ATTN_D) || SL_ATTN_D == 64
ATTN_PREFILL(64)
#endif
#if !defined(SL_ATTN_D) || SL_ATTN_D == 128
ATTN_PREFILL(128)
#endif
#if !defined(SL_ATTN_D) || SL_ATTN_D == 256
ATTN_PREFILL(256)
#endif
