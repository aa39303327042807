//! Byte layouts of the GGML quantized blocks and of the activation formats
//! they are dotted with.
//!
//! Every field is a byte array, so the structs have alignment 1 and no
//! padding: a row from a memory-mapped file casts to a slice of blocks
//! whatever its address, and multi-byte fields are decoded explicitly as
//! little-endian.

use bytemuck::{Pod, Zeroable};

/// Elements per block of the 32-element formats.
pub(crate) const QK: usize = 32;
/// Elements per block of the K-quant formats.
pub(crate) const QK_K: usize = 256;

#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub(crate) struct BlockQ4_0 {
    pub d: [u8; 2],
    pub qs: [u8; 16],
}

#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub(crate) struct BlockQ4_1 {
    pub d: [u8; 2],
    pub m: [u8; 2],
    pub qs: [u8; 16],
}

#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub(crate) struct BlockQ5_0 {
    pub d: [u8; 2],
    pub qh: [u8; 4],
    pub qs: [u8; 16],
}

#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub(crate) struct BlockQ5_1 {
    pub d: [u8; 2],
    pub m: [u8; 2],
    pub qh: [u8; 4],
    pub qs: [u8; 16],
}

/// GGML's Q8_0: a weight format, and how a Q8_0 KV cache holds its rows.
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub(crate) struct BlockQ8_0 {
    pub d: [u8; 2],
    pub qs: [i8; 32],
}

/// Activation partner of Q4_0/Q5_0/Q8_0: a Q8_0 block with the exact sum of
/// its quants (little-endian i16) after `d`. The packed kernels multiply
/// unsigned weight bytes (the quants plus a bias) and take the bias times
/// this sum back off.
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub(crate) struct BlockQ8_0S {
    pub d: [u8; 2],
    pub sum: [u8; 2],
    pub qs: [i8; 32],
}

/// Activation partner of Q4_1/Q5_1, laid out as GGML's: `s` is the f16 of
/// `d · Σq` computed with the f32 scale before `d` itself is rounded, which
/// the weight block's offset `m` multiplies. (Rounding `d` first moves
/// outputs by ~1e-4 on real models, enough to change log-probabilities
/// compared with llama.cpp.) Like GGML's, `s` overflows to infinity once a
/// block's largest activation passes about 2050.
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub(crate) struct BlockQ8_1 {
    pub d: [u8; 2],
    pub s: [u8; 2],
    pub qs: [i8; 32],
}

#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub(crate) struct BlockQ4K {
    pub d: [u8; 2],
    pub dmin: [u8; 2],
    pub scales: [u8; 12],
    pub qs: [u8; 128],
}

#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub(crate) struct BlockQ5K {
    pub d: [u8; 2],
    pub dmin: [u8; 2],
    pub scales: [u8; 12],
    pub qh: [u8; 32],
    pub qs: [u8; 128],
}

#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub(crate) struct BlockQ6K {
    pub ql: [u8; 128],
    pub qh: [u8; 64],
    pub scales: [i8; 16],
    pub d: [u8; 2],
}

/// Activation partner of the K-quants. `bsums` holds sixteen little-endian
/// i16 sums of 16 consecutive quants, which the weight minima (Q4_K, Q5_K)
/// and Q6_K's offset of 32 are multiplied with instead of every element.
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub(crate) struct BlockQ8K {
    pub d: [u8; 4],
    pub qs: [i8; 256],
    pub bsums: [u8; 32],
}

const _: () = {
    use std::mem::size_of;
    assert!(size_of::<BlockQ4_0>() == 18);
    assert!(size_of::<BlockQ4_1>() == 20);
    assert!(size_of::<BlockQ5_0>() == 22);
    assert!(size_of::<BlockQ5_1>() == 24);
    assert!(size_of::<BlockQ8_0>() == 34);
    assert!(size_of::<BlockQ8_0S>() == 36);
    assert!(size_of::<BlockQ8_1>() == 36);
    assert!(size_of::<BlockQ4K>() == 144);
    assert!(size_of::<BlockQ5K>() == 176);
    assert!(size_of::<BlockQ6K>() == 210);
    assert!(size_of::<BlockQ8K>() == 292);
};

/// The whole blocks at the start of `bytes`. Kernels are handed rows whose
/// lengths were validated, so a trailing partial block never occurs there;
/// truncating instead of panicking keeps the kernels total functions.
#[inline(always)]
pub(crate) fn blocks<B: Pod>(bytes: &[u8]) -> &[B] {
    let whole = bytes.len() / size_of::<B>() * size_of::<B>();
    bytemuck::cast_slice(&bytes[..whole])
}

#[inline(always)]
pub(crate) fn blocks_mut<B: Pod>(bytes: &mut [u8]) -> &mut [B] {
    let whole = bytes.len() / size_of::<B>() * size_of::<B>();
    bytemuck::cast_slice_mut(&mut bytes[..whole])
}

/// The two packed 6-bit (scale, min) arrays of a Q4_K/Q5_K block, one entry
/// per 32-element sub-block. Working on three little-endian words decodes
/// four sub-blocks per operation.
#[inline(always)]
pub(crate) fn k_scales(s: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    let word = |i: usize| u32::from_le_bytes([s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]]);
    let (s0, s1, s2) = (word(0), word(1), word(2));
    let low6 = 0x3f3f_3f3f;
    let top2 = |w: u32| ((w >> 6) & 0x0303_0303) << 4;
    let sc_hi = (s2 & 0x0f0f_0f0f) | top2(s0);
    let m_hi = ((s2 >> 4) & 0x0f0f_0f0f) | top2(s1);
    let join = |lo: u32, hi: u32| {
        let mut out = [0u8; 8];
        out[..4].copy_from_slice(&lo.to_le_bytes());
        out[4..].copy_from_slice(&hi.to_le_bytes());
        out
    };
    (join(s0 & low6, sc_hi), join(s1 & low6, m_hi))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The packing rule spelled out per sub-block, as the format describes it.
    fn k_scales_by_rule(s: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
        let (mut sc, mut m) = ([0u8; 8], [0u8; 8]);
        for j in 0..8 {
            if j < 4 {
                sc[j] = s[j] & 63;
                m[j] = s[j + 4] & 63;
            } else {
                sc[j] = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
                m[j] = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
            }
        }
        (sc, m)
    }

    #[test]
    fn k_scales_match_the_packing_rule() {
        let mut state = 0x1234_5678_9abc_def0u64;
        for _ in 0..1000 {
            let mut s = [0u8; 12];
            for b in &mut s {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                *b = (state >> 56) as u8;
            }
            assert_eq!(k_scales(&s), k_scales_by_rule(&s));
        }
        assert_eq!(k_scales(&[0xFF; 12]), ([63; 8], [63; 8]));
    }

    #[test]
    fn partial_trailing_blocks_are_dropped() {
        let bytes = [0u8; 18 * 2 + 5];
        assert_eq!(blocks::<BlockQ4_0>(&bytes).len(), 2);
    }
}

/// GGML's `block_q2_K`: sixteen scale bytes (low nibble the scale, high
/// nibble the minimum of a 16-element group), the 2-bit quants, then `d`
/// and `dmin`.
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub(crate) struct BlockQ2K {
    pub scales: [u8; 16],
    pub qs: [u8; 64],
    pub d: [u8; 2],
    pub dmin: [u8; 2],
}

/// GGML's `block_q3_K`: the high bits, the low 2-bit fields, sixteen 6-bit
/// scales packed into 12 bytes (`low_k::q3_k_scales`), then `d`.
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub(crate) struct BlockQ3K {
    pub hmask: [u8; 32],
    pub qs: [u8; 64],
    pub scales: [u8; 12],
    pub d: [u8; 2],
}

const _: () = {
    assert!(size_of::<BlockQ2K>() == 84);
    assert!(size_of::<BlockQ3K>() == 110);
};

/// IQ4_NL: f16 `d`, then 32 table indices as nibbles (low nibbles are
/// elements 0..16, high nibbles 16..32).
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub(crate) struct BlockIQ4NL {
    pub d: [u8; 2],
    pub qs: [u8; 16],
}

/// IQ4_XS: f16 `d`, the top two bits of the eight sub-block scales
/// (little-endian u16, two bits per sub-block), their low four bits (two
/// per byte, low nibble first), then eight sub-blocks of 16 nibble bytes
/// laid out as IQ4_NL's.
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub(crate) struct BlockIQ4XS {
    pub d: [u8; 2],
    pub scales_h: [u8; 2],
    pub scales_l: [u8; 4],
    pub qs: [u8; 128],
}

/// MXFP4: an E8M0 exponent byte, then 32 table indices as IQ4_NL's. The
/// block is 17 bytes, so rows and blocks have no alignment.
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub(crate) struct BlockMXFP4 {
    pub e: u8,
    pub qs: [u8; 16],
}

const _: () = {
    use std::mem::size_of;
    assert!(size_of::<BlockIQ4NL>() == 18);
    assert!(size_of::<BlockIQ4XS>() == 136);
    assert!(size_of::<BlockMXFP4>() == 17);
};

/// TQ2_0 (ternary in 2 bits): 2-bit fields laid out as Q2_K's quants
/// (`low_k::two_bit_quants`), each field q standing for q − 1, then `d`.
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub(crate) struct BlockTQ2_0 {
    pub qs: [u8; 64],
    pub d: [u8; 2],
}

const _: () = {
    assert!(size_of::<BlockTQ2_0>() == 66);
};

/// TQ1_0 (ternary in base 3): five trits per byte of `qs`, four per byte
/// of `qh` (`ternary::tq1_0_quants` gives the element order), then `d`.
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub(crate) struct BlockTQ1_0 {
    pub qs: [u8; 48],
    pub qh: [u8; 4],
    pub d: [u8; 2],
}

const _: () = {
    assert!(size_of::<BlockTQ1_0>() == 54);
};

/// IQ3_XXS: f16 `d`, then 64 grid indices and eight little-endian words of
/// sub-block scale and signs (`iq3::iq3_xxs_sub_block`).
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub(crate) struct BlockIQ3XXS {
    pub d: [u8; 2],
    pub qs: [u8; 96],
}

/// IQ3_S: f16 `d`, the low eight bits of 64 grid indices, their ninth bits,
/// one sign bit per weight, eight 4-bit sub-block scales
/// (`iq3::iq3_s_sub_block`).
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub(crate) struct BlockIQ3S {
    pub d: [u8; 2],
    pub qs: [u8; 64],
    pub qh: [u8; 8],
    pub signs: [u8; 32],
    pub scales: [u8; 4],
}

const _: () = {
    assert!(size_of::<BlockIQ3XXS>() == 98);
    assert!(size_of::<BlockIQ3S>() == 110);
};

/// IQ2_XXS: f16 `d`, then eight sub-blocks of 32 elements in 8 bytes each:
/// four `iq2xxs` grid indices (one per group of 8), then a little-endian
/// u32 whose bits 7l..7l+7 select group l's signs (`iq_signs`) and whose
/// top four bits are the sub-block's scale.
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub(crate) struct BlockIQ2XXS {
    pub d: [u8; 2],
    pub qs: [u8; 64],
}

const _: () = {
    assert!(size_of::<BlockIQ2XXS>() == 66);
};

/// IQ2_XS: f16 `d`, then per group of 8 elements a little-endian u16 (low
/// nine bits an `iq2xs` grid index, high seven the sign field), then one
/// byte per sub-block of 32: low nibble the scale of elements 0..16, high
/// nibble that of 16..32.
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub(crate) struct BlockIQ2XS {
    pub d: [u8; 2],
    pub qs: [u8; 64],
    pub scales: [u8; 8],
}

/// IQ2_S: f16 `d`, the low eight bits of the 32 `iq2s` grid indices, the
/// 32 sign bytes (bit j negates element j of the group), per sub-block a
/// byte of the indices' top two bits (bits 2l, 2l+1 for group l), then the
/// scales as IQ2_XS's.
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub(crate) struct BlockIQ2S {
    pub d: [u8; 2],
    pub qs: [u8; 32],
    pub signs: [u8; 32],
    pub qh: [u8; 8],
    pub scales: [u8; 8],
}

/// IQ1_S: f16 `d`, the low eight bits of the 32 `iq1s` grid indices, then
/// per sub-block a little-endian u16: bits 3l..3l+3 the top of group l's
/// index, bits 12..14 the scale, bit 15 the sign of the ±1/8 offset.
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub(crate) struct BlockIQ1S {
    pub d: [u8; 2],
    pub qs: [u8; 32],
    pub qh: [u8; 16],
}

/// IQ1_M: the low eight bits of the 32 `iq1s` grid indices, per pair of
/// groups a byte (per group a nibble: bits 0..2 the index's top, bit 3 the
/// offset's sign), then four little-endian u16 holding two 3-bit scales per
/// sub-block (bits 6·(ib % 2).. of word ib / 2) and, in their top nibbles,
/// the f16 `d`.
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub(crate) struct BlockIQ1M {
    pub qs: [u8; 32],
    pub qh: [u8; 16],
    pub scales: [u8; 8],
}

const _: () = {
    assert!(size_of::<BlockIQ2XS>() == 74);
    assert!(size_of::<BlockIQ2S>() == 82);
    assert!(size_of::<BlockIQ1S>() == 50);
    assert!(size_of::<BlockIQ1M>() == 56);
};
