use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;
use crate::matmul::{QuantMatrix, matmul};
use crate::ops::{self, HeadShape, KvArena, KvPages, KvType, PageTable, Rope, RopeAngles, RopeKind, noise};
use crate::pool::ThreadPool;
use crate::quant::DType;
use crate::quant::tests::{Rng, random_weights};

/// Kernels entered, per family and level (see [`note`]).
pub(super) static DISPATCHED: [[AtomicUsize; 3]; 3] = [const { [const { AtomicUsize::new(0) }; 3] }; 3];

const NO_FEATURES: Features = Features { avx2: false, avx512f: false, avx512_int8: false };
const AVX2: Features = Features { avx2: true, ..NO_FEATURES };
const AVX512F: Features = Features { avx512f: true, ..AVX2 };
const AVX512_VNNI: Features = Features { avx512_int8: true, ..AVX512F };

#[test]
fn each_family_takes_the_best_level_its_features_allow() {
    use SimdLevel::*;
    // Ops, Gemm, Quant.
    let cases = [
        (NO_FEATURES, [Scalar, Scalar, Scalar]),
        (AVX2, [Avx2, Avx2, Avx2]),
        (AVX512F, [Avx512, Avx512, Avx2]),
        (AVX512_VNNI, [Avx512, Avx512, Avx512]),
        // AVX-512 without the AVX2 entry's FMA or F16C is no level at all.
        (Features { avx2: false, ..AVX512_VNNI }, [Scalar, Scalar, Scalar]),
    ];
    for (features, want) in cases {
        assert_eq!(Family::ALL.map(|family| family.best(features)), want, "{features:?}");
    }
}

#[test]
fn sluice_simd_only_lowers_levels_and_other_values_are_ignored() {
    use SimdLevel::*;
    assert_eq!(cap_from(None), None);
    for level in SimdLevel::ALL {
        assert_eq!(cap_from(Some(level.name())), Some(level));
    }
    for ignored in ["", "AVX2", "avx1024", "avx2 "] {
        assert_eq!(cap_from(Some(ignored)), None, "{ignored:?}");
    }
    // (features, cap) -> Ops, Gemm, Quant.
    let cases = [
        (AVX512F, Some(Avx512), [Avx512, Avx512, Avx2]),
        (AVX512F, Some(Avx2), [Avx2, Avx2, Avx2]),
        (AVX512_VNNI, Some(Avx2), [Avx2, Avx2, Avx2]),
        (AVX512_VNNI, Some(Scalar), [Scalar, Scalar, Scalar]),
        (AVX512_VNNI, None, [Avx512, Avx512, Avx512]),
        (AVX2, Some(Avx512), [Avx2, Avx2, Avx2]),
        (NO_FEATURES, Some(Avx2), [Scalar, Scalar, Scalar]),
    ];
    for (features, cap, want) in cases {
        assert_eq!(Family::ALL.map(|family| capped(family, features, cap)), want, "{features:?} under {cap:?}");
    }
}

/// The entry functions enable FMA (every `mul_add` of the AVX2 and AVX-512
/// paths is one), so a level may only be chosen on a CPU that has it,
/// whatever else it has.
#[test]
#[cfg(target_arch = "x86_64")]
fn the_detected_features_are_the_cpus() {
    let has = |features: &[&str]| {
        features.iter().all(|&feature| match feature {
            "avx2" => is_x86_feature_detected!("avx2"),
            "fma" => is_x86_feature_detected!("fma"),
            "f16c" => is_x86_feature_detected!("f16c"),
            "avx512f" => is_x86_feature_detected!("avx512f"),
            "avx512bw" => is_x86_feature_detected!("avx512bw"),
            "avx512vl" => is_x86_feature_detected!("avx512vl"),
            "avx512vnni" => is_x86_feature_detected!("avx512vnni"),
            _ => false,
        })
    };
    let features = Features::detected();
    assert_eq!(features.avx2, has(&["avx2", "fma", "f16c"]));
    assert_eq!(features.avx512f, has(&["avx512f"]));
    assert_eq!(features.avx512_int8, has(&["avx512bw", "avx512vl", "avx512vnni"]));
}

/// Set in the processes [`every_family_runs_at_the_level_sluice_simd_caps_it_to`]
/// starts.
const CHILD: &str = "SLUICE_TEST_DISPATCH_CHILD";

/// `SLUICE_SIMD` is read once per process, so each value is tried in a
/// process of its own: this test binary, running only
/// [`dispatch_in_this_process`].
#[test]
fn every_family_runs_at_the_level_sluice_simd_caps_it_to() {
    let exe = std::env::current_exe().expect("the test binary's path");
    for cap in ["scalar", "avx2", "avx512", "avx1024"] {
        let output = Command::new(&exe)
            .args(["--exact", "cpu::tests::dispatch_in_this_process", "--nocapture", "--test-threads=1"])
            .env("SLUICE_SIMD", cap)
            .env(CHILD, "1")
            .output()
            .expect("the test binary runs");
        let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        assert!(output.status.success(), "SLUICE_SIMD={cap}:\n{text}");
        assert!(text.contains("1 passed"), "SLUICE_SIMD={cap}: the check did not run:\n{text}");
    }
}

/// Runs kernels of every family (norms, softmax, SiLU, RoPE, paged
/// attention over Q8_0 and f16 caches, attention within a pass on the gemm
/// tiles, an f32 gemm, a quantized matmul) and checks that each family
/// entered its kernels at exactly the level `SLUICE_SIMD` leaves it, and
/// never above. Does nothing outside a process started for it.
#[test]
fn dispatch_in_this_process() {
    let Some(cap) = std::env::var_os(CHILD).and(std::env::var("SLUICE_SIMD").ok()) else { return };
    let cap = match cap.as_str() {
        "scalar" => SimdLevel::Scalar,
        "avx2" => SimdLevel::Avx2,
        // `avx512`, and names of no level, which leave every family its best.
        _ => SimdLevel::Avx512,
    };
    run_every_family();
    for family in Family::ALL {
        let want = family.best(Features::detected()).min(cap);
        let counts = DISPATCHED[family as usize].each_ref().map(|count| count.load(Ordering::Relaxed));
        for level in SimdLevel::ALL {
            let count = counts[level as usize];
            if level == want {
                assert!(count > 0, "{family:?} never ran at {want:?}: {counts:?}");
            } else {
                assert_eq!(count, 0, "{family:?} ran at {level:?}, not {want:?}, {count} times: {counts:?}");
            }
        }
    }
}

fn run_every_family() {
    let pool = ThreadPool::new(2);
    let width = 256;
    let weight = noise(width, 1, 1.0);
    let mut x = noise(width, 2, 1.0);
    let mut normed = vec![0.0; width];
    ops::rms_norm(&x, &weight, 1e-5, &mut normed);
    ops::softmax_in_place(&mut normed);
    ops::silu(&mut x);
    let rope = Rope::new(64, 64, 10000.0, 1.0, RopeKind::Neox).expect("valid rope");
    let mut angles = RopeAngles::default();
    rope.angles(Rope::text_pos(5), &mut angles);
    rope.apply(&angles, &mut x);

    let shape = HeadShape::new(4, 2, 64).expect("valid heads");
    let positions = 40;
    let (k, v) = (noise(positions * shape.kv_len(), 3, 1.0), noise(positions * shape.kv_len(), 4, 1.0));
    let blocks: Vec<u32> = (0..positions.div_ceil(16) as u32).collect();
    for kv_type in [KvType::Q8_0, KvType::F16] {
        let (mut k_arena, mut v_arena) = (
            KvArena::zeros(kv_type, blocks.len() * 16 * shape.kv_len()),
            KvArena::zeros(kv_type, blocks.len() * 16 * shape.kv_len()),
        );
        k_arena.write(0, &k);
        v_arena.write(0, &v);
        let kv = KvPages {
            k: k_arena.rows(),
            v: v_arena.rows(),
            pages: PageTable { blocks: &blocks, block_tokens: 16 },
            hidden: &[],
        };
        let mut out = vec![0.0; shape.q_len()];
        ops::attend(&x[..shape.q_len()], kv, positions, shape, 0.125, &mut out, &mut Vec::new())
            .expect("valid attention");
    }
    let q = noise(positions * shape.q_len(), 5, 1.0);
    let mut within = vec![0.0; q.len()];
    ops::attend_within(&q, &k, &v, &vec![0; positions], shape, 0.125, &mut within, &pool).expect("valid attention");

    let mut rng = Rng::new(6);
    let (n_in, n_out, m) = (256, 64, 3);
    let acts = noise(m * n_in, 7, 1.0);
    for dtype in [DType::F32, DType::Q4_0] {
        let bytes: Vec<u8> = (0..n_out).flat_map(|_| random_weights(&mut rng, dtype, n_in)).collect();
        let weights = QuantMatrix::new(dtype, &bytes, n_out, n_in).expect("a whole matrix");
        let mut out = vec![0.0; m * n_out];
        if crate::gemm::supports(dtype) {
            crate::gemm::gemm(&weights, &acts, m, &mut out, &pool);
        } else {
            matmul(&weights, &acts, m, &mut out, &pool);
        }
    }
}
