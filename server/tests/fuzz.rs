//! Bounded fuzzing of everything that reads untrusted input
//! (docs/reliability.md, "Fuzzing"): one test per target, each fed for
//! `SLUICE_FUZZ_SECONDS` (6 by default, which is what `cargo xtask test`
//! runs; `cargo xtask fuzz` runs longer) from its corpus in
//! `fuzz-corpus/<target>/` and the entries the target generates.

#[path = "fuzz/alloc.rs"]
mod alloc;
#[path = "fuzz/chat_template.rs"]
mod chat_template;
#[path = "fuzz/decision.rs"]
mod decision;
#[path = "fuzz/endpoints.rs"]
mod endpoints;
#[path = "fuzz/gguf.rs"]
mod gguf;
#[path = "fuzz/grammar.rs"]
mod grammar;
#[path = "fuzz/tokenizer.rs"]
mod tokenizer;

#[global_allocator]
static ALLOCATOR: alloc::Counting = alloc::Counting;

#[test]
fn gguf() {
    gguf::run();
}

#[test]
fn tokenizer() {
    tokenizer::run();
}

#[test]
fn chat_template() {
    chat_template::run();
}

#[test]
fn decision() {
    decision::run();
}

#[test]
fn endpoints() {
    endpoints::run();
}

#[test]
fn grammar() {
    grammar::run();
}

/// A regression test beside the target: the reader once reserved room for
/// every entry a header claimed, ten times the file's size, before reading
/// the first.
#[test]
fn gguf_claimed_counts_reserve_nothing() {
    gguf::claimed_counts();
}
