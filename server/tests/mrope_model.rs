//! M-RoPE targets (qwen2vl, qwen3vl) on synthetic models: embedding
//! segments positioned as images, and MROPE reducing to NEOX for text.

use sluice_model::batch::{Batch, BatchRow, Position, RowInput, image_positions, text_position};
use sluice_model::gguf::GgufFile;
use std::sync::Arc;

use sluice_kernels::backend::{CpuBackend, KvTypes};
use sluice_model::session::Session;
use sluice_model::{Model, Transformer};
use sluice_tests::gguf_writer::{Rng, TinyModel};

fn tiny(arch: &'static str, sections: Option<[i32; 4]>) -> Arc<dyn Model> {
    // head_dim 8 → n_rot 8 → 4 rotary pairs.
    let shape = TinyModel { arch, sections, ..TinyModel::llama(11) };
    let file = GgufFile::from_bytes(shape.build().build()).expect("valid gguf");
    Arc::new(Transformer::from_file(file, Arc::new(CpuBackend::new(1))).expect("model loads"))
}

fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|value| value.to_bits()).collect()
}

/// Run rows with explicit positions on one sequence; logits of the last row.
fn run_rows(model: &Arc<dyn Model>, rows: &[(RowInput, Position)], embeddings: &[f32]) -> Vec<f32> {
    let mut context = Arc::clone(model).context(4, 16, KvTypes::default()).expect("a context");
    let batch = Batch {
        rows: rows
            .iter()
            .enumerate()
            .map(|(cell, &(input, pos))| BatchRow {
                input,
                seq: 0,
                cell: cell as u32,
                pos,
                logits: cell + 1 == rows.len(),
            })
            .collect(),
        block_tables: vec![vec![0, 1, 2, 3]],
        embeddings: embeddings.to_vec(),
        ..Batch::default()
    };
    context.forward(&batch).expect("forward").logits
}

#[test]
fn image_segments_get_spec_positions_and_text_resumes_after_the_jump() {
    let model = tiny("qwen2vl", Some([2, 1, 1, 0]));
    let n_embd = model.hparams().n_embd;
    let (nx, ny) = (3u32, 2u32);
    let embeddings = Rng::new(5).vec((nx * ny) as usize * n_embd, 0.5);

    let mut session = Session::new(Arc::clone(&model), 32).expect("a session");
    session.prefill(&[1, 2, 3], 8).expect("text before");
    session.embed_image(&embeddings, nx, ny).expect("image");
    let after = session.decode(4).expect("text after");

    // The same rows with the positions of the spec written out by hand.
    let mut rows: Vec<(RowInput, Position)> =
        [1, 2, 3].iter().enumerate().map(|(p, &token)| (RowInput::Token(token), text_position(p as u32))).collect();
    let (positions, next) = image_positions(3, nx, ny);
    assert_eq!(positions[4], [3, 4, 4, 0], "row 1, column 1 of an image at position 3");
    assert_eq!(next, 3 + nx.max(ny));
    rows.extend(positions.iter().enumerate().map(|(index, &pos)| (RowInput::Embedding(index), pos)));
    rows.push((RowInput::Token(4), text_position(next)));
    assert_eq!(bits(&after), bits(&run_rows(&model, &rows, &embeddings)));

    // Positions matter: numbering the image rows as plain text changes the
    // result.
    let mut sequential = rows.clone();
    for (cell, row) in sequential.iter_mut().enumerate() {
        row.1 = text_position(cell as u32);
    }
    assert_ne!(bits(&after), bits(&run_rows(&model, &sequential, &embeddings)));
}

#[test]
fn mrope_with_one_temporal_section_equals_neox_on_text() {
    let prompt: Vec<(RowInput, Position)> = [5u32, 9, 2, 7, 7, 1]
        .iter()
        .enumerate()
        .map(|(p, &token)| (RowInput::Token(token), text_position(p as u32)))
        .collect();
    // Same seed, same weights: qwen2vl differs from qwen2 only in rope.
    let neox = run_rows(&tiny("qwen2", None), &prompt, &[]);
    let mrope = run_rows(&tiny("qwen2vl", Some([4, 0, 0, 0])), &prompt, &[]);
    assert_eq!(bits(&neox), bits(&mrope));
    let imrope = run_rows(&tiny("qwen3vl", Some([4, 0, 0, 0])), &prompt, &[]);
    let qwen3 = run_rows(&tiny("qwen3", None), &prompt, &[]);
    assert_ne!(bits(&qwen3), bits(&imrope), "IMROPE with these sections is not NEOX");
}

#[test]
fn hidden_state_taps_expose_layer_inputs() {
    let model = tiny("llama", None);
    let hp = model.hparams().clone();
    let mut context = Arc::clone(&model).context(2, 16, KvTypes::default()).expect("a context");
    let rows = [3u32, 1, 4]
        .iter()
        .enumerate()
        .map(|(cell, &token)| BatchRow {
            input: RowInput::Token(token),
            seq: 0,
            cell: cell as u32,
            pos: text_position(cell as u32),
            logits: cell == 2,
        })
        .collect();
    let batch = Batch { rows, block_tables: vec![vec![0, 1]], taps: vec![0, 1, hp.n_layer], ..Batch::default() };
    let output = context.forward(&batch).expect("forward");
    assert_eq!(output.taps.len(), 3);
    assert!(output.taps.iter().all(|tap| tap.len() == 3 * hp.n_embd));
    // Layer 0's input is the embedding of each token.
    let file = model.file();
    let embd = file.tensor("token_embd.weight").expect("embedding table");
    let table: Vec<f32> =
        file.data(embd).chunks_exact(4).map(|bytes| f32::from_le_bytes(bytes.try_into().expect("4 bytes"))).collect();
    for (row, token) in [3usize, 1, 4].iter().enumerate() {
        assert_eq!(
            &output.taps[0][row * hp.n_embd..(row + 1) * hp.n_embd],
            &table[token * hp.n_embd..(token + 1) * hp.n_embd]
        );
    }
    assert_ne!(output.taps[1], output.taps[0]);
    assert_ne!(output.taps[2], output.taps[1]);
    let out_of_range = Batch { taps: vec![hp.n_layer + 1], ..batch };
    assert!(context.forward(&out_of_range).is_err());
}

/// Sequences of one session decoding together (`sluice bench model
/// --batch`) each get the logits they get alone, bit for bit.
#[test]
fn sequences_decoding_together_get_their_solo_logits() {
    let model = tiny("llama", None);
    let prompts: [&[u32]; 3] = [&[1, 2, 3], &[4, 5], &[6, 7, 8, 9]];
    let solo: Vec<Vec<u32>> = prompts
        .iter()
        .map(|prompt| {
            let mut session = Session::new(Arc::clone(&model), 16).expect("a session");
            session.prefill(prompt, 8).expect("prefill");
            bits(&session.decode(10).expect("decode"))
        })
        .collect();
    let mut together = Session::with_sequences(Arc::clone(&model), 16, 3, KvTypes::default()).expect("a session");
    for (seq, prompt) in prompts.iter().enumerate() {
        together.prefill_sequence(seq, prompt, 8).expect("prefill");
    }
    assert!(together.prefill_sequence(3, &[1], 8).is_err(), "there is no fourth sequence");
    let logits = bits(&together.decode_each(&[10, 10, 10]).expect("decode"));
    let n_vocab = model.hparams().n_vocab;
    assert_eq!(logits.chunks(n_vocab).map(<[u32]>::to_vec).collect::<Vec<_>>(), solo);
}
