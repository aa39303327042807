//! Decode-shaped matmuls of the default model (SmolLM2-135M: 576-wide,
//! FFN 1536, Q4_1 weights, a 49152-row Q8_0 output matrix), prompt- and
//! decode-shaped matmuls of the 1B shape's FFN in the formats of K-quant
//! files, and the thread pool's dispatch cost.

use divan::{Bencher, black_box};
use half::f16;
use sluice_kernels::matmul::{QuantMatrix, matmul};
use sluice_kernels::pool::ThreadPool;
use sluice_kernels::quant::DType;

fn main() {
    divan::main();
}

/// Random quants with small finite scales in the first two f16 slots of
/// every block (Q4_1's d and m; Q8_0's d and its first two quants).
fn random_matrix(dtype: DType, n_out: usize, n_in: usize) -> Vec<u8> {
    let len = dtype.row_bytes(n_in).expect("whole blocks") * n_out;
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut data: Vec<u8> = (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    for block in data.chunks_exact_mut(dtype.block_bytes()) {
        block[..2].copy_from_slice(&f16::from_f32(0.01).to_le_bytes());
        block[2..4].copy_from_slice(&f16::from_f32(-0.05).to_le_bytes());
    }
    data
}

fn bench_matmul(bencher: Bencher, dtype: DType, n_out: usize, n_in: usize, m: usize, threads: usize) {
    let data = random_matrix(dtype, n_out, n_in);
    let w = QuantMatrix::new(dtype, &data, n_out, n_in).expect("consistent shapes");
    let pool = ThreadPool::new(threads);
    // As the CPU backend loads it: packed where the kernels have a layout.
    let packed = w.pack(&pool);
    let w = packed.as_ref().map_or(Ok(w), |packed| w.with_packed(packed)).expect("packed from these bytes");
    let x: Vec<f32> = (0..m * n_in).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
    let mut out = vec![0.0; m * n_out];
    bencher.bench_local(|| matmul(&w, black_box(&x), m, &mut out, &pool));
}

#[divan::bench(args = [1, 2])]
fn matvec_q4_1_1536x576(bencher: Bencher, threads: usize) {
    bench_matmul(bencher, DType::Q4_1, 1536, 576, 1, threads);
}

#[divan::bench(args = [1, 2])]
fn matvec_q4_1_576x1536(bencher: Bencher, threads: usize) {
    bench_matmul(bencher, DType::Q4_1, 576, 1536, 1, threads);
}

#[divan::bench(args = [1, 2])]
fn matvec_q8_0_49152x576(bencher: Bencher, threads: usize) {
    bench_matmul(bencher, DType::Q8_0, 49152, 576, 1, threads);
}

#[divan::bench(args = [1, 2])]
fn prefill64_q4_1_1536x576(bencher: Bencher, threads: usize) {
    bench_matmul(bencher, DType::Q4_1, 1536, 576, 64, threads);
}

/// Prefill-shaped: 64 activation rows over a weight matrix of each format
/// (the 1B shape's 2048 × 2048 for the K-quants), one thread.
#[divan::bench(args = [
    DType::Q4_1, DType::Q8_0, DType::Q5_0, DType::Q4_K, DType::Q6_K, DType::IQ4_NL, DType::IQ4_XS, DType::MXFP4,
])]
fn prefill64_1_thread(bencher: Bencher, dtype: DType) {
    let n = if dtype.block_elems() == 256 { 2048 } else { 576 };
    bench_matmul(bencher, dtype, 2048, n, 64, 1);
}

#[divan::bench(args = [2])]
fn pool_dispatch(bencher: Bencher, threads: usize) {
    let pool = ThreadPool::new(threads);
    bencher.bench_local(|| {
        pool.run(|index, n| {
            black_box((index, n));
        })
    });
}

/// One dot of a 576-wide row, cache-resident: the kernel's own speed.
#[divan::bench(args = [DType::Q4_1, DType::Q8_0, DType::Q4_K, DType::Q6_K, DType::IQ4_NL, DType::IQ4_XS, DType::MXFP4, DType::Q2_K, DType::Q3_K])]
fn vec_dot_576(bencher: Bencher, dtype: DType) {
    let n = if dtype.block_elems() == 256 { 512 } else { 576 };
    let w = random_matrix(dtype, 1, n);
    let x: Vec<f32> = (0..n).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
    let mut a = vec![0u8; dtype.act_format().row_bytes(n).expect("whole blocks")];
    sluice_kernels::quant::quantize_act_row(dtype.act_format(), &x, &mut a).expect("valid lengths");
    bencher.bench_local(|| sluice_kernels::quant::vec_dot(dtype, black_box(&w), black_box(&a), n));
}

/// One decode step's worth of weights streamed from memory: the default
/// model's 66 MB of Q4_1 layers (as one matrix) and its 30 MB Q8_0 output
/// matrix, too much for the caches to keep between steps.
#[divan::bench(args = [2])]
fn matvec_decode_step_weights(bencher: Bencher, threads: usize) {
    let layers = random_matrix(DType::Q4_1, 183_000, 576);
    let output = random_matrix(DType::Q8_0, 49152, 576);
    let layers = QuantMatrix::new(DType::Q4_1, &layers, 183_000, 576).expect("consistent shapes");
    let output = QuantMatrix::new(DType::Q8_0, &output, 49152, 576).expect("consistent shapes");
    let x: Vec<f32> = (0..576).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
    let (mut hidden, mut logits) = (vec![0.0; 183_000], vec![0.0; 49152]);
    let pool = ThreadPool::new(threads);
    bencher.bench_local(|| {
        matmul(&layers, black_box(&x), 1, &mut hidden, &pool);
        matmul(&output, black_box(&x), 1, &mut logits, &pool);
    });
}

/// `n` cached positions of SmolLM2's 3 KV heads of 64, as f16 and as Q8_0.
struct Cache {
    f16: (Vec<f16>, Vec<f16>),
    q8_0: (Vec<u8>, Vec<u8>),
    pages: Vec<u32>,
}

impl Cache {
    fn new(shape: sluice_kernels::ops::HeadShape, n: usize) -> Self {
        use sluice_kernels::quant::{ActFormat, quantize_act_row};
        let value = |i: usize| ((i * 7919) % 1000) as f32 / 500.0 - 1.0;
        let (k, v): (Vec<f32>, Vec<f32>) = (0..n * shape.kv_len()).map(|i| (value(i), value(i + 1))).unzip();
        let halves = |x: &[f32]| x.iter().map(|&x| f16::from_f32(x)).collect::<Vec<f16>>();
        let blocks = |x: &[f32]| {
            let mut bytes = vec![0; ActFormat::Q8_0.row_bytes(x.len()).expect("whole blocks")];
            quantize_act_row(ActFormat::Q8_0, x, &mut bytes).expect("valid lengths");
            bytes
        };
        let pages = (0..n.div_ceil(16) as u32).collect();
        Cache { f16: (halves(&k), halves(&v)), q8_0: (blocks(&k), blocks(&v)), pages }
    }

    /// K and V both of `kv_type` (`f16` or `q8_0`).
    fn kv(&self, kv_type: &str) -> sluice_kernels::ops::KvPages<'_> {
        use sluice_kernels::ops::{KvPages, KvRows, PageTable};
        let (k, v) = match kv_type {
            "f16" => (KvRows::F16(&self.f16.0), KvRows::F16(&self.f16.1)),
            _ => (KvRows::Q8_0(&self.q8_0.0), KvRows::Q8_0(&self.q8_0.1)),
        };
        KvPages { k, v, pages: PageTable { blocks: &self.pages, block_tokens: 16 }, hidden: &[] }
    }
}

/// Attention of 64 consecutive query rows (SmolLM2's 9 heads over 3 KV
/// heads of 64) over the 512 cached positions before them, one thread, K
/// and V stored as f16 or as Q8_0.
#[divan::bench(args = ["f16", "q8_0"])]
fn attention_64_rows_at_512(bencher: Bencher, kv_type: &str) {
    use sluice_kernels::ops::{HeadShape, attend_heads};
    let shape = HeadShape::new(9, 3, 64).expect("valid heads");
    let (rows, cached) = (64, 512);
    let cache = Cache::new(shape, cached + rows);
    let kv = cache.kv(kv_type);
    let q: Vec<f32> = (0..rows * shape.q_len()).map(|i| ((i * 31) % 100) as f32 / 50.0 - 1.0).collect();
    let mut out = vec![0.0; q.len()];
    let mut scratch = Vec::new();
    bencher.bench_local(|| {
        for block in (0..rows).step_by(4) {
            let visible: Vec<usize> = (block..block + 4).map(|r| cached + r + 1).collect();
            let range = block * shape.q_len()..(block + 4) * shape.q_len();
            attend_heads(black_box(&q[range.clone()]), kv, &visible, shape, 0..3, 0.125, &mut out[range], &mut scratch)
                .expect("valid attention");
        }
    });
}

/// One decoding row over 2048 cached positions, one thread (`tg` at depth
/// 2048), K and V stored as f16 or as Q8_0.
#[divan::bench(args = ["f16", "q8_0"])]
fn attention_1_row_at_2048(bencher: Bencher, kv_type: &str) {
    use sluice_kernels::ops::{HeadShape, attend};
    let shape = HeadShape::new(9, 3, 64).expect("valid heads");
    let n = 2048;
    let cache = Cache::new(shape, n);
    let kv = cache.kv(kv_type);
    let q: Vec<f32> = (0..shape.q_len()).map(|i| ((i * 31) % 100) as f32 / 50.0 - 1.0).collect();
    let mut out = vec![0.0; q.len()];
    let mut scratch = Vec::new();
    bencher
        .bench_local(|| attend(black_box(&q), kv, n, shape, 0.125, &mut out, &mut scratch).expect("valid attention"));
}

/// The 1B shape's FFN in a prompt of 512 tokens, one thread: gate (8192 ×
/// 2048) and down (2048 × 8192), whose 512 activation rows do not fit in
/// a core's caches.
#[divan::bench(args = [DType::Q4_K, DType::Q6_K, DType::Q8_0, DType::Q2_K, DType::Q3_K], sample_count = 5, sample_size = 1)]
fn prefill512_gate_1b(bencher: Bencher, dtype: DType) {
    bench_matmul(bencher, dtype, 8192, 2048, 512, 1);
}

#[divan::bench(args = [DType::Q4_K, DType::Q6_K], sample_count = 5, sample_size = 1)]
fn prefill512_down_1b(bencher: Bencher, dtype: DType) {
    bench_matmul(bencher, dtype, 2048, 8192, 512, 1);
}

/// A decode step's gate matrix of the 1B shape, one thread.
#[divan::bench(args = [DType::Q4_K, DType::Q6_K, DType::Q8_0, DType::IQ4_NL, DType::IQ4_XS, DType::MXFP4, DType::Q2_K, DType::Q3_K])]
fn matvec_gate_1b(bencher: Bencher, dtype: DType) {
    bench_matmul(bencher, dtype, 8192, 2048, 1, 1);
}
