//! The CUDA backend against the CPU backend, operation by operation, on
//! random inputs, and its own batch invariance. Compiled always; without a
//! GPU (or without NVRTC) each test says why it is skipped and passes.
//!
//! Tolerances, relative to the largest magnitude of the CPU's result:
//! element-wise steps and norms 1e-5 (f32 both sides, orders differ);
//! matrix products 3e-2 (the CPU quantizes activations to 8 bits per
//! block, the GPU's decode kernel keeps them f32 and its prefill kernel
//! rounds both operands to f16); attention 1e-2 (f16 cache both sides, the
//! CPU with f16 running sums as llama.cpp has them).

use std::sync::Arc;

use super::super::{
    Backend, CpuBackend, Embed, KvShape, KvTypes, LowRankSource, LowRankTerm, MatrixSource, PassLayout, PassRow,
    PassSequence, SharedBytes,
};
use super::{CudaBackend, CudaPass, CudaRows, KernelCache, Nvrtc, library_from_env};
use crate::ops::{HeadShape, KvType, Rope, RopeKind, Scores, noise};
use crate::quant::DType;
use crate::quant::tests::{Rng, random_weights};

/// The GPU backend, or `None` after saying why the test is skipped
/// (`SLUICE_REQUIRE_GPU` makes that a failure: `cargo xtask device-check`
/// sets it, so that a GPU machine never passes by skipping).
fn gpu(test: &str) -> Option<CudaBackend> {
    let skip = |why: String| {
        assert!(std::env::var_os("SLUICE_REQUIRE_GPU").is_none(), "{test} needs the GPU: {why}");
        eprintln!("skipped {test}: {why}");
        None
    };
    let nvrtc = match Nvrtc::load(library_from_env().as_deref()) {
        Ok(nvrtc) => nvrtc,
        Err(error) => return skip(error.to_string()),
    };
    if let Err(why) = super::probe(0) {
        return skip(why);
    }
    let cache = KernelCache::new(std::env::temp_dir().join("sluice-parity-kernels"));
    match CudaBackend::new(0, &nvrtc, &cache, |line| eprintln!("{line}")) {
        Ok(backend) => Some(backend),
        Err(error) => skip(error.to_string()),
    }
}

fn assert_close(what: &str, gpu: &[f32], cpu: &[f32], tolerance: f32) {
    assert_eq!(gpu.len(), cpu.len(), "{what}: lengths");
    let scale = cpu.iter().fold(1e-6f32, |top, value| top.max(value.abs()));
    let (at, worst) = gpu
        .iter()
        .zip(cpu)
        .map(|(g, c)| (g - c).abs())
        .enumerate()
        .fold((0, 0.0f32), |(at, worst), (i, diff)| if diff > worst { (i, diff) } else { (at, worst) });
    assert!(worst <= tolerance * scale, "{what}: |gpu - cpu| = {worst} at {at} (scale {scale}, tolerance {tolerance})");
}

fn rows<B: Backend>(backend: &B, values: &[f32]) -> B::Rows {
    let mut rows = B::Rows::default();
    backend.upload(values, &mut rows).expect("upload");
    rows
}

fn matrix<B: Backend>(backend: &B, dtype: DType, bytes: &[u8], n_out: usize, n_in: usize) -> B::Matrix {
    let owner: Arc<dyn AsRef<[u8]> + Send + Sync> = Arc::new(bytes.to_vec());
    let bytes = SharedBytes::new(owner, 0..bytes.len()).expect("whole range");
    backend.matrix(MatrixSource { dtype, bytes, n_out, n_in }).expect("matrix")
}

#[test]
fn row_operations_match_the_cpu() {
    let Some(gpu) = gpu("row_operations_match_the_cpu") else { return };
    let cpu = CpuBackend::new(2);
    let (width, n) = (96, 5);
    let x = noise(n * width, 1, 2.0);
    let y = noise(n * width, 2, 2.0);
    let weight = noise(width, 3, 1.0);
    fn run<B: Backend>(b: &B, x: &[f32], y: &[f32], weight: &[f32], width: usize) -> Vec<Vec<f32>> {
        let (xs, ys, w) = (rows(b, x), rows(b, y), b.vector(weight).expect("vector"));
        let mut out = B::Rows::default();
        let mut results = Vec::new();
        b.rms_norm(&xs, &w, 1e-5, &mut out);
        results.push(b.download(&out).expect("download"));
        let mut heads = rows(b, x);
        let head_weight = b.vector(&weight[..32]).expect("vector");
        b.rms_norm_in_place(&mut heads, &head_weight, 1e-6);
        results.push(b.download(&heads).expect("download"));
        b.swiglu(&xs, &ys, &mut out);
        results.push(b.download(&out).expect("download"));
        let mut sum = rows(b, x);
        b.add(&mut sum, &ys);
        b.add_bias(&mut sum, &w);
        results.push(b.download(&sum).expect("download"));
        b.gather(&xs, &[4, 0, 2], width, &mut out);
        results.push(b.download(&out).expect("download"));
        results
    }
    let names = ["rms_norm", "rms_norm_in_place", "swiglu", "add + add_bias", "gather"];
    for ((name, g), c) in names.iter().zip(run(&gpu, &x, &y, &weight, width)).zip(run(&cpu, &x, &y, &weight, width)) {
        assert_close(name, &g, &c, 1e-5);
    }
}

#[test]
fn matrix_products_of_every_format_match_the_cpu_and_do_not_depend_on_the_batch() {
    let Some(gpu) = gpu("matrix_products…") else { return };
    let cpu = CpuBackend::new(2);
    let mut rng = Rng::new(7);
    let (n_in, n_out) = (512, 160);
    for dtype in DType::ALL {
        let bytes: Vec<u8> = (0..n_out).flat_map(|_| random_weights(&mut rng, dtype, n_in)).collect();
        let (w_gpu, w_cpu) = (matrix(&gpu, dtype, &bytes, n_out, n_in), matrix(&cpu, dtype, &bytes, n_out, n_in));
        for m in [1, 3, 8, 70] {
            let x = noise(m * n_in, 11 + m as u64, 1.0);
            let mut out = Default::default();
            gpu.matmul(&w_gpu, &rows(&gpu, &x), m, &mut out);
            let g = gpu.download(&out).expect("download");
            let mut cpu_out = Vec::new();
            cpu.matmul(&w_cpu, &rows(&cpu, &x), m, &mut cpu_out);
            assert_close(&format!("{} m={m}", dtype.name()), &g, &cpu_out, 3e-2);
            // The first row alone, by the same kernel (m ≤ 8) — or the
            // first 64 rows, one tile of the prefill kernel — give the
            // same bits as within the batch.
            // cuBLAS (f16/bf16 weights past 8 rows, where it is present)
            // chooses its algorithm by shape and promises no such thing.
            if m > super::MATVEC_ROWS && gpu.uses_blas() && matches!(dtype, DType::F16 | DType::BF16) {
                continue;
            }
            let part = if m <= super::MATVEC_ROWS { 1 } else { 64 };
            gpu.matmul(&w_gpu, &rows(&gpu, &x[..part * n_in]), part, &mut out);
            let alone = gpu.download(&out).expect("download");
            assert_eq!(alone, g[..part * n_out], "{} m={m}: rows depend on the batch", dtype.name());
        }
    }
}

#[test]
fn embeddings_argmax_and_top_k_match_the_cpu_and_a_sort() {
    let Some(gpu) = gpu("embeddings_argmax_and_top_k…") else { return };
    let cpu = CpuBackend::new(1);
    let mut rng = Rng::new(3);
    let (width, vocab) = (256, 40);
    for dtype in DType::ALL {
        let bytes: Vec<u8> = (0..vocab).flat_map(|_| random_weights(&mut rng, dtype, width)).collect();
        let given = noise(width, 5, 1.0);
        let inputs = [Embed::Token(39), Embed::Values(&given), Embed::Token(0)];
        let mut out = Default::default();
        gpu.embed(Some(&matrix(&gpu, dtype, &bytes, vocab, width)), &inputs, width, &mut out).expect("embed");
        let mut cpu_out = Vec::new();
        cpu.embed(Some(&matrix(&cpu, dtype, &bytes, vocab, width)), &inputs, width, &mut cpu_out).expect("embed");
        // Dequantization is exact in f32 on both.
        assert_eq!(gpu.download(&out).expect("download"), cpu_out, "{}", dtype.name());
    }
    let logits = noise(3 * 1000, 9, 4.0);
    let expected: Vec<u32> = logits
        .chunks_exact(1000)
        .map(|row| row.iter().enumerate().fold(0, |best, (i, &v)| if v > row[best] { i } else { best }) as u32)
        .collect();
    assert_eq!(gpu.argmax(&rows(&gpu, &logits), 1000).expect("argmax"), expected);
    let top = gpu.top_k(&rows(&gpu, &logits), 1000, 40).expect("top_k");
    for (row, picked) in logits.chunks_exact(1000).zip(top) {
        let mut sorted: Vec<(u32, f32)> = row.iter().enumerate().map(|(i, &v)| (i as u32, v)).collect();
        sorted.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        assert_eq!(picked, sorted[..40]);
    }
}

/// Rows of one sequence written to the KV store and attended, on both
/// backends, for each type pair and way of scoring (plain; Gemma's sliding
/// windows, one narrower than a prompt tile and one the decode kernel
/// splits, and soft-capping): a prompt of `n` rows, then one decoding row
/// at `n` that sees everything (its window of it).
#[test]
fn kv_writes_rope_and_attention_match_the_cpu() {
    let Some(gpu) = gpu("kv_writes_rope_and_attention…") else { return };
    let cpu = CpuBackend::new(2);
    let (n_head, n_kv_head, head_dim) = (8, 2, 64);
    let heads = HeadShape::new(n_head, n_kv_head, head_dim).expect("heads");
    let rope = Rope::new(head_dim, head_dim, 10000.0, 1.0, RopeKind::Neox).expect("rope");
    let scorings = [
        Scores::scaled(0.125),
        Scores { softcap: Some(2.0), window: Some(24), ..Scores::scaled(0.125) },
        Scores { window: Some(700), ..Scores::scaled(0.125) },
    ];
    for (types, scores) in [KvType::F16, KvType::Q8_0]
        .into_iter()
        .flat_map(|k| scorings.map(|scores| (KvTypes { k, v: KvType::F16 }, scores)))
    {
        for n in [40, 1300] {
            let shape =
                KvShape { n_layer: 1, kv_dim: n_kv_head * head_dim, head_dim, n_blocks: 100, block_tokens: 16, types };
            let blocks: Vec<u32> = (0..shape.n_blocks as u32).rev().collect();
            #[allow(clippy::too_many_arguments)]
            fn pass<B: Backend>(
                b: &B,
                kv: &mut B::Kv,
                rope: &Rope,
                heads: HeadShape,
                blocks: &[u32],
                shape: KvShape,
                scores: Scores,
                first: usize,
                n: usize,
            ) -> Vec<f32> {
                let layout_rows: Vec<PassRow> = (first..first + n)
                    .map(|i| PassRow {
                        pos: Rope::text_pos(i as u32),
                        slot: shape.slot(blocks, i).expect("in the table"),
                        seq: 0,
                        visible: i + 1,
                    })
                    .collect();
                let sequences = [PassSequence { blocks, hidden: &[] }];
                let mut prepared = B::Pass::default();
                b.prepare(rope, &PassLayout { rows: &layout_rows, sequences: &sequences }, &mut prepared)
                    .expect("prepare");
                let mut q = rows(b, &noise(n * heads.q_len(), 20 + first as u64, 1.0));
                let mut k = rows(b, &noise(n * heads.kv_len(), 21 + first as u64, 1.0));
                let v = rows(b, &noise(n * heads.kv_len(), 22 + first as u64, 1.0));
                b.rope(rope, &prepared, &mut q);
                b.rope(rope, &prepared, &mut k);
                b.store_kv(kv, 0, &k, &v, &prepared);
                let mut out = B::Rows::default();
                b.attend(kv, 0, &q, &prepared, heads, scores, &mut out).expect("attend");
                b.download(&out).expect("download")
            }
            let mut kv_gpu = gpu.kv(shape).expect("kv");
            let mut kv_cpu = cpu.kv(shape).expect("kv");
            let prompt = [
                pass(&gpu, &mut kv_gpu, &rope, heads, &blocks, shape, scores, 0, n),
                pass(&cpu, &mut kv_cpu, &rope, heads, &blocks, shape, scores, 0, n),
            ];
            assert_close(&format!("{types:?} {scores:?}, prompt of {n}"), &prompt[0], &prompt[1], 1e-2);
            let decode = [
                pass(&gpu, &mut kv_gpu, &rope, heads, &blocks, shape, scores, n, 1),
                pass(&cpu, &mut kv_cpu, &rope, heads, &blocks, shape, scores, n, 1),
            ];
            assert_close(&format!("{types:?} {scores:?}, decode after {n}"), &decode[0], &decode[1], 1e-2);
            // The store holds what the CPU's holds, bit for bit (f16
            // rounding and Q8_0 quantization are exact on both).
            for block in [blocks[0], blocks[1]] {
                assert_eq!(gpu.read_kv_block(&kv_gpu, block).ok(), cpu.read_kv_block(&kv_cpu, block).ok());
            }
        }
    }
}

#[test]
fn low_rank_deltas_match_the_cpu() {
    let Some(gpu) = gpu("low_rank_deltas…") else { return };
    let cpu = CpuBackend::new(1);
    let (rank, n_in, n_out, n) = (8, 128, 96, 4);
    let source = LowRankSource { a: noise(rank * n_in, 1, 0.5), b: noise(n_out * rank, 2, 0.5), rank, n_in, n_out };
    let x = noise(n * n_in, 3, 1.0);
    let base = noise(n * n_out, 4, 1.0);
    fn run<B: Backend>(b: &B, source: &LowRankSource, x: &[f32], base: &[f32]) -> Vec<f32> {
        let factors = b.low_rank(source.clone()).expect("factors");
        let mut out = rows(b, base);
        let listed = [(3, 0.5), (0, 2.0)];
        b.add_low_rank(&rows(b, x), &[LowRankTerm { factors: &factors, rows: &listed }], &mut out);
        b.download(&out).expect("download")
    }
    assert_close("lora", &run(&gpu, &source, &x, &base), &run(&cpu, &source, &x, &base), 1e-5);
}

/// Decode steps whose layers are recorded as CUDA graphs (from the second
/// step of a pass on: a plain run, a fresh record, then updates) give the
/// bits of the same steps launched one by one, including a step whose
/// record ends early because a buffer has to grow inside it.
#[test]
fn decode_layers_recorded_as_graphs_compute_what_launches_compute() {
    let Some(gpu) = gpu("decode_layers_recorded_as_graphs…") else { return };
    let (n_head, n_kv_head, head_dim) = (4, 2, 64);
    let heads = HeadShape::new(n_head, n_kv_head, head_dim).expect("heads");
    let rope = Rope::new(head_dim, head_dim, 10000.0, 1.0, RopeKind::Neox).expect("rope");
    let shape = KvShape {
        n_layer: 2,
        kv_dim: n_kv_head * head_dim,
        head_dim,
        n_blocks: 8,
        block_tokens: 16,
        types: KvTypes::default(),
    };
    let width = heads.q_len();
    let mut rng = Rng::new(3);
    let mut weights = |n_out: usize| {
        let bytes: Vec<u8> = (0..n_out).flat_map(|_| random_weights(&mut rng, DType::Q8_0, width)).collect();
        matrix(&gpu, DType::Q8_0, &bytes, n_out, width)
    };
    let (wq, wk, wv) = (weights(width), weights(heads.kv_len()), weights(heads.kv_len()));
    let norm = gpu.vector(&noise(width, 4, 1.0)).expect("vector");
    let blocks: Vec<u32> = (0..shape.n_blocks as u32).collect();
    let run = |recorded: bool| -> Vec<Vec<f32>> {
        let mut kv = gpu.kv(shape).expect("kv");
        let mut pass = CudaPass::default();
        let (mut x, mut h, mut q, mut k, mut v, mut attn) = Default::default();
        let mut steps = Vec::new();
        for step in 0..6usize {
            let n = if step == 4 { 3 } else { 2 };
            let layout_rows: Vec<PassRow> = (0..n)
                .map(|i| PassRow {
                    pos: Rope::text_pos((step * 3 + i) as u32),
                    slot: shape.slot(&blocks, step * 3 + i).expect("in the table"),
                    seq: 0,
                    visible: step * 3 + i + 1,
                })
                .collect();
            let sequences = [PassSequence { blocks: &blocks, hidden: &[] }];
            gpu.prepare(&rope, &PassLayout { rows: &layout_rows, sequences: &sequences }, &mut pass).expect("prepare");
            gpu.upload(&noise(n * width, 30 + step as u64, 1.0), &mut x).expect("upload");
            if step == 5 {
                // A buffer that first grows in attention, after a few
                // recorded launches: the record ends there.
                attn = CudaRows::default();
            }
            if recorded {
                gpu.begin_layers(&pass);
            }
            for layer in 0..shape.n_layer {
                gpu.rms_norm(&x, &norm, 1e-5, &mut h);
                gpu.matmuls(&h, n, &mut [(&wq, &mut q), (&wk, &mut k), (&wv, &mut v)]);
                gpu.rope(&rope, &pass, &mut q);
                gpu.rope(&rope, &pass, &mut k);
                gpu.store_kv(&mut kv, layer, &k, &v, &pass);
                gpu.attend(&kv, layer, &q, &pass, heads, Scores::scaled(0.125), &mut attn).expect("attend");
                gpu.add(&mut x, &attn);
            }
            if recorded {
                gpu.end_layers(&pass).expect("end");
            }
            steps.push(gpu.download(&x).expect("download"));
        }
        steps
    };
    let launched = gpu.graphs_launched();
    assert_eq!(run(true), run(false));
    assert!(gpu.graphs_enabled(), "a graph call failed and turned graphs off");
    // Steps 1, 2, 3 and 5 are recorded (0 and 4 are their buckets' first).
    assert_eq!(gpu.graphs_launched() - launched, 4, "graphs submitted");
}
