//! llama-server command lines start sluice: its flags are sluice's own,
//! ignored with a logged reason, or refused naming the missing feature.

use std::process::Command;

use serde_json::json;
use sluice_tests::binary::sluice_binary;
use sluice_tests::http::Server;

#[test]
fn a_typical_llama_server_command_line_serves_with_its_settings() {
    let dir = std::env::temp_dir().join(format!("sluice-llama-flags-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let key_file = dir.join("keys.txt");
    std::fs::write(&key_file, "\n  secret-key  \n").expect("key file");
    let template = dir.join("template.jinja");
    std::fs::write(&template, "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}<assistant>")
        .expect("template file");
    let args = [
        "-ngl",
        "99",
        "-fa",
        "on",
        "--jinja",
        "-cb",
        "--no-webui",
        "-ub",
        "256",
        "-ctk",
        "f16",
        "--mirostat",
        "0",
        "-np",
        "2",
        "-c",
        "512",
        "--top-k",
        "7",
        "--min_p",
        "0.2",
        "--repeat-penalty",
        "1.1",
        "-lv",
        "3",
        "--api-key-file",
        key_file.to_str().expect("utf-8 path"),
        "--chat-template-file",
        template.to_str().expect("utf-8 path"),
    ];
    let server = Server::start(&args);
    let log = server.log();
    for note in
        ["`-ngl 99` is ignored: ", "`-fa on` is ignored: ", "`--mirostat 0` is ignored: it is llama-server's default"]
    {
        assert!(log.contains(note), "{note} missing from the log:\n{log}");
    }
    let request = server.client().get(server.url("/props"));
    let (status, _) = server.send(request);
    assert_eq!(status.as_u16(), 401, "the key file's key is required");
    let request = server.client().get(server.url("/props")).bearer_auth("secret-key");
    let (status, props) = server.send(request);
    assert_eq!(status.as_u16(), 200, "{props}");
    let params = &props["default_generation_settings"]["params"];
    assert_eq!(params["top_k"], 7, "{params}");
    assert!((params["min_p"].as_f64().expect("min_p") - 0.2).abs() < 1e-6, "{params}");
    assert!((params["repeat_penalty"].as_f64().expect("repeat_penalty") - 1.1).abs() < 1e-6, "{params}");
    let body = json!({"messages": [{"role": "user", "content": "hi"}]});
    let request = server.client().post(server.url("/apply-template")).bearer_auth("secret-key").json(&body);
    let (status, applied) = server.send(request);
    assert_eq!(status.as_u16(), 200, "{applied}");
    assert_eq!(applied["prompt"], "<user>hi<assistant>", "the template file is the chat template");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Run `sluice serve` with `args`; return (exit code, stderr).
fn serve(args: &[&str]) -> (Option<i32>, String) {
    let output = Command::new(sluice_binary()).arg("serve").args(args).output().expect("sluice runs");
    (output.status.code(), String::from_utf8_lossy(&output.stderr).into_owned())
}

#[test]
fn refused_flags_stop_the_start_naming_the_flag_and_the_feature() {
    for (args, message) in [
        (&["--embedding"][..], "error: `--embedding`: embeddings are not supported yet"),
        (&["-ctkd", "q8_0"][..], "error: `-ctkd q8_0`: the draft's KV cache is f16 only"),
        (&["--draft-max", "8"][..], "error: `--draft-max 8`: llama-server removed this flag: use --spec-draft-n-max"),
        (&["-ngl"][..], "error: `-ngl` needs a value"),
    ] {
        let (code, stderr) = serve(args);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert!(stderr.starts_with(message), "{args:?}: {stderr}");
    }
    let (code, stderr) = serve(&["--no-such-flag"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("unexpected argument '--no-such-flag'"), "{stderr}");
}

#[test]
fn chat_template_names_are_llama_cpp_s_built_in_ones_and_other_text_is_a_template() {
    let messages = json!([{"role": "system", "content": "You are a test."}, {"role": "user", "content": "Hi there"}]);
    let server = Server::start(&["--chat-template", "command-r"]);
    let (status, applied) = server.post("/apply-template", &json!({ "messages": messages }));
    assert_eq!(status.as_u16(), 200, "{applied}");
    assert_eq!(
        applied["prompt"],
        "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are a test.<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|>\
         <|USER_TOKEN|>Hi there<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"
    );
    drop(server);
    let server = Server::start(&["--chat-template", "This is not a chat template, it is"]);
    let (_, applied) = server.post("/apply-template", &json!({ "messages": messages }));
    assert_eq!(applied["prompt"], "This is not a chat template, it is");
}

#[test]
fn host_takes_a_list_of_addresses() {
    if std::net::TcpListener::bind(("::1", 0)).is_err() {
        eprintln!("no IPv6 loopback here: skipped");
        return;
    }
    let server = Server::start(&["--host", "127.0.0.1,::1"]);
    let log = server.log();
    let listening: Vec<&str> = log.lines().filter(|line| line.contains("listening on http://")).collect();
    assert_eq!(listening.len(), 2, "{log}");
    assert!(listening[1].contains("http://[::1]:"), "{log}");
    let address =
        listening[1].split("http://").nth(1).and_then(|rest| rest.split_whitespace().next()).expect("address");
    let request = server.client().get(format!("http://{address}/health"));
    let (status, _) = server.send(request);
    assert_eq!(status.as_u16(), 200);
}
