//! Fixture plugins written in WAT against the canonical ABI of
//! `plugin-api/wit` and turned into components with `wit-component`, so a
//! test controls every byte a plugin returns.

/// The scheduler world's WIT, as the host was built with.
pub const SCHEDULER_WIT: &str = include_str!("../../plugin-api/wit/scheduler.wit");
/// The draft-fixup world's WIT.
pub const FIXUP_WIT: &str = include_str!("../../plugin-api/wit/draft-fixup.wit");

/// The package version of the host's WIT (`sluice:plugin@VERSION`).
pub fn version() -> &'static str {
    SCHEDULER_WIT
        .split_once("package sluice:plugin@")
        .and_then(|(_, rest)| rest.split_once(';'))
        .map(|(version, _)| version)
        .expect("the WIT names its package")
}

/// A `configure` body returning `ok` (a pointer to zeroed memory).
pub const OK: &str = "(i32.const 0)";
/// A hostile body that does nothing hostile.
pub const BENIGN: &str = "(nop)";

/// A policy whose `step` behaves (returns `decode: [calls on this instance]`)
/// except at step 1, where it runs `hostile`. `configure` runs
/// `configure_body`, which must leave a `result<_, string>` pointer on the
/// stack; the default returns a pointer to zeroed memory (`ok`).
pub fn policy_module(version: &str, hostile: &str, configure_body: &str, extra: &str) -> String {
    format!(
        r#"(module
  {extra}
  (memory (export "memory") 1)
  (global $heap (mut i32) (i32.const 4096))
  (global $calls (mut i32) (i32.const 0))
  (data (i32.const 256) "`max_members` must be at least 1")
  (func (export "cabi_realloc") (param i32 i32) (param $align i32) (param $size i32) (result i32)
    (local $ptr i32)
    (local.set $ptr (i32.and
      (i32.add (global.get $heap) (i32.sub (local.get $align) (i32.const 1)))
      (i32.xor (i32.sub (local.get $align) (i32.const 1)) (i32.const -1))))
    (global.set $heap (i32.add (local.get $ptr) (local.get $size)))
    (if (i32.gt_u (global.get $heap) (i32.mul (memory.size) (i32.const 65536)))
      (then (drop (memory.grow (i32.add (i32.const 1)
        (i32.shr_u (i32.sub (global.get $heap) (i32.mul (memory.size) (i32.const 65536))) (i32.const 16)))))))
    (local.get $ptr))
  (func (export "sluice:plugin/policy@{version}#configure") (param i32 i32) (result i32)
    {configure_body})
  ;; The view's 14 flat values arrive as parameters, the step number first:
  ;; step, now-ms, token-budget, the five step costs, the four counts, the
  ;; words' pointer and length.
  (func (export "sluice:plugin/policy@{version}#step")
    (param $step i64) (param i64 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32) (result i32)
    (global.set $calls (i32.add (global.get $calls) (i32.const 1)))
    (if (i64.eq (local.get $step) (i64.const 1)) (then {hostile}))
    ;; decision at 64: admit = [], prefill = [], decode = [calls] (stored at 128)
    (i32.store (i32.const 128) (global.get $calls))
    (i64.store (i32.const 64) (i64.const 0))
    (i64.store (i32.const 72) (i64.const 0))
    (i32.store (i32.const 80) (i32.const 128))
    (i32.store (i32.const 84) (i32.const 1))
    (i32.const 64)))"#
    )
}

/// A fixup whose `fixup` returns the `result<list<edit>, string>` that
/// `body` leaves a pointer to.
pub fn fixup_module(body: &str) -> String {
    let version = version();
    format!(
        r#"(module
  (memory (export "memory") 1)
  (data (i32.const 256) "draft has no rope")
  (func (export "cabi_realloc") (param i32 i32 i32 i32) (result i32) (i32.const 1024))
  (func (export "sluice:plugin/fixup@{version}#fixup")
    (param i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32) (result i32)
    {body}))"#
    )
}

/// Embed `world` of `wit` into the core module `wat` and encode a component.
pub fn componentize(wat: &str, wit: &str, world: &str) -> Vec<u8> {
    let mut resolve = wit_parser::Resolve::default();
    let package = resolve.push_str("plugin.wit", wit).expect("fixture WIT parses");
    let world = resolve.select_world(&[package], Some(world)).expect("fixture world exists");
    let mut module = wat::parse_str(wat).expect("fixture WAT parses");
    wit_component::embed_component_metadata(&mut module, &resolve, world, wit_component::StringEncoding::UTF8, false)
        .expect("metadata embeds");
    wit_component::ComponentEncoder::default()
        .module(&module)
        .and_then(|encoder| encoder.validate(true).encode())
        .expect("fixture encodes as a component")
}
