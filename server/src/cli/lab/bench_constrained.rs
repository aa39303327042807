//! `sluice bench constrained`: what structured outputs cost, on three JSON
//! schemas. With `-m`, in process: the time to commit each token of a valid
//! instance and compute the next mask over the model's vocabulary (p50 and
//! p99). With `--url`, against a running server (sluice or llama-server):
//! decode tokens/s of the same prompt with each schema and without one.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};
use sluice_engine::constraint::{GrammarSource, Grammars};
use sluice_model::gguf::GgufFile;
use sluice_model::tokenizer::Tokenizer;

use crate::cli::bench::median;

#[derive(clap::Args)]
pub struct BenchConstrainedArgs {
    /// The model (GGUF) whose vocabulary the masks are computed over.
    #[arg(short = 'm', long = "model", value_name = "FILE")]
    model: Option<PathBuf>,
    /// A running server to measure decode speed on (`http://127.0.0.1:8080`).
    #[arg(long)]
    url: Option<String>,
    /// The server's name in the output.
    #[arg(long, default_value = "server")]
    label: String,
    /// Most tokens per request.
    #[arg(long, default_value_t = 128)]
    n_predict: u32,
    /// Repetitions of each measurement (the median is reported).
    #[arg(long, default_value_t = 3)]
    reps: usize,
}

/// (name, schema, an instance of it): the instance is the path the mask
/// timing walks, token by token.
fn schemas() -> Vec<(&'static str, Value, Value)> {
    vec![
        (
            "person",
            json!({"type": "object", "properties": {"name": {"type": "string", "maxLength": 40},
                   "age": {"type": "integer", "minimum": 0, "maximum": 150}, "email": {"type": "string", "format": "email"}},
                   "required": ["name", "age", "email"], "additionalProperties": false}),
            json!({"name": "Ada Lovelace", "age": 36, "email": "ada@example.com"}),
        ),
        (
            "order",
            json!({"type": "object", "properties": {"id": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{4}$"},
                   "items": {"type": "array", "maxItems": 8, "items": {"type": "object", "properties": {
                       "sku": {"type": "string", "maxLength": 12}, "qty": {"type": "integer", "minimum": 1, "maximum": 99},
                       "price": {"type": "number", "minimum": 0}}, "required": ["sku", "qty", "price"],
                       "additionalProperties": false}},
                   "status": {"enum": ["open", "paid", "shipped"]}}, "required": ["id", "items", "status"],
                   "additionalProperties": false}),
            json!({"id": "AB1234", "items": [{"sku": "pen-blue", "qty": 3, "price": 1.25},
                   {"sku": "notebook", "qty": 1, "price": 4.5}], "status": "paid"}),
        ),
        (
            "event",
            json!({"$defs": {"place": {"anyOf": [{"type": "string", "maxLength": 30}, {"type": "object", "properties": {
                       "lat": {"type": "number"}, "lon": {"type": "number"}}, "required": ["lat", "lon"],
                       "additionalProperties": false}]}},
                   "type": "object", "properties": {"title": {"type": "string", "maxLength": 60},
                   "when": {"type": "string", "format": "date-time"}, "where": {"$ref": "#/$defs/place"},
                   "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 5}},
                   "required": ["title", "when", "where"], "additionalProperties": false}),
            json!({"title": "Launch party", "when": "2026-12-02T18:30:00Z", "where": {"lat": 48.85, "lon": 2.35},
                   "tags": ["fun", "team"]}),
        ),
    ]
}

pub fn bench_constrained(args: BenchConstrainedArgs) -> anyhow::Result<()> {
    if args.model.is_none() && args.url.is_none() {
        bail!("give -m FILE (mask time), --url URL (decode speed) or both");
    }
    if let Some(model) = &args.model {
        mask_times(model, args.reps.max(1))?;
    }
    if let Some(url) = &args.url {
        decode_speed(url, &args)?;
    }
    Ok(())
}

fn mask_times(model: &std::path::Path, reps: usize) -> anyhow::Result<()> {
    let file = GgufFile::open(model).with_context(|| format!("reading {}", model.display()))?;
    let tokenizer = Tokenizer::from_gguf(&file)?;
    let started = Instant::now();
    let grammars = Grammars::new(&tokenizer)?;
    println!(
        "vocabulary: {} tokens, indexed in {:.0} ms",
        tokenizer.vocab_size(),
        started.elapsed().as_secs_f64() * 1e3
    );
    println!("| schema | compile + first mask (ms) | tokens | mask p50 (µs) | mask p99 (µs) |");
    println!("|---|---:|---:|---:|---:|");
    for (name, schema, instance) in schemas() {
        let tokens = tokenizer.encode(&instance.to_string(), false, false);
        let mut compile = Vec::new();
        let mut steps = Vec::new();
        let mut logits = vec![0.0f32; tokenizer.vocab_size()];
        for _ in 0..reps {
            let started = Instant::now();
            let grammar = grammars.compile(&GrammarSource::JsonSchema(schema.clone()))?;
            compile.push(started.elapsed());
            let mut constraint = grammar.start();
            for &token in &tokens {
                // Commit, then wait for the mask the worker computes: the
                // whole cost of one constrained token when nothing hides it.
                let started = Instant::now();
                constraint.commit(token).with_context(|| format!("{name}: the instance's token {token}"))?;
                constraint.apply(&mut logits).with_context(|| format!("{name}: the mask after {token}"))?;
                steps.push(started.elapsed());
            }
        }
        compile.sort();
        steps.sort();
        let micros = |at: f64| steps.get(((steps.len() as f64 - 1.0) * at) as usize).map_or(0.0, |d| micros(*d));
        println!(
            "| {name} | {:.1} | {} | {:.0} | {:.0} |",
            compile[compile.len() / 2].as_secs_f64() * 1e3,
            tokens.len(),
            micros(0.5),
            micros(0.99)
        );
    }
    Ok(())
}

fn micros(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e6
}

/// A client for the server at `url`, once it answers `/health` (a server
/// just started answers 503 while its model loads).
pub(super) fn ready_client(url: &str) -> anyhow::Result<reqwest::blocking::Client> {
    let client = reqwest::blocking::Client::builder().timeout(Duration::from_secs(1800)).build()?;
    let deadline = Instant::now() + Duration::from_secs(300);
    while !client.get(format!("{url}/health")).send().is_ok_and(|answer| answer.status().is_success()) {
        if Instant::now() > deadline {
            bail!("{url}/health did not answer 200 within 300 s");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(client)
}

fn decode_speed(url: &str, args: &BenchConstrainedArgs) -> anyhow::Result<()> {
    let client = ready_client(url)?;
    let run = |body: &Value| -> anyhow::Result<(f64, u64)> {
        let answer: Value = client
            .post(format!("{url}/completion"))
            .json(body)
            .send()
            .with_context(|| format!("POST {url}/completion"))?
            .error_for_status()?
            .json()?;
        let timings = &answer["timings"];
        Ok((timings["predicted_per_second"].as_f64().unwrap_or(0.0), timings["predicted_n"].as_u64().unwrap_or(0)))
    };
    println!("{}: decode tokens/s (median of {}), temperature 0", args.label, args.reps.max(1));
    println!("| schema | constrained | tokens | unconstrained | ratio |");
    println!("|---|---:|---:|---:|---:|");
    for (name, schema, _) in schemas() {
        let prompt = format!("Write a JSON {name} record:\n");
        let base = json!({"prompt": prompt, "n_predict": args.n_predict, "temperature": 0, "cache_prompt": false});
        let mut constrained = Vec::new();
        let mut free = Vec::new();
        let mut tokens = 0;
        for _ in 0..args.reps.max(1) {
            let mut body = base.clone();
            body["json_schema"] = schema.clone();
            let (speed, n) = run(&body)?;
            constrained.push(speed);
            tokens = n;
            // The same number of tokens, unconstrained.
            let mut body = base.clone();
            body["n_predict"] = json!(n.max(1));
            body["ignore_eos"] = json!(true);
            free.push(run(&body)?.0);
        }
        let (constrained, free) = (median(&mut constrained), median(&mut free));
        println!(
            "| {name} | {constrained:.1} | {tokens} | {free:.1} | {:.2}× |",
            constrained / free.max(f64::MIN_POSITIVE)
        );
    }
    Ok(())
}
