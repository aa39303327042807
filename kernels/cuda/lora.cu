// LoRA deltas, out[row] += scale × B·(A·x[row]), for the rows one adapter
// term lists (Backend::add_low_rank). The host launches sl_lora_down then
// sl_lora_up once per term, in term order, so that a row named by several
// terms adds their deltas in that order; within a term rows are distinct,
// so every output element has one writer.
//
// Both sums follow the CPU's order exactly (kernels/src/ops/low_rank.rs),
// with explicitly rounded products and sums (no fused multiply-add), so a
// row's delta is the CPU's to the bit:
//   t[r] = A[r]·x: sixteen partial sums, lane l adding a[16c + l] × x[16c + l]
//          over c in order (missing elements past n_in as 0 × 0), then
//          folded as a tree, lane l with lane l + 8, then + 4, + 2, + 1;
//   out  += (Σ_r t[r] × Bᵀ[r][o], r in order, from 0) × scale.

// Listed rows per block of sl_lora_down: a block reads each row of A once
// for all of them.
#define LORA_DOWN_ROWS 4
// Listed rows per block of sl_lora_up: each Bᵀ element read serves them all.
#define LORA_UP_ROWS 8
// The CPU's lane count, which the down-projection's order follows.
#define LORA_LANES 16

// t = A·x for listed rows: t[i × rank + r] = A[r] · x[rows[i]].
//
// Launch: grid (ceil(n_listed / 4)), block (256) — any multiple of 32 up to
// 1024 works; no dynamic shared memory. Each half-warp computes one rank
// at a time for the block's (up to) 4 listed rows.
//   t        n_listed × rank floats, written (scratch for sl_lora_up)
//   x        the pass's rows, n_in floats each
//   a        A: rank rows of n_in floats
//   rows     n_listed row indices into x (and out)
//   n_listed how many rows the term lists
//   n_in     the width of x's rows
//   rank     the adapter's rank
extern "C" __global__ void sl_lora_down(
    float* __restrict__ t,
    const float* __restrict__ x,
    const float* __restrict__ a,
    const int* __restrict__ rows,
    int n_listed,
    int n_in,
    int rank) {
    const int first = blockIdx.x * LORA_DOWN_ROWS;
    const int count = min(LORA_DOWN_ROWS, n_listed - first);
    const int lane = threadIdx.x % LORA_LANES;
    const int half_warp = threadIdx.x / LORA_LANES;
    const int half_warps = blockDim.x / LORA_LANES;
    // The half-warps of one warp may run different numbers of ranks, so
    // each shuffles within its own sixteen lanes.
    const u32 mask = 0xffffu << (threadIdx.x % WARP / LORA_LANES * LORA_LANES);
    const float* in[LORA_DOWN_ROWS];
#pragma unroll
    for (int j = 0; j < LORA_DOWN_ROWS; ++j) {
        // Places past the listed rows repeat the last one; their sums are
        // never stored.
        in[j] = x + (long long)rows[first + min(j, count - 1)] * n_in;
    }
    for (int r = half_warp; r < rank; r += half_warps) {
        const float* a_row = a + (long long)r * n_in;
        float sums[LORA_DOWN_ROWS];
#pragma unroll
        for (int j = 0; j < LORA_DOWN_ROWS; ++j) {
            sums[j] = 0.0f;
        }
        for (int base = 0; base < n_in; base += LORA_LANES) {
            const int i = base + lane;
            const bool inside = i < n_in;
            const float a_value = inside ? a_row[i] : 0.0f;
#pragma unroll
            for (int j = 0; j < LORA_DOWN_ROWS; ++j) {
                const float x_value = inside ? in[j][i] : 0.0f;
                sums[j] = __fadd_rn(sums[j], __fmul_rn(a_value, x_value));
            }
        }
#pragma unroll
        for (int j = 0; j < LORA_DOWN_ROWS; ++j) {
#pragma unroll
            for (int offset = LORA_LANES / 2; offset > 0; offset /= 2) {
                sums[j] = __fadd_rn(sums[j], __shfl_xor_sync(mask, sums[j], offset));
            }
        }
        if (lane == 0) {
#pragma unroll
            for (int j = 0; j < LORA_DOWN_ROWS; ++j) {
                if (j < count) {
                    t[(long long)(first + j) * rank + r] = sums[j];
                }
            }
        }
    }
}

// out[rows[i]] += scales[i] × B·t[i] for listed rows.
//
// Launch: grid (ceil(n_listed / 8), ceil(n_out / 256)), block (256) — any
// block size works, thread o of block (bx, by) taking output
// by × blockDim.x + o of the block's (up to) 8 listed rows; no dynamic
// shared memory.
//   out      the pass's rows, n_out floats each; listed rows updated
//   t        n_listed × rank floats from sl_lora_down
//   b_t      B transposed: rank rows of n_out floats (Bᵀ[r][o] = B[o][r];
//            the host transposes the adapter's n_out × rank B on upload, as
//            the CPU backend does, so that these loads are coalesced)
//   rows     n_listed row indices into out, distinct
//   scales   n_listed floats: each listed row's scale
//   n_listed how many rows the term lists
//   rank     the adapter's rank
//   n_out    the width of out's rows
extern "C" __global__ void sl_lora_up(
    float* __restrict__ out,
    const float* __restrict__ t,
    const float* __restrict__ b_t,
    const int* __restrict__ rows,
    const float* __restrict__ scales,
    int n_listed,
    int rank,
    int n_out) {
    const int o = blockIdx.y * blockDim.x + threadIdx.x;
    if (o >= n_out) {
        return;
    }
    const int first = blockIdx.x * LORA_UP_ROWS;
    const int count = min(LORA_UP_ROWS, n_listed - first);
    const float* t_rows[LORA_UP_ROWS];
    float sums[LORA_UP_ROWS];
#pragma unroll
    for (int j = 0; j < LORA_UP_ROWS; ++j) {
        // Places past the listed rows repeat the last one; their sums are
        // never stored.
        t_rows[j] = t + (long long)(first + min(j, count - 1)) * rank;
        sums[j] = 0.0f;
    }
    for (int r = 0; r < rank; ++r) {
        const float b_value = b_t[(long long)r * n_out + o];
#pragma unroll
        for (int j = 0; j < LORA_UP_ROWS; ++j) {
            sums[j] = __fadd_rn(sums[j], __fmul_rn(t_rows[j][r], b_value));
        }
    }
#pragma unroll
    for (int j = 0; j < LORA_UP_ROWS; ++j) {
        if (j < count) {
            float* at = out + (long long)rows[first + j] * n_out + o;
            *at = __fadd_rn(*at, __fmul_rn(sums[j], scales[first + j]));
        }
    }
}
