//! Weights repacked at load (the K-quants, and the legacy formats without
//! an offset: Q4_0, Q5_0, Q8_0): eight weight rows interleaved, so that
//! the kernels keep one weight row per 32-bit lane.
//!
//! In the file's layout a kernel multiplies 32 quants of one weight row at
//! a time and must, per block, reduce each row's lanes to one sum (and for
//! the K-quants unpack the 6-bit scales). Interleaved, four consecutive quants
//! of eight rows fill one 32-byte vector: a byte dot against the activation
//! row's four matching bytes (broadcast) gives each row's partial sum in its
//! own lane, the scales are unpacked bytes ready to widen, and the per-block
//! float step of the reference runs on eight rows at once. Integer sums are
//! exact and the float steps are the reference's, so every output keeps the
//! bits of [`super::vec_dot`] on the original row.
//!
//! Kernels that take two groups per call (AVX-512: one group per 256-bit
//! half) get each block of a pair of groups as one pair block, the two
//! groups' pieces alternating so that each of the kernel's loads is one
//! contiguous read (see [`place_block`]); a lone last group is paired
//! with itself.
//!
//! A matrix keeps its file bytes beside the packed copy: rows past the last
//! whole group of eight and embedding lookups read those.
//!
//! Layout of one packed block (eight rows' block `b`, in that order):
//!
//! - Q4_K, 1184 bytes: the eight `d` (f16), the eight `dmin` (f16); scales
//!   then minima, each as four 16-byte groups `p`, row by row the pair
//!   (sub-block 2p, 2p+1); then for `p` in 0..4 and step `s` in 0..8, each
//!   row's bytes `qs[32p + 4s .. 32p + 4s + 4]` (low nibbles: sub-block 2p,
//!   elements 4s..4s+4; high nibbles: sub-block 2p+1).
//! - Q6_K, 1680 bytes: the eight `d` (f16); the sixteen signed scales as
//!   eight 16-byte groups, row by row the pair (2g, 2g+1); then 32-byte
//!   chunks of low bits `L(t)`, `t` in 0..32: each row's four bytes holding
//!   elements 4t+k in the low nibble and 128+4t+k in the high; and of high
//!   bits `H(u)`, `u` in 0..16: four bytes per row holding the two high bits
//!   of elements 4u+k, 64+4u+k, 128+4u+k and 192+4u+k at bits 0, 2, 4 and
//!   6. The chunks are in the order the kernels first read them: `L(0)`,
//!   `H(0)`, `L(1)`, `H(1)`, …, `H(15)`, then `L(16)` … `L(31)`.
//! - Q8_0, 272 bytes: the eight `d` (f16); then for step `s` in 0..8, each
//!   row's quants `4s..4s+4`.
//! - Q4_0, 144 bytes: the eight `d`; then for `h` in 0..4, each row's bytes
//!   `qs[4h..4h+4]` (low nibbles: elements 4h+k; high: 16+4h+k).
//! - MXFP4, 144 bytes: as Q4_0, each `d` the bf16 of the block's scale.
//! - Q5_0, 176 bytes: as Q4_0, then each row's four bytes of fifth bits
//!   rearranged so that bit `i` of byte `k` is element 4i+k's.
//! - Q2_K, 800 bytes: the eight `d`, the eight `dmin`; the sixteen 4-bit
//!   scales, then the minima, each as bytes in eight 16-byte groups, row by
//!   row the pair (2g, 2g+1); then for `c` in 0..16, each row's bytes
//!   `qs[4c..4c + 4]`, whose 2-bit fields at shift `2j` are elements
//!   `128(c / 8) + 32j + 4(c % 8) + k`: one load serves four steps.
//! - Q3_K, 912 bytes: the eight `d`; the sixteen signed scales as Q6_K's;
//!   then for `t` in 0..8, each row's bytes `hmask[4t..4t + 4]`, whose bit
//!   `j` is the third bit of element `32j + 4t + k`; then the 2-bit fields
//!   as Q2_K's. A quant is `low + 4 · third` (0..8), the file's value
//!   plus 4. (Decoded to nibbles, as the first packed kernel took them,
//!   the block was 1168 bytes, and a Q3_K_M file decoded about a tenth
//!   slower at AVX-512 and a third slower at AVX2 on a 2-core Zen 4.)
//! - Q5_K, 1440 bytes: Q4_K's block, then for `s` in 0..8 each row's bytes
//!   `qh[4s..4s + 4]`, whose bit `j` is the fifth bit of sub-block `j`'s
//!   elements `4s + k`, the ones Q4_K's step `s` of that sub-block reads.
//! - IQ4_XS, 1168 bytes: the eight `d`; the eight signed sub-block scales as
//!   eight 16-byte groups, row by row scale `j` twice (a pair per 16-value
//!   half, as Q3_K's pairs of group scales); then for `c` in
//!   0..32, each row's bytes `qs[4c..4c + 4]` (low nibbles: elements
//!   `32(c / 4) + 4(c % 4) + k`, high: 16 further), indices into the table.
//!
//! ## Wide blocks
//!
//! A long prompt passes every call of groups once per eight activation
//! rows, and the formats whose quants take several instructions to unpack
//! (IQ4_XS's table, Q5_K's and Q6_K's high bits) pay for that unpacking on
//! every pass. For those, the level may first widen a call's blocks to
//! one unsigned byte per quant (`x86/packed_wide.rs`), so that each pass
//! is one load per step. A wide block, 2848 bytes per group:
//!
//! - for step `t` in 0..64, each row's quants `4t..4t + 4`, with whatever
//!   offset makes them unsigned (IQ4_XS's table values plus 128);
//! - sixteen 32-byte fields of scales, one 32-bit scale per row: the scale
//!   of each run of 16 or 32 elements (the format's sub-block);
//! - eight 32-byte fields of corrections, row by row two 16-bit words for
//!   the 16-element groups `2p` and `2p + 1`, to be multiplied with the
//!   activation's sums of those groups: the minima, or the quants' offset
//!   times their scale (which comes off the sum);
//! - the eight `d`, then the eight `dmin` (f16), as in the packed blocks.
//!
//! The integer sums come out the same and the float step is the packed
//! kernels', so the bits are theirs.

use super::blocks::{
    BlockIQ4XS, BlockMXFP4, BlockQ2K, BlockQ3K, BlockQ4_0, BlockQ4K, BlockQ5_0, BlockQ5K, BlockQ6K, BlockQ8_0, blocks,
    k_scales,
};
use super::low_k::q3_k_scales;
use super::lut4::{e8m0_half, iq4_xs_scale};
use super::pages::WeightBytes;
use super::{DType, scalar};
use crate::pool::ThreadPool;

/// Weight rows per packed group: one per 32-bit lane of a 256-bit vector.
pub(crate) const GROUP_ROWS: usize = 8;

/// The whole groups of eight rows of a matrix, interleaved.
pub struct PackedRows {
    dtype: DType,
    /// Bytes of one group: its rows' blocks, block by block.
    group_bytes: usize,
    n_groups: usize,
    data: WeightBytes,
}

impl PackedRows {
    /// The packed form of the `n_out` rows of `n_in` elements in `data`
    /// (the file's layout, as [`crate::matmul::QuantMatrix`] checked it)
    /// for kernels that take `per_call` groups at a time (1, or 2 for two
    /// groups side by side, see [`place_block`]), or `None` for a type
    /// without packed kernels or fewer than eight rows. The groups are
    /// packed on `pool`'s threads, each its own share.
    pub(crate) fn new(
        dtype: DType,
        data: &[u8],
        n_out: usize,
        n_in: usize,
        per_call: usize,
        pool: &ThreadPool,
    ) -> Option<PackedRows> {
        let block_bytes = packed_block_bytes(dtype)?;
        let pack_block: fn(&[&[u8]; GROUP_ROWS], usize, &mut [u8]) = match dtype {
            DType::Q4_K => |rows, b, out| pack_q4_k(rows.map(|row| &blocks::<BlockQ4K>(row)[b]), out),
            DType::Q6_K => |rows, b, out| pack_q6_k(rows.map(|row| &blocks::<BlockQ6K>(row)[b]), out),
            DType::Q8_0 => |rows, b, out| {
                pack_legacy(rows.map(|row| &blocks::<BlockQ8_0>(row)[b]).map(|x| (x.d, bytemuck::bytes_of(&x.qs))), out)
            },
            DType::Q4_0 => {
                |rows, b, out| pack_legacy(rows.map(|row| &blocks::<BlockQ4_0>(row)[b]).map(|x| (x.d, &x.qs[..])), out)
            }
            DType::Q5_0 => |rows, b, out| pack_q5_0(rows.map(|row| &blocks::<BlockQ5_0>(row)[b]), out),
            DType::Q5_K => |rows, b, out| pack_q5_k(rows.map(|row| &blocks::<BlockQ5K>(row)[b]), out),
            DType::Q2_K => |rows, b, out| pack_q2_k(rows.map(|row| &blocks::<BlockQ2K>(row)[b]), out),
            DType::Q3_K => |rows, b, out| pack_q3_k(rows.map(|row| &blocks::<BlockQ3K>(row)[b]), out),
            DType::IQ4_XS => |rows, b, out| pack_iq4_xs(rows.map(|row| &blocks::<BlockIQ4XS>(row)[b]), out),
            DType::MXFP4 => |rows, b, out| pack_mxfp4(rows.map(|row| &blocks::<BlockMXFP4>(row)[b]), out),
            _ => return None,
        };
        let header = packed_header_bytes(dtype)?;
        let n_groups = n_out / GROUP_ROWS;
        let row_bytes = dtype.row_bytes(n_in)?;
        if n_groups == 0 || data.len() != n_out.checked_mul(row_bytes)? || !(1..=2).contains(&per_call) {
            return None;
        }
        let n_blocks = n_in / dtype.block_elems();
        let group_bytes = n_blocks * block_bytes;
        if group_bytes == 0 {
            return None;
        }
        let unit_bytes = per_call * group_bytes;
        let mut packed = WeightBytes::zeroed(Self::len_for(dtype, n_out, n_in, per_call)?)?;
        pool.split_mut(packed.bytes_mut(), unit_bytes, |start, piece| {
            let first = start / unit_bytes;
            let mut single = vec![0u8; block_bytes];
            for (u, out) in piece.chunks_exact_mut(unit_bytes).enumerate() {
                for h in 0..per_call {
                    // A lone last group stands in for its missing partner.
                    let g = (per_call * (first + u) + h).min(n_groups - 1);
                    let at = |r: usize| (GROUP_ROWS * g + r) * row_bytes;
                    let rows: [&[u8]; GROUP_ROWS] = std::array::from_fn(|r| &data[at(r)..at(r) + row_bytes]);
                    for (b, out) in out.chunks_exact_mut(per_call * block_bytes).enumerate() {
                        pack_block(&rows, b, &mut single);
                        place_block(&single, header, per_call, h, out);
                    }
                }
            }
        });
        Some(PackedRows { dtype, group_bytes, n_groups, data: packed })
    }

    /// Bytes of the packed form of `n_out` rows of `n_in` elements for
    /// kernels taking `per_call` groups (a lone last group is stored as a
    /// whole call's); `None` for a type without one.
    pub(crate) fn len_for(dtype: DType, n_out: usize, n_in: usize, per_call: usize) -> Option<usize> {
        (n_out / GROUP_ROWS)
            .checked_next_multiple_of(per_call)?
            .checked_mul(n_in / dtype.block_elems())?
            .checked_mul(packed_block_bytes(dtype)?)
    }

    pub(crate) fn dtype(&self) -> DType {
        self.dtype
    }

    /// Rows `0..8 · n_groups` are packed; group `g`'s call starts at byte
    /// `g · group_bytes` (`g` a multiple of the kernels' groups per call).
    pub(crate) fn n_groups(&self) -> usize {
        self.n_groups
    }

    pub(crate) fn group_bytes(&self) -> usize {
        self.group_bytes
    }

    /// Bytes of one group widened (see "Wide blocks"): the same blocks.
    pub(crate) fn wide_group_bytes(&self) -> usize {
        packed_block_bytes(self.dtype).map_or(0, |block| self.group_bytes / block * WIDE_BLOCK)
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        self.data.bytes()
    }
}

/// Shape only, as for the matrix.
impl std::fmt::Debug for PackedRows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PackedRows({} groups of 8 {})", self.n_groups, self.dtype)
    }
}

/// Bytes of eight rows' block in the packed layout; `None` for types that
/// are not packed.
pub(crate) fn packed_block_bytes(dtype: DType) -> Option<usize> {
    match dtype {
        DType::Q4_K => Some(Q4_K_BLOCK),
        DType::Q6_K => Some(Q6_K_BLOCK),
        DType::Q8_0 => Some(Q8_0_BLOCK),
        DType::Q4_0 | DType::MXFP4 => Some(Q4_0_BLOCK),
        DType::Q5_0 => Some(Q5_0_BLOCK),
        DType::Q5_K => Some(Q5_K_BLOCK),
        DType::Q2_K => Some(Q2_K_BLOCK),
        DType::Q3_K => Some(Q3_K_BLOCK),
        DType::IQ4_XS => Some(IQ4_XS_BLOCK),
        _ => None,
    }
}

/// Bytes before a packed block's quants: its scales, as 16-byte fields.
fn packed_header_bytes(dtype: DType) -> Option<usize> {
    match dtype {
        DType::Q4_K | DType::Q5_K => Some(Q4_K_QS),
        DType::Q6_K => Some(Q6_K_QS),
        DType::Q8_0 | DType::Q4_0 | DType::Q5_0 | DType::MXFP4 => Some(LEGACY_QS),
        DType::Q2_K => Some(Q2_K_QS),
        DType::Q3_K => Some(Q3_K_HMASK),
        DType::IQ4_XS => Some(IQ4_XS_QS),
        _ => None,
    }
}

/// Group `h`'s packed block `single` into the call block `out` of
/// `per_call` groups, whose kernels read each 16 bytes of the header
/// (`header` bytes) or 32 of the quants from all the call's groups with one
/// load `per_call` times as wide: the call block holds those pieces of its
/// groups in turn, each field at `per_call` times its offset (one group:
/// the block as it is). The loads then walk memory in one stream; reading
/// two groups' blocks from two places took a 2-core Zen 4 to half its
/// memory bandwidth when decoding.
fn place_block(single: &[u8], header: usize, per_call: usize, h: usize, out: &mut [u8]) {
    for (start, end, piece) in [(0, header, 16), (header, single.len(), 32)] {
        for (k, bytes) in single[start..end].chunks_exact(piece).enumerate() {
            let at = per_call * (start + piece * k) + piece * h;
            out[at..at + piece].copy_from_slice(bytes);
        }
    }
}

pub(crate) const Q4_K_D: usize = 0;
pub(crate) const Q4_K_DMIN: usize = 16;
pub(crate) const Q4_K_SCALES: usize = 32;
pub(crate) const Q4_K_MINS: usize = 96;
pub(crate) const Q4_K_QS: usize = 160;
pub(crate) const Q4_K_BLOCK: usize = Q4_K_QS + 8 * 128;

/// Q5_K's block is Q4_K's with the fifth bits after it.
pub(crate) const Q5_K_QH: usize = Q4_K_BLOCK;
pub(crate) const Q5_K_BLOCK: usize = Q5_K_QH + 8 * 32;

pub(crate) const Q6_K_D: usize = 0;
pub(crate) const Q6_K_SCALES: usize = 16;
const Q6_K_QS: usize = 144;
pub(crate) const Q6_K_BLOCK: usize = Q6_K_QS + 8 * 128 + 8 * 64;

/// Low-bit chunk `t` of a packed Q6_K block. The first quarter of a block
/// reads `L(t)` with `H(t)`, the second `L(16 + t)`: stored in that order,
/// a block is read as one stream (from two regions, `L` then `H`, a
/// 1B-shaped Q6_K model decoded at 0.7× llama.cpp's speed on a 2-core
/// Zen 4 instead of 0.9×). The second quarter's chunks follow `H(15)`.
pub(crate) const fn q6_k_ql(t: usize) -> usize {
    if t < 16 { Q6_K_QS + 64 * t } else { q6_k_qh(15) + 32 * (t - 15) }
}

/// High-bit chunk `u` of a packed Q6_K block, right after `L(u)`.
pub(crate) const fn q6_k_qh(u: usize) -> usize {
    Q6_K_QS + 64 * u + 32
}

// The chunks fill a Q6_K block to its end, without overlap.
const _: () = assert!(q6_k_ql(15) + 32 == q6_k_qh(15) && q6_k_ql(31) + 32 == Q6_K_BLOCK);

/// The eight `d` of the legacy formats' packed blocks.
pub(crate) const LEGACY_D: usize = 0;
/// Their quants (Q8_0) or nibbles (Q4_0, Q5_0).
pub(crate) const LEGACY_QS: usize = 16;
pub(crate) const Q8_0_BLOCK: usize = LEGACY_QS + 8 * 32;
pub(crate) const Q4_0_BLOCK: usize = LEGACY_QS + 4 * 32;
pub(crate) const Q5_0_QH: usize = Q4_0_BLOCK;
pub(crate) const Q5_0_BLOCK: usize = Q5_0_QH + 32;

pub(crate) const Q2_K_D: usize = 0;
pub(crate) const Q2_K_DMIN: usize = 16;
pub(crate) const Q2_K_SCALES: usize = 32;
pub(crate) const Q2_K_MINS: usize = 160;
pub(crate) const Q2_K_QS: usize = 288;
pub(crate) const Q2_K_BLOCK: usize = Q2_K_QS + 16 * 32;

pub(crate) const Q3_K_D: usize = 0;
pub(crate) const Q3_K_SCALES: usize = 16;
pub(crate) const Q3_K_HMASK: usize = 144;
pub(crate) const Q3_K_QS: usize = Q3_K_HMASK + 8 * 32;
pub(crate) const Q3_K_BLOCK: usize = Q3_K_QS + 16 * 32;

pub(crate) const IQ4_XS_D: usize = 0;
pub(crate) const IQ4_XS_SCALES: usize = 16;
pub(crate) const IQ4_XS_QS: usize = 144;
pub(crate) const IQ4_XS_BLOCK: usize = IQ4_XS_QS + 32 * 32;

pub(crate) const WIDE_QS: usize = 0;
pub(crate) const WIDE_SCALES: usize = WIDE_QS + 64 * 32;
pub(crate) const WIDE_CORRECTIONS: usize = WIDE_SCALES + 16 * 32;
pub(crate) const WIDE_D: usize = WIDE_CORRECTIONS + 8 * 32;
pub(crate) const WIDE_DMIN: usize = WIDE_D + 16;
pub(crate) const WIDE_BLOCK: usize = WIDE_DMIN + 16;

// `place_block` cuts the headers into 16-byte pieces and the quants into
// 32-byte ones.
const fn pairs_whole(header: usize, block: usize) -> bool {
    header.is_multiple_of(16) && (block - header).is_multiple_of(32)
}
const _: () = assert!(
    pairs_whole(Q4_K_QS, Q4_K_BLOCK)
        && pairs_whole(Q6_K_QS, Q6_K_BLOCK)
        && pairs_whole(LEGACY_QS, Q8_0_BLOCK)
        && pairs_whole(LEGACY_QS, Q4_0_BLOCK)
        && pairs_whole(LEGACY_QS, Q5_0_BLOCK)
        && pairs_whole(Q4_K_QS, Q5_K_BLOCK)
        && pairs_whole(Q2_K_QS, Q2_K_BLOCK)
        && pairs_whole(Q3_K_HMASK, Q3_K_BLOCK)
        && pairs_whole(IQ4_XS_QS, IQ4_XS_BLOCK)
);

const _: () = assert!(
    Q4_K_BLOCK == 1184
        && Q6_K_BLOCK == 8 * size_of::<BlockQ6K>()
        && Q8_0_BLOCK == 8 * size_of::<BlockQ8_0>()
        && Q4_0_BLOCK == 8 * size_of::<BlockQ4_0>()
        && Q5_0_BLOCK == 8 * size_of::<BlockQ5_0>()
        && Q5_K_BLOCK == 1440
        && Q2_K_BLOCK == 800
        && Q3_K_BLOCK == 912
        && IQ4_XS_BLOCK == 1168
        && WIDE_BLOCK == 2848
        && WIDE_D.is_multiple_of(16)
);

/// Row `r`'s `bytes` into the interleaved field at `base`, `piece` bytes
/// at a time: piece `k` of the eight rows fills `8 · piece` bytes, row by
/// row (four bytes for quants, a 32-byte load per step; two for d and for
/// pairs of scales, 16-byte groups).
fn interleave(out: &mut [u8], base: usize, r: usize, piece: usize, bytes: &[u8]) {
    for (k, chunk) in bytes.chunks_exact(piece).enumerate() {
        let at = base + GROUP_ROWS * piece * k + piece * r;
        out[at..at + piece].copy_from_slice(chunk);
    }
}

fn pack_q4_k(rows: [&BlockQ4K; GROUP_ROWS], out: &mut [u8]) {
    for (r, x) in rows.iter().enumerate() {
        interleave(out, Q4_K_D, r, 2, &x.d);
        interleave(out, Q4_K_DMIN, r, 2, &x.dmin);
        let (sc, m) = k_scales(&x.scales);
        interleave(out, Q4_K_SCALES, r, 2, &sc);
        interleave(out, Q4_K_MINS, r, 2, &m);
        interleave(out, Q4_K_QS, r, 4, &x.qs);
    }
}

fn pack_q5_k(rows: [&BlockQ5K; GROUP_ROWS], out: &mut [u8]) {
    let q4_k = rows.map(|x| BlockQ4K { d: x.d, dmin: x.dmin, scales: x.scales, qs: x.qs });
    pack_q4_k(std::array::from_fn(|r| &q4_k[r]), out);
    for (r, x) in rows.iter().enumerate() {
        interleave(out, Q5_K_QH, r, 4, &x.qh);
    }
}

fn pack_q6_k(rows: [&BlockQ6K; GROUP_ROWS], out: &mut [u8]) {
    for (r, x) in rows.iter().enumerate() {
        interleave(out, Q6_K_D, r, 2, &x.d);
        interleave(out, Q6_K_SCALES, r, 2, &x.scales.map(|s| s as u8));
        let q = scalar::q6_k_quants(x);
        for t in 0..32 {
            for k in 0..4 {
                let (lo, hi) = (q[4 * t + k], q[128 + 4 * t + k]);
                out[q6_k_ql(t) + 4 * r + k] = (lo & 0xF) | (hi & 0xF) << 4;
            }
        }
        for u in 0..16 {
            for k in 0..4 {
                let high = |e: usize| q[e] >> 4;
                let bits = high(4 * u + k)
                    | high(64 + 4 * u + k) << 2
                    | high(128 + 4 * u + k) << 4
                    | high(192 + 4 * u + k) << 6;
                out[q6_k_qh(u) + 4 * r + k] = bits;
            }
        }
    }
}

/// The scale and quant bytes of Q8_0 rows, or the scale and nibbles of
/// Q4_0 and Q5_0 rows (`(d, bytes)` per row), four bytes of a row at a time.
fn pack_legacy(rows: [([u8; 2], &[u8]); GROUP_ROWS], out: &mut [u8]) {
    for (r, (d, bytes)) in rows.iter().enumerate() {
        interleave(out, LEGACY_D, r, 2, d);
        interleave(out, LEGACY_QS, r, 4, bytes);
    }
}

/// MXFP4 rows as Q4_0's, each block's E8M0 scale (its value halved, see
/// `lut4::e8m0_half`) as the bf16 of that power of two in place of `d`.
fn pack_mxfp4(rows: [&BlockMXFP4; GROUP_ROWS], out: &mut [u8]) {
    pack_legacy(rows.map(|x| (half::bf16::from_f32(e8m0_half(x.e)).to_le_bytes(), &x.qs[..])), out);
}

fn pack_q5_0(rows: [&BlockQ5_0; GROUP_ROWS], out: &mut [u8]) {
    pack_legacy(rows.map(|x| (x.d, &x.qs[..])), out);
    for (r, x) in rows.iter().enumerate() {
        let qh = u32::from_le_bytes(x.qh);
        for k in 0..4 {
            out[Q5_0_QH + 4 * r + k] = (0..8).fold(0u8, |byte, i| byte | (((qh >> (4 * i + k)) & 1) as u8) << i);
        }
    }
}

fn pack_q2_k(rows: [&BlockQ2K; GROUP_ROWS], out: &mut [u8]) {
    for (r, x) in rows.iter().enumerate() {
        interleave(out, Q2_K_D, r, 2, &x.d);
        interleave(out, Q2_K_DMIN, r, 2, &x.dmin);
        interleave(out, Q2_K_SCALES, r, 2, &x.scales.map(|s| s & 0xF));
        interleave(out, Q2_K_MINS, r, 2, &x.scales.map(|s| s >> 4));
        interleave(out, Q2_K_QS, r, 4, &x.qs);
    }
}

fn pack_q3_k(rows: [&BlockQ3K; GROUP_ROWS], out: &mut [u8]) {
    for (r, x) in rows.iter().enumerate() {
        interleave(out, Q3_K_D, r, 2, &x.d);
        interleave(out, Q3_K_SCALES, r, 2, &q3_k_scales(&x.scales).map(|s| s as u8));
        interleave(out, Q3_K_HMASK, r, 4, &x.hmask);
        interleave(out, Q3_K_QS, r, 4, &x.qs);
    }
}

fn pack_iq4_xs(rows: [&BlockIQ4XS; GROUP_ROWS], out: &mut [u8]) {
    for (r, x) in rows.iter().enumerate() {
        interleave(out, IQ4_XS_D, r, 2, &x.d);
        // Each scale is 6 bits minus 32: it fits a signed byte.
        let scales: [u8; 16] = std::array::from_fn(|k| iq4_xs_scale(x, k / 2) as i8 as u8);
        interleave(out, IQ4_XS_SCALES, r, 2, &scales);
        interleave(out, IQ4_XS_QS, r, 4, &x.qs);
    }
}
