//! Hostile policies mid-traffic (plugins/dist/chaos.wasm): after a few good
//! steps the policy traps, spins, hoards memory, stalls or breaks a
//! validation rule. Fail-closed: every request ends with a clear error and
//! none hangs, /health says why, and a reload (SIGHUP) resumes service.
//! Fallback: every request completes on the embedded `continuous`.

use std::path::PathBuf;

use reqwest::StatusCode;
use serde_json::{Value, json};
use sluice_tests::http::Server;

const FAULTS: [&str; 7] = ["trap", "loop", "memory", "stall", "admit-missing", "decode-not-ready", "over-budget"];

fn chaos_wasm() -> String {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../plugins/dist/chaos.wasm")).display().to_string()
}

fn start(fault: &str, on_fault: &str) -> (Server, PathBuf) {
    let dir = std::env::temp_dir().join(format!("sluice-chaos-{fault}-{on_fault}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let config = dir.join("sluice.toml");
    std::fs::write(
        &config,
        format!(
            "[policy]\nplugin = {:?}\non_fault = \"{on_fault}\"\nstall_steps = 16\n\
             [policy.settings]\nfault = \"{fault}\"\nafter_step = 6\n",
            chaos_wasm()
        ),
    )
    .expect("config");
    let server = Server::start(&["--config", config.to_str().expect("utf-8 path"), "-np", "2", "-b", "32"]);
    (server, dir)
}

/// Four requests at once, two streamed; each one's outcome: Ok(tokens
/// generated) or Err(the error it got).
fn traffic(server: &Server) -> Vec<Result<usize, Value>> {
    let bodies: Vec<Value> = (0..4)
        .map(|i| {
            json!({ "prompt": format!("Request {i}: tell me a long story about rivers."), "n_predict": 24,
                         "ignore_eos": true, "stream": i % 2 == 1 })
        })
        .collect();
    std::thread::scope(|scope| {
        let handles: Vec<_> = bodies
            .iter()
            .map(|body| {
                scope.spawn(move || {
                    if body["stream"] == true {
                        let stream = server.stream("/completion", body);
                        if stream.status != StatusCode::OK {
                            return Err(stream.error);
                        }
                        match stream.events.iter().find(|event| event.get("error").is_some()) {
                            Some(error) => Err(error.clone()),
                            None => Ok(stream.events.iter().filter(|event| event["stop"] == false).count()),
                        }
                    } else {
                        let (status, answer) = server.post("/completion", body);
                        if status == StatusCode::OK {
                            Ok(answer["tokens_predicted"].as_u64().unwrap_or(0) as usize)
                        } else {
                            Err(answer)
                        }
                    }
                })
            })
            .collect();
        handles.into_iter().map(|handle| handle.join().expect("request thread")).collect()
    })
}

#[test]
fn fail_closed_ends_every_request_with_an_error_and_a_reload_resumes() {
    for fault in FAULTS {
        let (server, dir) = start(fault, "fail-closed");
        let outcomes = traffic(&server);
        for outcome in &outcomes {
            let error = outcome.as_ref().expect_err(&format!("{fault}: a request completed: {outcomes:?}"));
            assert_eq!(error["error"]["type"], "unavailable_error", "{fault}: {error}");
            assert!(error["error"]["message"].as_str().is_some_and(|m| m.contains("chaos.wasm")), "{fault}: {error}");
        }
        let (status, health) = server.get("/health");
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{fault}: {health}");
        assert!(health["error"]["fault"].as_str().is_some_and(|f| !f.is_empty()), "{fault}: {health}");
        let (status, refused) = server.post("/completion", &json!({ "prompt": "Hi", "n_predict": 2 }));
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{fault}: {refused}");

        // An operator fixes the config and sends SIGHUP (POST /admin/policy
        // is the other way, tested in http_lifecycle.rs).
        std::fs::write(dir.join("sluice.toml"), "[policy]\nplugin = \"continuous\"\n").expect("config");
        server.signal("HUP");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !server.log().contains("SIGHUP: policy reloaded") {
            assert!(std::time::Instant::now() < deadline, "{fault}: no reload:\n{}", server.log());
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert_eq!(server.get("/health"), (StatusCode::OK, json!({"status": "ok"})));
        assert!(traffic(&server).iter().all(|outcome| outcome == &Ok(24)), "{fault}: service resumes");
        server.wait_idle();
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}

#[test]
fn fallback_completes_every_request_on_continuous() {
    for fault in FAULTS {
        let (server, dir) = start(fault, "fallback");
        let outcomes = traffic(&server);
        assert!(outcomes.iter().all(|outcome| outcome == &Ok(24)), "{fault}: {outcomes:?}");
        let (status, health) = server.get("/health");
        assert_eq!(status, StatusCode::OK);
        assert_eq!(health["status"], "degraded", "{fault}: {health}");
        assert_eq!(server.metric("sluice_policy_fallbacks_total"), 1.0, "{fault}");
        server.wait_idle();
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
