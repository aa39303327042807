//! The generation fields shared by `/completion`, `/v1/completions` and
//! `/v1/chat/completions` with llama-server's names, aliases and defaults.
//!
//! As in llama-server, `null` means "absent" and unknown fields are
//! ignored. Unlike it, a wrong type is an error naming the field rather than
//! a silent fall back to the default.

use serde_json::{Value, json};

use super::adapters::Adapters;
use super::error::ApiError;
use crate::chat::fields::{Fields, integer, wrong};
use crate::chat::structured::{self, Compiler};
use crate::config::RequestDefaults;
use sluice_engine::request::GenerationRequest;
use sluice_engine::sampling::{SamplingParams, Stage};
use sluice_model::tokenizer::Tokenizer;

/// The server-side limits a request is checked against.
pub struct Limits<'a> {
    pub defaults: &'a RequestDefaults,
    pub slots: usize,
    pub n_ctx: usize,
    /// Most probabilities per token a request may ask for
    /// (`server.limits.n_probs`).
    pub n_probs: usize,
    pub tokenizer: &'a Tokenizer,
    pub adapters: &'a Adapters,
    pub grammars: &'a Compiler,
}

/// The generation fields of one request (the prompt comes separately).
#[derive(Debug, Clone)]
pub struct Generation {
    /// Everything but the prompt.
    pub request: GenerationRequest,
    /// `n_predict` as resolved (-1 = no limit), for `generation_settings`.
    pub n_predict: i64,
    /// The seed as llama-server reports it (4294967295 = random).
    pub seed: u32,
    pub stream: bool,
    pub include_usage: bool,
    pub return_tokens: bool,
    pub timings_per_token: bool,
    /// OpenAI responses carry `__verbose`, the native response.
    pub verbose: bool,
    pub response_fields: Vec<String>,
    /// Completions per prompt (`n_cmpl` / `n`).
    pub n_cmpl: usize,
}

/// llama.cpp's "random seed" value.
pub const RANDOM_SEED: u32 = u32::MAX;

/// Read the generation fields of a request.
pub fn generation(fields: Fields<'_>, limits: &Limits<'_>) -> Result<Generation, ApiError> {
    let defaults = limits.defaults;
    let n_predict =
        match ["n_predict", "max_completion_tokens", "max_tokens"].iter().find(|key| fields.get(key).is_some()) {
            Some(key) => {
                let value = fields.int(key)?.unwrap_or(-1);
                if value < -1 {
                    return Err(ApiError::invalid(format!("`{key}` must be -1 (no limit) or more, not {value}")));
                }
                value
            }
            None => defaults.n_predict,
        };

    // Soft limits clamp, as llama-server's schema does.
    let mut sampling = SamplingParams {
        temperature: fields.f32("temperature")?.unwrap_or(defaults.temperature).max(0.0),
        top_k: defaults.top_k,
        top_p: defaults.top_p.clamp(0.0, 1.0),
        min_p: defaults.min_p.clamp(0.0, 1.0),
        typical_p: defaults.typical_p,
        repeat_penalty: defaults.repeat_penalty,
        repeat_last_n: usize::try_from(defaults.repeat_last_n).unwrap_or(limits.n_ctx),
        presence_penalty: defaults.presence_penalty,
        frequency_penalty: defaults.frequency_penalty,
        ..SamplingParams::default()
    };
    if let Some(top_k) = fields.int("top_k")? {
        sampling.top_k = top_k.clamp(0, i64::from(i32::MAX)) as i32;
    }
    if let Some(top_p) = fields.f32("top_p")? {
        sampling.top_p = top_p.clamp(0.0, 1.0);
    }
    if let Some(min_p) = fields.f32("min_p")? {
        sampling.min_p = min_p.clamp(0.0, 1.0);
    }
    if let Some(typical_p) = fields.f32("typical_p")? {
        sampling.typical_p = typical_p;
    }
    if let Some(penalty) = fields.f32("repeat_penalty")? {
        sampling.repeat_penalty = penalty;
    }
    if let Some(penalty) = fields.f32("presence_penalty")? {
        sampling.presence_penalty = penalty;
    }
    if let Some(penalty) = fields.f32("frequency_penalty")? {
        sampling.frequency_penalty = penalty;
    }
    if let Some(last_n) = fields.int("repeat_last_n")? {
        sampling.repeat_last_n = match last_n {
            -1 => limits.n_ctx,
            n if n >= 0 => n as usize,
            n => return Err(ApiError::invalid(format!("`repeat_last_n` must be -1 (the context) or more, not {n}"))),
        };
    }
    if let Some(min_keep) = fields.int("min_keep")? {
        sampling.min_keep = usize::try_from(min_keep)
            .map_err(|_| ApiError::invalid(format!("`min_keep` must be 0 or more, not {min_keep}")))?;
    }
    let seed = match fields.int("seed")? {
        None | Some(-1) => defaults.seed,
        Some(seed) => seed,
    };
    let seed = match seed {
        -1 => RANDOM_SEED,
        seed => u32::try_from(seed)
            .map_err(|_| ApiError::invalid(format!("`seed` must be -1 (random) or 0..=4294967295, not {seed}")))?,
    };
    sampling.seed = (seed != RANDOM_SEED).then_some(seed);
    if let Some(stages) = samplers(fields)? {
        sampling.stages = stages;
    }
    sampling.logit_bias = logit_bias(fields, limits.tokenizer)?;
    let ignore_eos = fields.bool_or("ignore_eos", false)?;
    if ignore_eos {
        // llama-server bans end-of-generation tokens outright.
        sampling.logit_bias.extend(limits.tokenizer.end_of_generation_ids().iter().map(|&id| (id, f32::NEG_INFINITY)));
    }

    let n_probs = match fields.int("n_probs")? {
        Some(n) => Some(("n_probs", n)),
        None => match fields.get("logprobs") {
            // `/v1/completions` spells it `logprobs` (an integer); chat's
            // boolean `logprobs` is read by the chat handler.
            Some(Value::Number(_)) => fields.int("logprobs")?.map(|n| ("logprobs", n)),
            Some(Value::Bool(_)) | None => None,
            Some(_) => return Err(wrong("logprobs", "an integer (a boolean on chat completions)").into()),
        },
    };
    let n_probs = match n_probs {
        Some((key, n)) => probabilities(key, n, limits)?,
        None => 0,
    };
    let id_slot = match fields.int("id_slot")? {
        None | Some(-1) => None,
        Some(slot) if (0..limits.slots as i64).contains(&slot) => Some(slot as u32),
        Some(slot) => {
            return Err(ApiError::invalid(format!(
                "`id_slot` must be -1 (any) or a slot id below {}, not {slot}",
                limits.slots
            )));
        }
    };
    let priority = fields.int_in("priority", i64::from(i32::MIN)..=i64::from(i32::MAX))?.unwrap_or(0) as i32;
    let n_cmpl_key = if fields.get("n_cmpl").is_some() { "n_cmpl" } else { "n" };
    let n_cmpl = fields.int_in(n_cmpl_key, 1..=limits.slots as i64)?.unwrap_or(1) as usize;

    let stop: Vec<String> =
        fields.strings("stop")?.unwrap_or_default().into_iter().filter(|word| !word.is_empty()).collect();
    let include_usage = match fields.get("stream_options") {
        Some(Value::Object(options)) => Fields(options).bool_or("include_usage", false)?,
        Some(_) => return Err(wrong("stream_options", "an object").into()),
        None => false,
    };
    let n_keep = match fields.int("n_keep")?.unwrap_or(defaults.n_keep) {
        -1 => None,
        n => Some(
            usize::try_from(n)
                .map_err(|_| ApiError::invalid(format!("`n_keep` must be -1 (the whole prompt) or more, not {n}")))?,
        ),
    };
    let n_discard = match fields.int("n_discard")? {
        None => 0,
        Some(n) => usize::try_from(n)
            .map_err(|_| ApiError::invalid(format!("`n_discard` must be 0 (half) or more, not {n}")))?,
    };
    let request = GenerationRequest {
        prompt: Vec::new(),
        sampling,
        n_predict: usize::try_from(n_predict).ok(),
        stop,
        ignore_eos,
        n_probs,
        post_sampling_probs: fields.bool_or("post_sampling_probs", false)?,
        cache_prompt: fields.bool_or("cache_prompt", defaults.cache_prompt)?,
        // Progress is only ever streamed.
        return_progress: fields.bool_or("stream", false)? && fields.bool_or("return_progress", false)?,
        id_slot,
        priority,
        lora: limits.adapters.request(fields.get("lora"), fields.get("model").and_then(Value::as_str))?,
        n_keep,
        n_discard,
        grammar: structured::grammar(fields, limits.grammars)?,
        images: Vec::new(),
    };
    Ok(Generation {
        request,
        n_predict,
        seed,
        stream: fields.bool_or("stream", false)?,
        include_usage,
        return_tokens: fields.bool_or("return_tokens", false)?,
        timings_per_token: fields.bool_or("timings_per_token", false)?,
        verbose: fields.bool_or("verbose", defaults.verbose)?,
        response_fields: fields.strings("response_fields")?.unwrap_or_default(),
        n_cmpl,
    })
}

/// How many probabilities per token a request asks for in `key` (`n_probs`,
/// `logprobs`, `top_logprobs`): at most the server's cap, and no more than
/// the vocabulary has.
pub fn probabilities(key: &str, n: i64, limits: &Limits<'_>) -> Result<usize, ApiError> {
    let n = usize::try_from(n).map_err(|_| ApiError::invalid(format!("`{key}` must be 0 or more, not {n}")))?;
    if n > limits.n_probs {
        return Err(ApiError::invalid(format!(
            "`{key}` asks for {n} probabilities per token; this server gives at most {} (server.limits.n_probs)",
            limits.n_probs
        )));
    }
    Ok(n.min(limits.tokenizer.vocab_size()))
}

/// `samplers`: names (with llama.cpp's aliases) or a string of letters.
/// Stages sluice does not have (dry, xtc, …) are skipped, as llama.cpp
/// skips names it does not know.
fn samplers(fields: Fields<'_>) -> Result<Option<Vec<Stage>>, ApiError> {
    let Some(value) = fields.get("samplers") else { return Ok(None) };
    let stages = match value {
        Value::String(letters) => letters.chars().filter_map(stage_of_letter).collect(),
        Value::Array(names) => names
            .iter()
            .map(|name| name.as_str().ok_or_else(|| wrong("samplers", "an array of sampler names or a string")))
            .collect::<Result<Vec<_>, _>>()?
            .into_iter()
            .filter_map(Stage::from_name)
            .collect(),
        _ => return Err(wrong("samplers", "an array of sampler names or a string").into()),
    };
    Ok(Some(stages))
}

fn stage_of_letter(letter: char) -> Option<Stage> {
    Some(match letter {
        'e' => Stage::Penalties,
        'k' => Stage::TopK,
        'y' => Stage::TypicalP,
        'p' => Stage::TopP,
        'm' => Stage::MinP,
        't' => Stage::Temperature,
        _ => return None,
    })
}

/// A stage's llama.cpp name, for `generation_settings.samplers`.
pub fn stage_name(stage: Stage) -> &'static str {
    match stage {
        Stage::Penalties => "penalties",
        Stage::TopK => "top_k",
        Stage::TypicalP => "typ_p",
        Stage::TopP => "top_p",
        Stage::MinP => "min_p",
        Stage::Temperature => "temperature",
    }
}

/// `logit_bias`: `[[token|text, bias|false], …]` or `{"token|text": bias|false}`.
/// Text is tokenized and every token of it biased; `false` bans; ids
/// outside the vocabulary are dropped, as llama-server drops them. A bias
/// of another type is refused: llama-server skips it, and the client then
/// never learns that its bias did nothing.
fn logit_bias(fields: Fields<'_>, tokenizer: &Tokenizer) -> Result<Vec<(u32, f32)>, ApiError> {
    let Some(value) = fields.get("logit_bias") else { return Ok(Vec::new()) };
    let shape = "`logit_bias` must be [[token or text, bias or false], …] or {\"token or text\": bias or false}";
    let mut biases = Vec::new();
    let mut add = |target: &Value, bias: &Value| -> Result<(), ApiError> {
        let bias = match bias {
            Value::Number(number) => number.as_f64().map(|bias| bias as f32).ok_or_else(|| ApiError::invalid(shape))?,
            Value::Bool(false) => f32::NEG_INFINITY,
            _ => return Err(ApiError::invalid(format!("{shape}; a bias of {bias} is neither"))),
        };
        let tokens = match target {
            Value::Number(_) => vec![integer("logit_bias", target)?],
            Value::String(text) => match text.parse::<i64>() {
                Ok(id) => vec![id],
                Err(_) => tokenizer.encode(text, false, false).into_iter().map(i64::from).collect(),
            },
            _ => return Err(ApiError::invalid(shape)),
        };
        let vocab = tokenizer.vocab_size() as i64;
        biases.extend(tokens.into_iter().filter(|&id| (0..vocab).contains(&id)).map(|id| (id as u32, bias)));
        Ok(())
    };
    match value {
        Value::Array(pairs) => {
            for pair in pairs {
                match pair.as_array().map(Vec::as_slice) {
                    Some([target, bias]) => add(target, bias)?,
                    _ => return Err(ApiError::invalid(shape)),
                }
            }
        }
        Value::Object(map) => {
            for (target, bias) in map {
                add(&Value::String(target.clone()), bias)?;
            }
        }
        _ => return Err(ApiError::invalid(shape)),
    }
    Ok(biases)
}

/// `generation_settings` (llama-server's `params` object, for the fields
/// sluice has).
pub fn settings_json(generation: &Generation) -> Value {
    let request = &generation.request;
    let sampling = &request.sampling;
    let logit_bias: Vec<Value> = sampling
        .logit_bias
        .iter()
        .map(|&(id, bias)| {
            // llama-server writes -inf as null.
            let bias = if bias.is_finite() { json!(bias) } else { Value::Null };
            json!({ "bias": bias, "token": id })
        })
        .collect();
    json!({
        "n_predict": generation.n_predict,
        "seed": generation.seed,
        "temperature": sampling.temperature,
        "top_k": sampling.top_k,
        "top_p": sampling.top_p,
        "min_p": sampling.min_p,
        "typical_p": sampling.typical_p,
        "repeat_last_n": sampling.repeat_last_n,
        "repeat_penalty": sampling.repeat_penalty,
        "presence_penalty": sampling.presence_penalty,
        "frequency_penalty": sampling.frequency_penalty,
        "stop": request.stop,
        "max_tokens": generation.n_predict,
        "n_probs": request.n_probs,
        "n_keep": request.n_keep.map_or(-1, |n| n as i64),
        "n_discard": request.n_discard,
        "min_keep": sampling.min_keep,
        "samplers": sampling.stages.iter().map(|&stage| stage_name(stage)).collect::<Vec<_>>(),
        "ignore_eos": request.ignore_eos,
        "logit_bias": logit_bias,
        "post_sampling_probs": request.post_sampling_probs,
        "cache_prompt": request.cache_prompt,
        "id_slot": request.id_slot.map_or(-1, i64::from),
        "priority": request.priority,
        "stream": generation.stream,
        "timings_per_token": generation.timings_per_token,
        "lora": request.lora.iter().map(|&(id, scale)| json!({"id": id, "scale": scale})).collect::<Vec<_>>(),
    })
}
