//! Shadow policies, promotion, and record/replay as an operator uses them:
//! a shadow that always agrees shows 100 %, `prefill-first` shadowing
//! `cohort` on mixed prompt lengths diverges with every divergence kept with
//! its view, the served tokens do not change with shadows attached, hostile
//! shadows are quarantined while serving goes on, promotion swaps between
//! steps, and `sluice lab replay` of the recorded steps reproduces what the
//! shadows saw, deterministically.

use std::path::{Path, PathBuf};
use std::process::Command;

use reqwest::StatusCode;
use serde_json::{Value, json};
use sluice_tests::binary::sluice_binary;
use sluice_tests::http::{Server, config_file};

const KEY: &str = "k";

fn admin(server: &Server, method: reqwest::Method, path: &str, body: &Value) -> (StatusCode, Value) {
    server.send(server.client().request(method, server.url(path)).bearer_auth(KEY).json(body))
}

/// Until no slot is busy (`Server::wait_idle` with the API key).
fn wait_idle(server: &Server) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let (_, slots) = server.send(server.client().get(server.url("/slots")).bearer_auth(KEY));
        if slots.as_array().is_some_and(|slots| slots.iter().all(|slot| slot["is_processing"] == false)) {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "slots stayed busy: {slots}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

fn metrics(server: &Server) -> String {
    let request = server.client().get(server.url("/metrics")).bearer_auth(KEY);
    request.send().and_then(|response| response.text()).expect("metrics")
}

fn report(server: &Server) -> Value {
    let (status, report) = server.send(server.client().get(server.url("/admin/policy/shadow")).bearer_auth(KEY));
    assert_eq!(status, StatusCode::OK, "{report}");
    report
}

/// The shadow record named `policy`.
fn shadow<'a>(report: &'a Value, policy: &str) -> &'a Value {
    report["shadows"]
        .as_array()
        .and_then(|shadows| shadows.iter().find(|shadow| shadow["policy"] == policy))
        .unwrap_or_else(|| panic!("no shadow `{policy}` in {report}"))
}

/// Six requests at once, prompts of mixed lengths, seeded sampling; the
/// generated text of each, in order.
fn mixed_traffic(server: &Server) -> Vec<String> {
    let bodies: Vec<Value> = (0..6)
        .map(|i| {
            let prompt = format!("Request {i}: ") + &"tell me about rivers and the sea. ".repeat(1 + 6 * (i % 3));
            json!({ "prompt": prompt, "n_predict": 12, "ignore_eos": true, "temperature": 0.8, "seed": 40 + i,
                    "stream": i % 2 == 1 })
        })
        .collect();
    std::thread::scope(|scope| {
        let handles: Vec<_> = bodies
            .iter()
            .map(|body| {
                scope.spawn(move || {
                    let request = server.client().post(server.url("/completion")).bearer_auth(KEY).json(body);
                    if body["stream"] == true {
                        let text = request.send().and_then(|response| response.text()).expect("stream");
                        text.lines()
                            .filter_map(|line| line.strip_prefix("data: "))
                            .map(|data| serde_json::from_str::<Value>(data).expect("an event"))
                            .inspect(|event| assert!(event.get("error").is_none(), "{event}"))
                            .filter_map(|event| event["content"].as_str().map(str::to_owned))
                            .collect::<String>()
                    } else {
                        let (status, answer) = server.send(request);
                        assert_eq!(status, StatusCode::OK, "{answer}");
                        answer["content"].as_str().expect("content").to_owned()
                    }
                })
            })
            .collect();
        handles.into_iter().map(|handle| handle.join().expect("request thread")).collect()
    })
}

fn replay(traces: &[&Path], policy: &str) -> Value {
    let output = Command::new(sluice_binary())
        .args(["lab", "replay", "--policy", policy, "--json"])
        .args(traces)
        .output()
        .expect("sluice lab replay runs");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).expect("a JSON report")
}

fn steps_of(divergences: &Value) -> Vec<u64> {
    divergences.as_array().expect("divergences").iter().map(|d| d["step"].as_u64().expect("step")).collect()
}

#[test]
fn shadows_compare_without_changing_what_is_served_and_a_replay_reproduces_them() {
    let config = config_file("shadow-cohort", "[policy]\nplugin = \"cohort\"\nshadow_budget_us = 1000000\n");
    let trace = config.with_file_name("steps.jsonl");
    let base = ["-np", "3", "-b", "24", "--api-key", KEY, "--config", config.to_str().expect("utf-8")];
    let shadows = ["--policy-shadow", "cohort", "--policy-shadow", "prefill-first"];
    let record = ["--record-trace", trace.to_str().expect("utf-8")];
    let server = Server::start(&[&base[..], &shadows, &record].concat());
    let shadowed = mixed_traffic(&server);
    wait_idle(&server);
    let report = report(&server);
    assert_eq!(report["policy"], "cohort");

    let same = shadow(&report, "cohort");
    let steps = same["steps"].as_u64().expect("steps");
    assert!(steps > 10, "{same}");
    assert_eq!(same["skipped"], 0, "{same}");
    assert_eq!(same["agreement"], json!({ "admit": 1.0, "prefill": 1.0, "decode": 1.0, "all": 1.0 }), "{same}");
    assert_eq!(same["divergences"], json!([]));

    let other = shadow(&report, "prefill-first");
    assert_eq!((other["steps"].as_u64(), other["skipped"].as_u64()), (Some(steps), Some(0)), "{other}");
    let divergences = other["divergences"].as_array().expect("divergences");
    assert!(!divergences.is_empty(), "prefill-first never diverged from cohort: {other}");
    let disagreed = steps - other["agreed"]["all"].as_u64().expect("agreed");
    assert_eq!(divergences.len() as u64, disagreed.min(32), "the first 32 divergent steps are kept");
    for divergence in divergences {
        assert_eq!(divergence["view"]["step"], divergence["step"], "{divergence}");
        assert_ne!(divergence["active"], divergence["candidate"], "{divergence}");
        assert!(!divergence["parts"].as_array().expect("parts").is_empty());
    }
    let metrics = metrics(&server);
    let agreed = format!("sluice_shadow_agreed_steps_total{{policy=\"cohort\",part=\"all\"}} {steps}\n");
    assert!(metrics.contains(&agreed), "{agreed} missing:\n{metrics}");
    assert!(metrics.contains("sluice_shadow_quarantined{policy=\"prefill-first\"} 0\n"), "{metrics}");
    drop(server);

    // Without shadows (and without the trace) the same requests get the same tokens.
    let plain = Server::start(&base);
    assert_eq!(mixed_traffic(&plain), shadowed);
    drop(plain);

    // The recorded steps, replayed: the active policy agrees everywhere and
    // hashes alike twice; the candidate diverges where its shadow did.
    let cohort = replay(&[&trace], "cohort");
    assert_eq!((cohort["steps"].as_u64(), cohort["missing_steps"].as_u64()), (Some(steps), Some(0)), "{cohort}");
    assert_eq!(cohort["divergent_steps"], 0, "{cohort}");
    assert_eq!(cohort["decision_hash"], cohort["applied_hash"]);
    assert_eq!(replay(&[&trace], "cohort")["decision_hash"], cohort["decision_hash"]);
    let candidate = replay(&[&trace], "prefill-first");
    assert_eq!(candidate["divergent_steps"].as_u64(), Some(disagreed), "{candidate}");
    assert_eq!(candidate["agreed"], other["agreed"]);
    let shown = steps_of(&other["divergences"]);
    assert_eq!(steps_of(&candidate["divergences"])[..shown.len().min(20)], shown[..shown.len().min(20)]);
    assert_eq!(replay(&[&trace], "prefill-first")["decision_hash"], candidate["decision_hash"]);

    // Every view carries the step costs the engine measured: none at first,
    // then a fit over more and more steps, a prefill token never free.
    let text = std::fs::read_to_string(&trace).expect("trace");
    let costs: Vec<Value> = text
        .lines()
        .filter_map(|line| {
            serde_json::from_str::<Value>(line).ok()?.get("step").map(|step| step["view"]["costs"].clone())
        })
        .collect();
    assert_eq!(costs.first().map(|first| &first["measured_steps"]), Some(&json!(0)), "{costs:?}");
    let last = costs.last().expect("steps recorded");
    assert!(last["measured_steps"].as_u64().is_some_and(|steps| steps > 1), "{last}");
    assert!(last["prefill_token_ns"].as_u64().is_some_and(|ns| ns > 0), "{last}");

    // The trace is also a lab workload: one request per request served.
    let lab = Command::new(sluice_binary())
        .args(["lab", "--json", "--policy", "continuous", "--trace"])
        .arg(&trace)
        .arg("--out")
        .arg(trace.with_file_name("lab"))
        .args(["--cost-model"])
        .arg(write_cost_model(&trace))
        .output()
        .expect("sluice lab runs");
    assert!(lab.status.success(), "{}", String::from_utf8_lossy(&lab.stderr));
    let lab: Value = serde_json::from_slice(&lab.stdout).expect("lab report");
    let workload = std::fs::read_to_string(trace.with_file_name("lab").join("trace.jsonl")).expect("workload");
    assert_eq!(workload.lines().count(), 6, "{workload}\n{lab}");
    assert!(workload.lines().all(|line| line.contains("\"max_tokens\":12")), "{workload}");
    std::fs::remove_dir_all(config.parent().expect("scratch dir")).expect("clean up");
}

fn write_cost_model(near: &Path) -> PathBuf {
    let path = near.with_file_name("cost.json");
    std::fs::write(
        &path,
        r#"{"base_ms": 2.0, "prefill_token_ms": 0.3, "decode_token_ms": 1.5, "attention_kpair_ms": 0.001}"#,
    )
    .expect("cost model");
    path
}

/// The folder of the built plugins, as the server resolves it.
fn dist() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../plugins/dist")).canonicalize().expect("plugins/dist")
}

fn chaos_wasm() -> String {
    dist().join("chaos.wasm").display().to_string()
}

#[test]
fn hostile_shadows_are_quarantined_and_serving_goes_on() {
    let dist = dist();
    let plugin_dir = dist.to_str().expect("utf-8 path");
    let server = Server::start(&["-np", "2", "-b", "32", "--api-key", KEY, "--plugin-dir", plugin_dir]);
    let (status, refused) = server.get("/admin/policy/shadow");
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{refused}");
    let chaos = chaos_wasm();
    for fault in ["trap", "loop", "decode-not-ready"] {
        let attach = json!({ "policy": chaos, "settings": { "fault": fault, "after_step": 3 } });
        let (status, answer) = admin(&server, reqwest::Method::POST, "/admin/policy/shadow", &attach);
        assert_eq!(status, StatusCode::OK, "{answer}");
        let served = mixed_traffic(&server);
        assert!(served.iter().all(|text| !text.is_empty()), "{fault}: every request completes: {served:?}");
        wait_idle(&server);
        let (status, health) = server.get("/health");
        assert_eq!((status, health), (StatusCode::OK, json!({ "status": "ok" })), "{fault}");
        let report = report(&server);
        let record = shadow(&report, &chaos);
        assert!(record["quarantined"].is_string(), "{fault}: {record}");
        let reasons: &[&str] = match fault {
            "decode-not-ready" => &["invalid"],
            // A spin ends on whichever of the sandbox's bounds comes first.
            "loop" => &["fuel", "deadline"],
            _ => &["trap"],
        };
        let faults = record["faults"].as_object().expect("faults");
        assert_eq!(faults.values().filter_map(Value::as_u64).sum::<u64>(), 2, "{fault}: a retry, then quarantine");
        assert!(faults.keys().all(|key| reasons.contains(&key.as_str())), "{fault}: {record}");
        let (status, refused) =
            admin(&server, reqwest::Method::POST, "/admin/policy/promote", &json!({ "policy": chaos }));
        assert_eq!(status, StatusCode::BAD_REQUEST, "{refused}");
        assert!(refused["error"]["message"].as_str().is_some_and(|m| m.contains("quarantined")), "{refused}");
        let detach = json!({ "policy": chaos });
        let (status, answer) = admin(&server, reqwest::Method::DELETE, "/admin/policy/shadow", &detach);
        assert_eq!(status, StatusCode::OK, "{answer}");
    }
    let metrics = metrics(&server);
    assert!(!metrics.contains("sluice_policy_faults_total{"), "shadow faults are not the active policy's: {metrics}");
}

#[test]
fn promotion_swaps_between_steps_and_keeps_the_old_policy_as_a_shadow() {
    let server = Server::start(&["-np", "2", "--api-key", KEY, "--policy-shadow", "cohort,max_members=2"]);
    let props = |server: &Server| {
        let (status, props) = server.send(server.client().get(server.url("/props")).bearer_auth(KEY));
        assert_eq!(status, StatusCode::OK);
        props
    };
    assert_eq!(props(&server)["policy"]["shadows"], json!(["cohort"]));
    mixed_traffic(&server);
    let (status, answer) =
        admin(&server, reqwest::Method::POST, "/admin/policy/promote", &json!({ "policy": "cohort" }));
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(
        answer,
        json!({ "success": true, "policy": "cohort", "previous": "chunked", "previous_is_shadow": true })
    );
    let props = props(&server);
    assert_eq!(props["policy"]["name"], "cohort");
    assert_eq!(props["policy"]["settings"], json!({ "max_members": 2 }));
    assert_eq!(props["policy"]["shadows"], json!(["chunked"]));
    let served = mixed_traffic(&server);
    assert_eq!(served.len(), 6);
    wait_idle(&server);
    let promoted = report(&server);
    assert_eq!(promoted["policy"], "cohort");
    assert!(shadow(&promoted, "chunked")["steps"].as_u64().is_some_and(|steps| steps > 0), "{promoted}");
    let (status, refused) =
        admin(&server, reqwest::Method::POST, "/admin/policy/promote", &json!({ "policy": "priority" }));
    assert_eq!(status, StatusCode::BAD_REQUEST, "{refused}");
    assert_eq!(refused["error"]["message"], "no shadow policy `priority` is attached");
    // A reload from the configuration (here: the flags) restores its policy and shadows.
    let (status, answer) = admin(&server, reqwest::Method::POST, "/admin/policy", &json!({}));
    assert_eq!(status, StatusCode::OK, "{answer}");
    let reloaded = report(&server);
    assert_eq!(reloaded["policy"], "chunked");
    let shadows: Vec<&Value> = reloaded["shadows"].as_array().expect("shadows").iter().map(|s| &s["policy"]).collect();
    assert_eq!(shadows, [&json!("cohort")]);
    assert_eq!(shadow(&reloaded, "cohort")["steps"], 0, "a fresh record");
    let (status, answer) =
        admin(&server, reqwest::Method::POST, "/admin/policy/promote", &json!({ "policy": "cohort" }));
    assert_eq!(status, StatusCode::OK, "{answer}");
    for (body, expected) in [
        (json!({ "policy": "chunked" }), "a shadow policy `chunked` is already attached"),
        (json!({ "policy": "fastest" }), "`policy` = \"fastest\" is neither a built-in policy"),
    ] {
        let (status, refused) = admin(&server, reqwest::Method::POST, "/admin/policy/shadow", &body);
        assert_eq!(status, StatusCode::BAD_REQUEST, "{refused}");
        assert!(refused["error"]["message"].as_str().is_some_and(|m| m.contains(expected)), "{refused}");
    }
}

#[test]
fn a_fallback_taking_over_is_a_policy_line_in_the_trace() {
    let config = config_file(
        "shadow-fallback",
        &format!(
            "[policy]\nplugin = {:?}\non_fault = \"fallback\"\n[policy.settings]\nfault = \"trap\"\nafter_step = 4\n",
            chaos_wasm()
        ),
    );
    let trace = config.with_file_name("steps.jsonl");
    let args = ["-np", "2", "--api-key", KEY, "--config", config.to_str().expect("utf-8")];
    let server = Server::start(&[&args[..], &["--record-trace", trace.to_str().expect("utf-8")]].concat());
    assert!(mixed_traffic(&server).iter().all(|text| !text.is_empty()));
    wait_idle(&server);
    drop(server);
    let text = std::fs::read_to_string(&trace).expect("trace");
    let lines: Vec<Value> = text.lines().map(|line| serde_json::from_str(line).expect("a JSON line")).collect();
    assert_eq!(lines[0]["header"]["policy"], chaos_wasm());
    let changes: Vec<&Value> = lines.iter().filter_map(|line| line.get("policy")).collect();
    assert_eq!(changes.len(), 1, "{changes:?}");
    assert_eq!(changes[0]["policy"], "continuous");
    assert_eq!(changes[0]["step"], 4, "the trap at step 4 is retried, then the fallback decides step 4");
    std::fs::remove_dir_all(config.parent().expect("scratch dir")).expect("clean up");
}
