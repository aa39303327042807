//! Rope scaling against ggml's rope, and its refusals.

use serde_json::Value;

use super::{OpsError, Rope, RopeAngles, RopeKind, RopeScaling, Yarn};

/// ggml's CPU rope (llama.cpp b11434) rotating unit pairs, so its
/// outputs are each pair's cosine and sine; made by a C program calling
/// `ggml_rope_ext` with the attention factor llama.cpp's context derives.
const GGML: &str = include_str!("../../tests/fixtures/rope-scaling-ggml.json");

fn f32_of(value: &Value) -> f32 {
    value.as_f64().expect("a number") as f32
}

#[test]
fn angles_are_ggml_s_bits_for_every_kind_of_scaling() {
    let cases: serde_json::Map<String, Value> = serde_json::from_str(GGML).expect("fixture is JSON");
    assert_eq!(cases.len(), 7);
    for (name, case) in &cases {
        let int = |key: &str| case[key].as_u64().expect("an integer") as usize;
        let kind = if int("mode") == 0 { RopeKind::Norm } else { RopeKind::Neox };
        let yarn = (f32_of(&case["ext_factor"]) != 0.0).then(|| Yarn {
            n_ctx_orig: int("n_ctx_orig") as u32,
            beta_fast: f32_of(&case["beta_fast"]),
            beta_slow: f32_of(&case["beta_slow"]),
            log_multiplier: f32_of(&case["log_mul"]),
        });
        let scaling = RopeScaling {
            freq_factors: case["freq_factors"].as_array().expect("factors").iter().map(f32_of).collect(),
            yarn,
            attn_factor: f32_of(&case["file_attn_factor"]),
        };
        let rope = Rope::new(int("head_dim"), int("n_rot"), f32_of(&case["base"]), f32_of(&case["freq_scale"]), kind)
            .and_then(|rope| rope.scaled(&scaling))
            .expect("valid rope");
        let mut angles = RopeAngles::default();
        let positions = case["positions"].as_array().expect("positions");
        for (pos, want) in positions.iter().zip(case["cos_sin_bits"].as_array().expect("bits")) {
            let p = pos.as_u64().expect("a position") as u32;
            rope.angles(Rope::text_pos(p), &mut angles);
            let (cos, sin) = angles.tables();
            let got: Vec<u64> =
                cos.iter().zip(sin).flat_map(|(c, s)| [c.to_bits().into(), s.to_bits().into()]).collect();
            let want: Vec<u64> = want.as_array().expect("row").iter().map(|b| b.as_u64().expect("bits")).collect();
            assert_eq!(got, want, "{name} at position {p}");
        }
    }
}

#[test]
fn no_scaling_changes_nothing() {
    let plain = Rope::new(64, 48, 10_000.0, 0.5, RopeKind::Neox).expect("valid");
    let scaled = plain.clone().scaled(&RopeScaling::default()).expect("valid");
    let (mut a, mut b) = (RopeAngles::default(), RopeAngles::default());
    for p in [0, 1, 900, 65_000] {
        plain.angles(Rope::text_pos(p), &mut a);
        scaled.angles(Rope::text_pos(p), &mut b);
        assert_eq!(a.tables(), b.tables());
    }
}

#[test]
fn refuses_factors_of_the_wrong_count_or_sign() {
    let rope = || Rope::new(64, 64, 10_000.0, 1.0, RopeKind::Neox).expect("valid");
    let bad = [
        RopeScaling { freq_factors: vec![1.0; 31], ..RopeScaling::default() },
        RopeScaling { freq_factors: vec![0.0; 32], ..RopeScaling::default() },
        RopeScaling { attn_factor: f32::NAN, ..RopeScaling::default() },
        RopeScaling {
            yarn: Some(Yarn { n_ctx_orig: 0, beta_fast: 32.0, beta_slow: 1.0, log_multiplier: 0.0 }),
            ..RopeScaling::default()
        },
    ];
    for scaling in bad {
        assert!(matches!(rope().scaled(&scaling), Err(OpsError::Rope(_))), "{scaling:?}");
    }
}
