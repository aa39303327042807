// Greedy and top-k selection over rows of logits, one block per row.
//
// Both rank elements by a 64-bit key: the value's bits mapped so that
// unsigned order is float order, above the complement of the index, so
// that equal values rank the lower index higher and every key is distinct.
// The largest key is then the argmax and the k largest keys are the top k,
// whatever order the threads met them in: the results are deterministic
// and independent of the block size.
//
// NaN maps to the value part 0, below -inf: a NaN is chosen only when
// nothing else is left (an all-NaN row gives index 0 for argmax, and NaNs
// by ascending index fill the top k once the other values run out).

#define TOPK_FULL_MASK 0xffffffffu
// At most this many values per row; the sort network is this wide.
#define TOPK_MAX_K 64
// Radix-select digits of 8 bits: 256 histogram bins, eight per lane of
// the one warp that searches them.
#define TOPK_BINS 256

// The key of `value` at `index`. `zeros_equal`: -0 and +0 rank as one value
// (float comparison, as the engine's greedy choice compares); otherwise -0
// ranks below +0 (f32::total_cmp, as the engine's candidate sort orders).
__device__ __forceinline__ unsigned long long topk_key(float value, int index, bool zeros_equal) {
    u32 bits = __float_as_uint(value);
    if (zeros_equal && value == 0.0f) {
        bits = 0;
    }
    u32 order = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
    if (value != value) {
        order = 0;
    }
    return ((unsigned long long)order << 32) | (unsigned long long)(~(u32)index);
}

__device__ __forceinline__ int topk_index(unsigned long long key) {
    return (int)~(u32)key;
}

__device__ __forceinline__ unsigned long long topk_warp_max(unsigned long long key) {
#pragma unroll
    for (int offset = WARP / 2; offset > 0; offset /= 2) {
        const unsigned long long other = __shfl_xor_sync(TOPK_FULL_MASK, key, offset);
        key = other > key ? other : key;
    }
    return key;
}

// Per row, the index of its largest logit: the lowest such index on ties
// (-0 equal to +0), never a NaN unless the row is all NaN (then 0).
//
// Launch: grid (n_rows), block (1024) — any multiple of 32 up to 1024
// works; no dynamic shared memory. Block b reads row b.
//   out     n_rows ints, written: row b's argmax
//   logits  n_rows × n_vocab floats
//   n_vocab the row width, ≥ 1
extern "C" __global__ void sl_argmax(int* __restrict__ out, const float* __restrict__ logits, int n_vocab) {
    __shared__ unsigned long long scratch[WARP];
    const float* row = logits + (long long)blockIdx.x * n_vocab;
    // 0 is below every element's key: an index's complement is never 0.
    unsigned long long best = 0;
    for (int i = threadIdx.x; i < n_vocab; i += blockDim.x) {
        const unsigned long long key = topk_key(row[i], i, true);
        best = key > best ? key : best;
    }
    best = topk_warp_max(best);
    const int lane = threadIdx.x % WARP;
    if (lane == 0) {
        scratch[threadIdx.x / WARP] = best;
    }
    __syncthreads();
    if (threadIdx.x < WARP) {
        const int warps = (blockDim.x + WARP - 1) / WARP;
        best = topk_warp_max(lane < warps ? scratch[lane] : 0ull);
        if (lane == 0) {
            out[blockIdx.x] = topk_index(best);
        }
    }
}

// Where the radix select stands between passes. The selected keys are
// those whose top `depth` bits are at least `prefix`; `need` of them still
// lie in the bucket `prefix` itself.
struct topk_state {
    unsigned long long prefix;
    int depth;
    int need;
    int done;
};

// Warp 0 of the block: finds the bucket the need-th largest matching key
// falls in, walking the histogram from its top bin down, and narrows the
// state to it.
__device__ __forceinline__ void topk_narrow(const u32* hist, topk_state* state) {
    const int lane = threadIdx.x;
    const int per_lane = TOPK_BINS / WARP;
    const int first_bin = lane * per_lane;
    int own = 0;
#pragma unroll
    for (int b = 0; b < per_lane; ++b) {
        own += (int)hist[first_bin + b];
    }
    // Inclusive suffix sums over lanes: the count in this lane's bins and
    // every bin above them.
    int from_here = own;
#pragma unroll
    for (int offset = 1; offset < WARP; offset *= 2) {
        const int other = __shfl_down_sync(TOPK_FULL_MASK, from_here, offset);
        if (lane + offset < WARP) {
            from_here += other;
        }
    }
    const int need = state->need;
    int above = from_here - own;
    // Exactly one lane holds the crossing: the counts sum to at least
    // `need` over the whole histogram, and to less above its first lane.
    if (above < need && need <= from_here) {
        for (int b = first_bin + per_lane - 1; b >= first_bin; --b) {
            const int count = (int)hist[b];
            if (above + count >= need) {
                state->prefix = (state->prefix << 8) | (unsigned long long)b;
                state->depth += 8;
                state->need = need - above;
                // Every key of the bucket is chosen: stop here.
                state->done = count == need - above;
                break;
            }
            above += count;
        }
    }
}

// Per row, its k largest logits in descending order and their indices:
// equal values by ascending index, -0 below +0 (f32::total_cmp), NaN
// below everything.
//
// A radix select over the keys, 8 bits a pass (one read of the row each;
// the passes stop as soon as a bucket holds exactly the keys still needed,
// usually within the 32 bits of the value), then the k chosen keys sorted
// in shared memory.
//
// Launch: grid (n_rows), block (1024) — any multiple of 32 up to 1024
// works; no dynamic shared memory (1.6 KB static). Block b reads row b.
//   out_values  n_rows × k floats, written: row b's values, largest first
//   out_indices n_rows × k ints, written: their indices into the row
//   logits      n_rows × n_vocab floats
//   n_vocab     the row width, ≥ 1
//   k           how many to keep, 1 ≤ k ≤ 64 (the output row stride);
//               places past n_vocab or 64 hold index -1 and value -inf
extern "C" __global__ void sl_top_k(
    float* __restrict__ out_values,
    int* __restrict__ out_indices,
    const float* __restrict__ logits,
    int n_vocab,
    int k) {
    __shared__ u32 hist[TOPK_BINS];
    __shared__ unsigned long long chosen[TOPK_MAX_K];
    __shared__ topk_state state;
    __shared__ int n_chosen;
    const float* row = logits + (long long)blockIdx.x * n_vocab;
    const int lane = threadIdx.x % WARP;
    const int keep = min(min(k, TOPK_MAX_K), n_vocab);
    // Nothing to select: the search below would look for a 0th key forever.
    if (keep < 1) {
        return;
    }
    if (threadIdx.x == 0) {
        state.prefix = 0;
        state.depth = 0;
        state.need = keep;
        state.done = 0;
        n_chosen = 0;
    }
    for (int i = threadIdx.x; i < TOPK_MAX_K; i += blockDim.x) {
        chosen[i] = 0;
    }
    // Every pass narrows the prefix by 8 bits; at 64 bits a bucket holds
    // one key, so the eighth pass at the latest is the last.
    while (true) {
        for (int b = threadIdx.x; b < TOPK_BINS; b += blockDim.x) {
            hist[b] = 0;
        }
        __syncthreads();
        const unsigned long long prefix = state.prefix;
        const int depth = state.depth;
        // The bound is the same for the whole block, so every lane of a
        // warp takes part in each __match_any_sync below.
        for (int base = 0; base < n_vocab; base += blockDim.x) {
            const int i = base + threadIdx.x;
            int digit = TOPK_BINS;
            if (i < n_vocab) {
                const unsigned long long key = topk_key(row[i], i, false);
                if (depth == 0 || (key >> (64 - depth)) == prefix) {
                    digit = (int)((key >> (56 - depth)) & 0xff);
                }
            }
            // One shared add per distinct digit of the warp: the top bins
            // of a row of logits are crowded.
            const u32 peers = __match_any_sync(TOPK_FULL_MASK, digit);
            if (digit < TOPK_BINS && lane == __ffs(peers) - 1) {
                atomicAdd(&hist[digit], (u32)__popc(peers));
            }
        }
        __syncthreads();
        if (threadIdx.x < WARP) {
            topk_narrow(hist, &state);
        }
        __syncthreads();
        if (state.done) {
            break;
        }
    }
    const unsigned long long prefix = state.prefix;
    const int depth = state.depth;
    // Exactly `keep` keys qualify; their slots depend on timing, but the
    // sort below orders them by key alone.
    for (int i = threadIdx.x; i < n_vocab; i += blockDim.x) {
        const unsigned long long key = topk_key(row[i], i, false);
        if ((key >> (64 - depth)) >= prefix) {
            chosen[atomicAdd(&n_chosen, 1)] = key;
        }
    }
    __syncthreads();
    // Bitonic sort, descending; the empty places hold key 0 and sink.
    for (int size = 2; size <= TOPK_MAX_K; size *= 2) {
        for (int stride = size / 2; stride > 0; stride /= 2) {
            for (int i = threadIdx.x; i < TOPK_MAX_K; i += blockDim.x) {
                const int j = i ^ stride;
                if (j > i) {
                    const unsigned long long a = chosen[i];
                    const unsigned long long b = chosen[j];
                    const bool descending = (i & size) == 0;
                    if (descending ? a < b : a > b) {
                        chosen[i] = b;
                        chosen[j] = a;
                    }
                }
            }
            __syncthreads();
        }
    }
    const long long out_row = (long long)blockIdx.x * k;
    for (int j = threadIdx.x; j < k; j += blockDim.x) {
        if (j < keep) {
            const int index = topk_index(chosen[j]);
            out_indices[out_row + j] = index;
            out_values[out_row + j] = row[index];
        } else {
            out_indices[out_row + j] = -1;
            out_values[out_row + j] = -__int_as_float(0x7f800000);
        }
    }
}
