//! The operands of [`super`]'s kernels in the layouts they stream: rows in
//! groups of the kernel's `mr`, the `mr` values of one k side by side (one
//! broadcast each), and columns in panels of its `nr`, the `nr` values of
//! one k side by side (whole vector loads).

use std::mem::MaybeUninit;
use std::ops::Range;

use super::kernel::Kernel;
use crate::pool::ThreadPool;

/// The left-hand rows of a product as a kernel reads them: `m` rows of `k`
/// in groups of `mr`, group `g` starting at `g × group_stride`, its
/// values for one k adjacent and the steps of k `k_stride` apart. Rows
/// past `m` in the last group are read but their outputs dropped.
#[derive(Clone, Copy)]
pub(crate) struct Lhs<'a> {
    data: &'a [f32],
    mr: usize,
    m: usize,
    k: usize,
    k_stride: usize,
    group_stride: usize,
}

impl<'a> Lhs<'a> {
    /// The first `m` columns of `data` (`k` rows of `ld`) read in place as
    /// `m` rows of `k`: a matrix stored transposed is already in groups.
    /// Panics unless `ld` leaves room for whole groups (`m` rounded up to
    /// the kernel's rows) and `data` holds `k` rows of it.
    pub(crate) fn transposed(kernel: Kernel, data: &'a [f32], m: usize, k: usize, ld: usize) -> Lhs<'a> {
        let width = m.next_multiple_of(kernel.mr);
        assert!(ld >= width && data.len() >= k.saturating_sub(1) * ld + width, "{k} rows of {ld} holding {m} columns");
        Lhs { data, mr: kernel.mr, m, k, k_stride: ld, group_stride: kernel.mr }
    }

    /// Rows packed by [`pack_groups`] one group after another.
    fn grouped(kernel: Kernel, data: &'a [f32], m: usize, k: usize) -> Lhs<'a> {
        assert!(data.len() >= m.div_ceil(kernel.mr) * kernel.mr * k, "{m} rows of {k} in groups");
        Lhs { data, mr: kernel.mr, m, k, k_stride: kernel.mr, group_stride: kernel.mr * k }
    }

    pub(super) fn mr(&self) -> usize {
        self.mr
    }

    pub(super) fn m(&self) -> usize {
        self.m
    }

    pub(super) fn k(&self) -> usize {
        self.k
    }

    pub(super) fn k_stride(&self) -> usize {
        self.k_stride
    }

    /// The values the group holding `first_row` (a multiple of `mr`) has
    /// over `ks`: `ks.len()` steps of `mr`, `k_stride` apart.
    pub(super) fn values(&self, first_row: usize, ks: &Range<usize>) -> &'a [f32] {
        let at = first_row / self.mr * self.group_stride + ks.start * self.k_stride;
        &self.data[at..at + ks.len().saturating_sub(1) * self.k_stride + self.mr]
    }
}

/// Rows packed into groups once, for a left-hand operand used by many
/// products (the keys a head's queries are scored against).
pub(crate) struct Grouped {
    kernel: Kernel,
    data: Vec<f32>,
    m: usize,
    k: usize,
}

impl Grouped {
    /// Row `i` is `row(i)`'s first `k` values, for `i` in `0..m`.
    pub(crate) fn new<'a>(kernel: Kernel, m: usize, k: usize, row: impl Fn(usize) -> &'a [f32]) -> Grouped {
        Grouped::build(kernel, m, k, |all| pack_groups(kernel.mr, k, 0, all, m, &row))
    }

    /// `x`'s rows (`m` of `k`), packed by the threads of `pool`.
    pub(super) fn in_parallel(kernel: Kernel, x: &[f32], m: usize, k: usize, pool: &ThreadPool) -> Grouped {
        let row = |i: usize| &x[i * k..][..k];
        let mr = kernel.mr;
        // Written once, in parallel, instead of zeroed first on one thread.
        Grouped::build(kernel, m, k, |all| {
            pool.split_mut(all, mr * k, |start, piece| pack_groups(mr, k, start / k, piece, m, &row));
        })
    }

    /// A buffer of whole groups for `m` rows of `k`, which `fill` must
    /// write completely (it is not called when `k` is zero).
    fn build(kernel: Kernel, m: usize, k: usize, fill: impl FnOnce(&mut [MaybeUninit<f32>])) -> Grouped {
        let len = m.div_ceil(kernel.mr) * kernel.mr * k;
        let mut data = Vec::with_capacity(len);
        if k > 0 {
            fill(&mut data.spare_capacity_mut()[..len]);
        }
        // SAFETY: `fill` wrote the first `len` elements (there are none
        // when `k` is zero).
        unsafe { data.set_len(len) };
        Grouped { kernel, data, m, k }
    }

    pub(crate) fn lhs(&self) -> Lhs<'_> {
        Lhs::grouped(self.kernel, &self.data, self.m, self.k)
    }
}

/// Writes whole groups of rows of `k` into `piece`, the first group
/// holding rows from `first_row`: row `i` is `row(i)` below `m`, zeros
/// from `m` on.
fn pack_groups<'a>(
    mr: usize,
    k: usize,
    first_row: usize,
    piece: &mut [MaybeUninit<f32>],
    m: usize,
    row: &impl Fn(usize) -> &'a [f32],
) {
    for (g, group) in piece.chunks_exact_mut(mr * k).enumerate() {
        let first = first_row + g * mr;
        pack_group(|i| (first + i < m).then(|| row(first + i)), mr, group);
    }
}

/// Writes one group: row `i` of the group is `row(i)` for `i` in `0..mr`
/// up to the first `None`, zeros after; every element of `group`
/// (`mr` × k) is written.
fn pack_group<'a>(row: impl Fn(usize) -> Option<&'a [f32]>, mr: usize, group: &mut [MaybeUninit<f32>]) {
    let k = group.len() / mr;
    let mut rows = [&[][..]; MAX_MR];
    let mut present = 0;
    while let Some(values) = (present < mr).then(|| row(present)).flatten() {
        rows[present] = &values[..k];
        present += 1;
    }
    // The kernels' row counts as constants, so that the copies unroll.
    match mr {
        4 => transpose::<4>(&rows[..present], group),
        6 => transpose::<6>(&rows[..present], group),
        12 => transpose::<12>(&rows[..present], group),
        _ => unreachable!("no kernel has {mr} rows"),
    }
}

/// The most rows a kernel's tile has.
const MAX_MR: usize = 12;

/// `group[k][i] = rows[i][k]`, zeros for `i` past the rows given.
fn transpose<const MR: usize>(rows: &[&[f32]], group: &mut [MaybeUninit<f32>]) {
    // Eight k at a time: the reads stay in a line of each row and the
    // writes in a few lines of the group.
    const STEP: usize = 8;
    let mut blocks = group.chunks_exact_mut(STEP * MR);
    let mut steps = 0;
    for (step, block) in blocks.by_ref().enumerate() {
        steps = step + 1;
        for (i, values) in rows.iter().enumerate() {
            let values: &[f32; STEP] = values[step * STEP..][..STEP].try_into().expect("eight values");
            for (t, &value) in values.iter().enumerate() {
                block[t * MR + i].write(value);
            }
        }
        for t in 0..STEP {
            block[t * MR + rows.len()..(t + 1) * MR].iter_mut().for_each(|slot| _ = slot.write(0.0));
        }
    }
    let start = steps * STEP;
    for (t, values) in blocks.into_remainder().chunks_exact_mut(MR).enumerate() {
        for (slot, i) in values.iter_mut().zip(0..) {
            slot.write(rows.get(i).map_or(0.0, |row| row[start + t]));
        }
    }
}

/// A right-hand operand packed once for many products: `k` × `n` in
/// panels of the kernel's `nr` columns, each panel `k` rows of `nr`, zeros
/// past the last column.
pub(crate) struct Packed {
    pub(super) kernel: Kernel,
    pub(super) data: Vec<f32>,
    pub(super) k: usize,
    pub(super) n: usize,
}

impl Packed {
    /// Column `j` is `column(j)`'s first `k` values, for `j` in `0..n`:
    /// the layout of a weight matrix's rows, or of queries.
    pub(crate) fn from_columns<'a>(kernel: Kernel, k: usize, n: usize, column: impl Fn(usize) -> &'a [f32]) -> Packed {
        let mut packed = Packed::zeros(kernel, k, n);
        let nr = kernel.nr;
        if k > 0 {
            for (p, panel) in packed.data.chunks_exact_mut(k * nr).enumerate() {
                for j in p * nr..((p + 1) * nr).min(n) {
                    for (slot, &value) in panel[j - p * nr..].iter_mut().step_by(nr).zip(&column(j)[..k]) {
                        *slot = value;
                    }
                }
            }
        }
        packed
    }

    /// Row `i` is `row(i)`'s first `n` values, for `i` in `0..k`: the
    /// layout of the values attention weighs.
    pub(crate) fn from_rows<'a>(kernel: Kernel, k: usize, n: usize, row: impl Fn(usize) -> &'a [f32]) -> Packed {
        let mut packed = Packed::zeros(kernel, k, n);
        let nr = kernel.nr;
        for i in 0..k {
            for (p, values) in row(i)[..n].chunks(nr).enumerate() {
                packed.data[(p * k + i) * nr..][..values.len()].copy_from_slice(values);
            }
        }
        packed
    }

    fn zeros(kernel: Kernel, k: usize, n: usize) -> Packed {
        Packed { kernel, data: vec![0.0; n.div_ceil(kernel.nr) * k * kernel.nr], k, n }
    }
}
