//! Products of float weight matrices with a whole batch of activation rows
//! at once (an image's patches through a vision tower).
//!
//! [`crate::matmul`] keeps every row's bits equal to its single-row dot,
//! whose lanes sum k in interleaved partial sums: the text model needs that
//! for batch invariance. A vision tower multiplies an image's rows together
//! every time and needs no such match, so here every output element is the
//! plain sequence of fused multiply-adds `acc = x[k]·w[k] + acc` for k = 0,
//! 1, 2, … from zero. That order is a function of nothing but the two rows,
//! so the result has the same bits on every SIMD level, for any batch,
//! blocking or thread count, and it lets a kernel keep a tile of outputs in
//! registers while k streams past: one activation broadcast against a
//! vector of weight columns packed for it (an outer product), instead of a
//! dot tile that reduces lanes and is bound by how fast rows stream from L2.
//!
//! The same kernels serve attention's products (`multiply`), whose
//! operands are packed once per head (`Grouped`, `Packed`) or read in
//! place (`Lhs::transposed`).

mod kernel;
mod operands;

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};

pub(crate) use kernel::Kernel;
use kernel::Out;
pub(crate) use operands::{Grouped, Lhs, Packed};

use crate::matmul::{QuantMatrix, act_block_bytes};
use crate::pool::ThreadPool;
use crate::quant::DType;

/// k per pass: a packed panel of `KC × nr` weights (32 KiB at AVX-512's
/// 32 columns) stays in L1 while every activation row passes over it.
const KC: usize = 256;

/// Whether [`gemm`] multiplies matrices of this type: the float types,
/// whose elements are read one by one into the packed panels.
pub fn supports(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::F16 | DType::BF16)
}

/// `out[i][j] = Σ_k x[i][k] · weights[j][k]` for the `m` rows of `x`
/// (`m × n_in`, row-major) into `out` (`m × n_out`), each element summed in
/// order of k with fused multiply-adds (see the module's docs).
///
/// Threads claim panels of weight columns (or parts of a panel's rows,
/// when panels are few for the threads), pack each (converting f16 and
/// bf16 to f32) and pass the activation rows over it. Panics
/// if the type is not one [`supports`] names or a length is wrong.
pub fn gemm(weights: &QuantMatrix, x: &[f32], m: usize, out: &mut [f32], pool: &ThreadPool) {
    let (n_in, n_out) = (weights.n_in(), weights.n_out());
    assert!(supports(weights.dtype()), "gemm multiplies float matrices, not {}", weights.dtype().name());
    assert_eq!(Some(x.len()), m.checked_mul(n_in), "activations: {m} rows of {n_in}");
    assert_eq!(Some(out.len()), m.checked_mul(n_out), "outputs: {m} rows of {n_out}");
    if n_in == 0 {
        out.fill(0.0);
        return;
    }
    let kernel = Kernel::current();
    let n_panels = n_out.div_ceil(kernel.nr);
    // Rows per block: the block's KC-wide slice of activations fills the
    // share of L2 the matmul's activation blocks take.
    let block_rows = (act_block_bytes() / (KC * 4)).max(kernel.mr).next_multiple_of(kernel.mr);
    let groups = Grouped::in_parallel(kernel, x, m, n_in, pool);
    let lhs = groups.lhs();
    let target = Out { ptr: out.as_mut_ptr(), ld: n_out };
    let mut rows = 0;
    while rows < m {
        let block = rows..(rows + block_rows).min(m);
        // Few panels for many threads (a 1280-wide matrix has 40 at
        // AVX-512): each panel's rows are cut into parts, so that every
        // thread has work to claim; a part packs its panel itself.
        let n_groups = block.len().div_ceil(kernel.mr);
        let parts = (2 * pool.n_threads()).div_ceil(n_panels).clamp(1, n_groups);
        let groups_per_part = n_groups.div_ceil(parts);
        let mut k = 0;
        while k < n_in {
            let ks = k..(k + KC).min(n_in);
            let next = AtomicUsize::new(0);
            pool.run(|_, _| {
                let (mut panel, mut c) = (vec![0.0; KC * kernel.nr], vec![0.0; kernel.mr * kernel.nr]);
                loop {
                    let item = next.fetch_add(1, Ordering::Relaxed);
                    if item >= n_panels * parts {
                        break;
                    }
                    let (p, part) = (item / parts, item % parts);
                    let cols = p * kernel.nr..((p + 1) * kernel.nr).min(n_out);
                    pack(weights, cols.clone(), ks.clone(), kernel.nr, &mut panel);
                    let first = block.start + part * groups_per_part * kernel.mr;
                    let end = (first + groups_per_part * kernel.mr).min(block.end);
                    for first_row in (first..end).step_by(kernel.mr) {
                        let tile_rows = first_row..(first_row + kernel.mr).min(end);
                        let xs = (lhs.values(first_row, &ks), lhs.k_stride());
                        // SAFETY: `target` is `out`, which holds `m × n_out`
                        // elements and outlives the run; this thread alone
                        // writes the rows and columns of the item it
                        // claimed, and the runs of the blocks and k ranges
                        // follow one another.
                        unsafe { kernel.tile(xs, tile_rows, ks.clone(), &cols, &panel, &target, &mut c) };
                    }
                }
            });
            k = ks.end;
        }
        rows = block.end;
    }
}

/// Copies `weights[cols][ks]` into `panel` as `ks.len()` rows of `nr`
/// columns, zeros past the matrix's last column.
fn pack(weights: &QuantMatrix, cols: Range<usize>, ks: Range<usize>, nr: usize, panel: &mut [f32]) {
    let kc = ks.len();
    if cols.len() < nr {
        panel[..kc * nr].fill(0.0);
    }
    let width = weights.dtype().block_bytes();
    for (j, col) in cols.enumerate() {
        let bytes = &weights.row(col)[ks.start * width..ks.end * width];
        let dst = panel[j..].iter_mut().step_by(nr);
        match weights.dtype() {
            DType::F16 => {
                bytes.chunks_exact(2).zip(dst).for_each(|(b, d)| *d = half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            }
            DType::BF16 => {
                bytes.chunks_exact(2).zip(dst).for_each(|(b, d)| *d = half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
            }
            _ => bytes.chunks_exact(4).zip(dst).for_each(|(b, d)| *d = f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        }
    }
}

/// `out[i][j] = Σ_k a[i][k] · b[k][j]` for the `a`'s rows and `b`'s
/// columns, into `out` at a stride of `ldo`, each element summed as
/// [`gemm`] sums it, on the calling thread. Panics if the operands were
/// packed for different kernels or differ in k, or if `out` cannot hold the
/// rows at that stride.
pub(crate) fn multiply(a: &Lhs<'_>, b: &Packed, out: &mut [f32], ldo: usize) {
    let (kernel, m, k) = (b.kernel, a.m(), b.k);
    assert!(a.mr() == kernel.mr && a.k() == k, "operands packed for one kernel, over one k");
    let needed = m.saturating_sub(1).checked_mul(ldo).and_then(|len| len.checked_add(b.n));
    assert!(
        ldo >= b.n && needed.is_some_and(|needed| out.len() >= needed),
        "out: {m} rows of {} at a stride of {ldo}",
        b.n
    );
    if m == 0 || b.n == 0 {
        return;
    }
    if k == 0 {
        out.chunks_mut(ldo).take(m).for_each(|row| row[..b.n].fill(0.0));
        return;
    }
    let target = Out { ptr: out.as_mut_ptr(), ld: ldo };
    let mut c = vec![0.0; kernel.mr * kernel.nr];
    for start in (0..k).step_by(KC) {
        let ks = start..(start + KC).min(k);
        for (p, panel) in b.data.chunks_exact(k * kernel.nr).enumerate() {
            let cols = p * kernel.nr..((p + 1) * kernel.nr).min(b.n);
            let panel = &panel[ks.start * kernel.nr..ks.end * kernel.nr];
            for first_row in (0..m).step_by(kernel.mr) {
                let rows = first_row..(first_row + kernel.mr).min(m);
                let xs = (a.values(first_row, &ks), a.k_stride());
                // SAFETY: `out` holds `m` rows at stride `ldo` of at least
                // `b.n` columns (asserted above) and is borrowed mutably
                // for the whole call.
                unsafe { kernel.tile(xs, rows, ks.clone(), &cols, panel, &target, &mut c) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::same_on_every_level;

    /// Deterministic values of mixed sign and magnitude.
    fn values(n: usize, seed: u32) -> Vec<f32> {
        let mut state = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
        (0..n)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 17;
                state ^= state << 5;
                (state % 20_001) as f32 / 10_000.0 - 1.0
            })
            .collect()
    }

    fn encode(dtype: DType, values: &[f32]) -> Vec<u8> {
        values
            .iter()
            .flat_map(|&v| match dtype {
                DType::F16 => half::f16::from_f32(v).to_le_bytes().to_vec(),
                DType::BF16 => half::bf16::from_f32(v).to_le_bytes().to_vec(),
                _ => v.to_le_bytes().to_vec(),
            })
            .collect()
    }

    fn bits(values: &[f32]) -> Vec<u32> {
        values.iter().map(|v| v.to_bits()).collect()
    }

    /// Each element as one in-order chain of fused multiply-adds, from the
    /// weights as the matrix decodes them.
    fn reference(w: &QuantMatrix, x: &[f32], m: usize) -> Vec<f32> {
        let (n_in, n_out) = (w.n_in(), w.n_out());
        let mut row = vec![0.0; n_in];
        let mut out = vec![0.0; m * n_out];
        for j in 0..n_out {
            w.dequantize_row(j, &mut row);
            for i in 0..m {
                out[i * n_out + j] =
                    x[i * n_in..(i + 1) * n_in].iter().zip(&row).fold(0.0f32, |acc, (a, b)| a.mul_add(*b, acc));
            }
        }
        out
    }

    #[test]
    fn every_element_is_the_in_order_fused_sum_on_every_level_and_thread_count() {
        // Rows and columns off every tile size, k across several passes and
        // a partial one.
        for (dtype, m, n_in, n_out) in
            [(DType::F32, 13, 600, 70), (DType::F16, 25, 37, 33), (DType::BF16, 7, 257, 45), (DType::F32, 1, 5, 1)]
        {
            let bytes = encode(dtype, &values(n_out * n_in, 1));
            let w = QuantMatrix::new(dtype, &bytes, n_out, n_in).expect("a whole matrix");
            let x = values(m * n_in, 2);
            let want = reference(&w, &x, m);
            for threads in [1, 3, 8] {
                let pool = ThreadPool::new(threads);
                let got = same_on_every_level(|| {
                    let mut out = vec![f32::NAN; m * n_out];
                    gemm(&w, &x, m, &mut out, &pool);
                    out
                });
                assert_eq!(bits(&got), bits(&want), "{dtype:?} {m}×{n_in}×{n_out} on {threads} threads");
            }
        }
    }

    #[test]
    fn a_row_alone_gets_the_bits_it_gets_among_others() {
        let (m, n_in, n_out) = (30, 300, 40);
        let bytes = encode(DType::F32, &values(n_out * n_in, 3));
        let w = QuantMatrix::new(DType::F32, &bytes, n_out, n_in).expect("a whole matrix");
        let x = values(m * n_in, 4);
        let pool = ThreadPool::new(2);
        let mut all = vec![0.0; m * n_out];
        gemm(&w, &x, m, &mut all, &pool);
        for i in [0, 13, 29] {
            let mut one = vec![0.0; n_out];
            gemm(&w, &x[i * n_in..(i + 1) * n_in], 1, &mut one, &pool);
            assert_eq!(one, all[i * n_out..(i + 1) * n_out]);
        }
    }

    #[test]
    fn products_of_packed_operands_are_the_in_order_fused_sums_on_every_level() {
        // k across a whole pass and a partial one; rows and columns off every
        // tile size; the output at a stride wider than its columns.
        let (m, k, n, ldo) = (29, 300, 37, 40);
        let (a, b) = (values(m * k, 5), values(k * n, 6));
        let want: Vec<f32> =
            (0..m * n).map(|e| (0..k).fold(0.0f32, |acc, t| a[e / n * k + t].mul_add(b[t * n + e % n], acc))).collect();
        let b_columns: Vec<f32> = (0..n * k).map(|e| b[e % k * n + e / k]).collect();
        // `a` stored transposed: k rows of 48 (room for whole groups of 29).
        let a_transposed: Vec<f32> =
            (0..k * 48).map(|e| if e % 48 < m { a[e % 48 * k + e / 48] } else { 0.0 }).collect();
        let got = same_on_every_level(|| {
            let kernel = Kernel::current();
            let grouped = Grouped::new(kernel, m, k, |i| &a[i * k..][..k]);
            let columns = Packed::from_columns(kernel, k, n, |j| &b_columns[j * k..][..k]);
            let mut strided = vec![f32::NAN; m * ldo];
            multiply(&grouped.lhs(), &columns, &mut strided, ldo);
            let rows = Packed::from_rows(kernel, k, n, |t| &b[t * n..][..n]);
            let mut out = vec![f32::NAN; m * n];
            multiply(&Lhs::transposed(kernel, &a_transposed, m, k, 48), &rows, &mut out, n);
            let compact: Vec<f32> = strided.chunks(ldo).flat_map(|row| &row[..n]).copied().collect();
            assert_eq!(bits(&compact), bits(&out), "the two layouts of each operand");
            out
        });
        assert_eq!(bits(&got), bits(&want));
        let kernel = Kernel::current();
        let mut zeros = vec![1.0; 6];
        multiply(&Grouped::new(kernel, 2, 0, |_| &[]).lhs(), &Packed::from_rows(kernel, 0, 3, |_| &[]), &mut zeros, 3);
        assert_eq!(zeros, vec![0.0; 6], "k = 0");
    }

    #[test]
    fn empty_inner_dimension_gives_zeros_and_quantized_types_are_not_supported() {
        let w = QuantMatrix::new(DType::F32, &[], 3, 0).expect("an empty matrix");
        let mut out = vec![1.0; 6];
        gemm(&w, &[], 2, &mut out, &ThreadPool::new(1));
        assert_eq!(out, vec![0.0; 6]);
        assert!(supports(DType::BF16) && !supports(DType::Q8_0));
    }
}
