//! The types of the kernels' entry points and the tables a level fills
//! with them ([`Dot`], [`PackedDot`]): a leaf that `mod.rs` (for the
//! scalar level) and `x86/` fill.
//!
//! Kernel entry points may require CPU features; they are unsafe to call
//! unless the level they belong to is supported.

pub(super) type DotFn = unsafe fn(&[u8], &[u8]) -> f32;
pub(super) type Dot4Fn = unsafe fn([&[u8]; 4], &[u8]) -> [f32; 4];
pub(super) type Dot4x2Fn = unsafe fn([&[u8]; 4], [&[u8]; 2]) -> [[f32; 4]; 2];
pub(super) type Dot4x4Fn = unsafe fn([&[u8]; 4], [&[u8]; 4]) -> [[f32; 4]; 4];
pub(super) type Dot4x8Fn = unsafe fn([&[u8]; 4], [&[u8]; 8]) -> [[f32; 4]; 8];
pub(super) type QuantizeFn = unsafe fn(&[f32], &mut [u8]);
/// Packed groups of eight weight rows (as many as [`PackedDot::groups`])
/// against `A` activation rows: eight values per group, per activation row.
pub(super) type PackedFn<const A: usize> = unsafe fn(&[u8], [&[u8]; A]) -> [[f32; 16]; A];

/// The dot kernels of one dtype at a supported level, resolved once per
/// matmul. [`Dot::call4`] gives, lane for lane, what [`Dot::call`] gives
/// for each row.
#[derive(Clone, Copy)]
pub(crate) struct Dot {
    pub(super) one: DotFn,
    pub(super) four: Option<Dot4Fn>,
    pub(super) four_by_two: Option<Dot4x2Fn>,
    pub(super) four_by_four: Option<Dot4x4Fn>,
    pub(super) four_by_eight: Option<Dot4x8Fn>,
    pub(super) packed: Option<PackedDot>,
}

/// The kernels over [`super::PackedRows`] groups, by activation rows per call.
#[derive(Clone, Copy)]
pub(crate) struct PackedDot {
    /// Groups per call, side by side in the level's vectors (1 or 2).
    pub(crate) groups: usize,
    pub(crate) one: PackedFn<1>,
    pub(crate) four: PackedFn<4>,
    /// Only where the registers hold eight rows' sums (AVX-512's 32);
    /// AVX2's 16 spill them.
    pub(crate) eight: Option<PackedFn<8>>,
    /// Where a call's blocks can be widened to a byte per quant for
    /// long prompts (see `super::packed`, "Wide blocks").
    pub(crate) wide: Option<WideDot>,
}

/// Widens a call's packed blocks (the first argument) into wide ones.
pub(super) type WidenFn = unsafe fn(&[u8], &mut [u8]);

/// A format's widening and the kernels over wide call blocks, which give
/// the packed kernels' bits.
#[derive(Clone, Copy)]
pub(crate) struct WideDot {
    pub(crate) widen: WidenFn,
    pub(crate) one: PackedFn<1>,
    pub(crate) four: PackedFn<4>,
    pub(crate) eight: PackedFn<8>,
}

impl Dot {
    #[inline]
    pub(crate) fn call(self, weight_row: &[u8], act_row: &[u8]) -> f32 {
        // SAFETY: `Dot` is only built by `Kernels::dot`, for a supported level.
        unsafe { (self.one)(weight_row, act_row) }
    }

    /// Whether this level multiplies the dtype's weights packed
    /// ([`super::PackedRows`]).
    pub(crate) fn packs(self) -> bool {
        self.packed.is_some()
    }

    /// Packed groups per call: [`Dot::call_packed`] takes up to this
    /// many at once (1 where the level has no packed kernels).
    pub(crate) fn packed_groups(self) -> usize {
        self.packed.map_or(1, |packed| packed.groups)
    }

    /// The rows of the packed groups in `groups` (at most
    /// [`Dot::packed_groups`] of them, consecutive) against each of `acts`,
    /// the same bits as [`Dot::call`] on each original row; `store(i,
    /// values)` takes activation row `i`'s outputs, eight per group. Does
    /// nothing at a level without packed kernels (the caller packs only
    /// where [`Dot::packs`]).
    #[inline]
    pub(crate) fn call_packed(self, groups: &[u8], n_groups: usize, acts: &[&[u8]], store: impl FnMut(usize, &[f32])) {
        let Some(packed) = self.packed else { return };
        call_groups(packed.groups, (packed.one, packed.four, packed.eight), groups, n_groups, acts, store);
    }

    /// Whether this level widens the dtype's packed blocks for long
    /// prompts ([`Dot::widen`]).
    pub(crate) fn widens(self) -> bool {
        self.packed.is_some_and(|packed| packed.wide.is_some())
    }

    /// The packed call blocks in `call` (one call's groups, all their
    /// blocks) widened into `wide`, `super::packed::WIDE_BLOCK` bytes per
    /// group and block. Does nothing where the level does not widen.
    pub(crate) fn widen(self, call: &[u8], wide: &mut [u8]) {
        let Some(w) = self.packed.and_then(|packed| packed.wide) else { return };
        // SAFETY: as in `call`; the widening checks the lengths.
        unsafe { (w.widen)(call, wide) }
    }

    /// [`Dot::call_packed`] on one call widened by [`Dot::widen`]: the
    /// same bits.
    #[inline]
    pub(crate) fn call_wide(self, wide: &[u8], n_groups: usize, acts: &[&[u8]], store: impl FnMut(usize, &[f32])) {
        let Some(packed) = self.packed else { return };
        let Some(w) = packed.wide else { return };
        call_groups(packed.groups, (w.one, w.four, Some(w.eight)), wide, n_groups, acts, store);
    }

    /// Four weight rows against one activation row: side by side,
    /// sharing the activation loads and the reductions, or one after
    /// another where that streams faster (Q8_0, the K-quants).
    #[inline]
    pub(crate) fn call4(self, weight_rows: [&[u8]; 4], act_row: &[u8]) -> [f32; 4] {
        match self.four {
            // SAFETY: as in `call`.
            Some(four) => unsafe { four(weight_rows, act_row) },
            None => weight_rows.map(|w| self.call(w, act_row)),
        }
    }

    /// Four weight rows against two activation rows, decoding each weight
    /// block once; the same bits as two `call4`s.
    #[inline]
    pub(crate) fn call4x2(self, weight_rows: [&[u8]; 4], act_rows: [&[u8]; 2]) -> [[f32; 4]; 2] {
        match self.four_by_two {
            // SAFETY: as in `call`.
            Some(four_by_two) => unsafe { four_by_two(weight_rows, act_rows) },
            None => act_rows.map(|a| self.call4(weight_rows, a)),
        }
    }

    /// Four weight rows against four activation rows; the same bits as
    /// two `call4x2`s.
    #[inline]
    pub(crate) fn call4x4(self, weight_rows: [&[u8]; 4], act_rows: [&[u8]; 4]) -> [[f32; 4]; 4] {
        match self.four_by_four {
            // SAFETY: as in `call`.
            Some(four_by_four) => unsafe { four_by_four(weight_rows, act_rows) },
            None => {
                let [a0, a1, a2, a3] = act_rows;
                let ([v0, v1], [v2, v3]) = (self.call4x2(weight_rows, [a0, a1]), self.call4x2(weight_rows, [a2, a3]));
                [v0, v1, v2, v3]
            }
        }
    }

    /// Four weight rows against eight activation rows; the same bits as
    /// two `call4x4`s.
    #[inline]
    pub(crate) fn call4x8(self, weight_rows: [&[u8]; 4], act_rows: [&[u8]; 8]) -> [[f32; 4]; 8] {
        match self.four_by_eight {
            // SAFETY: as in `call`.
            Some(four_by_eight) => unsafe { four_by_eight(weight_rows, act_rows) },
            None => {
                let [a0, a1, a2, a3, a4, a5, a6, a7] = act_rows;
                let ([v0, v1, v2, v3], [v4, v5, v6, v7]) =
                    (self.call4x4(weight_rows, [a0, a1, a2, a3]), self.call4x4(weight_rows, [a4, a5, a6, a7]));
                [v0, v1, v2, v3, v4, v5, v6, v7]
            }
        }
    }
}

/// One call's groups in `groups` against each of `acts`, eight activation
/// rows per kernel call where the level has that kernel, then fours, then
/// ones; `store(i, values)` takes row `i`'s outputs, eight per group.
#[inline]
fn call_groups(
    per_call: usize,
    (one, four, eight): (PackedFn<1>, PackedFn<4>, Option<PackedFn<8>>),
    groups: &[u8],
    n_groups: usize,
    acts: &[&[u8]],
    mut store: impl FnMut(usize, &[f32]),
) {
    let width = 8 * n_groups.min(per_call);
    let mut start = 0;
    while let Some(rest) = acts.get(start..).filter(|rest| !rest.is_empty()) {
        let mut emit = |values: &[[f32; 16]]| {
            for (k, v) in values.iter().enumerate() {
                store(start + k, &v[..width]);
            }
            values.len()
        };
        start += match (rest.len(), eight) {
            (8.., Some(eight)) => {
                // SAFETY: the kernels are only in a `Dot` built by
                // `Kernels::dot`, for a supported level.
                emit(&unsafe { eight(groups, std::array::from_fn(|k| rest[k])) })
            }
            (4.., _) => {
                // SAFETY: as above.
                emit(&unsafe { four(groups, std::array::from_fn(|k| rest[k])) })
            }
            _ => {
                // SAFETY: as above.
                emit(&unsafe { one(groups, [rest[0]]) })
            }
        };
    }
}
