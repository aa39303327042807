//! How a KV cache holds keys and values: f16 values (the default, as
//! llama.cpp's), or GGML's Q8_0 blocks, 32 int8 quants and one f16 scale
//! `d` in 34 bytes instead of 64 (llama.cpp's `-ctk q8_0` / `-ctv q8_0`).
//!
//! Attention runs the same steps whatever the storage: each chunk of 16
//! values is widened to f32 and goes into the arithmetic of the f16 path.
//! A Q8_0 value is `d · q` in f32, which is exact (the scale has at most 11
//! significant bits and the quant 8), so it is the value the scalar
//! dequantization gives, on every SIMD level, and a Q8_0 cache holding
//! values that f16 holds too attends to the bits of the f16 cache.

use std::fmt;
use std::str::FromStr;

use half::f16;

use super::row::f32_to_f16_row;
use super::simd::{LANES, Simd, padded};
use crate::quant::blocks::{BlockQ8_0, QK, blocks};
use crate::quant::{ActFormat, DType, Kernels};

// A 16-lane chunk of a head is one half of a Q8_0 block.
const _: () = assert!(QK == 2 * LANES);

/// How a KV cache holds its keys or its values, by llama.cpp's names.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum KvType {
    /// Rounded to f16: two bytes a value.
    #[default]
    F16,
    /// Q8_0 blocks: 34 bytes per 32 values, each value within about half a
    /// step (the block's largest magnitude / 254) of what was stored.
    Q8_0,
}

impl KvType {
    pub const ALL: [KvType; 2] = [KvType::F16, KvType::Q8_0];

    /// llama.cpp's name: `f16` or `q8_0`.
    pub fn name(self) -> &'static str {
        match self {
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
        }
    }

    /// Values per block: a row, and every head in it, is whole blocks.
    pub fn block_values(self) -> usize {
        self.dtype().block_elems()
    }

    /// Bytes of `n` values; `None` when `n` is not a whole number of blocks
    /// or the size overflows.
    pub fn row_bytes(self, n: usize) -> Option<usize> {
        self.dtype().row_bytes(n)
    }

    /// The GGML type of the same layout.
    pub fn dtype(self) -> DType {
        match self {
            KvType::F16 => DType::F16,
            KvType::Q8_0 => DType::Q8_0,
        }
    }
}

impl fmt::Display for KvType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for KvType {
    type Err = String;

    /// llama.cpp's names of the types sluice stores; its others (`f32`,
    /// `bf16`, `q4_0`, …) are refused with the ones there are.
    fn from_str(name: &str) -> Result<Self, String> {
        KvType::ALL.into_iter().find(|kv_type| kv_type.name() == name).ok_or_else(|| {
            let names: Vec<&str> = KvType::ALL.iter().map(|kv_type| kv_type.name()).collect();
            format!("the KV cache holds {}, not {name:?}", names.join(" or "))
        })
    }
}

/// One layer's keys or values as attention reads them, a run of rows of
/// values.
#[derive(Clone, Copy, Debug)]
pub enum KvRows<'a> {
    F16(&'a [f16]),
    /// Q8_0 blocks, 34 bytes each as GGML lays them out; a partial block at
    /// the end is never read.
    Q8_0(&'a [u8]),
}

impl KvRows<'_> {
    pub fn kv_type(&self) -> KvType {
        match self {
            KvRows::F16(_) => KvType::F16,
            KvRows::Q8_0(_) => KvType::Q8_0,
        }
    }

    /// How many values the rows hold.
    pub fn values(&self) -> usize {
        match self {
            KvRows::F16(values) => values.len(),
            KvRows::Q8_0(bytes) => q8_0_blocks(bytes).len() * QK,
        }
    }
}

/// What a K or V arena is made of: f16 values or Q8_0 blocks. Attention is
/// generic over it, so each pair of types gets its own compiled kernel and
/// the f16 one is the kernel it always was.
pub(crate) trait KvElement: Copy {
    /// Values per element.
    const VALUES: usize;

    /// Chunk `c` (values `16c..16c + 16`) of a head stored in `head`,
    /// zero-padded past its end.
    fn load_chunk<S: Simd>(s: S, head: &[Self], c: usize) -> S::V;
}

/// Q8_0 rows' blocks (a partial block at the end left out).
#[inline(always)]
pub(crate) fn q8_0_blocks(bytes: &[u8]) -> &[BlockQ8_0] {
    blocks(bytes)
}

/// The elements of `arena` holding its `len` values from value `at`. Both
/// are whole elements: attention checks that heads are whole blocks.
#[inline(always)]
pub(crate) fn head<E: KvElement>(arena: &[E], at: usize, len: usize) -> &[E] {
    &arena[at / E::VALUES..(at + len) / E::VALUES]
}

impl KvElement for f16 {
    const VALUES: usize = 1;

    #[inline(always)]
    fn load_chunk<S: Simd>(s: S, head: &[f16], c: usize) -> S::V {
        let (chunks, tail) = head.as_chunks::<LANES>();
        match chunks.get(c) {
            Some(chunk) => s.load_f16(chunk),
            None if c == chunks.len() && !tail.is_empty() => s.load_f16(&padded(tail, f16::ZERO)),
            None => s.splat(0.0),
        }
    }
}

impl KvElement for BlockQ8_0 {
    const VALUES: usize = QK;

    /// `d · q` for half of block `c / 2`: both widen exactly, and their
    /// product is exact in f32.
    #[inline(always)]
    fn load_chunk<S: Simd>(s: S, head: &[BlockQ8_0], c: usize) -> S::V {
        match head.get(c / 2) {
            Some(block) => {
                let d = s.load_f16(&[f16::from_le_bytes(block.d); LANES]);
                s.mul(s.load_i8(&block.qs.as_chunks::<LANES>().0[c % 2]), d)
            }
            None => s.splat(0.0),
        }
    }
}

/// An owned arena of keys or values: a layer of a CPU KV store.
pub(crate) enum KvArena {
    F16(Vec<f16>),
    Q8_0(Vec<BlockQ8_0>),
}

impl KvArena {
    /// `values` zeros, a whole number of blocks of `kv_type` (callers check
    /// with [`KvType::row_bytes`]).
    pub(crate) fn zeros(kv_type: KvType, values: usize) -> Self {
        match kv_type {
            KvType::F16 => KvArena::F16(vec![f16::ZERO; values]),
            KvType::Q8_0 => KvArena::Q8_0(vec![bytemuck::Zeroable::zeroed(); values / QK]),
        }
    }

    /// `values` NaNs, so that a test reading a value never written sees it.
    #[cfg(test)]
    pub(crate) fn nan(kv_type: KvType, values: usize) -> Self {
        match kv_type {
            KvType::F16 => KvArena::F16(vec![f16::NAN; values]),
            KvType::Q8_0 => KvArena::Q8_0(vec![BlockQ8_0 { d: f16::NAN.to_le_bytes(), qs: [1; QK] }; values / QK]),
        }
    }

    pub(crate) fn rows(&self) -> KvRows<'_> {
        match self {
            KvArena::F16(values) => KvRows::F16(values),
            KvArena::Q8_0(blocks) => KvRows::Q8_0(bytemuck::cast_slice(blocks)),
        }
    }

    /// Stores `src` from value `at`, both whole blocks: rounded to f16, or
    /// quantized as GGML's CPU backend quantizes a KV row (the crate's Q8_0
    /// activation quantization: `d = amax / 127`, quants `x · 127 / amax`
    /// rounded to nearest, ties to even).
    pub(crate) fn write(&mut self, at: usize, src: &[f32]) {
        match self {
            KvArena::F16(values) => f32_to_f16_row(src, &mut values[at..at + src.len()]),
            KvArena::Q8_0(blocks) => {
                let dst = bytemuck::cast_slice_mut(&mut blocks[at / QK..(at + src.len()) / QK]);
                Kernels::current().quantize(ActFormat::Q8_0, src, dst);
            }
        }
    }

    /// The bytes as stored: what copying a block, or saving one, copies.
    pub(crate) fn bytes(&self) -> &[u8] {
        match self {
            KvArena::F16(values) => bytemuck::cast_slice(values),
            KvArena::Q8_0(blocks) => bytemuck::cast_slice(blocks),
        }
    }

    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            KvArena::F16(values) => bytemuck::cast_slice_mut(values),
            KvArena::Q8_0(blocks) => bytemuck::cast_slice_mut(blocks),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::same_on_every_level;
    use crate::ops::noise;
    use crate::ops::simd::dispatch;
    use crate::quant::dequantize_row;

    /// Every chunk of a head, as attention loads it.
    fn chunks<E: KvElement>(head: &[E], n: usize) -> Vec<f32> {
        let mut out = vec![0.0; n.div_ceil(LANES) * LANES];
        dispatch!(s => {
            for (c, chunk) in out.as_chunks_mut::<LANES>().0.iter_mut().enumerate() {
                s.store(E::load_chunk(s, head, c), chunk);
            }
        });
        out.truncate(n);
        out
    }

    #[test]
    fn q8_0_chunks_are_the_scalar_dequantization_on_every_level() {
        let mut x = noise(4 * QK, 3, 2.0);
        // A block of zeros, one holding a single value, and huge and
        // subnormal scales.
        x[QK..2 * QK].fill(0.0);
        x[2 * QK + 5] = -1e-3;
        x[3 * QK] = 60_000.0 * 127.0;
        let mut arena = KvArena::zeros(KvType::Q8_0, x.len());
        arena.write(0, &x);
        let KvArena::Q8_0(blocks) = &arena else { unreachable!("a Q8_0 arena") };
        let got = same_on_every_level(|| chunks(blocks, x.len()));
        let mut want = vec![0.0; x.len()];
        dequantize_row(DType::Q8_0, arena.bytes(), &mut want).expect("whole blocks");
        assert_eq!(
            got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            want.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        // Within half a step of what was stored, plus what rounding the
        // scale to f16 moves the largest quant.
        for (block, (got, x)) in got.chunks(QK).zip(x.chunks(QK)).enumerate() {
            let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let d = amax / 127.0;
            let bound = amax / 254.0 * 1.0001 + 127.0 * (f16::from_f32(d).to_f32() - d).abs();
            for (g, v) in got.iter().zip(x) {
                assert!((g - v).abs() <= bound, "block {block}: {g} for {v}");
            }
        }
    }

    #[test]
    fn f16_chunks_pad_a_short_head_with_zeros() {
        let x = noise(20, 4, 1.0);
        let mut arena = KvArena::zeros(KvType::F16, 20);
        arena.write(0, &x);
        let KvArena::F16(values) = &arena else { unreachable!("an f16 arena") };
        let got = same_on_every_level(|| chunks(values, 32));
        let rounded: Vec<f32> = x.iter().map(|&v| f16::from_f32(v).to_f32()).collect();
        assert_eq!(got[..20], rounded[..]);
        assert!(got[20..].iter().all(|&v| v == 0.0));
    }

    #[test]
    fn sizes_and_names_follow_llama_cpp() {
        assert_eq!(KvType::F16.row_bytes(64), Some(128));
        assert_eq!(KvType::Q8_0.row_bytes(64), Some(68));
        assert_eq!(KvType::Q8_0.row_bytes(48), None, "not whole blocks");
        assert_eq!(KvType::Q8_0.block_values(), 32);
        for kv_type in KvType::ALL {
            assert_eq!(kv_type.name().parse(), Ok(kv_type));
            let arena = KvArena::zeros(kv_type, 96);
            assert_eq!(Some(arena.bytes().len()), kv_type.row_bytes(96));
            assert_eq!((arena.rows().kv_type(), arena.rows().values()), (kv_type, 96));
        }
        for other in ["f32", "bf16", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1", "F16", ""] {
            let error = other.parse::<KvType>().expect_err(other);
            assert_eq!(error, format!("the KV cache holds f16 or q8_0, not {other:?}"));
        }
    }
}
