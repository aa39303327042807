//! Draft decoding on synthetic models: pairing (the `mrope-temporal` fixup's
//! decision table, then the native checks) and output parity with and
//! without a draft through the real engine.

use std::sync::Arc;

use sluice::config::PolicyConfig;
use sluice::startup::{DraftKind, PairedDraft, PairingError, load_policy, model_info, pair};
use sluice_engine::request::{Event, GenerationRequest};
use sluice_engine::sampling::SamplingParams;
use sluice_engine::speculative::{DraftSettings, Speculation};
use sluice_engine::{EngineConfig, EngineHandle};
use sluice_kernels::backend::CpuBackend;
use sluice_model::gguf::GgufFile;
use sluice_model::hparams::RopeStyle;
use sluice_model::session::Session;
use sluice_model::tokenizer::Tokenizer;
use sluice_model::{Model, Transformer};
use sluice_plugin_host::{PluginHost, PluginLimits, PluginSource, WasmFixup, builtin_fixup};
use sluice_tests::gguf_writer::{GgufBuilder, Tensor, TinyModel, Value};
use sluice_tests::models::tiny_family;

fn model(builder: &GgufBuilder) -> Arc<dyn Model> {
    let file = GgufFile::from_bytes(builder.build()).expect("parses");
    Arc::new(Transformer::from_file(file, Arc::new(CpuBackend::new(2))).expect("loads"))
}

fn mrope_target() -> GgufBuilder {
    TinyModel { sections: Some([2, 3, 3, 0]), ..TinyModel::recipe("qwen2vl", 1) }.build()
}

fn imrope_target() -> GgufBuilder {
    TinyModel { sections: Some([4, 2, 2, 0]), ..TinyModel::recipe("qwen3vl", 2) }.build()
}

fn text_target() -> GgufBuilder {
    TinyModel::recipe("qwen3", 3).build()
}

/// The reference recipe's legacy draft: one layer, taps of target layers 1
/// and 2, blocks of 4, no rope sections.
fn legacy_draft() -> GgufBuilder {
    TinyModel { n_layer: 1, ..TinyModel::recipe("qwen3", 9) }.dflash(&[1, 2], 64, 4)
}

fn mrope_temporal() -> WasmFixup {
    let host = PluginHost::new().expect("host");
    let (name, bytes) = builtin_fixup("mrope-temporal").expect("built in");
    WasmFixup::load(&host, PluginSource::Builtin(name), bytes, PluginLimits::default()).expect("loads")
}

fn paired(target: &GgufBuilder, draft: &GgufBuilder) -> Result<PairedDraft, PairingError> {
    pair(&*model(target), GgufFile::from_bytes(draft.build()).expect("parses"), None, &[mrope_temporal()])
}

fn refusal(target: &GgufBuilder, draft: &GgufBuilder) -> String {
    match paired(target, draft) {
        Ok(_) => panic!("the pair was accepted"),
        Err(error) => error.to_string(),
    }
}

fn sections(values: &[i32]) -> Value {
    Value::I32s(values.to_vec())
}

#[test]
fn legacy_drafts_of_mrope_and_imrope_targets_get_temporal_only_mrope() {
    for target in [mrope_target(), imrope_target()] {
        let paired = paired(&target, &legacy_draft()).expect("paired");
        assert_eq!(paired.kind(), DraftKind::Dflash);
        // Contiguous M-RoPE even for an interleaved target, and n_rot/2 pairs
        // on the temporal component, never the target's sections.
        assert_eq!(paired.hparams().rope, RopeStyle::MRope([8, 0, 0, 0]));
        assert_eq!(paired.edits.len(), 1, "{:?}", paired.edits);
        assert_eq!(paired.edits[0].key, "dflash.rope.dimension_sections");
        assert_eq!(paired.edits[0].plugin, "built-in plugin `mrope-temporal`");
    }
}

#[test]
fn explicit_sections_text_targets_and_dsv4_drafts_are_left_unchanged() {
    for explicit in [[8, 0, 0, 0], [5, 0, 0, 0]] {
        let draft = legacy_draft().meta("dflash.rope.dimension_sections", sections(&explicit));
        let paired = paired(&mrope_target(), &draft).expect("paired");
        assert_eq!(paired.hparams().rope, RopeStyle::MRope(explicit.map(|section| section as u32)));
        assert!(paired.edits.is_empty(), "{:?}", paired.edits);
    }
    let paired = paired(&text_target(), &legacy_draft()).expect("paired");
    assert_eq!(paired.hparams().rope, RopeStyle::Neox);
    assert!(paired.edits.is_empty());

    // A DSV4 backbone is not the fixup's business; sluice cannot run one.
    let dsv4 = legacy_draft().meta("dflash.hyper_connection.count", Value::U32(4));
    let dsv4_file = GgufFile::from_bytes(dsv4.build()).expect("parses");
    let target = model(&mrope_target());
    let edits = mrope_temporal().run(&model_info(target.file()), &model_info(&dsv4_file)).expect("runs");
    assert!(edits.is_empty(), "{edits:?}");
    assert!(refusal(&mrope_target(), &dsv4).contains("DSV4"));
}

#[test]
fn invalid_rotary_dimensions_are_refused_before_any_draft_context() {
    let freqs = legacy_draft().tensor(Tensor::f32("rope_freqs.weight", &[8], &[1.0; 8]));
    let cases = [
        (legacy_draft().meta("dflash.rope.dimension_count", Value::U32(15)), "must be even"),
        (legacy_draft().meta("dflash.rope.dimension_count", Value::U32(0)), "must be even"),
        (legacy_draft().meta("dflash.rope.dimension_count", Value::U32(32)), "in 1..=16"),
        (legacy_draft().meta("dflash.attention.value_length", Value::U32(8)), "differs from"),
        (freqs.clone(), "rope_freqs.weight"),
    ];
    for (draft, expected) in &cases {
        let refused = refusal(&mrope_target(), draft);
        assert!(
            refused.starts_with("built-in plugin `mrope-temporal`: refused the draft") && refused.contains(expected),
            "{refused}"
        );
    }
    // With a text-only target the fixup has nothing to infer, and the
    // native checks refuse the same files (every DFlash draft's rotary
    // dimensions are validated).
    for (draft, expected) in [
        (&cases[0].0, "must be even"),
        (&cases[2].0, "must be even and 1..=16"),
        (&cases[3].0, "must equal key_length"),
    ] {
        let refused = refusal(&text_target(), draft);
        assert!(refused.contains(expected), "{refused}");
    }
    assert!(refusal(&text_target(), &freqs).contains("rope_freqs.weight"));
}

#[test]
fn pairing_checks_fail_closed_with_the_reason() {
    let narrow = TinyModel { n_embd: 32, n_layer: 1, ..TinyModel::recipe("qwen3", 9) }.dflash(&[1, 2], 64, 4);
    assert!(
        refusal(&text_target(), &narrow)
            .contains("dflash.embedding_length = 32 differs from the target's hidden size 64")
    );
    let fc = legacy_draft().tensor(Tensor::f32("fc.weight", &[96, 64], &vec![0.0; 96 * 64]));
    assert!(
        refusal(&text_target(), &fc)
            .contains("fc.weight takes 96 inputs; 2 target layers × target hidden size 64 = 128")
    );
    let layers = TinyModel { n_layer: 1, ..TinyModel::recipe("qwen3", 9) }.dflash(&[1, 3], 64, 4);
    assert!(refusal(&text_target(), &layers).contains("dflash.target_layers names layer 3; the target has 2 layers"));
    let dflash2 = legacy_draft().meta("dflash.conv_kernel_size", Value::U32(4));
    assert!(refusal(&text_target(), &dflash2).contains("dflash.conv_kernel_size is set: DFlash2, DSpark"));
    let sinks = legacy_draft().tensor(Tensor::f32("blk.0.attn_sinks.weight", &[4], &[0.0; 4]));
    assert!(refusal(&text_target(), &sinks).contains("tensor blk.0.attn_sinks.weight: this DFlash variant"));
    let no_mask = legacy_draft().without_meta("tokenizer.ggml.mask_token_id");
    assert!(refusal(&text_target(), &no_mask).contains("no tokenizer.ggml.mask_token_id"));
    let vocabulary = legacy_draft()
        .tensor(Tensor::f32("output.weight", &[64, 31], &vec![0.0; 64 * 31]))
        .meta("dflash.vocab_size", Value::U32(31));
    assert!(refusal(&text_target(), &vocabulary).contains("the draft's vocabulary has 31 tokens, the target's 32"));

    // Without the fixup, a legacy draft of an M-RoPE target is refused at
    // start rather than failing at the first image.
    let unfixed =
        pair(&*model(&mrope_target()), GgufFile::from_bytes(legacy_draft().build()).expect("parses"), None, &[]);
    let refused = unfixed.err().expect("refused").to_string();
    assert!(refused.contains("uses M-RoPE but the draft has 1-D positions"), "{refused}");

    let wrong_kind = pair(
        &*model(&text_target()),
        GgufFile::from_bytes(legacy_draft().build()).expect("parses"),
        Some(DraftKind::Simple),
        &[],
    );
    assert!(
        wrong_kind
            .err()
            .expect("refused")
            .to_string()
            .contains("is draft-simple but the draft's architecture is \"dflash\"")
    );

    let mut other_tokens = TinyModel::recipe("qwen3", 4);
    other_tokens.tokens = Some((0..32).map(|id| if id == 7 { "seven".into() } else { format!("t{id}") }).collect());
    let simple =
        pair(&*model(&text_target()), GgufFile::from_bytes(other_tokens.build().build()).expect("parses"), None, &[]);
    assert!(
        simple
            .err()
            .expect("refused")
            .to_string()
            .contains("token 7 is \"t7\" in the target and \"seven\" in the draft")
    );
}

/// What a batch of requests gave.
#[derive(Debug, Default)]
struct Outputs {
    tokens: Vec<Vec<u32>>,
    /// Summed over the requests.
    drafted: usize,
    accepted: usize,
    cached: Vec<usize>,
}

/// Generate with the continuous policy on `target`, with `draft` as its
/// draft when given. With `together`, every request is submitted at once;
/// otherwise each after the previous one finished (so later ones can reuse
/// earlier prompts from the prefix cache).
fn run_engine(
    target: &GgufBuilder,
    draft: Option<&GgufBuilder>,
    requests: &[GenerationRequest],
    slots: usize,
    together: bool,
) -> Outputs {
    run_engine_with(EngineConfig { slots, ctx: 256, ..EngineConfig::default() }, target, draft, requests, together)
}

/// [`run_engine`] with the engine's settings `config`.
fn run_engine_with(
    config: EngineConfig,
    target: &GgufBuilder,
    draft: Option<&GgufBuilder>,
    requests: &[GenerationRequest],
    together: bool,
) -> Outputs {
    let target = model(target);
    let tokenizer = Arc::new(Tokenizer::from_gguf(target.file()).expect("tokenizer"));
    let speculation = draft.map(|draft| {
        let paired = pair(&*target, GgufFile::from_bytes(draft.build()).expect("parses"), None, &[mrope_temporal()])
            .expect("paired");
        let (n_blocks, block_tokens) = config.kv_blocks();
        let drafter = paired.into_drafter(&target, n_blocks, block_tokens).expect("drafter");
        Speculation { drafter, settings: DraftSettings { n_max: 6, n_min: 0, p_min: 0.0 } }
    });
    let host = PluginHost::new().expect("host");
    let policy = load_policy(&host, &PolicyConfig::default()).expect("continuous");
    let engine = EngineHandle::start(target, tokenizer, Box::new(policy), Box::new(|| None), config, speculation)
        .expect("engine");
    let submit = |request: &GenerationRequest| engine.submit(request.clone()).expect("submitted").1;
    let mut receivers: Vec<_> = if together { requests.iter().map(submit).collect() } else { Vec::new() };
    let mut outputs = Outputs::default();
    for index in 0..requests.len() {
        if !together {
            receivers.push(submit(&requests[index]));
        }
        let mut tokens = Vec::new();
        loop {
            match receivers[index].blocking_recv().expect("the engine answers") {
                Event::Started { .. } | Event::Progress(_) => {}
                Event::Token(event) => tokens.push(event.token),
                Event::Done(completion) => {
                    outputs.drafted += completion.timings.draft_n;
                    outputs.accepted += completion.timings.draft_n_accepted;
                    outputs.cached.push(completion.tokens_cached);
                    break;
                }
                Event::Failed(error) => panic!("request failed: {error}"),
            }
        }
        outputs.tokens.push(tokens);
    }
    outputs
}

fn requests(temperature: f32) -> Vec<GenerationRequest> {
    (0..4)
        .map(|index| {
            let prompt = (0..5 + 3 * index).map(|token| ((token * 7 + index * 3) % 30) as u32).collect();
            let mut request = GenerationRequest::new(prompt);
            request.n_predict = Some(40);
            request.sampling =
                SamplingParams { temperature, seed: Some(100 + index as u32), ..SamplingParams::default() };
            request
        })
        .collect()
}

/// Output with the draft equals output without it, greedy and sampled, one
/// slot and four; returns the (drafted, accepted) counts of each run.
fn assert_parity(target: &GgufBuilder, draft: &GgufBuilder) -> Vec<(usize, usize)> {
    let mut counts = Vec::new();
    for temperature in [0.0, 0.8] {
        let requests = requests(temperature);
        let alone = run_engine(target, None, &requests, 1, true);
        for slots in [1, 4] {
            let drafted = run_engine(target, Some(draft), &requests, slots, true);
            assert_eq!(drafted.tokens, alone.tokens, "temperature {temperature}, {slots} slots");
            counts.push((drafted.drafted, drafted.accepted));
        }
    }
    counts
}

#[test]
fn a_target_drafting_for_itself_accepts_every_greedy_draft() {
    let target = text_target();
    let counts = assert_parity(&target, &target);
    let (drafted, accepted) = counts[0];
    assert!(drafted > 0 && accepted == drafted, "greedy self-drafting: {counts:?}");
    assert!(counts.iter().all(|&(drafted, _)| drafted > 0), "{counts:?}");
}

/// Gemma 3 (windows of 5) drafting for itself: the target's window layers
/// free their old cells (steps of at most 64 tokens size its window store
/// below the paged one) while rejected drafts roll back; tokens equal the
/// run without a draft and the run keeping every cell (`--swa-full`), one
/// slot and four.
#[test]
fn a_window_model_drafts_for_itself_and_freeing_changes_nothing() {
    let gemma = tiny_family("gemma3").expect("a tiny Gemma 3");
    let config =
        |slots, swa_full| EngineConfig { slots, ctx: 256, batch_tokens: 64, swa_full, ..EngineConfig::default() };
    assert!(config(4, false).window_blocks(Some(5)).is_some(), "the window layers free cells");
    let requests: Vec<GenerationRequest> =
        requests(0.0).into_iter().map(|request| GenerationRequest { ignore_eos: true, ..request }).collect();
    let alone = run_engine_with(config(1, false), &gemma, None, &requests, true);
    let full = run_engine_with(config(1, true), &gemma, None, &requests, true);
    assert_eq!(alone.tokens, full.tokens, "freeing window cells changes no token");
    for slots in [1, 4] {
        let drafted = run_engine_with(config(slots, false), &gemma, Some(&gemma), &requests, true);
        assert_eq!(drafted.tokens, alone.tokens, "{slots} slots");
        assert!(drafted.drafted > 0 && drafted.accepted == drafted.drafted, "{drafted:?}");
    }
}

#[test]
fn a_random_draft_accepts_little_and_changes_nothing() {
    let counts = assert_parity(&text_target(), &TinyModel::recipe("qwen3", 77).build());
    assert!(counts.iter().all(|&(drafted, accepted)| drafted > 0 && accepted * 2 < drafted), "{counts:?}");
}

#[test]
fn dflash_drafts_change_nothing_for_text_and_mrope_targets() {
    for (target, draft) in [(text_target(), legacy_draft()), (mrope_target(), legacy_draft())] {
        let counts = assert_parity(&target, &draft);
        assert!(counts.iter().all(|&(drafted, _)| drafted > 0), "{counts:?}");
    }
}

/// A prompt of text, a `4 × 3` image, then text (the reference recipe's
/// case (a)): the first text token after the image sits at position
/// 5 + max(4, 3) = 9 while its cell is 17.
fn image_request(temperature: f32, seed: u32) -> GenerationRequest {
    let mut rng = sluice_tests::gguf_writer::Rng::new(u64::from(seed));
    let mut request = GenerationRequest::new(vec![3, 14, 15, 9, 2]);
    request.push_image(4, 3, rng.vec(12 * 64, 1.0));
    request.prompt.extend([6, 5, 3, 5]);
    request.n_predict = Some(32);
    request.sampling = SamplingParams { temperature, seed: Some(seed), ..SamplingParams::default() };
    request
}

#[test]
fn a_legacy_dflash_draft_follows_an_mrope_target_past_an_image() {
    let target = mrope_target();
    for temperature in [0.0, 0.8] {
        // Cold: two different images at once.
        let cold = [image_request(temperature, 1), image_request(temperature, 2)];
        let alone = run_engine(&target, None, &cold, 2, true);
        let drafted = run_engine(&target, Some(&legacy_draft()), &cold, 2, true);
        assert_eq!(drafted.tokens, alone.tokens, "temperature {temperature}");
        // The draft drafted after the position jump (with 1-D positions the
        // pair is refused at start instead, see pairing_checks_fail_closed).
        assert!(drafted.drafted > 0, "{drafted:?}");

        // The same image again, continued: its prefix (image included) comes
        // from the cache, the draft's context with it.
        let mut continued = image_request(temperature, 1);
        continued.prompt.extend([7, 7, 1, 2, 8, 9, 11, 13, 4, 6, 5, 3, 5, 8, 9, 7, 2]);
        let turns = [image_request(temperature, 1), continued.clone()];
        let alone = run_engine(&target, None, &turns, 1, false);
        let drafted = run_engine(&target, Some(&legacy_draft()), &turns, 1, false);
        assert_eq!(drafted.tokens, alone.tokens, "temperature {temperature}, cached continuation");
        assert!(drafted.cached[1] >= 16, "the continuation should reuse the cached image: {:?}", drafted.cached);
        // And cold, with nothing cached, it gives the same.
        let fresh = run_engine(&target, None, std::slice::from_ref(&continued), 1, true);
        assert_eq!(fresh.tokens[0], drafted.tokens[1]);
    }

    // The engine places the image as a plain session does.
    let request = image_request(0.0, 1);
    let mut session = Session::new(model(&target), 64).expect("a session");
    session.prefill(&request.prompt[..5], 8).expect("text");
    session.embed_image(&request.images[0].embeddings, 4, 3).expect("image");
    let mut logits = session.prefill(&request.prompt[17..], 8).expect("text after");
    let mut greedy = Vec::new();
    for _ in 0..32 {
        let token = sluice_engine::speculative::most_likely(&logits).0;
        greedy.push(token);
        logits = session.decode(token).expect("decode");
    }
    assert_eq!(run_engine(&target, None, &[request], 1, true).tokens[0], greedy);
}

#[test]
fn images_are_refused_by_models_without_mrope_and_must_match_their_placeholders() {
    let text = model(&text_target());
    let tokenizer = Arc::new(Tokenizer::from_gguf(text.file()).expect("tokenizer"));
    let host = PluginHost::new().expect("host");
    let policy = load_policy(&host, &PolicyConfig::default()).expect("continuous");
    let config = EngineConfig { slots: 1, ctx: 128, ..EngineConfig::default() };
    let engine =
        EngineHandle::start(text, tokenizer, Box::new(policy), Box::new(|| None), config, None).expect("engine");
    let refused = engine.submit(image_request(0.0, 1)).expect_err("refused").to_string();
    assert!(refused.contains("no M-RoPE positions"), "{refused}");

    let target = model(&mrope_target());
    let tokenizer = Arc::new(Tokenizer::from_gguf(target.file()).expect("tokenizer"));
    let policy = load_policy(&host, &PolicyConfig::default()).expect("continuous");
    let config = EngineConfig { slots: 1, ctx: 128, ..EngineConfig::default() };
    let engine =
        EngineHandle::start(target, tokenizer, Box::new(policy), Box::new(|| None), config, None).expect("engine");
    let mut moved = image_request(0.0, 1);
    moved.images[0].start = 4;
    let refused = engine.submit(moved).expect_err("refused").to_string();
    assert!(refused.contains("does not match the prompt's placeholders"), "{refused}");
    let mut short = image_request(0.0, 1);
    short.images[0].embeddings = vec![0.0; 10].into();
    let refused = engine.submit(short).expect_err("refused").to_string();
    assert!(refused.contains("a 4 × 3 image needs 768 values of width 64, got 10"), "{refused}");
}

#[test]
fn a_fixup_that_traps_or_edits_outside_the_draft_refuses_the_pair() {
    use sluice_tests::plugin_fixtures::{FIXUP_WIT, componentize, fixup_module};
    let host = PluginHost::new().expect("host");
    let fixup = |body: &str| {
        let bytes = componentize(&fixup_module(body), FIXUP_WIT, "draft-fixup");
        WasmFixup::load(&host, PluginSource::Path("rogue.wasm".into()), &bytes, PluginLimits::default()).expect("loads")
    };
    let pair_with = |fixup: WasmFixup| {
        let draft = GgufFile::from_bytes(legacy_draft().build()).expect("parses");
        match pair(&*model(&text_target()), draft, None, &[fixup]) {
            Ok(_) => panic!("the pair was accepted"),
            Err(error) => error.to_string(),
        }
    };
    // `ok([remove("draft")])`: the result at 512, one edit at 600 whose key
    // is the first five bytes of the module's data at 256.
    let remove_foreign_key = "(i32.store (i32.const 512) (i32.const 0)) (i32.store (i32.const 516) (i32.const 600))
        (i32.store (i32.const 520) (i32.const 1)) (i32.store8 (i32.const 600) (i32.const 1))
        (i32.store (i32.const 608) (i32.const 256)) (i32.store (i32.const 612) (i32.const 5)) (i32.const 512)";
    let refused = pair_with(fixup(remove_foreign_key));
    assert!(refused.contains("rogue.wasm: may not edit \"draft\" (only `dflash.*` keys of the draft)"), "{refused}");
    let refused = pair_with(fixup("(unreachable)"));
    assert!(refused.starts_with("rogue.wasm: ") && refused.contains("trap"), "{refused}");
}

/// The legacy draft with a reduced head: 16 rows, row i drafting target
/// token `ids[i]`.
fn reduced_draft(ids: &[i64]) -> GgufBuilder {
    let mut rng = sluice_tests::gguf_writer::Rng::new(31);
    legacy_draft()
        .tensor(Tensor::f32("output.weight", &[64, ids.len() as u64], &rng.vec(64 * ids.len(), 0.125)))
        .tensor(Tensor {
            name: "d2t".into(),
            dims: vec![ids.len() as u64],
            type_id: 27,
            data: ids.iter().flat_map(|id| id.to_le_bytes()).collect(),
        })
}

#[test]
fn a_reduced_vocabulary_dflash_draft_maps_its_head_through_d2t() {
    let even: Vec<i64> = (0..16).map(|row| 2 * row).collect();
    let counts = assert_parity(&text_target(), &reduced_draft(&even));
    assert!(counts.iter().all(|&(drafted, _)| drafted > 0), "{counts:?}");

    let out_of_range: Vec<i64> = (0..16).map(|row| if row == 5 { 32 } else { row }).collect();
    assert!(
        refusal(&text_target(), &reduced_draft(&out_of_range))
            .contains("d2t maps to token 32, outside the target's vocabulary of 32")
    );
    let short = reduced_draft(&even).tensor(Tensor::f32("output.weight", &[64, 15], &vec![0.0; 64 * 15]));
    assert!(
        refusal(&text_target(), &short)
            .contains("d2t has 16 entries; output.weight must have as many rows (it has 15)")
    );
    let floats = reduced_draft(&even).tensor(Tensor::f32("d2t", &[16], &[0.0; 16]));
    assert!(refusal(&text_target(), &floats).contains("d2t has type F32; it must hold integers"));
}
