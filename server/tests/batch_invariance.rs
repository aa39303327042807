//! Batch invariance: a sequence's logits are bit-identical whether it runs
//! alone or batched with others, whatever the prefill chunk size, thread
//! count or the KV blocks it lands in, for every KV cache type.

use std::path::Path;
use std::sync::Arc;

use sluice_kernels::backend::{CpuBackend, KvType, KvTypes};
use sluice_model::batch::{Batch, BatchRow, RowInput, forward_in_parts, text_position};
use sluice_model::{Context, Model, Transformer};
use sluice_tests::models::default_model;

const BLOCK_TOKENS: usize = 16;
const DECODE_STEPS: usize = 4;

struct Run<'a> {
    prompts: &'a [Vec<u32>],
    chunk: usize,
    threads: usize,
    /// Reverse the block ids each sequence gets (a different "slot").
    reversed_blocks: bool,
    kv_types: KvTypes,
}

/// Prefill every prompt in chunks (all sequences share each step's batch),
/// then decode greedily together. Returns, per sequence, the bits of the
/// logits after the prompt and after each decode step.
fn run(path: &Path, config: Run) -> Vec<Vec<Vec<u32>>> {
    let backend = Arc::new(CpuBackend::new(config.threads));
    let model: Arc<dyn Model> = Arc::new(Transformer::load(path, backend).expect("default model loads"));
    let blocks_per_seq = 8;
    let n_seqs = config.prompts.len();
    let mut context =
        Arc::clone(&model).context(n_seqs * blocks_per_seq, BLOCK_TOKENS, config.kv_types).expect("a context");
    let mut tables: Vec<Vec<u32>> =
        (0..n_seqs).map(|seq| ((seq * blocks_per_seq) as u32..((seq + 1) * blocks_per_seq) as u32).collect()).collect();
    // A sequence's recurrent state slot (models with recurrent layers).
    let mut states: Vec<u32> = (0..n_seqs as u32).collect();
    if config.reversed_blocks {
        tables.reverse();
        states.reverse();
    }
    let mut done = vec![0usize; n_seqs];
    let mut last_token: Vec<u32> = vec![0; n_seqs];
    let mut out: Vec<Vec<Vec<u32>>> = vec![Vec::new(); n_seqs];
    let step_outputs =
        |batch: Batch, context: &mut Box<dyn Context>, out: &mut Vec<Vec<Vec<u32>>>, last: &mut Vec<u32>| {
            let output = context.forward(&batch).expect("forward");
            let n_vocab = model.hparams().n_vocab;
            for (index, &row) in output.logit_rows.iter().enumerate() {
                let logits = &output.logits[index * n_vocab..(index + 1) * n_vocab];
                let seq = batch.rows[row].seq;
                out[seq].push(logits.iter().map(|value| value.to_bits()).collect());
                let best = logits.iter().enumerate().fold((0, f32::NEG_INFINITY), |best, (token, &logit)| {
                    if logit > best.1 { (token, logit) } else { best }
                });
                last[seq] = best.0 as u32;
            }
        };
    while done.iter().zip(config.prompts).any(|(done, prompt)| *done < prompt.len()) {
        let mut rows = Vec::new();
        for (seq, prompt) in config.prompts.iter().enumerate() {
            let end = (done[seq] + config.chunk).min(prompt.len());
            for cell in done[seq]..end {
                rows.push(BatchRow {
                    input: RowInput::Token(prompt[cell]),
                    seq,
                    cell: cell as u32,
                    pos: text_position(cell as u32),
                    logits: cell + 1 == prompt.len(),
                });
            }
            done[seq] = end;
        }
        let batch = Batch { rows, block_tables: tables.clone(), states: states.clone(), ..Batch::default() };
        step_outputs(batch, &mut context, &mut out, &mut last_token);
    }
    for step in 0..DECODE_STEPS {
        let rows = (0..n_seqs)
            .map(|seq| {
                let cell = config.prompts[seq].len() + step;
                BatchRow {
                    input: RowInput::Token(last_token[seq]),
                    seq,
                    cell: cell as u32,
                    pos: text_position(cell as u32),
                    logits: true,
                }
            })
            .collect();
        let batch = Batch { rows, block_tables: tables.clone(), states: states.clone(), ..Batch::default() };
        step_outputs(batch, &mut context, &mut out, &mut last_token);
    }
    out
}

#[test]
fn logits_do_not_depend_on_batch_chunking_threads_or_blocks() {
    invariant_with(KvTypes::default());
}

#[test]
fn logits_do_not_depend_on_batch_chunking_threads_or_blocks_with_a_q8_0_kv_cache() {
    invariant_with(KvTypes { k: KvType::Q8_0, v: KvType::Q8_0 });
    // And with keys and values of different types.
    invariant_with(KvTypes { k: KvType::Q8_0, v: KvType::F16 });
}

/// A mixture of experts (Qwen2-MoE's layout: 2 of 8 experts and a shared
/// one): rows grouped by expert give each row the bits it gets alone.
#[test]
fn an_moe_model_s_logits_do_not_depend_on_batch_chunking_threads_or_blocks() {
    let path = std::env::temp_dir().join(format!("sluice-moe-invariance-{}.gguf", std::process::id()));
    let model = sluice_tests::models::tiny_family("qwen2moe").expect("a tiny MoE model");
    std::fs::write(&path, model.build()).expect("written");
    invariant_on(&path, 300, KvTypes::default());
    std::fs::remove_file(&path).expect("removed");
}

/// A hybrid model (Qwen3.5-MoE's layout: Gated DeltaNet layers, a gated
/// attention layer every fourth, experts): each sequence's recurrent state
/// goes on from pass to pass whatever else shares them.
#[test]
fn a_hybrid_model_s_logits_do_not_depend_on_batch_chunking_threads_or_blocks() {
    let path = std::env::temp_dir().join(format!("sluice-hybrid-invariance-{}.gguf", std::process::id()));
    let model = sluice_tests::models::tiny_family("qwen35moe").expect("a tiny hybrid model");
    std::fs::write(&path, model.build()).expect("written");
    invariant_on(&path, 300, KvTypes::default());
    std::fs::remove_file(&path).expect("removed");
}

fn invariant_with(kv_types: KvTypes) {
    invariant_on(&default_model(), 49152, kv_types);
}

/// [`run`]'s checks on the model at `path`, with prompts of tokens below
/// `n_vocab`.
fn invariant_on(model: &Path, n_vocab: u32, kv_types: KvTypes) {
    let target: Vec<u32> = (0..45).map(|i| (i * 7919 + 13) % n_vocab).collect();
    let others: Vec<Vec<u32>> =
        (1..4).map(|seed| (0..(20 + 9 * seed)).map(|i| (i * 104_729 * seed + 7) as u32 % n_vocab).collect()).collect();
    let alone = run(
        model,
        Run { prompts: std::slice::from_ref(&target), chunk: 512, threads: 2, reversed_blocks: false, kv_types },
    );
    assert_eq!(alone[0].len(), 1 + DECODE_STEPS);

    let mut batched_prompts = vec![target.clone()];
    batched_prompts.extend(others.iter().cloned());
    let batched =
        run(model, Run { prompts: &batched_prompts, chunk: 512, threads: 2, reversed_blocks: false, kv_types });
    assert!(batched[0] == alone[0], "{kv_types:?}: batched with 3 other sequences differs from alone");

    let mut last_first = others.clone();
    last_first.push(target.clone());
    let placed = run(model, Run { prompts: &last_first, chunk: 64, threads: 2, reversed_blocks: true, kv_types });
    assert!(placed[3] == alone[0], "{kv_types:?}: another slot, other blocks and chunks of 64 differ from alone");

    for chunk in [1, 7, 64] {
        let chunked = run(
            model,
            Run { prompts: std::slice::from_ref(&target), chunk, threads: 2, reversed_blocks: false, kv_types },
        );
        assert!(chunked[0] == alone[0], "{kv_types:?}: prefill chunks of {chunk} differ from one chunk");
    }
    for threads in [1, 3] {
        let threaded =
            run(model, Run { prompts: &batched_prompts, chunk: 7, threads, reversed_blocks: false, kv_types });
        assert!(threaded[0] == alone[0], "{kv_types:?}: {threads} threads differ from 2");
    }
}

#[test]
fn a_pass_run_in_micro_batches_gives_the_whole_pass_s_logits() {
    let path = default_model();
    let model: Arc<dyn Model> =
        Arc::new(Transformer::load(&path, Arc::new(CpuBackend::new(2))).expect("default model loads"));
    let n_embd = model.hparams().n_embd;
    let prompts: [Vec<u32>; 2] =
        [(0..20).map(|i| (i * 7919 + 13) % 49152).collect(), (0..13).map(|i| (i * 104_729 + 7) % 49152).collect()];
    // Both sequences' rows interleaved, every row wanting logits.
    let mut rows = Vec::new();
    for cell in 0..20 {
        for (seq, prompt) in prompts.iter().enumerate() {
            if let Some(&token) = prompt.get(cell) {
                let pos = text_position(cell as u32);
                rows.push(BatchRow { input: RowInput::Token(token), seq, cell: cell as u32, pos, logits: true });
            }
        }
    }
    let batch = Batch { rows, block_tables: vec![vec![0, 1], vec![2, 3]], ..Batch::default() };
    let fresh = || Arc::clone(&model).context(4, BLOCK_TOKENS, KvTypes::default()).expect("a context");
    let whole = fresh().forward(&batch).expect("forward");
    for max_rows in [1, 5, 32] {
        let parts = forward_in_parts(&mut *fresh(), &batch, max_rows, n_embd).expect("forward in parts");
        assert_eq!(parts.logit_rows, whole.logit_rows, "parts of {max_rows}");
        let bits = |logits: &[f32]| logits.iter().map(|value| value.to_bits()).collect::<Vec<_>>();
        assert!(bits(&parts.logits) == bits(&whole.logits), "parts of {max_rows} rows differ from one pass");
    }
}

/// A hybrid pass that stops for state snapshots gives the whole pass's
/// logits; each snapshot holds its sequence's rows before the stop, and a
/// fresh context resumed from one goes on with the same bits.
#[test]
fn a_hybrid_pass_stops_for_snapshots_that_resume_bit_exactly() {
    let path = std::env::temp_dir().join(format!("sluice-hybrid-stops-{}.gguf", std::process::id()));
    std::fs::write(&path, sluice_tests::models::tiny_family("qwen35").expect("a tiny hybrid model").build())
        .expect("written");
    let model: Arc<dyn Model> = Arc::new(Transformer::load(&path, Arc::new(CpuBackend::new(2))).expect("loads"));
    let n_embd = model.hparams().n_embd;
    let prompts: [Vec<u32>; 2] =
        [(0..20).map(|i| (i * 37 + 5) % 300).collect(), (0..13).map(|i| (i * 91 + 3) % 300).collect()];
    let row = |seq: usize, cell: usize| BatchRow {
        input: RowInput::Token(prompts[seq][cell]),
        seq,
        cell: cell as u32,
        pos: text_position(cell as u32),
        logits: true,
    };
    // Sequence 0's rows, then sequence 1's, in state slots 3 and 0.
    let rows: Vec<BatchRow> = (0..20).map(|cell| row(0, cell)).chain((0..13).map(|cell| row(1, cell))).collect();
    let tables = vec![vec![0, 1], vec![2, 3]];
    let batch = Batch { rows, block_tables: tables.clone(), states: vec![3, 0], ..Batch::default() };
    let fresh = || Arc::clone(&model).context(4, BLOCK_TOKENS, KvTypes::default()).expect("a context");
    let bits = |logits: &[f32]| logits.iter().map(|value| value.to_bits()).collect::<Vec<_>>();
    let whole = fresh().forward(&batch).expect("forward");
    let mut snapshots = Vec::new();
    let mut take = |context: &dyn Context, row: usize| {
        snapshots.push((row, context.read_state(3).expect("slot 3"), context.read_state(0)));
    };
    let stopped = sluice_model::batch::forward_with_stops(&mut *fresh(), &batch, 8, n_embd, &[7, 20, 33], &mut take)
        .expect("forward with stops");
    assert!(bits(&stopped.logits) == bits(&whole.logits), "stops changed the logits");
    assert_eq!(stopped.logit_rows, whole.logit_rows);
    let cells: Vec<(usize, u32, Option<u32>)> =
        snapshots.iter().map(|(row, first, second)| (*row, first.cells, second.as_ref().map(|s| s.cells))).collect();
    assert_eq!(cells, vec![(7, 7, None), (20, 20, None), (33, 20, Some(13))]);

    // Sequence 0 resumed at cell 7 in a fresh context's slot 1, its KV
    // copied over: the rest of its rows give the whole pass's logits.
    let source = {
        let mut context = fresh();
        let first = Batch { rows: batch.rows[..7].to_vec(), ..batch.clone() };
        context.forward(&first).expect("first rows");
        (0..2).map(|block| context.read_block(block).expect("a block")).collect::<Vec<_>>()
    };
    let mut resumed = fresh();
    for (block, bytes) in source.iter().enumerate() {
        resumed.write_block(block as u32, bytes).expect("written");
    }
    resumed.write_state(1, &snapshots[0].1).expect("same shapes");
    let rest = Batch { rows: batch.rows[7..20].to_vec(), block_tables: tables, states: vec![1, 0], ..Batch::default() };
    let output = resumed.forward(&rest).expect("resumed");
    let n_vocab = model.hparams().n_vocab;
    assert!(bits(&output.logits) == bits(&whole.logits[7 * n_vocab..20 * n_vocab]), "the resumed state differs");
    std::fs::remove_file(&path).expect("removed");
}
