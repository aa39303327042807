// LoRA deltas, out[row] += scale × B·(A·x[row]), for the rows one adapter
// term lists (Backend::add_low_rank). The host launches sl_lora_down then
// sl_lora_up once per term, in term order, so that a row named by several
// terms adds their deltas in that order; within a term rows are distinct,
// so every output element has one writer.
//
// Every dot product follows the CPU's order exactly (kernels/src/ops/
// low_rank.rs: llama.cpp's vector dot product for F32 adapters), with
// explicitly rounded operations, so a row's delta is the CPU's to the bit.
// For a dot of n products (t[r] = A[r]·x over n_in; out[o]'s Σ_r t[r] ×
// Bᵀ[r][o] over the rank):
//   over the whole blocks of 64, lane l of accumulator k fuses element
//   64m + 16k + l into its sum over m in order; then per lane (acc 0 + acc 2)
//   + (acc 1 + acc 3), and the lanes folded as a tree, lane l with lane
//   l + 8, then + 4, + 2, + 1 (0 when there is no whole block);
//   then the rest in order, each product rounded and added, except for the
//   last n mod 8, fused.
// The delta is then scaled (rounded) and added.

// Listed rows per block of sl_lora_down: a block reads each row of A once
// for all of them.
#define LORA_DOWN_ROWS 4
// Listed rows per block of sl_lora_up, taken one after another.
#define LORA_UP_ROWS 8
// The CPU's lane count and block of four accumulators, and the rest's
// stretch of rounded products: the order of every dot.
#define LORA_LANES 16
#define LORA_BLOCK 64
#define LORA_ROUNDED 8

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
    const int whole = n_in - n_in % LORA_BLOCK;
    const int rounded = n_in - n_in % LORA_ROUNDED;
    for (int r = half_warp; r < rank; r += half_warps) {
        const float* a_row = a + (long long)r * n_in;
        float sums[LORA_DOWN_ROWS][4];
#pragma unroll
        for (int j = 0; j < LORA_DOWN_ROWS; ++j) {
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                sums[j][k] = 0.0f;
            }
        }
        for (int base = 0; base < whole; base += LORA_BLOCK) {
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const int i = base + k * LORA_LANES + lane;
                const float a_value = a_row[i];
#pragma unroll
                for (int j = 0; j < LORA_DOWN_ROWS; ++j) {
                    sums[j][k] = __fmaf_rn(a_value, in[j][i], sums[j][k]);
                }
            }
        }
#pragma unroll
        for (int j = 0; j < LORA_DOWN_ROWS; ++j) {
            float sum = __fadd_rn(__fadd_rn(sums[j][0], sums[j][2]), __fadd_rn(sums[j][1], sums[j][3]));
#pragma unroll
            for (int offset = LORA_LANES / 2; offset > 0; offset /= 2) {
                sum = __fadd_rn(sum, __shfl_xor_sync(mask, sum, offset));
            }
            if (lane == 0 && j < count) {
                for (int i = whole; i < n_in; ++i) {
                    sum = i < rounded ? __fadd_rn(sum, __fmul_rn(a_row[i], in[j][i]))
                                      : __fmaf_rn(a_row[i], in[j][i], sum);
                }
                t[(long long)(first + j) * rank + r] = sum;
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
    const int whole = rank - rank % LORA_BLOCK;
    const int rounded = rank - rank % LORA_ROUNDED;
    for (int j = 0; j < count; ++j) {
        const float* t_row = t + (long long)(first + j) * rank;
        float sum = 0.0f;
        if (whole > 0) {
            // Every index below is a constant once unrolled, so the 64
            // partial sums stay in registers.
            float acc[4][LORA_LANES];
#pragma unroll
            for (int k = 0; k < 4; ++k) {
#pragma unroll
                for (int l = 0; l < LORA_LANES; ++l) {
                    acc[k][l] = 0.0f;
                }
            }
            for (int base = 0; base < whole; base += LORA_BLOCK) {
#pragma unroll
                for (int k = 0; k < 4; ++k) {
#pragma unroll
                    for (int l = 0; l < LORA_LANES; ++l) {
                        const int r = base + k * LORA_LANES + l;
                        acc[k][l] = __fmaf_rn(t_row[r], b_t[(long long)r * n_out + o], acc[k][l]);
                    }
                }
            }
            float* lanes = acc[0];
#pragma unroll
            for (int l = 0; l < LORA_LANES; ++l) {
                lanes[l] = __fadd_rn(__fadd_rn(acc[0][l], acc[2][l]), __fadd_rn(acc[1][l], acc[3][l]));
            }
#pragma unroll
            for (int l = 0; l < 8; ++l) {
                lanes[l] = __fadd_rn(lanes[l], lanes[l + 8]);
            }
#pragma unroll
            for (int l = 0; l < 4; ++l) {
                lanes[l] = __fadd_rn(lanes[l], lanes[l + 4]);
            }
#pragma unroll
            for (int l = 0; l < 2; ++l) {
                lanes[l] = __fadd_rn(lanes[l], lanes[l + 2]);
            }
            sum = __fadd_rn(lanes[0], lanes[1]);
        }
        for (int r = whole; r < rank; ++r) {
            const float b_value = b_t[(long long)r * n_out + o];
            sum = r < rounded ? __fadd_rn(sum, __fmul_rn(t_row[r], b_value)) : __fmaf_rn(t_row[r], b_value, sum);
        }
        float* at = out + (long long)rows[first + j] * n_out + o;
        *at = __fadd_rn(*at, __fmul_rn(sum, scales[first + j]));
    }
}
