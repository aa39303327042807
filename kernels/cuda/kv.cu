// Writes into the paged KV store (kernels/src/backend/cpu.rs, `store_kv`
// and `copy_kv_block`). A layer has one arena for its keys and one for its
// values; cell `slot` of an arena holds kv_dim values from byte
// slot × cell_bytes, where cell_bytes is 2 × kv_dim for f16 and
// (kv_dim / 32) × 34 for Q8_0 (blocks of an f16 scale and 32 quants, packed
// without padding, as GGML lays them out). Keys and values may differ in
// type, so the host calls one store kernel for k and one for v.
//
// Arenas must start 2-byte aligned (a device allocation is); cells are
// addressed with 64-bit byte offsets, so an arena may exceed 4 GiB, but a
// layer holds fewer than 2^32 cells.

// Round every row of `src` to f16 into its cell: cell slots[r] of `arena`
// gets row r, as the CPU's `f32_to_f16_row` rounds it (to nearest, ties to
// even; cvt.rn.f16.f32 is that rounding, subnormals and overflow included).
//
// Launch: grid (n_rows, ceil(kv_dim / 256)), block (256), no dynamic
// shared memory. Block (r, b) writes values 256b.. of row r.
//   src      n_rows × kv_dim floats (the pass's k or v rows)
//   slots    n_rows cells, one per pass row (PassRow::slot)
//   arena    the layer's f16 key or value arena
//   kv_dim   values per cell, n_kv_head × head_dim
//   n_cells  cells in the arena (n_blocks × block_tokens); a row whose slot
//            is not below it is skipped rather than written out of bounds
extern "C" __global__ void sl_store_kv_f16(
    const float* __restrict__ src,
    const u32* __restrict__ slots,
    u8* __restrict__ arena,
    int kv_dim,
    u32 n_cells) {
    const int i = blockIdx.y * blockDim.x + threadIdx.x;
    const u32 slot = slots[blockIdx.x];
    if (i >= kv_dim || slot >= n_cells) {
        return;
    }
    u16* cell = (u16*)arena + (unsigned long long)slot * kv_dim;
    cell[i] = f32_to_f16(src[(unsigned long long)blockIdx.x * kv_dim + i]);
}

// Quantize every row of `src` to Q8_0 into its cell, bit for bit as the
// CPU does (kernels/src/quant/scalar.rs, `quantize_q8_0` and `act_scale`;
// its AVX2 twin computes the same): per block of 32 values,
//   amax = max |x|, d = amax / 127 (IEEE division),
//   id   = 127 / amax when d is a normal float, else 0 (1/d would overflow),
//   q    = x × id rounded to nearest, ties to even,
// and d is stored rounded to f16. Rust's `as i8` takes NaN to 0, as
// cvt.rni does; for finite inputs |x × id| never rounds past 127.
//
// Launch: grid (n_rows, ceil(kv_dim / 256)), block (256), no dynamic
// shared memory. Warp w of block (r, b) quantizes Q8_0 block 8b + w of row
// r, lane i its value i.
//   src, slots, arena, kv_dim, n_cells
//            as sl_store_kv_f16; arena is the layer's Q8_0 arena, kv_dim a
//            multiple of 32
extern "C" __global__ void sl_store_kv_q8_0(
    const float* __restrict__ src,
    const u32* __restrict__ slots,
    u8* __restrict__ arena,
    int kv_dim,
    u32 n_cells) {
    const int blocks = kv_dim / Q8_0_VALUES;
    const int block = blockIdx.y * (blockDim.x / WARP) + threadIdx.x / WARP;
    const int lane = threadIdx.x % WARP;
    const u32 slot = slots[blockIdx.x];
    // Whole warps leave together, so the reduction below has every lane.
    if (block >= blocks || slot >= n_cells) {
        return;
    }
    const float x = src[(unsigned long long)blockIdx.x * kv_dim + block * Q8_0_VALUES + lane];
    // fmaxf drops NaN as Rust's f32::max does in the CPU's fold.
    const float amax = warp_max(fabsf(x));
    const float d = __fdiv_rn(amax, 127.0f);
    // Normal: at least the smallest normal float and finite (NaN fails both).
    const bool normal = d >= __int_as_float(0x00800000) && d <= __int_as_float(0x7f7fffff);
    // 127/amax, not 1/d: the CPU computes it so (they differ in the last
    // bit for some blocks).
    const float id = normal ? __fdiv_rn(127.0f, amax) : 0.0f;
    const int q = __float2int_rn(__fmul_rn(x, id));
    u8* at = arena + (unsigned long long)slot * blocks * Q8_0_BYTES + block * Q8_0_BYTES;
    if (lane == 0) {
        // Block starts are even (34-byte blocks from an aligned arena).
        *(u16*)at = f32_to_f16(d);
    }
    at[2 + lane] = (u8)(i8)q;
}

// Copy one block of cells onto another within each of `n_arenas` arenas
// (copy-on-write of a shared tail), whatever the element type: the bytes
// are copied as stored.
//
// Launch: grid (ceil(block_bytes / 4096), n_arenas), block (256), no
// dynamic shared memory. Block (x, a) copies bytes 4096x.. of the block in
// arena a (16 bytes a thread where block_bytes is a multiple of 16, else a
// byte a thread striding over the piece).
//   arena        the first arena
//   arena_stride bytes from one arena to the next: lets the host copy every
//                layer's keys (or values) in one launch when they are laid
//                out at a fixed stride in one allocation; any value when
//                n_arenas is 1
//   block_bytes  bytes of one block of the arena, block_tokens × cell bytes
//   from, to     the blocks: block b spans bytes b × block_bytes..; they must
//                differ (a block never overlaps another)
extern "C" __global__ void sl_copy_kv_block(
    u8* __restrict__ arena,
    unsigned long long arena_stride,
    unsigned long long block_bytes,
    u32 from,
    u32 to) {
    u8* base = arena + blockIdx.y * arena_stride;
    const u8* src = base + from * block_bytes;
    u8* dst = base + to * block_bytes;
    const unsigned long long start = blockIdx.x * 4096ull;
    const unsigned long long end = start + 4096 < block_bytes ? start + 4096 : block_bytes;
    // 16-byte pieces where both blocks start 16-byte aligned (always, for an
    // arena of its own with such blocks: allocations are 256-byte aligned).
    if (((unsigned long long)base | block_bytes) % 16 == 0) {
        const unsigned long long i = start + threadIdx.x * 16ull;
        if (i < end) {
            *(uint4*)(dst + i) = *(const uint4*)(src + i);
        }
    } else {
        for (unsigned long long i = start + threadIdx.x; i < end; i += blockDim.x) {
            dst[i] = src[i];
        }
    }
}
