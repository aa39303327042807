//! The constraint on a byte-fallback vocabulary (any text can be written):
//! random logits, masked, then the best allowed token, as a model would
//! sample greedily.

use std::sync::Arc;

use serde_json::{Value, json};

use super::testing::{generate, test_spm};
use super::*;
use sluice_model::tokenizer::Tokenizer;

fn grammars() -> (Arc<Tokenizer>, Grammars) {
    let tokenizer = Arc::new(test_spm(&[("▁yes", -1.0), ("no", -1.0), ("{\"", -1.0)]));
    let grammars = Grammars::new(&tokenizer).expect("the vocabulary indexes");
    (tokenizer, grammars)
}

#[test]
fn json_schema_output_parses_and_matches() {
    let (tokenizer, grammars) = grammars();
    let schema = json!({
        "type": "object",
        "properties": {"answer": {"enum": ["yes", "no"]}, "n": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["answer", "n"],
        "additionalProperties": false
    });
    let grammar = grammars.compile(&GrammarSource::JsonSchema(schema)).expect("the schema compiles");
    for seed in 1..=20 {
        let (text, ended) = generate(&tokenizer, &grammar, seed, 400);
        assert!(ended, "seed {seed}: no end within the limit: {text:?}");
        let value: Value = serde_json::from_str(&text).unwrap_or_else(|error| panic!("{text:?}: {error}"));
        let object = value.as_object().expect("an object");
        assert_eq!(object.len(), 2, "{text}");
        assert!(matches!(object["answer"].as_str(), Some("yes" | "no")), "{text}");
        assert!(object["n"].as_i64().is_some_and(|n| (0..=9).contains(&n)), "{text}");
        // Whitespace between tokens is llama.cpp's: one space, or a newline
        // and at most 20 blanks.
        assert!(!text.contains("  \n") && !text.contains("\n\n"), "{text:?}");
    }
}

#[test]
fn lark_grammar_constrains_and_ends() {
    let (tokenizer, grammars) = grammars();
    let grammar = grammars
        .compile(&GrammarSource::Lark("start: (\"yes\" | \"no\") \"!\"{1,3}".into()))
        .expect("the grammar compiles");
    let mut seen = std::collections::BTreeSet::new();
    for seed in 1..=30 {
        let (text, ended) = generate(&tokenizer, &grammar, seed, 20);
        assert!(ended, "{text:?}");
        let word = text.trim_end_matches('!');
        assert!(matches!(word, "yes" | "no") && (1..=3).contains(&(text.len() - word.len())), "{text:?}");
        seen.insert(text);
    }
    assert!(seen.len() > 2, "random logits explore the language: {seen:?}");
}

#[test]
fn control_tokens_are_never_text() {
    let (tokenizer, grammars) = grammars();
    // `<s>` written out is text the grammar allows; the control token is not.
    let grammar = grammars.compile(&GrammarSource::Lark("start: /[<>a-z\\/]+/".into())).expect("compiles");
    let mut logits = vec![0.0f32; tokenizer.vocab_size()];
    grammar.start().apply(&mut logits).expect("a mask");
    let bos = tokenizer.bos().expect("the test vocabulary has <s>");
    assert_eq!(logits[bos as usize], f32::NEG_INFINITY);
    assert_eq!(logits[b'<' as usize + 3], 0.0, "the byte token of '<' stays");
}

#[test]
fn drafts_are_cut_where_the_grammar_forbids() {
    let (tokenizer, grammars) = grammars();
    let grammar = grammars.compile(&GrammarSource::Lark("start: \"yes\" | \"yet\"".into())).expect("compiles");
    let bytes = |text: &str| text.bytes().map(|byte| u32::from(byte) + 3).collect::<Vec<_>>();
    let mut constraint = grammar.start();
    assert_eq!(constraint.allowed_prefix(&bytes("yex")), 2);
    assert_eq!(constraint.allowed_prefix(&bytes("yet")), 3);
    // Checking drafts does not move the matcher.
    constraint.commit(bytes("y")[0]).expect("y");
    assert_eq!(constraint.allowed_prefix(&bytes("es")), 2);
    assert_eq!(tokenizer.token_bytes(bytes("y")[0]), b"y");
}

#[test]
fn a_forbidden_token_fails_the_matcher() {
    let (_, grammars) = grammars();
    let grammar = grammars.compile(&GrammarSource::Lark("start: \"yes\"".into())).expect("compiles");
    let mut constraint = grammar.start();
    // The token is taken on a grammar thread: the failure shows when the
    // next mask is wanted, and stays.
    constraint.commit(u32::from(b'n') + 3).expect("the step is queued");
    let mut logits = vec![0.0; 300];
    for _ in 0..2 {
        let failure = constraint.apply(&mut logits);
        let Err(ConstraintEnd::Failed(message)) = failure else { panic!("{failure:?}") };
        assert!(message.contains("error id grammar-") && !message.contains('\n'), "{message}");
    }
    assert!(matches!(constraint.commit(u32::from(b'y') + 3), Err(ConstraintEnd::Failed(_))));
}

#[test]
fn bad_grammars_are_errors_naming_the_problem() {
    let (_, grammars) = grammars();
    let error = |source: GrammarSource| grammars.compile(&source).expect_err("refused").to_string();
    let message = error(GrammarSource::Lark("start: missing_rule".into()));
    assert!(message.contains("missing_rule"), "{message}");
    let message = error(GrammarSource::JsonSchema(json!({"type": "object", "properties": {"a": {"type": 7}}})));
    assert!(message.contains("type"), "{message}");
    let message = error(GrammarSource::Gbnf("root ::= \"a".into()));
    assert!(message.contains("line 1"), "{message}");
}

/// `start: r0`, then `r{i}: {body}` for each i below `n`, each body
/// referring to the next rule, and `r{n}: "a"`.
fn chain(n: usize, body: impl Fn(usize) -> String) -> String {
    let mut text = String::from("start: r0\n");
    for i in 0..n {
        text.push_str(&format!("r{i}: {}\n", body(i + 1)));
    }
    text.push_str(&format!("r{n}: \"a\"\n"));
    text
}

fn depth_error(result: Result<(), LimitError>) -> (usize, String) {
    match result {
        Err(LimitError::RuleDepth { depth, from, .. } | LimitError::SchemaDepth { depth, from }) => (depth, from),
        other => panic!("not a depth error: {other:?}"),
    }
}

#[test]
fn rule_depth_counts_rules_groups_and_cycles() {
    let max = limits::MAX_DEPTH;
    // `start`, r0 … r{n}: n + 2 rules of one level each.
    let plain = |n| chain(n, |next| format!("\"a\" r{next}"));
    assert_eq!(limits::lark(&plain(max - 2)), Ok(()));
    assert_eq!(depth_error(limits::lark(&plain(max - 1))), (max + 1, "start".into()));
    assert_eq!(depth_error(limits::lark(&plain(40_000))).0, 40_002);
    // Alternatives, or the reference first, change nothing.
    assert_eq!(depth_error(limits::lark(&chain(max, |next| format!("\"a\" | r{next}")))).0, max + 2);
    assert_eq!(depth_error(limits::lark(&chain(max, |next| format!("r{next} \"a\"")))).0, max + 2);
    // Each group around a reference is a level more: 200 rules nested 24
    // deep are 5,000 levels, and `start` and r200 two more.
    let grouped = chain(200, |next| format!("{}\"a\" r{next}{}", "(".repeat(24), ")".repeat(24)));
    assert_eq!(depth_error(limits::lark(&grouped)).0, 200 * 25 + 2);
    // Rules that reach one another count together, in any order.
    let mut cycle = String::from("start: c0\n");
    for i in 0..max {
        cycle.push_str(&format!("c{i}: \"a\" c{} | c{} | \"b\"\n", (i * 7 + 3) % max, (i + 1) % max));
    }
    assert_eq!(depth_error(limits::lark(&cycle)).0, max + 1);
    // Terminals nest as rules do.
    let mut terminals = String::from("start: T0\n");
    for i in 0..max {
        terminals.push_str(&format!("T{i}: \"a\" T{}\n", i + 1));
    }
    terminals.push_str(&format!("T{max}: \"a\"\n"));
    assert_eq!(depth_error(limits::lark(&terminals)).0, max + 2);
    // Strings, regular expressions, comments, special tokens and `%json`
    // values hold no names or brackets: with one bracket counted, this
    // chain would be one level too deep.
    let quiet = plain(max - 2).replacen(
        "start: r0\n",
        "start: r0 \"((\" /[(]{2}\\/x/ // ((\n# (( r1\nextra: %json {\"a\": [[1]]} \"<(\" <spe(cial>\n",
        1,
    );
    assert_eq!(limits::lark(&quiet), Ok(()));
    assert!(limits::lark(&quiet.replacen("r0 \"((\"", "r0 (\"((\")", 1)).is_err());
}

#[test]
fn choices_are_bounded_in_rules_not_terminals() {
    let alternatives = |n: usize, name: &str| {
        let options: Vec<String> = (0..n).map(|i| format!("\"a{i}\"")).collect();
        format!("start: {name}\n{name}: \"x\" ({})\n", options.join(" | "))
    };
    assert_eq!(limits::lark(&alternatives(2_000, "r")), Ok(()));
    assert_eq!(
        limits::lark(&alternatives(2_001, "r")),
        Err(LimitError::Alternatives { rule: "r".into(), count: 2_001 })
    );
    assert_eq!(limits::lark(&alternatives(5_000, "WORDS")), Ok(()));
    // A rule's own choice, continued on `|` lines past a comment.
    let options: Vec<String> = (0..2_001).map(|i| format!("  | \"a{i}\"\n# note\n")).collect();
    let text = format!("start: \"b\"\n{}", options.concat());
    assert_eq!(limits::lark(&text), Err(LimitError::Alternatives { rule: "start".into(), count: 2_002 }));
}

/// `$defs` r0 … r{n-1}, each `wrap` around a `$ref` to the next, and
/// r{n} a string; the root refers to r0.
fn ref_chain(n: usize, wrap: impl Fn(Value) -> Value) -> Value {
    let mut defs = serde_json::Map::new();
    for i in 0..n {
        defs.insert(format!("r{i}"), wrap(json!({"$ref": format!("#/$defs/r{}", i + 1)})));
    }
    defs.insert(format!("r{n}"), json!({"type": "string"}));
    json!({"$ref": "#/$defs/r0", "$defs": defs})
}

#[test]
fn schema_depth_follows_refs_into_what_they_point_to() {
    let max = limits::MAX_DEPTH;
    // Each r{i} is `{"$ref": …}` (1 deep, 2 with its `$ref`); the root is
    // 3 deep with the defs; r{n} 2 levels.
    let bare = |n| ref_chain(n, |inner| inner);
    assert_eq!(limits::schema(&bare(max / 2 - 3)), Ok(()));
    let (depth, from) = depth_error(limits::schema(&bare(max / 2)));
    assert_eq!((depth, from.as_str()), (max + 6, "#"));
    // Properties nest two levels deeper per link.
    let object = |inner| json!({"type": "object", "properties": {"a": inner}, "required": ["a"]});
    assert_eq!(depth_error(limits::schema(&ref_chain(max / 4, object))).0, (max / 4) * 4 + 8);
    // Many refs into shallow schemas side by side are not a chain.
    let mut wide = serde_json::Map::new();
    let mut properties = serde_json::Map::new();
    for i in 0..max {
        wide.insert(format!("d{i}"), json!({"type": "integer"}));
        properties.insert(format!("p{i}"), json!({"$ref": format!("#/$defs/d{i}")}));
    }
    let wide = json!({"type": "object", "properties": properties, "$defs": wide});
    assert_eq!(limits::schema(&wide), Ok(()));
    // A ref that may resolve elsewhere (an `$id` below the root) is taken
    // as pointing to the whole schema.
    let mut relocated = bare(max / 4);
    assert_eq!(limits::schema(&relocated), Ok(()));
    relocated["$defs"]["r0"]["$id"] = json!("https://example.com/r0");
    assert_eq!(depth_error(limits::schema(&relocated)).0, 4 + (max / 4 + 1) * 4);
    // Pointers resolve with their escapes (`%24` is `$`, `~1` is `/`):
    // taken as pointing to the whole schema, this chain would be too deep.
    let n = max * 3 / 10;
    let mut defs = serde_json::Map::new();
    for i in 0..n {
        defs.insert(format!("a/b{i}"), json!({"$ref": format!("#/%24defs/a~1b{}", i + 1)}));
    }
    defs.insert(format!("a/b{n}"), json!({"type": "string"}));
    assert_eq!(limits::schema(&json!({"$ref": "#/%24defs/a~1b0", "$defs": defs})), Ok(()));
}

/// Grammars far past what a 2 MiB stack holds compile from a thread with
/// a small one: the compile runs on a grammar thread.
#[test]
fn deep_grammars_compile_off_the_callers_stack() {
    let (tokenizer, grammars) = grammars();
    let compile = move || {
        let lark = chain(3_000, |next| format!("\"a\" r{next}"));
        let grammar = grammars.compile(&GrammarSource::Lark(lark)).expect("a chain within the limit compiles");
        let schema = ref_chain(1_000, |inner| json!({"type": "array", "items": inner, "minItems": 1}));
        grammars.compile(&GrammarSource::JsonSchema(schema)).expect("a $ref chain within the limit compiles");
        let (text, ended) = generate(&tokenizer, &grammar, 7, 10);
        assert_eq!((text.len(), ended), (10, false), "{text:?}");
    };
    let small = std::thread::Builder::new().stack_size(256 << 10).spawn(compile).expect("a thread");
    small.join().expect("no panic");
}

#[test]
fn limits_and_llguidance_failures_are_400s_without_internals() {
    let (_, grammars) = grammars();
    let error = |source: GrammarSource| grammars.compile(&source).expect_err("refused");
    let clean = |error: &GrammarError| {
        let message = error.to_string();
        for internal in ["panic", "backtrace", "<state>", "<grammar>", "non-verbose", "\n"] {
            assert!(!message.contains(internal), "{internal:?} in {message:?}");
        }
        message
    };
    let chain_gbnf = (0..40_000).map(|i| format!("r{i} ::= \"a\" r{}\n", i + 1)).collect::<String>();
    let deep = error(GrammarSource::Gbnf(format!("root ::= r0\n{chain_gbnf}r40000 ::= \"a\"\n")));
    assert!(matches!(deep, GrammarError::Limit(LimitError::RuleDepth { depth: 40_003, .. })), "{deep:?}");
    assert!(clean(&deep).contains("at most 5000"));
    let options: Vec<String> = (0..20_001).map(|i| format!("\"a{i}\"")).collect();
    let wide = error(GrammarSource::Gbnf(format!("root ::= {}", options.join(" | "))));
    assert!(clean(&wide).contains("rule `root` has a choice of 20001 alternatives"), "{wide}");
    // More symbols than llguidance's 16-bit ids hold, in choices within
    // the bound.
    let rules: Vec<String> = (0..40)
        .map(|r| {
            let options: Vec<String> = (0..1_500).map(|i| format!("\"x\" \"{r}\" \"{i}\"")).collect();
            format!("w{r} ::= {}\n", options.join(" | "))
        })
        .collect();
    let names: Vec<String> = (0..40).map(|r| format!("w{r}")).collect();
    let huge = error(GrammarSource::Gbnf(format!("root ::= {}\n{}", names.join(" | "), rules.concat())));
    assert!(matches!(huge, GrammarError::Compile(_)), "{huge:?}");
    assert!(clean(&huge).contains("50000"), "{huge}");
    // A grammar that derives nothing says so.
    let empty = error(GrammarSource::Gbnf("root ::= root".into()));
    assert!(matches!(empty, GrammarError::Compile(_)), "{empty:?}");
    assert!(clean(&empty).starts_with("the grammar allows no output at all"), "{empty}");
}

#[test]
fn a_dead_end_exhausts_the_row() {
    let (tokenizer, grammars) = grammars();
    let grammar = grammars.compile(&GrammarSource::Gbnf("root ::= \"a\" x\nx ::= x".into())).expect("compiles");
    let mut constraint = grammar.start();
    let mut logits = vec![0.0; tokenizer.vocab_size()];
    constraint.apply(&mut logits).expect("`a` is allowed");
    constraint.commit(u32::from(b'a') + 3).expect("`a` commits");
    assert_eq!(constraint.apply(&mut logits), Err(ConstraintEnd::Exhausted));
}

/// llguidance turns integer bounds into `i64` through `f64` and then
/// negates them: at -2^63 it recursed without end (found by the fuzz
/// target), and a 32 MiB stack is as good as none.
#[test]
fn numbers_at_the_bottom_of_i64_are_refused() {
    let (_, grammars) = grammars();
    for schema in [
        json!({"const": -9_223_372_036_854_775_806i64}),
        json!({"type": "object", "properties": {"a": {"enum": [1, {"x": i64::MIN}]}}}),
        json!({"type": "integer", "minimum": -1e19, "maximum": -1e19}),
    ] {
        let error = grammars.compile(&GrammarSource::JsonSchema(schema.clone())).expect_err("refused");
        assert!(matches!(error, GrammarError::Limit(LimitError::Number(_))), "{schema}: {error:?}");
    }
    let lark = "start: %json {\"const\": -9223372036854775807}\n";
    let error = grammars.compile(&GrammarSource::Lark(lark.into())).expect_err("refused");
    assert!(error.to_string().starts_with("the `%json` schema at line 1: the schema holds the number"), "{error}");
    for fine in [json!({"const": -4_611_686_018_427_387_904i64}), json!({"const": i64::MIN + 1024})] {
        grammars.compile(&GrammarSource::JsonSchema(fine)).expect("within i64 through f64");
    }
}

/// llguidance's message about a value of the wrong type cuts the value's
/// text at byte 100, and panics when that is inside a character: it
/// catches the panic, and the client gets an error id, not the panic.
#[test]
fn a_panic_llguidance_catches_is_an_internal_error() {
    let (_, grammars) = grammars();
    let schema = json!({"type": "array", "minItems": ["a".repeat(96) + "🙂"]});
    let error = grammars.compile(&GrammarSource::JsonSchema(schema)).expect_err("refused");
    let GrammarError::Internal { id } = &error else { panic!("{error:?}") };
    assert!(id.starts_with("grammar-"), "{id}");
    assert_eq!(
        error.to_string(),
        format!("the grammar compiler failed (error id {id}; the detail is in the server log)")
    );
}

#[test]
fn client_messages_are_first_lines_and_never_panics() {
    assert_eq!(client_message("bad rule\n<state>\nTokens: …</state>"), Some("bad rule".into()));
    assert_eq!(client_message("panic: assertion failed\n<backtrace>…"), None);
    assert_eq!(client_message("thread 'x' panicked at …"), None);
    assert_eq!(client_message(""), None);
    let long = client_message(&"x".repeat(1_000)).expect("a message");
    assert_eq!(long.chars().count(), 301);
    let failure = step_failure("gbnf", "Parser Error: too many items\n<non-verbose/>");
    assert!(failure.starts_with("Parser Error: too many items (error id grammar-"), "{failure}");
    let failure = step_failure("gbnf", "panic: index out of bounds\n<backtrace>");
    assert!(failure.starts_with("the grammar's next-token mask could not be computed (error id"), "{failure}");
}
