//! Sixteen-lane f32 vectors with one implementation per instruction set.
//!
//! Every kernel in `ops` is written once, generically over [`Simd`], and always
//! works on 16 logical lanes: AVX-512 holds them in one register, AVX2 in two,
//! the scalar path in an array. Each lane operation is a single correctly
//! rounded IEEE-754 operation (no fused multiply-add, no approximate
//! reciprocal) and horizontal reductions combine lanes in one fixed tree, so
//! the three implementations give the same bits. The level picked at start-up
//! therefore never shows in an output, and a reduction's order is a function of
//! the reduced length alone.

use half::f16;

pub(crate) const LANES: usize = 16;

/// Runs `$body` with `$s` bound to the token of the level `ops` runs at
/// ([`crate::cpu`]).
///
/// `$body` is expanded once per level. It and everything it calls must be
/// inlined into the entry function that enables the level's target
/// features, or each vector operation would become a call compiled without
/// them: hence `#[inline(always)]` on this closure, on the generic kernels,
/// on the `Simd` methods and on every closure handed to [`update`].
macro_rules! dispatch {
    ($s:ident => $body:expr) => {{
        let level = $crate::cpu::Family::Ops.level();
        $crate::cpu::note($crate::cpu::Family::Ops, level);
        match level {
            #[cfg(target_arch = "x86_64")]
            $crate::cpu::SimdLevel::Avx2 => $crate::ops::simd::x86::run_avx2(
                #[inline(always)]
                |$s| $body,
            ),
            #[cfg(target_arch = "x86_64")]
            $crate::cpu::SimdLevel::Avx512 => $crate::ops::simd::x86::run_avx512(
                #[inline(always)]
                |$s| $body,
            ),
            // Off x86 every family's level is scalar.
            _ => {
                let $s = $crate::ops::simd::Scalar;
                $body
            }
        }
    }};
}
pub(crate) use dispatch;

/// Operations on 16 f32 lanes. Each must round exactly as the scalar
/// implementation does; see the module comment.
pub(crate) trait Simd: Copy {
    type V: Copy;
    /// Query heads whose attention V sums are stepped side by side, and
    /// chunks of each: as many chains as the vector registers hold beside
    /// each position's V values (see `attention::weigh_v`).
    const V_HEADS: usize;
    const V_CHUNKS: usize;
    fn splat(self, x: f32) -> Self::V;
    fn load(self, x: &[f32; LANES]) -> Self::V;
    /// Widening is exact, so every level agrees on it.
    fn load_f16(self, x: &[f16; LANES]) -> Self::V;
    /// Sixteen int8 as f32 (exact, as `load_f16`): the quants of half a
    /// Q8_0 block.
    fn load_i8(self, x: &[i8; LANES]) -> Self::V;
    fn store(self, v: Self::V, out: &mut [f32; LANES]);
    /// Rounds to nearest, ties to even.
    fn store_f16(self, v: Self::V, out: &mut [f16; LANES]);
    /// `v` rounded to f16 as [`Simd::store_f16`] does and widened back.
    #[inline(always)]
    fn round_f16(self, v: Self::V) -> Self::V {
        let mut rounded = [f16::ZERO; LANES];
        self.store_f16(v, &mut rounded);
        self.load_f16(&rounded)
    }
    fn add(self, a: Self::V, b: Self::V) -> Self::V;
    fn sub(self, a: Self::V, b: Self::V) -> Self::V;
    fn mul(self, a: Self::V, b: Self::V) -> Self::V;
    /// `a * b + c` with one rounding (fused multiply-add).
    fn mul_add(self, a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    fn div(self, a: Self::V, b: Self::V) -> Self::V;
    /// `if a > b { a } else { b }` per lane: x86 MAXPS semantics, which also
    /// fixes what NaN and signed zeros give.
    fn max(self, a: Self::V, b: Self::V) -> Self::V;
    /// `if a < b { a } else { b }` per lane (x86 MINPS).
    fn min(self, a: Self::V, b: Self::V) -> Self::V;
    /// 2^n for lanes holding integers in -126..=127.
    fn pow2i(self, n: Self::V) -> Self::V;
    /// `if a < b { x } else { y }` per lane.
    fn select_lt(self, a: Self::V, b: Self::V, x: Self::V, y: Self::V) -> Self::V;
    /// Sum of the lanes in the tree of [`Scalar::tree`].
    fn reduce_sum(self, v: Self::V) -> f32;
    /// Lane `p` of the result is `reduce_sum(v[p])`: sixteen trees taken
    /// level by level together, each level one lane pairing for all of
    /// them, so each sum is the same bits at a third of the instructions.
    fn reduce_sums(self, v: &[Self::V; LANES]) -> Self::V;
    /// [`Simd::max`] of the lanes in the tree of [`Scalar::tree`].
    fn reduce_max(self, v: Self::V) -> f32;
}

/// The portable level; also the reference the others are tested against.
#[derive(Clone, Copy)]
pub(crate) struct Scalar;

impl Scalar {
    /// Halves the live lanes until one is left, combining lane `l` with lane
    /// `l + width`: the order every level's reductions follow.
    fn tree(v: [f32; LANES], op: impl Fn(f32, f32) -> f32) -> f32 {
        let mut t = v;
        let mut width = LANES / 2;
        while width > 0 {
            for l in 0..width {
                t[l] = op(t[l], t[l + width]);
            }
            width /= 2;
        }
        t[0]
    }
}

fn max1(a: f32, b: f32) -> f32 {
    if a > b { a } else { b }
}

/// `[op(0), …, op(15)]`, as a plain loop: `array::map` and `from_fn` stay
/// out of line and would keep the loop from being vectorised.
#[inline(always)]
fn lanewise(op: impl Fn(usize) -> f32) -> [f32; LANES] {
    let mut out = [0.0; LANES];
    for (i, y) in out.iter_mut().enumerate() {
        *y = op(i);
    }
    out
}

impl Simd for Scalar {
    type V = [f32; LANES];
    const V_HEADS: usize = 1;
    const V_CHUNKS: usize = 4;
    #[inline(always)]
    fn splat(self, x: f32) -> Self::V {
        [x; LANES]
    }
    #[inline(always)]
    fn load(self, x: &[f32; LANES]) -> Self::V {
        *x
    }
    #[inline(always)]
    fn load_f16(self, x: &[f16; LANES]) -> Self::V {
        lanewise(|i| x[i].to_f32())
    }
    #[inline(always)]
    fn load_i8(self, x: &[i8; LANES]) -> Self::V {
        lanewise(|i| f32::from(x[i]))
    }
    #[inline(always)]
    fn store(self, v: Self::V, out: &mut [f32; LANES]) {
        *out = v;
    }
    #[inline(always)]
    fn store_f16(self, v: Self::V, out: &mut [f16; LANES]) {
        for (y, x) in out.iter_mut().zip(v) {
            *y = f16::from_f32(x);
        }
    }
    #[inline(always)]
    fn add(self, a: Self::V, b: Self::V) -> Self::V {
        lanewise(|i| a[i] + b[i])
    }
    #[inline(always)]
    fn sub(self, a: Self::V, b: Self::V) -> Self::V {
        lanewise(|i| a[i] - b[i])
    }
    #[inline(always)]
    fn mul(self, a: Self::V, b: Self::V) -> Self::V {
        lanewise(|i| a[i] * b[i])
    }
    #[inline(always)]
    fn mul_add(self, a: Self::V, b: Self::V, c: Self::V) -> Self::V {
        lanewise(|i| a[i].mul_add(b[i], c[i]))
    }
    #[inline(always)]
    fn div(self, a: Self::V, b: Self::V) -> Self::V {
        lanewise(|i| a[i] / b[i])
    }
    #[inline(always)]
    fn max(self, a: Self::V, b: Self::V) -> Self::V {
        lanewise(|i| max1(a[i], b[i]))
    }
    #[inline(always)]
    fn min(self, a: Self::V, b: Self::V) -> Self::V {
        lanewise(|i| if a[i] < b[i] { a[i] } else { b[i] })
    }
    #[inline(always)]
    fn pow2i(self, n: Self::V) -> Self::V {
        lanewise(|i| f32::from_bits(((n[i] as i32 + 127) as u32) << 23))
    }
    #[inline(always)]
    fn select_lt(self, a: Self::V, b: Self::V, x: Self::V, y: Self::V) -> Self::V {
        lanewise(|i| if a[i] < b[i] { x[i] } else { y[i] })
    }
    #[inline(always)]
    fn reduce_sum(self, v: Self::V) -> f32 {
        Self::tree(v, |a, b| a + b)
    }
    #[inline(always)]
    fn reduce_sums(self, v: &[Self::V; LANES]) -> Self::V {
        lanewise(|p| self.reduce_sum(v[p]))
    }
    #[inline(always)]
    fn reduce_max(self, v: Self::V) -> f32 {
        Self::tree(v, max1)
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    //! Every `unsafe` block in this module relies on the same two facts: a
    //! token (`Avx2`, `Avx512`) is only ever created by its `enter_*`
    //! function, which `run_*` enters only after checking that the CPU has
    //! the features it enables, so every instruction used exists; and all
    //! pointers come from references to 16-element arrays, so loads and
    //! stores stay in bounds.

    use super::{LANES, Simd};
    use crate::cpu::{Family, SimdLevel};
    use half::f16;
    use std::arch::x86_64::*;

    const NEAREST: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

    #[derive(Clone, Copy)]
    pub(crate) struct Avx2(());

    #[derive(Clone, Copy)]
    pub(crate) struct Avx512(());

    /// Runs `f` compiled for AVX2, FMA and F16C, which the CPU must have.
    /// (Without `fma` here, every `mul_add` stayed an out-of-line call.)
    #[target_feature(enable = "avx2,fma,f16c")]
    fn enter_avx2<R>(f: impl FnOnce(Avx2) -> R) -> R {
        f(Avx2(()))
    }

    /// Runs `f` compiled for AVX-512F, AVX2, FMA and F16C (the reductions
    /// use 256- and 128-bit instructions too), which the CPU must have.
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    fn enter_avx512<R>(f: impl FnOnce(Avx512) -> R) -> R {
        f(Avx512(()))
    }

    // `dispatch!` hands `run_*` the closure literal itself: wrapped first (in
    // a `let`, or through `identity`), rustc 1.95 stopped inlining it into
    // the entry function and each of its vector operations became a call.

    /// Runs `f` with AVX2, or panics if the CPU lacks it (`dispatch!` only
    /// comes here after detecting it).
    #[inline(always)]
    pub(crate) fn run_avx2<R>(f: impl FnOnce(Avx2) -> R) -> R {
        assert!(Family::Ops.supports(SimdLevel::Avx2), "AVX2 kernel on a CPU without AVX2");
        // SAFETY: the CPU has the entry function's features, checked above.
        unsafe { enter_avx2(f) }
    }

    /// Runs `f` with AVX-512, or panics if the CPU lacks it.
    #[inline(always)]
    pub(crate) fn run_avx512<R>(f: impl FnOnce(Avx512) -> R) -> R {
        assert!(Family::Ops.supports(SimdLevel::Avx512), "AVX-512 kernel on a CPU without AVX-512");
        // SAFETY: the CPU has the entry function's features, checked above.
        unsafe { enter_avx512(f) }
    }

    // Nothing below may hand a closure to a function that is not
    // `#[inline(always)]`: such a closure is compiled on its own, without the
    // entry function's target features, and each intrinsic in it becomes a
    // call. Hence macros and plain functions rather than closures.

    /// Applies a 256-bit intrinsic to the matching halves of AVX2 vectors.
    macro_rules! both {
        ($f:expr, $($v:expr),+) => {
            [$f($($v[0]),+), $f($($v[1]),+)]
        };
    }

    #[derive(Clone, Copy)]
    enum Fold {
        Sum,
        Max,
    }

    #[inline(always)]
    fn fold4(op: Fold, a: __m128, b: __m128) -> __m128 {
        // SAFETY: see the module comment.
        unsafe {
            match op {
                Fold::Sum => _mm_add_ps(a, b),
                Fold::Max => _mm_max_ps(a, b),
            }
        }
    }

    /// Finishes a reduction from eight lanes in the order of `Scalar::tree`:
    /// lane `l` with `l + 4`, then with `l + 2`, then lane 0 with lane 1.
    #[inline(always)]
    fn fold8(op: Fold, v: __m256) -> f32 {
        // SAFETY: see the module comment.
        unsafe {
            let v4 = fold4(op, _mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            let v2 = fold4(op, v4, _mm_movehl_ps(v4, v4));
            _mm_cvtss_f32(fold4(op, v2, _mm_shuffle_ps::<1>(v2, v2)))
        }
    }

    #[inline(always)]
    fn pow2i8(n: __m256) -> __m256 {
        // SAFETY: see the module comment.
        unsafe {
            let biased = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
            _mm256_castsi256_ps(_mm256_slli_epi32::<23>(biased))
        }
    }

    /// The low eight int8 of `q` as f32.
    #[inline(always)]
    fn widen_i8(q: __m128i) -> __m256 {
        // SAFETY: see the module comment.
        unsafe { _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)) }
    }

    #[inline(always)]
    fn select_lt8(a: __m256, b: __m256, x: __m256, y: __m256) -> __m256 {
        // SAFETY: see the module comment.
        unsafe { _mm256_blendv_ps(y, x, _mm256_cmp_ps::<_CMP_LT_OQ>(a, b)) }
    }

    impl Simd for Avx2 {
        type V = [__m256; 2];
        // Sixteen 256-bit registers: four sums and two values of two
        // halves each.
        const V_HEADS: usize = 2;
        const V_CHUNKS: usize = 2;
        #[inline(always)]
        fn splat(self, x: f32) -> Self::V {
            // SAFETY: see the module comment.
            let v = unsafe { _mm256_set1_ps(x) };
            [v, v]
        }
        #[inline(always)]
        fn load(self, x: &[f32; LANES]) -> Self::V {
            // SAFETY: see the module comment.
            unsafe { [_mm256_loadu_ps(x.as_ptr()), _mm256_loadu_ps(x.as_ptr().add(8))] }
        }
        #[inline(always)]
        fn load_f16(self, x: &[f16; LANES]) -> Self::V {
            let p = x.as_ptr().cast::<__m128i>();
            // SAFETY: see the module comment.
            unsafe { [_mm256_cvtph_ps(_mm_loadu_si128(p)), _mm256_cvtph_ps(_mm_loadu_si128(p.add(1)))] }
        }
        #[inline(always)]
        fn load_i8(self, x: &[i8; LANES]) -> Self::V {
            // SAFETY: see the module comment (one 16-byte load of the array).
            let q = unsafe { _mm_loadu_si128(x.as_ptr().cast()) };
            // SAFETY: see the module comment.
            [widen_i8(q), widen_i8(unsafe { _mm_unpackhi_epi64(q, q) })]
        }
        #[inline(always)]
        fn store(self, v: Self::V, out: &mut [f32; LANES]) {
            // SAFETY: see the module comment.
            unsafe {
                _mm256_storeu_ps(out.as_mut_ptr(), v[0]);
                _mm256_storeu_ps(out.as_mut_ptr().add(8), v[1]);
            }
        }
        #[inline(always)]
        fn store_f16(self, v: Self::V, out: &mut [f16; LANES]) {
            let p = out.as_mut_ptr().cast::<__m128i>();
            // SAFETY: see the module comment.
            unsafe {
                _mm_storeu_si128(p, _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v[0]));
                _mm_storeu_si128(p.add(1), _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v[1]));
            }
        }
        #[inline(always)]
        fn round_f16(self, v: Self::V) -> Self::V {
            // SAFETY: see the module comment.
            unsafe {
                [
                    _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v[0])),
                    _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v[1])),
                ]
            }
        }
        #[inline(always)]
        fn add(self, a: Self::V, b: Self::V) -> Self::V {
            // SAFETY: see the module comment.
            unsafe { both!(_mm256_add_ps, a, b) }
        }
        #[inline(always)]
        fn sub(self, a: Self::V, b: Self::V) -> Self::V {
            // SAFETY: see the module comment.
            unsafe { both!(_mm256_sub_ps, a, b) }
        }
        #[inline(always)]
        fn mul(self, a: Self::V, b: Self::V) -> Self::V {
            // SAFETY: see the module comment.
            unsafe { both!(_mm256_mul_ps, a, b) }
        }
        #[inline(always)]
        fn mul_add(self, a: Self::V, b: Self::V, c: Self::V) -> Self::V {
            // SAFETY: see the module comment.
            unsafe { both!(_mm256_fmadd_ps, a, b, c) }
        }
        #[inline(always)]
        fn div(self, a: Self::V, b: Self::V) -> Self::V {
            // SAFETY: see the module comment.
            unsafe { both!(_mm256_div_ps, a, b) }
        }
        #[inline(always)]
        fn max(self, a: Self::V, b: Self::V) -> Self::V {
            // SAFETY: see the module comment.
            unsafe { both!(_mm256_max_ps, a, b) }
        }
        #[inline(always)]
        fn min(self, a: Self::V, b: Self::V) -> Self::V {
            // SAFETY: see the module comment.
            unsafe { both!(_mm256_min_ps, a, b) }
        }
        #[inline(always)]
        fn pow2i(self, n: Self::V) -> Self::V {
            both!(pow2i8, n)
        }
        #[inline(always)]
        fn select_lt(self, a: Self::V, b: Self::V, x: Self::V, y: Self::V) -> Self::V {
            both!(select_lt8, a, b, x, y)
        }
        #[inline(always)]
        fn reduce_sum(self, v: Self::V) -> f32 {
            // SAFETY: see the module comment.
            fold8(Fold::Sum, unsafe { _mm256_add_ps(v[0], v[1]) })
        }
        #[inline(always)]
        fn reduce_sums(self, v: &[Self::V; LANES]) -> Self::V {
            // SAFETY: see the module comment.
            unsafe {
                // Lane l with l + 8: each tree's eight partial sums.
                let mut x = [_mm256_setzero_ps(); LANES];
                for (x, &[lo, hi]) in x.iter_mut().zip(v) {
                    *x = _mm256_add_ps(lo, hi);
                }
                // With l + 4: halves [tree 2i | tree 2i + 1].
                let y: [__m256; 8] = pairs(
                    &x,
                    #[inline(always)]
                    |a, b| _mm256_add_ps(_mm256_permute2f128_ps::<0x20>(a, b), _mm256_permute2f128_ps::<0x31>(a, b)),
                );
                // With l + 2: half h of z[j] holds trees 4j + h, 4j + 2 + h.
                let z: [__m256; 4] = pairs(
                    &y,
                    #[inline(always)]
                    |a, b| _mm256_add_ps(_mm256_shuffle_ps::<0x44>(a, b), _mm256_shuffle_ps::<0xEE>(a, b)),
                );
                // With l + 1: lane 4h + k of the m-th holds tree 8m + 2k + h.
                let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
                pairs(
                    &z,
                    #[inline(always)]
                    |a, b| {
                        let sums = _mm256_add_ps(_mm256_shuffle_ps::<0x88>(a, b), _mm256_shuffle_ps::<0xDD>(a, b));
                        _mm256_permutevar8x32_ps(sums, order)
                    },
                )
            }
        }
        #[inline(always)]
        fn reduce_max(self, v: Self::V) -> f32 {
            // SAFETY: see the module comment.
            fold8(Fold::Max, unsafe { _mm256_max_ps(v[0], v[1]) })
        }
    }

    /// `f` of each pair of neighbours, `[f(v[0], v[1]), f(v[2], v[3]), …]`:
    /// one level of [`Simd::reduce_sums`]'s trees.
    #[inline(always)]
    fn pairs<T: Copy, const N: usize, const H: usize>(v: &[T; N], f: impl Fn(T, T) -> T) -> [T; H] {
        const { assert!(N == 2 * H) };
        let mut out = [v[0]; H];
        for (i, out) in out.iter_mut().enumerate() {
            *out = f(v[2 * i], v[2 * i + 1]);
        }
        out
    }

    /// The low and high eight lanes of an AVX-512 vector.
    #[inline(always)]
    fn split(v: __m512) -> (__m256, __m256) {
        // SAFETY: see the module comment.
        unsafe {
            let hi = _mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v));
            (_mm512_castps512_ps256(v), _mm256_castpd_ps(hi))
        }
    }

    impl Simd for Avx512 {
        type V = __m512;
        // Thirty-two registers: sixteen sums and four values.
        const V_HEADS: usize = 4;
        const V_CHUNKS: usize = 4;
        #[inline(always)]
        fn splat(self, x: f32) -> Self::V {
            // SAFETY: see the module comment.
            unsafe { _mm512_set1_ps(x) }
        }
        #[inline(always)]
        fn load(self, x: &[f32; LANES]) -> Self::V {
            // SAFETY: see the module comment.
            unsafe { _mm512_loadu_ps(x.as_ptr()) }
        }
        #[inline(always)]
        fn load_f16(self, x: &[f16; LANES]) -> Self::V {
            // SAFETY: see the module comment.
            unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(x.as_ptr().cast())) }
        }
        #[inline(always)]
        fn load_i8(self, x: &[i8; LANES]) -> Self::V {
            // SAFETY: see the module comment (one 16-byte load of the array).
            unsafe { _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(x.as_ptr().cast()))) }
        }
        #[inline(always)]
        fn store(self, v: Self::V, out: &mut [f32; LANES]) {
            // SAFETY: see the module comment.
            unsafe { _mm512_storeu_ps(out.as_mut_ptr(), v) }
        }
        #[inline(always)]
        fn store_f16(self, v: Self::V, out: &mut [f16; LANES]) {
            // SAFETY: see the module comment.
            unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), _mm512_cvtps_ph::<NEAREST>(v)) }
        }
        #[inline(always)]
        fn round_f16(self, v: Self::V) -> Self::V {
            // SAFETY: see the module comment.
            unsafe { _mm512_cvtph_ps(_mm512_cvtps_ph::<NEAREST>(v)) }
        }
        #[inline(always)]
        fn add(self, a: Self::V, b: Self::V) -> Self::V {
            // SAFETY: see the module comment.
            unsafe { _mm512_add_ps(a, b) }
        }
        #[inline(always)]
        fn sub(self, a: Self::V, b: Self::V) -> Self::V {
            // SAFETY: see the module comment.
            unsafe { _mm512_sub_ps(a, b) }
        }
        #[inline(always)]
        fn mul(self, a: Self::V, b: Self::V) -> Self::V {
            // SAFETY: see the module comment.
            unsafe { _mm512_mul_ps(a, b) }
        }
        #[inline(always)]
        fn mul_add(self, a: Self::V, b: Self::V, c: Self::V) -> Self::V {
            // SAFETY: see the module comment.
            unsafe { _mm512_fmadd_ps(a, b, c) }
        }
        #[inline(always)]
        fn div(self, a: Self::V, b: Self::V) -> Self::V {
            // SAFETY: see the module comment.
            unsafe { _mm512_div_ps(a, b) }
        }
        #[inline(always)]
        fn max(self, a: Self::V, b: Self::V) -> Self::V {
            // SAFETY: see the module comment.
            unsafe { _mm512_max_ps(a, b) }
        }
        #[inline(always)]
        fn min(self, a: Self::V, b: Self::V) -> Self::V {
            // SAFETY: see the module comment.
            unsafe { _mm512_min_ps(a, b) }
        }
        #[inline(always)]
        fn pow2i(self, n: Self::V) -> Self::V {
            // SAFETY: see the module comment.
            unsafe {
                let biased = _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127));
                _mm512_castsi512_ps(_mm512_slli_epi32::<23>(biased))
            }
        }
        #[inline(always)]
        fn select_lt(self, a: Self::V, b: Self::V, x: Self::V, y: Self::V) -> Self::V {
            // SAFETY: see the module comment.
            unsafe { _mm512_mask_blend_ps(_mm512_cmp_ps_mask::<_CMP_LT_OQ>(a, b), y, x) }
        }
        #[inline(always)]
        fn reduce_sum(self, v: Self::V) -> f32 {
            let (lo, hi) = split(v);
            // SAFETY: see the module comment.
            fold8(Fold::Sum, unsafe { _mm256_add_ps(lo, hi) })
        }
        #[inline(always)]
        fn reduce_sums(self, v: &[Self::V; LANES]) -> Self::V {
            // SAFETY: see the module comment.
            unsafe {
                // Lane l with l + 8: halves [tree 2i | tree 2i + 1].
                let w: [__m512; 8] = pairs(
                    v,
                    #[inline(always)]
                    |a, b| _mm512_add_ps(_mm512_shuffle_f32x4::<0x44>(a, b), _mm512_shuffle_f32x4::<0xEE>(a, b)),
                );
                // With l + 4: quarter q of u[j] holds tree 4j + q.
                let u: [__m512; 4] = pairs(
                    &w,
                    #[inline(always)]
                    |a, b| _mm512_add_ps(_mm512_shuffle_f32x4::<0x88>(a, b), _mm512_shuffle_f32x4::<0xDD>(a, b)),
                );
                // With l + 2: quarter q of r[m] holds trees 8m + q, 8m + 4 + q.
                let r: [__m512; 2] = pairs(
                    &u,
                    #[inline(always)]
                    |a, b| _mm512_add_ps(_mm512_shuffle_ps::<0x44>(a, b), _mm512_shuffle_ps::<0xEE>(a, b)),
                );
                // With l + 1: lane 4q + k holds tree q + 4k.
                let sums = _mm512_add_ps(_mm512_shuffle_ps::<0x88>(r[0], r[1]), _mm512_shuffle_ps::<0xDD>(r[0], r[1]));
                let order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
                _mm512_permutexvar_ps(order, sums)
            }
        }
        #[inline(always)]
        fn reduce_max(self, v: Self::V) -> f32 {
            let (lo, hi) = split(v);
            // SAFETY: see the module comment.
            fold8(Fold::Max, unsafe { _mm256_max_ps(lo, hi) })
        }
    }
}

/// Copies a slice shorter than [`LANES`] into a full chunk padded with `pad`.
#[inline(always)]
pub(crate) fn padded<T: Copy>(tail: &[T], pad: T) -> [T; LANES] {
    let mut chunk = [pad; LANES];
    chunk[..tail.len()].copy_from_slice(tail);
    chunk
}

/// What [`reduce`] computes.
#[derive(Clone, Copy)]
pub(crate) enum Reduce {
    Sum,
    Max,
}

#[inline(always)]
fn reduce_step<S: Simd>(s: S, op: Reduce, acc: S::V, v: S::V) -> S::V {
    match op {
        Reduce::Sum => s.add(acc, v),
        Reduce::Max => s.max(acc, v),
    }
}

/// Reduces `x` in the fixed order: lane `l` of 16 accumulators takes
/// elements `l`, `l + 16`, … in index order (the last chunk padded with the
/// operation's neutral element), then the lanes combine in the tree of
/// [`Scalar::tree`].
#[inline(always)]
pub(crate) fn reduce<S: Simd>(s: S, x: &[f32], op: Reduce) -> f32 {
    let neutral = if let Reduce::Max = op { f32::NEG_INFINITY } else { 0.0 };
    let (chunks, tail) = x.as_chunks::<LANES>();
    let mut acc = s.splat(neutral);
    for chunk in chunks {
        acc = reduce_step(s, op, acc, s.load(chunk));
    }
    if !tail.is_empty() {
        acc = reduce_step(s, op, acc, s.load(&padded(tail, neutral)));
    }
    match op {
        Reduce::Max => s.reduce_max(acc),
        Reduce::Sum => s.reduce_sum(acc),
    }
}

/// Sets each element of `dst` to `f(dst, src…)`, 16 lanes at a time; the
/// last chunk's missing lanes are fed zeros and their results dropped.
/// Callers check that every `src` is as long as `dst`, and mark `f`
/// `#[inline(always)]` (see [`dispatch`]).
#[inline(always)]
pub(crate) fn update<S: Simd, const N: usize>(
    s: S,
    dst: &mut [f32],
    src: [&[f32]; N],
    f: impl Fn(S::V, [S::V; N]) -> S::V,
) {
    debug_assert!(src.iter().all(|x| x.len() == dst.len()));
    let (chunks, tail) = dst.as_chunks_mut::<LANES>();
    let mut args = [s.splat(0.0); N];
    for (i, chunk) in chunks.iter_mut().enumerate() {
        for (arg, x) in args.iter_mut().zip(src) {
            *arg = s.load(&x.as_chunks::<LANES>().0[i]);
        }
        s.store(f(s.load(chunk), args), chunk);
    }
    if !tail.is_empty() {
        for (arg, x) in args.iter_mut().zip(src) {
            *arg = s.load(&padded(x.as_chunks::<LANES>().1, 0.0));
        }
        let mut out = padded(tail, 0.0);
        s.store(f(s.load(&out), args), &mut out);
        tail.copy_from_slice(&out[..tail.len()]);
    }
}

const EXP_LO: f32 = -87.0;
const EXP_HI: f32 = 88.0;
/// 1.5 · 2^23: adding it rounds a float of magnitude below 2^22 to an integer.
const ROUND_SHIFT: f32 = 12_582_912.0;
const LOG2_E: f32 = f32::from_bits(0x3FB8_AA3B);
/// ln 2 split so that `n * LN2_HI` is exact for the exponents used.
const LN2_HI: f32 = f32::from_bits(0x3F31_7200);
const LN2_LO: f32 = f32::from_bits(0x35BF_BE8E);
/// Minimax coefficients of e^b on |b| ≤ ln2/2 for b, b², …, b⁵ (the
/// constant term is 1), the ones GGML's vector `expf` uses.
const EXP_POLY: [f32; 5] = [
    f32::from_bits(0x3F7F_FFF6),
    f32::from_bits(0x3EFF_FEDB),
    f32::from_bits(0x3E2A_AF33),
    f32::from_bits(0x3D2B_9F17),
    f32::from_bits(0x3C07_2010),
];

/// e^x per lane, bit-identical on every level, within 2 ulp of the true
/// value (tested). Outside [-87, 88] it returns 0 below and +inf above: the
/// true values there are under 1.7e-38 or over half of `f32::MAX`, which no
/// caller distinguishes. NaN stays NaN.
#[inline(always)]
pub(crate) fn exp<S: Simd>(s: S, x: S::V) -> S::V {
    let xc = s.min(s.max(x, s.splat(EXP_LO)), s.splat(EXP_HI));
    // GGML's steps, so that SiLU matches llama.cpp's bit for bit: n is
    // x·log2 e rounded by the shift, b = x − n·ln2 in two fused steps,
    // then a degree-5 polynomial evaluated as (c5·b + c4)·u + (c3·b + c2),
    // times u, plus (c1·b + 1), with u = b².
    let shift = s.splat(ROUND_SHIFT);
    let n = s.sub(s.mul_add(xc, s.splat(LOG2_E), shift), shift);
    let minus_n = s.sub(s.splat(0.0), n);
    let b = s.mul_add(minus_n, s.splat(LN2_LO), s.mul_add(minus_n, s.splat(LN2_HI), xc));
    let u = s.mul(b, b);
    let c = |k: usize| s.splat(EXP_POLY[k]);
    let high = s.mul_add(s.mul_add(c(4), b, c(3)), u, s.mul_add(c(2), b, c(1)));
    let p = s.mul_add(high, u, s.mul_add(c(0), b, s.splat(1.0)));
    let e = s.mul(p, s.pow2i(n));
    // x - x is 0 for finite x and NaN for ±inf and NaN: it carries NaN
    // through, and the two selects below then fix up the infinities.
    let e = s.add(e, s.sub(x, x));
    let e = s.select_lt(x, s.splat(EXP_LO), s.splat(0.0), e);
    s.select_lt(s.splat(EXP_HI), x, s.splat(f32::INFINITY), e)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::same_on_every_level;

    fn exp_row(x: &[f32]) -> Vec<f32> {
        let mut out = x.to_vec();
        dispatch!(s => update(s, &mut out, [], #[inline(always)] |v, []| exp(s, v)));
        out
    }

    #[test]
    fn exp_is_accurate_and_equal_on_every_level() {
        let x: Vec<f32> = (0..40_001).map(|i| -87.0 + 175.0 * i as f32 / 40_000.0).collect();
        let got = same_on_every_level(|| exp_row(&x));
        for (&x, &e) in x.iter().zip(&got) {
            let want = (x as f64).exp();
            let ulp = (want as f32).to_bits().abs_diff(e.to_bits());
            assert!(ulp <= 2, "exp({x}) = {e}, want {want} ({ulp} ulp)");
        }
    }

    #[test]
    fn exp_edge_cases() {
        let x = [0.0, -0.0, f32::NEG_INFINITY, f32::INFINITY, f32::NAN, -87.5, 88.5, -1e30, 1e30];
        let got = same_on_every_level(|| exp_row(&x));
        assert_eq!(&got[..2], &[1.0, 1.0]);
        assert_eq!(got[2], 0.0);
        assert_eq!(got[3], f32::INFINITY);
        assert!(got[4].is_nan());
        assert_eq!(&got[5..], &[0.0, f32::INFINITY, 0.0, f32::INFINITY]);
    }

    #[test]
    fn reductions_follow_the_tree_on_every_level() {
        // Magnitudes spread over 2^±20 make the sum depend on its order, so
        // equal bits mean equal trees.
        let x: Vec<f32> =
            (0..16).map(|i| ((i * 7919 % 41) as f32 - 20.0).exp2() * if i % 3 == 0 { -1.0 } else { 1.0 }).collect();
        let chunk: [f32; LANES] = x.clone().try_into().unwrap();
        let got = same_on_every_level(|| {
            let sum = dispatch!(s => s.reduce_sum(s.load(&chunk)));
            let max = dispatch!(s => s.reduce_max(s.load(&chunk)));
            vec![sum, max]
        });
        assert_eq!(got[0], Scalar::tree(chunk, |a, b| a + b));
        assert_eq!(got[1], x.iter().copied().fold(f32::MIN, f32::max));
    }

    #[test]
    fn sixteen_sums_at_once_follow_each_tree_on_every_level() {
        // Each tree's lanes spread over 2^±20, in a different order per
        // tree, so that a lane paired wrongly or a tree put in the wrong
        // lane changes bits.
        let trees: [[f32; LANES]; LANES] = std::array::from_fn(|p| {
            std::array::from_fn(|l| {
                let i = p * LANES + l;
                ((i * 7919 % 41) as f32 - 20.0).exp2() * if (i + p).is_multiple_of(3) { -1.0 } else { 1.0 }
            })
        });
        let got = same_on_every_level(|| {
            let mut out = [0.0; LANES];
            dispatch!(s => {
                let v = trees.map(|t| s.load(&t));
                s.store(s.reduce_sums(&v), &mut out)
            });
            out.to_vec()
        });
        let want: Vec<f32> = trees.iter().map(|&t| Scalar::tree(t, |a, b| a + b)).collect();
        assert_eq!(
            got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            want.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
    }

    #[test]
    fn int8_widens_exactly_on_every_level() {
        let x: [i8; LANES] = [i8::MIN, i8::MAX, -1, 0, 1, -77, 55, 2, -3, 100, -100, 64, -64, 13, -13, 126];
        let got = same_on_every_level(|| {
            let mut out = [0.0; LANES];
            dispatch!(s => s.store(s.load_i8(&x), &mut out));
            out.to_vec()
        });
        assert_eq!(got, x.map(f32::from));
    }

    #[test]
    fn reduce_pads_the_tail_and_keeps_lane_order() {
        for n in [0, 1, 15, 16, 17, 33, 100] {
            let x: Vec<f32> = (0..n).map(|i| 1.0 + (i as f32).sin() * 1e-3).collect();
            let got = same_on_every_level(|| vec![dispatch!(s => reduce(s, &x, Reduce::Sum))]);
            let mut lanes = [0.0f32; LANES];
            for (i, v) in x.iter().enumerate() {
                lanes[i % LANES] += v;
            }
            assert_eq!(got[0].to_bits(), Scalar::tree(lanes, |a, b| a + b).to_bits(), "n = {n}");
        }
    }
}
