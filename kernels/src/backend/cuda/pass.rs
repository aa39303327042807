//! The CUDA backend's operations that read a pass's layout: preparing it,
//! embedding, KV writes, attention and LoRA deltas.

use cudarc::driver::{CudaSlice, PushKernelArg};

use super::super::{BackendError, Embed, KvShape, LowRankTerm, PassLayout};
use super::functions::{decode_heads_per_block, grid, head_variant};
use super::gpu::{CudaKv, CudaLowRank, CudaMatrix, CudaRows, Gpu, int};
use crate::ops::{HeadShape, KvType, Rope, RopeAngles, Scores};

/// A pass's layout on the device (the arrays attention.cu describes).
#[derive(Default)]
pub struct CudaPass {
    /// Which pass this is (0 until prepared), for its recorded graphs.
    pub(super) id: u64,
    pub(super) rows: usize,
    pub(super) tables: Option<PassTables>,
}

pub(super) struct PassTables {
    /// Rotary pairs per row, and each row's cosines and sines.
    pub(super) pairs: usize,
    pub(super) cos: CudaSlice<f32>,
    pub(super) sin: CudaSlice<f32>,
    pub(super) slots: CudaSlice<u32>,
    pub(super) row_seq: CudaSlice<u32>,
    pub(super) row_visible: CudaSlice<u32>,
    pub(super) block_start: CudaSlice<u32>,
    pub(super) block_count: CudaSlice<u32>,
    pub(super) blocks: CudaSlice<u32>,
    pub(super) hidden_start: CudaSlice<u32>,
    pub(super) hidden_count: CudaSlice<u32>,
    pub(super) hidden: CudaSlice<u32>,
    /// Runs of consecutive rows of one sequence, (first row, rows), at most
    /// 32 rows each: the prefill kernel's tiles before its head grouping
    /// splits them further.
    pub(super) runs: Vec<(u32, u32)>,
    /// Rows that see the most cells: the decode kernel's split count.
    pub(super) max_visible: usize,
    /// Per sequence, what attention checks against the store.
    pub(super) reach: Vec<SequenceReach>,
}

/// Ids of prepared passes (0: never prepared), keys of their graphs.
static NEXT_PASS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// Cells per split of decode attention at most: a long context split for
/// the few rows that decode over it.
const SPLIT_CELLS: usize = 512;

/// Rows a prefill attention tile holds for `per_chunk` query heads.
fn tile_rows(per_chunk: usize) -> usize {
    (32 / per_chunk.max(1)).max(1)
}

pub(super) fn prepare(gpu: &Gpu, rope: &Rope, layout: &PassLayout<'_>, out: &mut CudaPass) -> Result<(), BackendError> {
    // The previous pass's tables are freed below: a record cannot hold that.
    gpu.transfers();
    let n_seq = layout.sequences.len();
    if let Some(row) = layout.rows.iter().find(|row| row.seq >= n_seq) {
        return Err(BackendError::Input(format!("a row of sequence {} in a pass of {n_seq} sequences", row.seq)));
    }
    let too_large = |what: &str| BackendError::Unsupported(format!("a pass whose {what} exceeds 2^32"));
    let u32_of = |n: usize, what: &str| u32::try_from(n).map_err(|_| too_large(what));
    let mut angles = RopeAngles::default();
    let (mut cos, mut sin) = (Vec::new(), Vec::new());
    let mut pairs = 0;
    for row in layout.rows {
        rope.angles(row.pos, &mut angles);
        let (c, s) = angles.tables();
        pairs = c.len();
        cos.extend_from_slice(c);
        sin.extend_from_slice(s);
    }
    let mut columns = [Vec::new(), Vec::new(), Vec::new()];
    for row in layout.rows {
        columns[0].push(u32_of(row.slot, "slots")?);
        columns[1].push(u32_of(row.seq, "sequences")?);
        columns[2].push(u32_of(row.visible, "visible cells")?);
    }
    let [slots, row_seq, row_visible] = columns;
    let (mut block_start, mut block_count, mut blocks) = (Vec::new(), Vec::new(), Vec::new());
    let (mut hidden_start, mut hidden_count, mut hidden) = (Vec::new(), Vec::new(), Vec::new());
    for sequence in layout.sequences {
        block_start.push(u32_of(blocks.len(), "block tables")?);
        block_count.push(u32_of(sequence.blocks.len(), "block tables")?);
        blocks.extend_from_slice(sequence.blocks);
        hidden_start.push(u32_of(hidden.len() / 2, "hidden ranges")?);
        hidden_count.push(u32_of(sequence.hidden.len(), "hidden ranges")?);
        for range in sequence.hidden {
            hidden.push(u32_of(range.start, "hidden ranges")?);
            hidden.push(u32_of(range.end, "hidden ranges")?);
        }
    }
    let mut runs: Vec<(u32, u32)> = Vec::new();
    for (index, row) in layout.rows.iter().enumerate() {
        match runs.last_mut() {
            Some((first, len)) if layout.rows[*first as usize].seq == row.seq && *len < 32 => *len += 1,
            _ => runs.push((u32_of(index, "rows")?, 1)),
        }
    }
    let floats = |values: &[f32]| {
        gpu.transfers()
            .clone_htod(if values.is_empty() { &[0.0][..] } else { values })
            .map_err(gpu.driver("uploading a pass"))
    };
    // Nothing of the previous pass stays if an upload below fails: its
    // tables would not match the new row count.
    out.rows = 0;
    out.tables = None;
    if out.id == 0 {
        out.id = NEXT_PASS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    let mut reach: Vec<SequenceReach> = layout
        .sequences
        .iter()
        .map(|sequence| SequenceReach {
            blocks: sequence.blocks.to_vec(),
            hidden: sequence.hidden.to_vec(),
            fewest: usize::MAX,
            most: 0,
        })
        .collect();
    for row in layout.rows {
        let sequence = &mut reach[row.seq];
        sequence.fewest = sequence.fewest.min(row.visible);
        sequence.most = sequence.most.max(row.visible);
    }
    let tables = PassTables {
        pairs,
        cos: floats(&cos)?,
        sin: floats(&sin)?,
        slots: gpu.upload_u32(&slots)?,
        row_seq: gpu.upload_u32(&row_seq)?,
        row_visible: gpu.upload_u32(&row_visible)?,
        block_start: gpu.upload_u32(&block_start)?,
        block_count: gpu.upload_u32(&block_count)?,
        blocks: gpu.upload_u32(&blocks)?,
        hidden_start: gpu.upload_u32(&hidden_start)?,
        hidden_count: gpu.upload_u32(&hidden_count)?,
        hidden: gpu.upload_u32(&hidden)?,
        max_visible: layout.rows.iter().map(|row| row.visible).max().unwrap_or(0),
        runs,
        reach,
    };
    out.rows = layout.rows.len();
    out.tables = Some(tables);
    Ok(())
}

/// What one sequence of a pass reaches, kept on the host so that attention
/// refuses what the CPU backend refuses before any kernel reads the store.
pub(super) struct SequenceReach {
    blocks: Vec<u32>,
    hidden: Vec<std::ops::Range<usize>>,
    /// The fewest and the most cells a row of the sequence sees.
    fewest: usize,
    most: usize,
}

impl SequenceReach {
    fn check(&self, shape: &KvShape) -> Result<(), String> {
        if self.most == 0 {
            // No row of this sequence is in the pass.
            return Ok(());
        }
        if self.fewest == 0 {
            return Err("a row sees no cells".into());
        }
        let sorted = self.hidden.windows(2).all(|pair| pair[0].end <= pair[1].start);
        if !sorted || self.hidden.iter().any(|range| range.start >= range.end) {
            return Err(format!("hidden cells {:?} are not sorted, disjoint, non-empty ranges", self.hidden));
        }
        let hidden: usize =
            self.hidden.iter().map(|range| range.end.min(self.fewest).saturating_sub(range.start)).sum();
        if hidden >= self.fewest {
            return Err(format!("all {} cells a row sees are hidden", self.fewest));
        }
        let needed = self.most.div_ceil(shape.block_tokens.max(1));
        if shape.block_tokens == 0 || self.blocks.len() < needed {
            return Err(format!("{} blocks do not cover {} cells", self.blocks.len(), self.most));
        }
        match self.blocks[..needed].iter().find(|&&block| block as usize >= shape.n_blocks) {
            Some(block) => Err(format!("block {block} of a store of {}", shape.n_blocks)),
            None => Ok(()),
        }
    }
}

pub(super) fn embed(
    gpu: &Gpu,
    table: Option<&CudaMatrix>,
    inputs: &[Embed<'_>],
    width: usize,
    out: &mut CudaRows,
) -> Result<(), BackendError> {
    let mut tokens = Vec::with_capacity(inputs.len());
    for input in inputs {
        match (*input, table) {
            (Embed::Token(token), Some(table)) if (token as usize) < table.n_out() && table.n_in() == width => {
                tokens.push(token)
            }
            (Embed::Token(token), _) => {
                return Err(BackendError::Input(format!("token {token} has no embedding row of width {width}")));
            }
            (Embed::Values(values), _) if values.len() != width => {
                return Err(BackendError::Input(format!("{} values for a row of width {width}", values.len())));
            }
            // Overwritten below; row 0 is a valid placeholder meanwhile.
            (Embed::Values(_), _) => tokens.push(0),
        }
    }
    if !gpu.size(out, inputs.len() * width) || inputs.is_empty() {
        return gpu.check();
    }
    let width_int = int(width).ok_or_else(|| BackendError::Unsupported(format!("rows of {width} values")))?;
    if let Some(table) = table.filter(|_| inputs.iter().any(|input| matches!(input, Embed::Token(_)))) {
        let list = gpu.upload_u32(&tokens)?;
        let name = format!("sl_embed_{}", table.dtype().name().to_lowercase());
        if let (Some(function), Some(output)) = (gpu.function(&name), out.buffer_mut()) {
            let mut args = gpu.stream().launch_builder(&function);
            let n_tokens = int(tokens.len()).unwrap_or(i32::MAX);
            args.arg(table.bytes()).arg(&list).arg(output).arg(&width_int).arg(&n_tokens);
            // SAFETY: sl_embed_<fmt>(const u8* table, const u32* tokens, float*
            // out, int width, int n_tokens): every token is a row of the
            // table (checked above), `out` holds a row of `width` per token.
            gpu.record("embedding", unsafe { args.launch(grid((tokens.len(), 1, 1), 128)) });
        }
    }
    for (row, input) in inputs.iter().enumerate() {
        if let (Embed::Values(values), Some(output)) = (input, out.buffer_mut()) {
            let mut target = output.slice_mut(row * width..(row + 1) * width);
            gpu.transfers().memcpy_htod(*values, &mut target).map_err(gpu.driver("uploading embeddings"))?;
        }
    }
    gpu.check()
}

pub(super) fn store_kv(gpu: &Gpu, kv: &mut CudaKv, layer: usize, k: &CudaRows, v: &CudaRows, pass: &CudaPass) {
    let shape = kv.shape();
    let Some(tables) = &pass.tables else { return gpu.fail("store_kv: no prepared pass".into()) };
    let (Some(kv_dim), Ok(n_cells)) = (int(shape.kv_dim), u32::try_from(shape.cells().unwrap_or(usize::MAX))) else {
        return gpu.fail(format!("store_kv: a store of {shape:?}"));
    };
    if layer >= shape.n_layer {
        return gpu.fail(format!("store_kv: layer {layer} of {}", shape.n_layer));
    }
    if pass.rows == 0 {
        return;
    }
    let (keys, values, arena_bytes) = kv.arenas_mut();
    for (arena, stride, kv_type, rows) in
        [(keys, arena_bytes.0, shape.types.k, k), (values, arena_bytes.1, shape.types.v, v)]
    {
        let Some(src) = rows.buffer().filter(|_| rows.len() >= pass.rows * shape.kv_dim) else {
            gpu.fail(format!("store_kv: {} values for {} rows of {}", rows.len(), pass.rows, shape.kv_dim));
            return;
        };
        let name = match kv_type {
            KvType::F16 => "sl_store_kv_f16",
            KvType::Q8_0 => "sl_store_kv_q8_0",
        };
        let Some(function) = gpu.function(name) else { return };
        let mut view = arena.slice_mut(layer * stride..(layer + 1) * stride);
        let mut args = gpu.stream().launch_builder(&function);
        args.arg(src).arg(&tables.slots).arg(&mut view).arg(&kv_dim).arg(&n_cells);
        // SAFETY: sl_store_kv_<type>(const float* src, const u32* slots, u8*
        // arena, int kv_dim, u32 n_cells): `src` holds a row of kv_dim per
        // pass row (checked above), `slots` a slot per row, the view one
        // layer's arena of n_cells cells; the kernel skips slots past it.
        gpu.record("store_kv", unsafe { args.launch(grid((pass.rows, shape.kv_dim.div_ceil(256), 1), 256)) });
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn attend(
    gpu: &Gpu,
    kv: &CudaKv,
    layer: usize,
    q: &CudaRows,
    pass: &CudaPass,
    heads: HeadShape,
    scores: Scores<'_>,
    out: &mut CudaRows,
) -> Result<(), BackendError> {
    let shape = kv.shape();
    let (n_head, n_kv_head, head_dim) = (heads.n_head(), heads.n_kv_head(), heads.head_dim());
    let Some(d) = head_variant(head_dim) else {
        return Err(BackendError::Unsupported(format!("heads of {head_dim} values: CUDA attention takes up to 256")));
    };
    if head_dim != shape.head_dim || n_kv_head * head_dim != shape.kv_dim || layer >= shape.n_layer {
        return Err(BackendError::Input(format!(
            "attention of {n_kv_head} KV heads of {head_dim} over a store of {} in layer {layer} of {}",
            shape.kv_dim, shape.n_layer
        )));
    }
    // What the CPU backend refuses (ops::attention::check).
    if scores.window == Some(0) || !scores.softcap.is_none_or(|cap| cap > 0.0 && cap.is_finite()) {
        return Err(BackendError::Input(format!(
            "attention: window {:?} and soft-cap {:?} must be positive",
            scores.window, scores.softcap
        )));
    }
    if scores.sinks.is_some() {
        return Err(BackendError::Unsupported("attention sinks (gpt-oss): CUDA attention has none yet".into()));
    }
    let q_dim = heads.q_len();
    let Some(tables) = &pass.tables else {
        gpu.size(out, 0);
        return gpu.check();
    };
    for sequence in &tables.reach {
        sequence.check(&shape).map_err(|why| BackendError::Input(format!("attention: {why}")))?;
    }
    let Some(q_buffer) = q.buffer().filter(|_| q.len() >= pass.rows * q_dim) else {
        return Err(BackendError::Input(format!("{} query values for {} rows of {q_dim}", q.len(), pass.rows)));
    };
    if !gpu.size(out, pass.rows * q_dim) || pass.rows == 0 {
        return gpu.check();
    }
    let unsupported = || BackendError::Unsupported("a KV store too large for CUDA attention".into());
    let (ints, n_cells) = (
        [n_head, n_kv_head, head_dim].map(int),
        u32::try_from(shape.cells().unwrap_or(usize::MAX)).map_err(|_| unsupported())?,
    );
    let [Some(n_head_int), Some(n_kv_head_int), Some(head_dim_int)] = ints else { return Err(unsupported()) };
    let block_tokens = u32::try_from(shape.block_tokens).map_err(|_| unsupported())?;
    let type_code = |kv_type: KvType| match kv_type {
        KvType::F16 => 0i32,
        KvType::Q8_0 => 1,
    };
    let (k_type, v_type) = (type_code(shape.types.k), type_code(shape.types.v));
    let (keys, values, arena_bytes) = kv.arenas();
    let k_arena = keys.slice(layer * arena_bytes.0..(layer + 1) * arena_bytes.0);
    let v_arena = values.slice(layer * arena_bytes.1..(layer + 1) * arena_bytes.1);
    let group = n_head / n_kv_head;
    // 0 for none in the kernels' arguments; a window past what a u32 counts
    // hides nothing a store can hold.
    let (scale, softcap) = (scores.scale, scores.softcap.unwrap_or(0.0));
    let window = scores.window.map_or(0, |window| u32::try_from(window).unwrap_or(0));
    // The most cells a row attends to, which the decode kernel splits.
    let most_seen = scores.window.map_or(tables.max_visible, |window| window.min(tables.max_visible));
    let Some(output) = out.buffer_mut() else { return gpu.check() };
    // Few rows per sequence (decoding, drafts): a block per row, the cells
    // split across blocks; long runs (prompts): tiles of rows share each
    // staged tile of cells.
    if pass.rows <= 2 * tables.runs.len() {
        let per_block = decode_heads_per_block(group);
        let lanes = 32 / per_block;
        // Splits fill the GPU when few rows decode over long contexts; with
        // enough rows × heads to fill it already, fewer (down to one).
        let blocks_per_split = pass.rows * n_kv_head * group.div_ceil(per_block);
        let wanted = (2 * gpu.multiprocessors()).div_ceil(blocks_per_split.max(1));
        let splits = most_seen.div_ceil(SPLIT_CELLS).min(wanted).max(1);
        // A multiple of 64 cells keeps the kernel's four warps even.
        let split_cells = if splits == 1 { most_seen.max(1) } else { most_seen.div_ceil(splits).next_multiple_of(64) };
        let parts = if splits == 1 { 1 } else { pass.rows * n_head * splits };
        let mut scratch = gpu.scratch([parts * head_dim.max(1), parts * 2])?;
        let [Some(part_o), Some(part_ml)] = &mut *scratch else { return gpu.check() };
        let (splits_int, split_cells_u32) = (int(splits).ok_or_else(unsupported)?, split_cells as u32);
        let Some(function) = gpu.function(&format!("sl_attend_decode_d{d}_l{lanes}")) else {
            return gpu.check();
        };
        let mut args = gpu.stream().launch_builder(&function);
        args.arg(q_buffer).arg(&mut *output).arg(&mut *part_o).arg(&mut *part_ml).arg(&k_arena).arg(&v_arena);
        args.arg(&k_type).arg(&v_type).arg(&tables.row_seq).arg(&tables.row_visible);
        args.arg(&tables.block_start).arg(&tables.block_count).arg(&tables.blocks);
        args.arg(&tables.hidden_start).arg(&tables.hidden_count).arg(&tables.hidden);
        args.arg(&n_head_int).arg(&n_kv_head_int).arg(&head_dim_int).arg(&block_tokens).arg(&n_cells);
        args.arg(&splits_int).arg(&split_cells_u32).arg(&scale).arg(&softcap).arg(&window);
        let config = grid((pass.rows, n_kv_head * group.div_ceil(per_block), splits), 128);
        // SAFETY: the argument list of sl_attend_decode_d<D>_l<L> in
        // attention.cu, in order; q and out hold rows × n_head × head_dim
        // floats, the partial buffers rows × n_head × splits × (head_dim,
        // 2) when splits > 1, the tables the prepared pass, the arenas one
        // layer of n_cells cells.
        gpu.record("attention", unsafe { args.launch(config) });
        if splits > 1 {
            let Some(merge) = gpu.function("sl_attend_merge") else { return gpu.check() };
            let mut args = gpu.stream().launch_builder(&merge);
            args.arg(&*part_o).arg(&*part_ml).arg(&tables.row_visible).arg(output);
            args.arg(&n_head_int).arg(&head_dim_int).arg(&splits_int).arg(&split_cells_u32).arg(&window);
            // SAFETY: sl_attend_merge(const float* part_o, const float*
            // part_ml, const u32* row_visible, float* out, int n_head, int
            // head_dim, int n_splits, u32 split_cells, u32 window), with
            // what the decode kernel above was given.
            gpu.record("attention merge", unsafe { args.launch(grid((pass.rows, n_head, 1), 128)) });
        }
    } else {
        let per_chunk = group.min(32);
        let mut tiles = Vec::new();
        for &(first, len) in &tables.runs {
            let mut start = 0;
            while start < len {
                let take = (len - start).min(tile_rows(per_chunk) as u32);
                tiles.extend([first + start, take]);
                start += take;
            }
        }
        let tile_list = gpu.upload_u32(&tiles)?;
        let Some(function) = gpu.function(&format!("sl_attend_prefill_d{d}")) else { return gpu.check() };
        let mut args = gpu.stream().launch_builder(&function);
        args.arg(q_buffer).arg(output).arg(&k_arena).arg(&v_arena).arg(&k_type).arg(&v_type).arg(&tile_list);
        args.arg(&tables.row_seq).arg(&tables.row_visible).arg(&tables.block_start).arg(&tables.block_count);
        args.arg(&tables.blocks).arg(&tables.hidden_start).arg(&tables.hidden_count).arg(&tables.hidden);
        args.arg(&n_head_int).arg(&n_kv_head_int).arg(&head_dim_int).arg(&block_tokens).arg(&n_cells);
        args.arg(&scale).arg(&softcap).arg(&window);
        let config = grid((tiles.len() / 2, n_kv_head * group.div_ceil(per_chunk), 1), 128);
        // SAFETY: the argument list of sl_attend_prefill_d<D> in
        // attention.cu, in order; every row in exactly one tile of at most
        // 32 / H rows of one sequence, the rest as for decode above.
        gpu.record("attention", unsafe { args.launch(config) });
    }
    gpu.check()
}

pub(super) fn add_low_rank(gpu: &Gpu, x: &CudaRows, terms: &[LowRankTerm<'_, CudaLowRank>], out: &mut CudaRows) {
    for term in terms {
        let factors = term.factors;
        let (rows_in, rows_out) = (x.len() / factors.n_in.max(1), out.len() / factors.n_out.max(1));
        if term.rows.iter().any(|&(row, _)| row >= rows_in || row >= rows_out) {
            gpu.fail(format!("add_low_rank: a row past the {rows_in} rows of the pass"));
            return;
        }
        let mut seen = std::collections::HashSet::new();
        if !term.rows.iter().all(|&(row, _)| seen.insert(row)) {
            // Two threads would add into one row at once.
            return gpu.fail("add_low_rank: a row listed twice in one term".into());
        }
        if term.rows.is_empty() {
            continue;
        }
        // Rows are below the rows of `x` (checked above), which fit an int.
        let listed: Vec<i32> = term.rows.iter().map(|&(row, _)| int(row).unwrap_or(i32::MAX)).collect();
        let scales: Vec<f32> = term.rows.iter().map(|&(_, scale)| scale).collect();
        let sizes = [listed.len(), factors.n_in, factors.rank, factors.n_out].map(int);
        let [Some(n_listed), Some(n_in), Some(rank), Some(n_out)] = sizes else { return };
        let uploaded = (
            gpu.transfers().clone_htod(&listed),
            gpu.transfers().clone_htod(&scales),
            gpu.transfers().alloc_zeros::<f32>(listed.len() * factors.rank),
        );
        let (Some(list), Some(scale_list), Some(mut t)) = (
            gpu.record("uploading LoRA rows", uploaded.0),
            gpu.record("uploading LoRA scales", uploaded.1),
            gpu.record("allocating", uploaded.2),
        ) else {
            return;
        };
        let (Some(input), Some(down), Some(up)) =
            (x.buffer(), gpu.function("sl_lora_down"), gpu.function("sl_lora_up"))
        else {
            return;
        };
        let mut args = gpu.stream().launch_builder(&down);
        args.arg(&mut t).arg(input).arg(&factors.a).arg(&list).arg(&n_listed).arg(&n_in).arg(&rank);
        // SAFETY: sl_lora_down(float* t, const float* x, const float* a,
        // const int* rows, int n_listed, int n_in, int rank): `t` holds
        // n_listed × rank floats, every listed row is a row of `x` (checked
        // above), `a` rank × n_in.
        gpu.record("LoRA down", unsafe { args.launch(grid((listed.len().div_ceil(4), 1, 1), 256)) });
        let Some(output) = out.buffer_mut() else { return };
        let mut args = gpu.stream().launch_builder(&up);
        args.arg(output).arg(&t).arg(&factors.b_t).arg(&list).arg(&scale_list);
        args.arg(&n_listed).arg(&rank).arg(&n_out);
        let config = grid((listed.len().div_ceil(8), factors.n_out.div_ceil(256), 1), 256);
        // SAFETY: sl_lora_up(float* out, const float* t, const float* b_t,
        // const int* rows, const float* scales, int n_listed, int rank, int
        // n_out): every listed row is a row of `out` (checked above), `b_t`
        // rank × n_out.
        gpu.record("LoRA up", unsafe { args.launch(config) });
    }
}
