//! The one place the CPU kernels learn which instruction set to run: the
//! CPU's features, detected once per process, and the cap the environment
//! variable `SLUICE_SIMD` puts on them.
//!
//! Each family of kernels ([`Family`]) needs its own features for a level:
//! the f32 kernels of `ops` and `gemm` run AVX-512 with AVX-512F alone,
//! while the int8 dot products of `quant` need BW, VL and VNNI too. So a
//! CPU with AVX-512F but no VNNI runs the first at AVX-512 and the second
//! at AVX2. `SLUICE_SIMD` (`scalar`, `avx2` or `avx512`) lowers every
//! family to at most the level it names and never raises one above what
//! the CPU has; any other value is ignored, as if unset. Every level gives
//! the same bits (see `ops` and `quant`), so the cap only changes speed,
//! which is what it is for: measuring the AVX2 kernels on an AVX-512
//! machine.

use std::sync::OnceLock;

/// Instruction-set levels, weakest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SimdLevel {
    /// Portable code; the reference the others equal.
    Scalar,
    /// AVX2 with FMA and F16C.
    Avx2,
    /// AVX-512 on top of AVX2 (which extensions: see [`Family`]).
    Avx512,
}

impl SimdLevel {
    pub const ALL: [SimdLevel; 3] = [SimdLevel::Scalar, SimdLevel::Avx2, SimdLevel::Avx512];

    /// The level's name, as `SLUICE_SIMD` spells it.
    pub fn name(self) -> &'static str {
        match self {
            SimdLevel::Scalar => "scalar",
            SimdLevel::Avx2 => "avx2",
            SimdLevel::Avx512 => "avx512",
        }
    }

    fn from_name(name: &str) -> Option<SimdLevel> {
        SimdLevel::ALL.into_iter().find(|level| level.name() == name)
    }
}

/// The features the kernels' levels are made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Features {
    /// AVX2, FMA and F16C.
    pub avx2: bool,
    /// AVX-512 Foundation.
    pub avx512f: bool,
    /// AVX-512 BW, VL and VNNI.
    pub avx512_int8: bool,
}

impl Features {
    /// What this CPU has.
    pub fn detected() -> Features {
        chosen().features
    }

    #[cfg(target_arch = "x86_64")]
    fn detect() -> Features {
        Features {
            avx2: is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c"),
            avx512f: is_x86_feature_detected!("avx512f"),
            avx512_int8: is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512vnni"),
        }
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn detect() -> Features {
        Features::default()
    }
}

/// The kernel families, each of which asks here for its level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// The f32 row operations of `ops` (norms, RoPE, softmax, attention…).
    Ops,
    /// The f32 register tiles of `gemm`.
    Gemm,
    /// The int8 dot products and activation quantization of `quant`, and
    /// so the quantized matmuls.
    Quant,
}

impl Family {
    pub(crate) const ALL: [Family; 3] = [Family::Ops, Family::Gemm, Family::Quant];

    /// The best level `features` allow this family.
    pub fn best(self, features: Features) -> SimdLevel {
        let avx512 = match self {
            Family::Ops | Family::Gemm => features.avx512f,
            Family::Quant => features.avx512f && features.avx512_int8,
        };
        match (features.avx2, avx512) {
            (true, true) => SimdLevel::Avx512,
            (true, false) => SimdLevel::Avx2,
            (false, _) => SimdLevel::Scalar,
        }
    }

    /// Whether this CPU can run the family's kernels of `level` (whatever
    /// the cap says).
    pub fn supports(self, level: SimdLevel) -> bool {
        level <= self.best(Features::detected())
    }

    /// The level the family's kernels run at: the best one the CPU has,
    /// capped by `SLUICE_SIMD`. Tests may set another per thread (see
    /// `same_on_every_level`).
    #[inline]
    pub fn level(self) -> SimdLevel {
        #[cfg(test)]
        if let Some(forced) = FORCED.get() {
            return forced.min(self.best(Features::detected()));
        }
        chosen().levels[self as usize]
    }
}

/// The level `family` runs at on a CPU with `features` under `cap`.
fn capped(family: Family, features: Features, cap: Option<SimdLevel>) -> SimdLevel {
    family.best(features).min(cap.unwrap_or(SimdLevel::Avx512))
}

/// `SLUICE_SIMD`'s value as a cap: `None` (no cap) when unset or not the
/// name of a level.
fn cap_from(value: Option<&str>) -> Option<SimdLevel> {
    value.and_then(SimdLevel::from_name)
}

struct Chosen {
    features: Features,
    /// Indexed by [`Family`].
    levels: [SimdLevel; 3],
}

fn chosen() -> &'static Chosen {
    static CHOSEN: OnceLock<Chosen> = OnceLock::new();
    CHOSEN.get_or_init(|| {
        let features = Features::detect();
        let cap = cap_from(std::env::var("SLUICE_SIMD").ok().as_deref());
        Chosen { features, levels: Family::ALL.map(|family| capped(family, features, cap)) }
    })
}

/// Notes that a kernel of `family` was entered at `level`. Counted in
/// tests, which check that the cap holds; nothing otherwise.
#[inline(always)]
pub(crate) fn note(family: Family, level: SimdLevel) {
    #[cfg(test)]
    DISPATCHED[family as usize][level as usize].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    #[cfg(not(test))]
    let _ = (family, level);
}

/// Kernels entered, per family and level (see [`note`]).
#[cfg(test)]
pub(crate) static DISPATCHED: [[std::sync::atomic::AtomicUsize; 3]; 3] =
    [const { [const { std::sync::atomic::AtomicUsize::new(0) }; 3] }; 3];

#[cfg(test)]
thread_local! {
    static FORCED: std::cell::Cell<Option<SimdLevel>> = const { std::cell::Cell::new(None) };
}

/// Runs `f` once per level this CPU supports for the f32 kernels, every
/// family at that level or its best below it, and asserts that every run
/// returns the same bits as the scalar one, which it returns.
#[cfg(test)]
pub(crate) fn same_on_every_level(mut f: impl FnMut() -> Vec<f32>) -> Vec<f32> {
    let mut reference: Option<Vec<f32>> = None;
    for level in SimdLevel::ALL.into_iter().filter(|&level| Family::Ops.supports(level)) {
        FORCED.set(Some(level));
        let got = f();
        FORCED.set(None);
        match &reference {
            None => reference = Some(got),
            Some(want) => {
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(want), bits(&got), "{level:?} differs from scalar");
            }
        }
    }
    reference.expect("the scalar level always runs")
}

#[cfg(test)]
mod tests;
