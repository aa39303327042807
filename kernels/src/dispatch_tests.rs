//! Which level each kernel family ran at, under every `SLUICE_SIMD` cap:
//! the kernels of every family run in a child process per cap and the
//! dispatch counts of `cpu` are checked. A test module of the crate root,
//! so that `cpu` (at the bottom) imports none of the kernels it counts.

use std::process::Command;
use std::sync::atomic::Ordering;

use crate::cpu::{DISPATCHED, Family, Features, SimdLevel};
use crate::matmul::{QuantMatrix, matmul};
use crate::ops::{self, HeadShape, KvArena, KvPages, KvType, PageTable, Rope, RopeAngles, RopeKind, noise};
use crate::pool::ThreadPool;
use crate::quant::DType;
use crate::quant::tests::{Rng, random_weights};

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
            .args(["--exact", "dispatch_tests::dispatch_in_this_process", "--nocapture", "--test-threads=1"])
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
