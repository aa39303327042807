//! The register tiles of [`super`]: `mr` rows × `nr` columns of outputs
//! held in registers while k streams past, one broadcast row value against
//! a vector of panel columns per fused multiply-add.

use std::ops::Range;

use crate::cpu::{Family, SimdLevel, note};

/// A register tile of `mr` rows × `nr` columns and the level that runs it.
/// Operands are packed for one kernel; a product checks that its two agree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Kernel {
    level: SimdLevel,
    pub(super) mr: usize,
    pub(super) nr: usize,
}

impl Kernel {
    /// The kernel of the level [`crate::cpu`] gives this family.
    pub(crate) fn current() -> Kernel {
        let level = Family::Gemm.level();
        let (mr, nr) = match level {
            // 12 accumulators of two vectors, their two weight vectors and
            // the broadcast: 15 of the 16 registers.
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx2 => (6, 16),
            // 24 accumulators, two weight vectors, one broadcast: 27 of 32.
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx512 => (12, 32),
            // Scalar (every level off x86).
            _ => (4, 16),
        };
        Kernel { level, mr, nr }
    }

    /// Rows a tile has: the groups [`Lhs`] reads.
    pub(crate) fn rows(&self) -> usize {
        self.mr
    }

    /// Adds the products of rows `rows` (at most `mr`, from a multiple of
    /// it) over `ks` with `panel` (`ks.len()` rows of `nr`) to the output
    /// tile at `rows × cols`, which it starts from zero at k = 0. `xs` holds
    /// the rows' group over `ks`: `ks.len()` steps of `mr` values,
    /// `x_stride` apart (`Lhs::values`). Edge tiles go through the scratch
    /// tile `c` (`mr × nr`).
    ///
    /// # Safety
    /// `out` holds the tile's rows, of `out.ld` elements, `cols` lies
    /// within them, and no other thread touches this tile meanwhile.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn tile(
        &self,
        (xs, x_stride): (&[f32], usize),
        rows: Range<usize>,
        ks: Range<usize>,
        cols: &Range<usize>,
        panel: &[f32],
        out: &Out,
        c: &mut [f32],
    ) {
        let (kc, first) = (ks.len(), ks.start == 0);
        assert!(panel.len() >= kc * self.nr && c.len() >= self.mr * self.nr, "a whole panel and scratch tile");
        assert!(xs.len() >= kc.saturating_sub(1) * x_stride + self.mr, "a group of this kernel's rows over ks");
        // SAFETY: rows of `out` at the tile's columns (caller's contract).
        let c_at = |i: usize| unsafe { out.ptr.add(i * out.ld + cols.start) };
        if rows.len() == self.mr && cols.len() == self.nr {
            let call =
                Call { x: xs.as_ptr(), x_stride, panel: panel.as_ptr(), kc, c: c_at(rows.start), ldc: out.ld, first };
            // SAFETY: `xs` holds `kc` steps of `mr` values `x_stride`
            // apart, the panel `kc × nr`, and the output tile `mr × nr` at
            // stride `ld` lies inside `out` (the caller's contract).
            return unsafe { self.run(call) };
        }
        if !first {
            for (i, row) in rows.clone().enumerate() {
                // SAFETY: the tile's own elements (caller's contract).
                let src = unsafe { std::slice::from_raw_parts(c_at(row), cols.len()) };
                c[i * self.nr..i * self.nr + cols.len()].copy_from_slice(src);
            }
        }
        let call = Call { x: xs.as_ptr(), x_stride, panel: panel.as_ptr(), kc, c: c.as_mut_ptr(), ldc: self.nr, first };
        // SAFETY: the scratch tile holds `mr × nr`; `xs` and the panel as
        // above.
        unsafe { self.run(call) };
        for (i, row) in rows.enumerate() {
            // SAFETY: as above.
            let dst = unsafe { std::slice::from_raw_parts_mut(c_at(row), cols.len()) };
            dst.copy_from_slice(&c[i * self.nr..i * self.nr + cols.len()]);
        }
    }

    /// # Safety
    /// As [`Call`]'s contract; the level is one the CPU has.
    unsafe fn run(&self, call: Call) {
        note(Family::Gemm, self.level);
        // SAFETY: the caller's contract; `Family::level` never names a
        // level the CPU lacks.
        unsafe {
            match self.level {
                #[cfg(target_arch = "x86_64")]
                SimdLevel::Avx2 => x86::avx2::<6>(call),
                #[cfg(target_arch = "x86_64")]
                SimdLevel::Avx512 => x86::avx512::<12>(call),
                _ => scalar::<4, 16>(call),
            }
        }
    }
}

/// One kernel call's operands. Contract: `x` holds `kc` steps of `mr`
/// adjacent values, `x_stride` apart, `panel` `kc × nr`, and `c` `mr` rows
/// of `nr` at a stride of `ldc`, which start from zero when `first` and
/// are added to otherwise.
#[derive(Clone, Copy)]
struct Call {
    x: *const f32,
    x_stride: usize,
    panel: *const f32,
    kc: usize,
    c: *mut f32,
    ldc: usize,
    first: bool,
}

/// An output matrix (`ld` elements a row) that threads write at disjoint
/// tiles.
pub(super) struct Out {
    pub(super) ptr: *mut f32,
    pub(super) ld: usize,
}

// SAFETY: threads write through the pointer only at the disjoint tiles
// they were given (see `gemm` and `multiply`).
unsafe impl Sync for Out {}

/// The reference the vector kernels equal bit for bit.
///
/// # Safety
/// As [`Call`]'s contract with `mr = MR`, `nr = NR`.
unsafe fn scalar<const MR: usize, const NR: usize>(call: Call) {
    let Call { x, x_stride, panel, kc, c, ldc, first } = call;
    for i in 0..MR {
        for j in 0..NR {
            // SAFETY: in bounds by the caller's contract.
            unsafe {
                let mut acc = if first { 0.0 } else { *c.add(i * ldc + j) };
                for k in 0..kc {
                    acc = (*x.add(k * x_stride + i)).mul_add(*panel.add(k * NR + j), acc);
                }
                *c.add(i * ldc + j) = acc;
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// A kernel of `MR` rows × two vectors of `$lanes` columns, written
    /// once for both instruction sets.
    macro_rules! outer_product_tile {
        ($(#[$doc:meta])* $name:ident, $features:literal, $lanes:literal,
         $setzero:ident, $set1:ident, $loadu:ident, $storeu:ident, $fmadd:ident) => {
            $(#[$doc])*
            #[target_feature(enable = $features)]
            pub(super) unsafe fn $name<const MR: usize>(call: super::Call) {
                let super::Call { x, x_stride, panel, kc, c, ldc, first } = call;
                // SAFETY: every access lies in the tiles the caller's
                // contract names; the features are enabled.
                unsafe {
                    let mut acc = [[$setzero(); 2]; MR];
                    if !first {
                        for (i, row) in acc.iter_mut().enumerate() {
                            *row = [$loadu(c.add(i * ldc)), $loadu(c.add(i * ldc + $lanes))];
                        }
                    }
                    for k in 0..kc {
                        let w = [$loadu(panel.add(k * 2 * $lanes)), $loadu(panel.add(k * 2 * $lanes + $lanes))];
                        for (i, row) in acc.iter_mut().enumerate() {
                            let a = $set1(*x.add(k * x_stride + i));
                            row[0] = $fmadd(a, w[0], row[0]);
                            row[1] = $fmadd(a, w[1], row[1]);
                        }
                    }
                    for (i, row) in acc.iter().enumerate() {
                        $storeu(c.add(i * ldc), row[0]);
                        $storeu(c.add(i * ldc + $lanes), row[1]);
                    }
                }
            }
        };
    }

    outer_product_tile!(
        /// `MR` rows × 16 columns (two 8-lane vectors).
        ///
        /// # Safety
        /// As [`super::Call`]'s contract with `mr = MR`, `nr = 16`; AVX2 and FMA.
        avx2, "avx2,fma", 8,
        _mm256_setzero_ps, _mm256_set1_ps, _mm256_loadu_ps, _mm256_storeu_ps, _mm256_fmadd_ps
    );

    outer_product_tile!(
        /// `MR` rows × 32 columns (two 16-lane vectors).
        ///
        /// # Safety
        /// As [`super::Call`]'s contract with `mr = MR`, `nr = 32`; AVX-512F.
        avx512, "avx512f,fma", 16,
        _mm512_setzero_ps, _mm512_set1_ps, _mm512_loadu_ps, _mm512_storeu_ps, _mm512_fmadd_ps
    );
}
