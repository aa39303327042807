//! `grammar`: GBNF, Lark and JSON-schema inputs, compiled by the server's
//! own compiler (`Grammars::compile`) against the default model's
//! vocabulary, with its grammar threads given exactly the stack the limits
//! claim is enough (`limits::NEEDED_STACK`, an eighth of what the server
//! gives them), so that a recursion the limits fail to bound overflows
//! and aborts the run. Generated inputs go deep and wide on purpose:
//! chains of rules, terminals and `$ref`s up to past `limits::MAX_DEPTH`,
//! nested groups, templates and conditions, choices up to past
//! `limits::MAX_ALTERNATIVES`, schemas nested through every keyword; then
//! text and JSON mutations of them. For each:
//!
//! - compiling gives a grammar or an error, never a panic out of our own
//!   code (the limits and the GBNF translation run outside any catch);
//!   a panic llguidance catches is an internal error, which the server
//!   answers with a 500 and an error id, and llguidance has some (its
//!   messages about a value of the wrong type cut the value's text at a
//!   byte that may fall inside a character);
//! - an error's message is one line without a panic, a backtrace or the
//!   parser's state;
//! - a grammar's first mask is there and a few tokens commit, each step
//!   either fine or failed with such a message.

use std::sync::OnceLock;

use serde_json::{Map, Value, json};
use sluice_engine::constraint::{ConstraintEnd, GrammarSource, Grammars, limits};
use sluice_model::gguf::GgufFile;
use sluice_model::tokenizer::Tokenizer;
use sluice_tests::fuzz::{Fuzzer, Rng, bytes, json as json_mutations};
use sluice_tests::models::default_model;

/// Longest text a mutation makes of a grammar.
const MAX_TEXT: usize = 256 << 10;
/// Tokens committed after a successful compile.
const STEPS: usize = 4;

fn compiler() -> &'static (Tokenizer, Grammars) {
    static COMPILER: OnceLock<(Tokenizer, Grammars)> = OnceLock::new();
    COMPILER.get_or_init(|| {
        let file = GgufFile::open(&default_model()).expect("the default model opens");
        let tokenizer = Tokenizer::from_gguf(&file).expect("the default vocabulary builds");
        let grammars = Grammars::with_stack(&tokenizer, limits::NEEDED_STACK).expect("the grammar compiler starts");
        (tokenizer, grammars)
    })
}

pub fn run() {
    let mut rng = Rng::new(0x6a2a_33a2);
    let generated: Vec<Value> = (0..48).map(|_| generate(&mut rng)).collect();
    Fuzzer::new("grammar", generated).run(mutate, check);
}

fn source(input: &Value) -> Option<GrammarSource> {
    let (kind, value) = input.as_object()?.iter().next()?;
    match (kind.as_str(), value) {
        ("gbnf", Value::String(text)) => Some(GrammarSource::Gbnf(text.clone())),
        ("lark", Value::String(text)) => Some(GrammarSource::Lark(text.clone())),
        ("json_schema", schema) => Some(GrammarSource::JsonSchema(schema.clone())),
        _ => None,
    }
}

fn check(input: &Value) -> Result<(), String> {
    let Some(source) = source(input) else { return Ok(()) };
    let (tokenizer, grammars) = compiler();
    let grammar = match grammars.compile(&source) {
        Ok(grammar) => grammar,
        Err(error) => return clean(&error.to_string()),
    };
    let mut constraint = grammar.start();
    let mut logits = vec![0.0f32; tokenizer.vocab_size()];
    for step in 0..STEPS {
        logits.fill(0.0);
        match constraint.apply(&mut logits) {
            Ok(()) => {}
            Err(ConstraintEnd::Exhausted) => return Ok(()),
            Err(ConstraintEnd::Failed(message)) => return failed_step(&message),
        }
        let allowed: Vec<usize> = (0..logits.len()).filter(|&token| logits[token].is_finite()).collect();
        if allowed.is_empty() {
            return Err("a mask allows nothing, and the constraint did not say it is exhausted".into());
        }
        let token = allowed[(step * 7_919) % allowed.len()] as u32;
        if tokenizer.is_end_of_generation(token) {
            return Ok(());
        }
        if let Err(ConstraintEnd::Failed(message)) = constraint.commit(token) {
            return failed_step(&message);
        }
    }
    match constraint.apply(&mut logits) {
        Err(ConstraintEnd::Failed(message)) => failed_step(&message),
        _ => Ok(()),
    }
}

fn clean(message: &str) -> Result<(), String> {
    let internal = ["panic", "backtrace", "<state>", "<grammar>", "non-verbose", "\n"];
    match internal.iter().find(|internal| message.contains(*internal)) {
        Some(internal) => Err(format!("{internal:?} in a message: {message:?}")),
        None => Ok(()),
    }
}

/// A step may fail (a grammar past the parser's limits at that point),
/// with a clean message; one that panicked may not.
fn failed_step(message: &str) -> Result<(), String> {
    if message.contains("could not be computed") {
        return Err(format!("a step panicked: {message}"));
    }
    clean(message)
}

fn mutate(rng: &mut Rng, input: &mut Value, corpus: &[Value]) {
    if rng.one_in(8) {
        *input = generate(rng);
        return;
    }
    let Some((kind, value)) = input.as_object_mut().and_then(|map| map.iter_mut().next()) else {
        *input = generate(rng);
        return;
    };
    if kind == "json_schema" {
        json_mutations::mutate(rng, value, corpus, &keywords());
        return;
    }
    let Value::String(text) = value else { return };
    let other = corpus[rng.below(corpus.len())].as_object().and_then(|map| map.values().next()?.as_str());
    let splice = vec![other.unwrap_or("root ::= \"a\"").as_bytes().to_vec()];
    let mut data = std::mem::take(text).into_bytes();
    bytes::mutate(rng, &mut data, &splice, MAX_TEXT);
    *text = String::from_utf8_lossy(&data).into_owned();
}

fn keywords() -> Vec<String> {
    ["$ref", "$defs", "$id", "$anchor", "properties", "items", "anyOf", "allOf", "oneOf", "enum", "const", "type"]
        .iter()
        .map(|keyword| (*keyword).to_owned())
        .collect()
}

/// A size: mostly small, sometimes around `limit`, rarely far past it.
fn size(rng: &mut Rng, limit: usize) -> usize {
    match rng.below(8) {
        0..=4 => 1 + rng.below(64),
        5 | 6 => limit - limit / 8 + rng.below(limit / 4),
        _ => limit * (2 + rng.below(6)),
    }
}

fn generate(rng: &mut Rng) -> Value {
    match rng.below(3) {
        0 => json!({"gbnf": gbnf(rng)}),
        1 => json!({"lark": lark(rng)}),
        _ => json!({"json_schema": schema(rng)}),
    }
}

fn gbnf(rng: &mut Rng) -> String {
    match rng.below(5) {
        0 | 1 => {
            let n = size(rng, limits::MAX_DEPTH);
            let groups = if rng.one_in(3) { rng.below(25) } else { 0 };
            let links = ["\"a\" r{}", "\"a\" | r{}", "r{} \"a\"", "(\"a\" r{})*", "r{}? \"b\""];
            let link = *rng.pick(&links);
            let mut text = String::from("root ::= r0\n");
            for i in 0..n {
                let body = link.replace("{}", &(i + 1).to_string());
                text.push_str(&format!("r{i} ::= {}{body}{}\n", "(".repeat(groups), ")".repeat(groups)));
            }
            text + &format!("r{n} ::= [a-z]\n")
        }
        2 => {
            let n = size(rng, limits::MAX_ALTERNATIVES);
            let options: Vec<String> = (0..n).map(|i| format!("\"a{i}\"")).collect();
            let prefix = if rng.one_in(2) { "\"x\" " } else { "" };
            format!("root ::= {prefix}({})\n", options.join(" | "))
        }
        3 => {
            let depth = rng.below(40);
            format!("root ::= {}\"a\"{}\n", "(".repeat(depth), ")*".repeat(depth))
        }
        _ => {
            let bound = rng.below(2_100);
            format!("root ::= (\"ab\"{{0,{bound}}} [0-9]{{1,{}}})+ item\nitem ::= item \"c\" | \"d\"\n", 1 + bound / 2)
        }
    }
}

fn lark(rng: &mut Rng) -> String {
    let header = "%llguidance {}\n";
    match rng.below(5) {
        0 => {
            let n = size(rng, limits::MAX_DEPTH);
            let body: String = (0..n).map(|i| format!("T{i}: \"a\" T{}\n", i + 1)).collect();
            format!("{header}start: T0\n{body}T{n}: /[a-z]/\n")
        }
        1 => {
            // Templates and conditions nest the parser, not the compiler.
            let n = size(rng, limits::MAX_DEPTH);
            if rng.one_in(2) {
                format!("{header}start: {}\"a\"{}\n", "x{".repeat(n), "}".repeat(n))
            } else {
                format!("{header}start: \"a\" %if {}true{}\n", "not(".repeat(n), ")".repeat(n))
            }
        }
        2 => {
            let depth = rng.below(40);
            format!("{header}start: {}\"a\"{} | %lark {{ start: \"b\" }}\n", "(".repeat(depth), ")".repeat(depth))
        }
        3 => format!("{header}start: \"<\" body \">\"\nbody: %json {}\n", schema(rng)),
        _ => {
            let n = size(rng, limits::MAX_ALTERNATIVES);
            let options: Vec<String> = (0..n).map(|i| format!("\"w{i}\"")).collect();
            let name = if rng.one_in(2) { "words" } else { "WORDS" };
            format!("{header}start: \"x\" {name}\n{name}: {}\n", options.join(" | "))
        }
    }
}

fn schema(rng: &mut Rng) -> Value {
    match rng.below(3) {
        0 => {
            let n = size(rng, limits::MAX_DEPTH / 2);
            let mut defs = Map::new();
            let shape = rng.below(4);
            for i in 0..n {
                let next = json!({"$ref": format!("#/$defs/r{}", i + 1)});
                let def = match shape {
                    0 => next,
                    1 => json!({"type": "object", "properties": {"a": next}, "required": ["a"]}),
                    2 => json!({"type": "array", "items": next, "minItems": 1}),
                    _ => json!({"anyOf": [next, {"$ref": format!("#/$defs/r{}", (i * 7 + 1) % n)}]}),
                };
                defs.insert(format!("r{i}"), def);
            }
            defs.insert(format!("r{n}"), json!({"type": "string", "maxLength": 3}));
            json!({"$ref": "#/$defs/r0", "$defs": defs})
        }
        1 => {
            // As deep as a request body can carry (serde_json stops at 128).
            let mut value = json!({"type": "integer"});
            for _ in 0..rng.below(120) {
                value = match rng.below(5) {
                    0 => json!({"type": "array", "items": value}),
                    1 => json!({"type": "object", "properties": {"a": value}, "required": ["a"]}),
                    2 => json!({"anyOf": [value, {"type": "null"}]}),
                    3 => json!({"allOf": [value, {"type": "integer", "minimum": 0}]}),
                    _ => json!({"type": "object", "additionalProperties": value}),
                };
            }
            value
        }
        _ => {
            let n = size(rng, 600);
            let properties: Map<String, Value> =
                (0..n).map(|i| (format!("p{i}"), json!({"enum": [i, format!("v{i}"), null]}))).collect();
            json!({"type": "object", "properties": properties, "additionalProperties": false})
        }
    }
}
