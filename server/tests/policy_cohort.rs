//! The cohort barrier through the real engine over HTTP (docs/scheduling.md,
//! cases (a)–(h); (d) with a synthetic LoRA adapter on the default model;
//! (a)–(d), (g) and (h) again on a hybrid model whose slots carry
//! recurrent states).
//! Phase transitions come from the engine's phase log (`sluice::phase` at
//! debug level), so each case asserts the order in which slots prefilled,
//! became ready, decoded and ended.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};
use sluice_tests::http::Server;

/// One phase transition from the log.
#[derive(Clone, Debug, PartialEq)]
struct Transition {
    step: u64,
    request: u64,
    phase: String,
}

fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let start = line.find(&format!(" {key}="))? + key.len() + 2;
    line[start..].split_whitespace().next().map(|value| value.trim_matches('"'))
}

fn transitions(server: &Server) -> Vec<Transition> {
    server
        .log()
        .lines()
        .filter(|line| line.contains("sluice::phase"))
        .filter_map(|line| {
            Some(Transition {
                step: field(line, "step")?.parse().ok()?,
                request: field(line, "request")?.parse().ok()?,
                phase: field(line, "phase")?.to_owned(),
            })
        })
        .collect()
}

/// Per request (in order of admission): its id and transitions.
type Run = Vec<(u64, Vec<Transition>)>;

/// The log grouped per request, in order of admission.
fn by_request(log: &[Transition]) -> Run {
    let mut order = Vec::new();
    let mut map: BTreeMap<u64, Vec<Transition>> = BTreeMap::new();
    for transition in log {
        if !map.contains_key(&transition.request) {
            order.push(transition.request);
        }
        map.entry(transition.request).or_default().push(transition.clone());
    }
    order.into_iter().map(|id| (id, map.remove(&id).unwrap_or_default())).collect()
}

fn step_of(transitions: &[Transition], phase: &str) -> u64 {
    transitions
        .iter()
        .find(|transition| transition.phase == phase)
        .unwrap_or_else(|| panic!("no {phase} in {transitions:?}"))
        .step
}

/// What a case runs on: a model (`None`: the default one) and the token
/// ids its prompts are drawn from (`first`, and `span` after it).
#[derive(Clone, Copy)]
struct On<'a> {
    model: Option<&'a Path>,
    first: u32,
    span: u32,
}

const DEFAULT: On<'static> = On { model: None, first: 1000, span: 9000 };

fn server(policy: &str, name: &str) -> (Server, PathBuf) {
    server_on(DEFAULT, policy, name, |_| Vec::new())
}

/// [`server`] on `on`'s model, with more flags made from its scratch
/// directory.
fn server_on(
    on: On<'_>,
    policy: &str,
    name: &str,
    extra: impl FnOnce(&std::path::Path) -> Vec<String>,
) -> (Server, PathBuf) {
    let dir = std::env::temp_dir().join(format!("sluice-cohort-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let config = dir.join("sluice.toml");
    std::fs::write(&config, format!("[policy]\nplugin = \"{policy}\"\n[log]\nlevel = \"info,sluice::phase=debug\"\n"))
        .expect("config");
    let extra = extra(&dir);
    let mut args = vec!["--config", config.to_str().expect("utf-8 path"), "-np", "4", "-b", "16"];
    args.extend(extra.iter().map(String::as_str));
    let server = match on.model {
        Some(model) => Server::start_model(model, &args, &[]),
        None => Server::start(&args),
    };
    (server, dir)
}

/// Distinct token prompts of exact lengths.
fn prompt(len: u32, seed: u32) -> Vec<u32> {
    prompt_on(DEFAULT, len, seed)
}

fn prompt_on(on: On<'_>, len: u32, seed: u32) -> Vec<u32> {
    (0..len).map(|i| on.first + (i * 37 + seed * 101) % on.span).collect()
}

fn body(prompt: &[u32], stream: bool) -> Value {
    json!({ "prompt": prompt, "n_predict": 6, "temperature": 0, "cache_prompt": false,
            "stream": stream, "return_tokens": true })
}

#[test]
fn d_an_arrival_of_another_adapter_group_leads_the_next_cohort() {
    use sluice_tests::lora::default_model_targets;
    adapter_group_leads_the_next_cohort(DEFAULT, "adapters", "llama", &default_model_targets());
}

/// (d) on a hybrid model (Qwen3.5-MoE's layout), its adapter on the dense
/// tensors: the full-attention layer's (the query twice as wide, each
/// head's query and gate).
#[test]
fn d_on_a_hybrid_model_an_adapter_group_leads_the_next_cohort() {
    use sluice_tests::lora::Target;
    let path = std::env::temp_dir().join(format!("sluice-cohort-hybrid-lora-{}.gguf", std::process::id()));
    let model = sluice_tests::models::tiny_family("qwen35moe").expect("a tiny hybrid model");
    std::fs::write(&path, model.build()).expect("written");
    let targets: Vec<Target> = [("attn_q", 64, 128), ("attn_k", 64, 32), ("attn_v", 64, 32), ("attn_output", 64, 64)]
        .iter()
        .map(|&(name, n_in, n_out)| Target { name: format!("blk.3.{name}.weight"), n_in, n_out })
        .collect();
    let on = On { model: Some(&path), first: 0, span: 250 };
    adapter_group_leads_the_next_cohort(on, "hybrid-adapters", "qwen35moe", &targets);
    std::fs::remove_file(&path).expect("clean up");
}

/// A long prompt forms a cohort; an arrival under an adapter of `targets`
/// waits for the next one while an arrival without joins this one.
fn adapter_group_leads_the_next_cohort(
    on: On<'_>,
    name: &str,
    arch: &'static str,
    targets: &[sluice_tests::lora::Target],
) {
    use sluice_tests::lora::LoraSpec;
    let (server, dir) = server_on(on, "cohort", name, |dir| {
        let adapter = dir.join("adapter.gguf");
        std::fs::write(&adapter, LoraSpec::new(arch, 7, 0.05).build(targets).build()).expect("adapter");
        vec!["--lora".into(), adapter.display().to_string(), "--lora-init-without-apply".into()]
    });
    let (long, other, same) = (prompt_on(on, 240, 6), prompt_on(on, 10, 7), prompt_on(on, 10, 8));
    let server = &server;
    let (before, ends) = (transitions(server).len(), ended(server));
    std::thread::scope(|scope| {
        let seen = transitions(server).iter().filter(|t| t.phase == "prefilling").count();
        let first = scope.spawn(|| complete(server, &long, false));
        wait_for(server, "prefilling", seen + 1);
        // During formation: one arrival under the adapter, then one without.
        let mut adapted = body(&other, false);
        adapted["lora"] = json!([{"id": 0, "scale": 1.0}]);
        let adapted = scope.spawn(move || {
            let (status, answer) = server.post("/completion", &adapted);
            assert_eq!(status, StatusCode::OK, "{answer}");
        });
        // The adapted request waits without a phase of its own; /metrics
        // names its adapter once the engine holds it.
        wait_until(
            || server.get_text("/metrics").contains("waiting_lora_adapters=\"adapter\""),
            || format!("the adapted request never waited:\n{}", server.get_text("/metrics")),
        );
        let compatible = scope.spawn(|| complete(server, &same, false));
        for handle in [first, compatible] {
            handle.join().expect("request");
        }
        adapted.join().expect("adapted request");
    });
    let run = by_request(&settled(server, ends + 3)[before..]);
    assert_eq!(run.len(), 3, "{run:?}");
    // Admission order: the long prompt, the compatible one (it joined the
    // forming cohort), then the adapted one.
    let (first, compatible, adapted) = (&run[0].1, &run[1].1, &run[2].1);
    let seal = step_of(first, "ready").min(step_of(compatible, "ready"));
    assert!(step_of(compatible, "prefilling") < seal, "the compatible arrival joins before the seal: {run:?}");
    let cohort_done = step_of(first, "completed").max(step_of(compatible, "completed"));
    assert!(step_of(adapted, "prefilling") > cohort_done, "another group waits for the next cohort: {run:?}");
    std::fs::remove_dir_all(&dir).expect("clean up");
}

/// The generated tokens of a completion, streamed or not.
fn complete(server: &Server, prompt: &[u32], stream: bool) -> Vec<u64> {
    if stream {
        let answer = server.stream("/completion", &body(prompt, true));
        assert_eq!(answer.status, StatusCode::OK, "{:?}", answer.error);
        return answer
            .events
            .iter()
            .filter(|event| event["stop"] == false)
            .flat_map(|event| event["tokens"].as_array().cloned().unwrap_or_default())
            .map(|token| token.as_u64().expect("token id"))
            .collect();
    }
    let (status, answer) = server.post("/completion", &body(prompt, false));
    assert_eq!(status, StatusCode::OK, "{answer}");
    answer["tokens"].as_array().expect("tokens").iter().map(|token| token.as_u64().expect("id")).collect()
}

/// Whether a transition ends its request.
fn is_end(transition: &Transition) -> bool {
    matches!(transition.phase.as_str(), "completed" | "cancelled" | "failed")
}

/// Requests ended so far, by the log.
fn ended(server: &Server) -> usize {
    transitions(server).iter().filter(|t| is_end(t)).count()
}

/// The transitions once the log shows `ends` requests ended: the log
/// reaches the test through the server's stderr, which on a busy machine
/// can trail the responses.
fn settled(server: &Server, ends: usize) -> Vec<Transition> {
    wait_until(
        || ended(server) >= ends,
        || {
            format!(
                "no {ends} ended requests:
{}",
                server.log()
            )
        },
    );
    transitions(server)
}

/// Waits until the log holds `count` transitions into `phase`.
fn wait_for(server: &Server, phase: &str, count: usize) {
    wait_until(
        || transitions(server).iter().filter(|transition| transition.phase == phase).count() >= count,
        || format!("no {count} × {phase}:\n{}", server.log()),
    );
}

/// Polls `ready` every 2 ms until it holds; fails after 60 s with `what`.
fn wait_until(mut ready: impl FnMut() -> bool, what: impl Fn() -> String) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ready() {
        assert!(Instant::now() < deadline, "{}", what());
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Runs a long prompt, then (once it is prefilling) a medium and a short
/// one, concurrently; returns each one's tokens and the phase log of the run.
fn trio(server: &Server, stream: bool, on: On<'_>) -> (Vec<Vec<u64>>, Run) {
    let (before, ends) = (transitions(server).len(), ended(server));
    let prompts = [prompt_on(on, 120, 1), prompt_on(on, 40, 2), prompt_on(on, 6, 3)];
    let tokens = std::thread::scope(|scope| {
        let seen = transitions(server).iter().filter(|t| t.phase == "prefilling").count();
        let long = scope.spawn(|| complete(server, &prompts[0], stream));
        wait_for(server, "prefilling", seen + 1);
        let others: Vec<_> = prompts[1..].iter().map(|p| scope.spawn(move || complete(server, p, stream))).collect();
        let mut tokens = vec![long.join().expect("long request")];
        tokens.extend(others.into_iter().map(|handle| handle.join().expect("request")));
        tokens
    });
    (tokens, by_request(&settled(server, ends + 3)[before..]))
}

/// The order of (member, phase) over the run, members numbered by admission.
fn phase_order(run: &[(u64, Vec<Transition>)]) -> Vec<(usize, String)> {
    let mut all: Vec<(u64, usize, String)> = run
        .iter()
        .enumerate()
        .flat_map(|(member, (_, transitions))| transitions.iter().map(move |t| (t.step, member, t.phase.clone())))
        .collect();
    all.sort();
    all.into_iter().map(|(_, member, phase)| (member, phase)).collect()
}

#[test]
fn members_hold_until_the_last_prompt_then_decode_together_streaming_or_not() {
    members_hold_then_decode_together(DEFAULT, "trio");
}

/// The same on a hybrid model (Qwen3.5-MoE's layout): each slot's
/// sequence carries its recurrent state through the held steps.
#[test]
fn on_a_hybrid_model_members_hold_then_decode_together_streaming_or_not() {
    let path = std::env::temp_dir().join(format!("sluice-cohort-hybrid-{}.gguf", std::process::id()));
    let model = sluice_tests::models::tiny_family("qwen35moe").expect("a tiny hybrid model");
    std::fs::write(&path, model.build()).expect("written");
    members_hold_then_decode_together(On { model: Some(&path), first: 0, span: 250 }, "hybrid");
    std::fs::remove_file(&path).expect("clean up");
}

fn members_hold_then_decode_together(on: On<'_>, name: &str) {
    let (server, dir) = server_on(on, "cohort", name, |_| Vec::new());
    let (tokens, run) = trio(&server, false, on);
    assert_eq!(run.len(), 3, "three members: {run:?}");
    let ready: Vec<u64> = run.iter().map(|(_, t)| step_of(t, "ready")).collect();
    let decoding: Vec<u64> = run.iter().map(|(_, t)| step_of(t, "decoding")).collect();
    let last_ready = *ready.iter().max().expect("members");
    // (a) TG starts together, (b) only after the last member's prompt:
    // earlier finishers held their logits meanwhile.
    assert!(decoding.iter().all(|&step| step == last_ready + 1), "ready {ready:?}, decoding {decoding:?}");
    assert!(ready.iter().any(|&step| step < last_ready), "someone was held: ready {ready:?}");
    // (c) the late compatible arrivals joined before the seal (the first ready).
    let seal = *ready.iter().min().expect("members");
    assert!(run.iter().all(|(_, t)| step_of(t, "prefilling") < seal), "{run:?}");
    assert!(run.iter().all(|(_, t)| t.last().is_some_and(|last| last.phase == "completed")));

    // (g) Streaming gives the same tokens and the same phase order.
    let (streamed, streamed_run) = trio(&server, true, on);
    assert_eq!(streamed, tokens);
    assert_eq!(phase_order(&streamed_run), phase_order(&run));

    // (h) A cohort of one behaves like a plain request: same tokens as under
    // `continuous`, prompt → ready → decoding in consecutive steps.
    let alone = prompt_on(on, 6, 3);
    let (before, ends) = (transitions(&server).len(), ended(&server));
    assert_eq!(complete(&server, &alone, false), tokens[2], "batch invariance across cohort sizes");
    let solo = by_request(&settled(&server, ends + 1)[before..]);
    let steps: Vec<u64> = ["prefilling", "ready", "decoding"].iter().map(|p| step_of(&solo[0].1, p)).collect();
    assert_eq!(steps[2], steps[1] + 1, "{solo:?}");
    let (plain, plain_dir) = server_on(on, "continuous", &format!("{name}-plain"), |_| Vec::new());
    assert_eq!(complete(&plain, &alone, false), tokens[2]);
    std::fs::remove_dir_all(&dir).expect("clean up");
    std::fs::remove_dir_all(&plain_dir).expect("clean up");
}

/// Sends a request on a plain TCP connection and returns the connection.
fn send_raw(server: &Server, body: &Value) -> std::net::TcpStream {
    use std::io::Write;
    let address = server.url("").trim_start_matches("http://").to_owned();
    let mut socket = std::net::TcpStream::connect(&address).expect("connect");
    let payload = body.to_string();
    write!(
        socket,
        "POST /completion HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{payload}",
        payload.len()
    )
    .expect("send");
    socket
}

fn server_continuous() -> (Server, PathBuf) {
    server("continuous", "plain")
}

#[test]
fn new_prompts_wait_for_the_decoding_cohort_to_drain() {
    let (server, dir) = server("cohort", "drain");
    let (long, medium) = (prompt(120, 4), prompt(40, 5));
    let late = prompt(6, 6);
    std::thread::scope(|scope| {
        let first = scope.spawn(|| complete(&server, &long, false));
        wait_for(&server, "prefilling", 1);
        let second = scope.spawn(|| complete(&server, &medium, false));
        // (c) After the seal nobody joins: this arrival waits for the next cohort.
        wait_for(&server, "ready", 1);
        let third = scope.spawn(|| complete(&server, &late, false));
        for handle in [first, second, third] {
            assert_eq!(handle.join().expect("request").len(), 6);
        }
    });
    let run = by_request(&settled(&server, 3));
    assert_eq!(run.len(), 3, "{run:?}");
    let seal = step_of(&run[0].1, "ready");
    assert!(step_of(&run[1].1, "prefilling") < seal, "the medium prompt joined before the seal: {run:?}");
    // (f) The late prompt's PP starts only after the cohort drained.
    let drained = run[..2].iter().map(|(_, t)| step_of(t, "completed")).max().expect("members");
    assert!(step_of(&run[2].1, "prefilling") >= drained, "{run:?}");
    std::fs::remove_dir_all(&dir).expect("clean up");
}

#[test]
fn a_member_cancelled_during_its_prompt_releases_the_others() {
    let (server, dir) = server("cohort", "cancel");
    let (first, long) = (prompt(120, 7), prompt(600, 8));
    let expected = {
        let (plain, plain_dir) = server_continuous();
        let tokens = complete(&plain, &first, false);
        drop(plain);
        std::fs::remove_dir_all(&plain_dir).expect("clean up");
        tokens
    };
    std::thread::scope(|scope| {
        let held = scope.spawn(|| complete(&server, &first, false));
        wait_for(&server, "prefilling", 1);
        // The long member joins, then its client goes away mid-prompt. (A
        // raw connection: nothing, not even headers, is sent to a member
        // before its first token, so an HTTP client would wait here.)
        let client = send_raw(&server, &body(&long, true));
        wait_for(&server, "ready", 1);
        drop(client);
        // (e) The held member is released and finishes with its solo tokens.
        assert_eq!(held.join().expect("request"), expected);
    });
    let run = by_request(&settled(&server, 2));
    let cancelled = step_of(&run[1].1, "cancelled");
    assert!(step_of(&run[0].1, "decoding") > cancelled, "{run:?}");
    assert!(!run[1].1.iter().any(|t| t.phase == "ready"), "cancelled during its prompt: {run:?}");
    server.wait_idle();
    std::fs::remove_dir_all(&dir).expect("clean up");
}
