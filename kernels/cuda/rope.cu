// Rotary position embedding, applied as the CPU backend applies it
// (kernels/src/ops/rope.rs, `Rope::apply`): the host computes each row's
// cos and sin per rotary pair (`Rope::angles`, where every kind — NEOX,
// M-RoPE, interleaved M-RoPE — has already picked its position component),
// so the device only rotates. Given the same tables the results are the
// CPU's to the bit: the rotation fuses the product of x0 into each output
// and rounds the other product first, exactly as the Rust does
//   x0' = fma(x0, cos, −(x1 × sin)),  x1' = fma(x0, sin, x1 × cos).

__device__ __forceinline__ void rope_rotate(float* a, float* b, float cos_value, float sin_value) {
    const float x0 = *a;
    const float x1 = *b;
    // __fmul_rn keeps the compiler from contracting these products into
    // other fused operations.
    *a = __fmaf_rn(x0, cos_value, -__fmul_rn(x1, sin_value));
    *b = __fmaf_rn(x0, sin_value, __fmul_rn(x1, cos_value));
}

// Rotate, in place, every head of every row of x by that row's angles.
//
// Launch: grid (n_rows), block (128) — any block size works, threads
// striding over the row's n_heads × pairs rotary pairs; no dynamic shared
// memory. Block b rotates row b.
//   x        n_rows × (n_heads × head_dim) floats, rotated in place
//   cos_table, sin_table
//            n_rows × pairs floats each: pair p of row r turns by the angle
//            whose cosine is cos_table[r × pairs + p] (the host's RopeAngles)
//   n_heads  heads per row
//   head_dim elements per head
//   pairs    rotary pairs per head, n_rot / 2 (n_rot ≤ head_dim); elements
//            from n_rot on are left untouched
//   adjacent nonzero: pair p is elements (2p, 2p + 1) of its head (llama's
//            "norm" rope); zero: elements (p, p + pairs) (NEOX, M-RoPE and
//            interleaved M-RoPE)
extern "C" __global__ void sl_rope(
    float* __restrict__ x,
    const float* __restrict__ cos_table,
    const float* __restrict__ sin_table,
    int n_heads,
    int head_dim,
    int pairs,
    int adjacent) {
    const long long row = blockIdx.x;
    float* values = x + row * n_heads * head_dim;
    const float* row_cos = cos_table + row * pairs;
    const float* row_sin = sin_table + row * pairs;
    const int total = n_heads * pairs;
    // Consecutive threads take consecutive pairs of one head, so the split
    // layout's loads of p and p + pairs are each coalesced.
    for (int i = threadIdx.x; i < total; i += blockDim.x) {
        const int head = i / pairs;
        const int p = i - head * pairs;
        float* at = values + head * head_dim;
        const int first = adjacent ? 2 * p : p;
        const int second = adjacent ? 2 * p + 1 : p + pairs;
        rope_rotate(at + first, at + second, row_cos[p], row_sin[p]);
    }
}
