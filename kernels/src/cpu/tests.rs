use super::*;

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
