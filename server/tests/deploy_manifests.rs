//! docs/deploy.md's manifests, read as a cluster would read them, against
//! a real sluice: the replicas' Deployment, Service, InferencePool, route,
//! the endpoint picker's Helm values and the scrape job agree on labels,
//! ports and probes, and every metric the picker is told to read is on
//! `/metrics` with the protocol's type. And the protocol's gauges move with
//! load and come back to their idle values.

use std::time::{Duration, Instant};

use serde_json::json;
use sluice_tests::http::Server;
use yaml_rust2::{Yaml, YamlLoader};

/// Every document of every ```yaml block of docs/deploy.md.
fn manifests() -> Vec<Yaml> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/deploy.md");
    let text = std::fs::read_to_string(path).expect("docs/deploy.md");
    let mut documents = Vec::new();
    let mut rest = text.as_str();
    while let Some(start) = rest.find("```yaml\n") {
        let block = &rest[start + "```yaml\n".len()..];
        let end = block.find("```").expect("a closed block");
        documents.extend(YamlLoader::load_from_str(&block[..end]).expect("valid YAML"));
        rest = &block[end + 3..];
    }
    documents
}

fn kind<'a>(documents: &'a [Yaml], kind: &str) -> &'a Yaml {
    documents.iter().find(|doc| doc["kind"].as_str() == Some(kind)).unwrap_or_else(|| panic!("no {kind}"))
}

fn with_key<'a>(documents: &'a [Yaml], key: &str) -> &'a Yaml {
    documents.iter().find(|doc| !doc[key].is_badvalue()).unwrap_or_else(|| panic!("no document with {key}"))
}

fn text(value: &Yaml) -> String {
    match value {
        Yaml::String(text) => text.clone(),
        Yaml::Integer(number) => number.to_string(),
        other => panic!("not a scalar: {other:?}"),
    }
}

/// The value after `flag` in `args`.
fn after(args: &[String], flag: &str) -> String {
    let at = args.iter().position(|arg| arg == flag).unwrap_or_else(|| panic!("no {flag} in {args:?}"));
    args.get(at + 1).cloned().unwrap_or_else(|| panic!("{flag} without a value"))
}

#[test]
fn the_deployment_manifests_fit_together_and_name_metrics_sluice_serves() {
    let documents = manifests();
    let deployment = kind(&documents, "Deployment");
    let labels = &deployment["spec"]["template"]["metadata"]["labels"];
    assert_eq!(deployment["spec"]["selector"]["matchLabels"], *labels);
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let args: Vec<String> = container["args"].as_vec().expect("args").iter().map(text).collect();
    assert_eq!(args[0], "serve");
    assert!(args.contains(&"--metrics".to_owned()), "the picker needs /metrics");
    assert_eq!(after(&args, "--host"), "0.0.0.0", "the picker reaches pods by IP");
    let port = after(&args, "--port");
    let named = &container["ports"][0];
    assert_eq!((text(&named["containerPort"]), named["name"].as_str()), (port.clone(), Some("http")));
    for probe in ["readinessProbe", "startupProbe"] {
        assert_eq!(container[probe]["httpGet"]["path"].as_str(), Some("/health"), "{probe}");
        assert_eq!(container[probe]["httpGet"]["port"].as_str(), Some("http"), "{probe}");
    }
    assert!(container["livenessProbe"].is_badvalue(), "a failed-closed policy is reloaded, not restarted");

    let service = kind(&documents, "Service");
    assert_eq!(service["spec"]["selector"], *labels);
    assert_eq!(service["spec"]["ports"][0]["targetPort"].as_str(), Some("http"));

    let pool = kind(&documents, "InferencePool");
    assert_eq!(pool["apiVersion"].as_str(), Some("inference.networking.k8s.io/v1"));
    assert_eq!(pool["spec"]["selector"]["matchLabels"], *labels);
    assert_eq!(text(&pool["spec"]["targetPorts"][0]["number"]), port);
    let picker = &pool["spec"]["endpointPickerRef"];
    assert!(picker["name"].as_str().is_some_and(|name| !name.is_empty()));
    assert!(matches!(picker["failureMode"].as_str(), Some("FailOpen" | "FailClose")));
    let route = &kind(&documents, "HTTPRoute")["spec"]["rules"][0]["backendRefs"][0];
    assert_eq!(route["group"].as_str(), Some("inference.networking.k8s.io"));
    assert_eq!((route["kind"].as_str(), &route["name"]), (Some("InferencePool"), &pool["metadata"]["name"]));

    let values = with_key(&documents, "inferenceExtension");
    assert_eq!(text(&values["inferencePool"]["targetPorts"][0]["number"]), port);
    assert_eq!(values["inferencePool"]["modelServers"]["matchLabels"], *labels);
    let flags = &values["inferenceExtension"]["flags"];

    let scrape = &with_key(&documents, "scrape_configs")["scrape_configs"][0];
    assert_eq!(scrape["metrics_path"].as_str(), Some("/metrics"));
    let keeps: Vec<String> =
        scrape["relabel_configs"].as_vec().expect("relabels").iter().map(|r| text(&r["regex"])).collect();
    assert!(keeps.contains(&text(&labels["app"])) && keeps.contains(&"http".to_owned()), "{keeps:?}");

    // The replica's own flags (less where the model is and where to
    // listen, which the test chooses) start a server that is ready and
    // serves every metric the picker is told to read, as a gauge.
    let mut own = Vec::new();
    let mut rest = args[1..].iter();
    while let Some(arg) = rest.next() {
        if ["--model", "--host", "--port"].contains(&arg.as_str()) {
            rest.next();
        } else {
            own.push(arg.as_str());
        }
    }
    let server = Server::start_plain(&own);
    let (status, health) = server.get("/health");
    assert_eq!((status.as_u16(), &health["status"]), (200, &json!("ok")));
    let exposition = server.get_text("/metrics");
    let labelled = [
        ("lora-info-metric", &["running_lora_adapters", "waiting_lora_adapters", "max_lora"][..]),
        ("cache-info-metric", &["block_size", "num_gpu_blocks"][..]),
    ];
    for flag in [
        "total-queued-requests-metric",
        "total-running-requests-metric",
        "kv-cache-usage-percentage-metric",
        "lora-info-metric",
        "cache-info-metric",
    ] {
        let name = text(&flags[flag]);
        assert!(exposition.contains(&format!("# TYPE {name} gauge\n")), "{flag}: no gauge {name} in\n{exposition}");
        let sample = exposition
            .lines()
            .find(|line| line.starts_with(&format!("{name} ")) || line.starts_with(&format!("{name}{{")))
            .unwrap_or_else(|| panic!("{flag}: no sample of {name}"));
        for (_, names) in labelled.iter().filter(|(labelled, _)| *labelled == flag) {
            for label in *names {
                assert!(sample.contains(&format!("{label}=\"")), "{flag}: no label {label} in {sample}");
            }
        }
    }
    // The cache's shape is there from the start, before any request.
    let blocks: usize = exposition
        .split("num_gpu_blocks=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .and_then(|blocks| blocks.parse().ok())
        .expect("num_gpu_blocks");
    assert!(blocks > 0, "no KV blocks named before the first request");
}

/// (waiting, running, KV usage) as the picker reads them.
fn gauges(server: &Server) -> (f64, f64, f64) {
    (
        server.metric("sluice_num_requests_waiting"),
        server.metric("sluice_num_requests_running"),
        server.metric("sluice_kv_cache_usage_perc"),
    )
}

#[test]
fn the_gateway_gauges_follow_the_load_and_return_to_idle() {
    let server = Server::start(&["-np", "1"]);
    assert_eq!(gauges(&server), (0.0, 0.0, 0.0));
    let body = json!({ "prompt": "Once upon a time, ".repeat(40), "n_predict": 96, "ignore_eos": true,
                       "cache_prompt": false });
    let busiest = std::thread::scope(|scope| {
        let clients: Vec<_> = (0..3).map(|_| scope.spawn(|| server.post("/completion", &body).0.as_u16())).collect();
        // One slot: one request runs and two queue behind it.
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut busiest: (f64, f64, f64) = (0.0, 0.0, 0.0);
        while clients.iter().any(|client| !client.is_finished()) && Instant::now() < deadline {
            let now = gauges(&server);
            busiest = (busiest.0.max(now.0), busiest.1.max(now.1), busiest.2.max(now.2));
            std::thread::sleep(Duration::from_millis(5));
        }
        for client in clients {
            assert_eq!(client.join().expect("client"), 200);
        }
        busiest
    });
    let (waiting, running, usage) = busiest;
    assert!(waiting >= 1.0 && running == 1.0, "one running at most, the rest queued: {busiest:?}");
    assert!(usage > 0.0 && usage <= 1.0, "a long prompt holds KV blocks: {busiest:?}");
    server.wait_idle();
    assert_eq!(gauges(&server), (0.0, 0.0, 0.0), "idle again");
}
