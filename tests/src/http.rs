//! A real `sluice serve` for end-to-end HTTP tests: started on a free port
//! of 127.0.0.1 (port 0; the port is read from the log), polled until
//! `/health` says ok, killed when dropped. Every wait is bounded.
//! `SLUICE_TEST_DEVICE` (cpu, cuda:N) adds `--device` to every server.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use reqwest::blocking::{Client, RequestBuilder, Response};
use serde_json::Value;

use crate::binary::sluice_binary;
use crate::models::default_model;

/// Bound on start-up (listening, then loading the model).
const START_TIMEOUT: Duration = Duration::from_secs(120);
/// Bound on any one request, streams included.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// `toml` written as `sluice.toml` in a scratch folder of its own (named
/// after `name` and this process), for `--config`.
pub fn config_file(name: &str, toml: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("sluice-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let path = dir.join("sluice.toml");
    std::fs::write(&path, toml).expect("config");
    path
}

/// A running server.
pub struct Server {
    child: Child,
    base: String,
    log: Arc<Mutex<String>>,
    client: Client,
}

impl Server {
    /// Start on the default model with `args` after `sluice serve`
    /// (llama-server-style flags); wait until `/health` is 200.
    pub fn start(args: &[&str]) -> Server {
        let server = Self::spawn(args);
        server.wait_healthy();
        server
    }

    /// Start without waiting for the model (`/health` may still be 503).
    /// `/metrics` is on, as the tests read it.
    pub fn spawn(args: &[&str]) -> Server {
        Self::launch(&sluice_binary(), &[&["--metrics"], args].concat(), &[])
    }

    /// [`Server::start`] with another `sluice` binary than this build's.
    pub fn start_binary(binary: &Path, args: &[&str]) -> Server {
        let server = Self::launch(binary, &[&["--metrics"], args].concat(), &[]);
        server.wait_healthy();
        server
    }

    /// [`Server::start`] with the server's own defaults (no `--metrics`).
    pub fn start_plain(args: &[&str]) -> Server {
        let server = Self::launch(&sluice_binary(), args, &[]);
        server.wait_healthy();
        server
    }

    /// [`Server::start`] with `env` set in the server's environment.
    pub fn start_with_env(args: &[&str], env: &[(&str, &str)]) -> Server {
        let server = Self::launch(&sluice_binary(), &[&["--metrics"], args].concat(), env);
        server.wait_healthy();
        server
    }

    /// [`Server::start_with_env`] on another model file (a synthetic one).
    pub fn start_model(model: &Path, args: &[&str], env: &[(&str, &str)]) -> Server {
        let server = Self::launch_model(&sluice_binary(), model, &[&["--metrics"], args].concat(), env);
        server.wait_healthy();
        server
    }

    fn launch(binary: &Path, args: &[&str], env: &[(&str, &str)]) -> Server {
        Self::launch_model(binary, &default_model(), args, env)
    }

    fn launch_model(binary: &Path, model: &Path, args: &[&str], env: &[(&str, &str)]) -> Server {
        // `cargo xtask device-check` runs the end-to-end tests on a GPU.
        let device = std::env::var("SLUICE_TEST_DEVICE").ok();
        let mut child = Command::new(binary)
            .arg("serve")
            .args(["--host", "127.0.0.1", "--port", "0", "-m"])
            .arg(model)
            .args(device.iter().flat_map(|device| ["--device", device.as_str()]))
            .args(args)
            .env_remove("RUST_LOG")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("sluice starts");
        let log = Arc::new(Mutex::new(String::new()));
        let (address_tx, address_rx) = mpsc::channel();
        let stderr = child.stderr.take().expect("piped stderr");
        let sink = Arc::clone(&log);
        // Keep draining stderr for the server's whole life so it never
        // blocks on a full pipe; the log is kept for failure messages.
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(at) = line.find("listening on http://") {
                    let address: String =
                        line[at + "listening on http://".len()..].chars().take_while(|c| !c.is_whitespace()).collect();
                    let _ = address_tx.send(address);
                }
                if let Ok(mut log) = sink.lock() {
                    log.push_str(&line);
                    log.push('\n');
                }
            }
        });
        let client = Client::builder().timeout(REQUEST_TIMEOUT).build().expect("http client");
        let mut server = Server { child, base: String::new(), log, client };
        match address_rx.recv_timeout(START_TIMEOUT) {
            Ok(address) => server.base = format!("http://{address}"),
            Err(_) => panic!("sluice did not report a listening address:\n{}", server.log()),
        }
        server
    }

    /// Poll `/health` until 200.
    pub fn wait_healthy(&self) {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Ok(response) = self.client.get(self.url("/health")).timeout(Duration::from_secs(5)).send()
                && response.status() == StatusCode::OK
            {
                return;
            }
            assert!(Instant::now() < deadline, "sluice did not become healthy:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        self.log.lock().map(|log| log.clone()).unwrap_or_default()
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    pub fn get(&self, path: &str) -> (StatusCode, Value) {
        self.send(self.client.get(self.url(path)))
    }

    /// GET a text body (such as `/metrics`); empty if the request fails.
    pub fn get_text(&self, path: &str) -> String {
        self.client.get(self.url(path)).send().and_then(|response| response.text()).unwrap_or_default()
    }

    pub fn post(&self, path: &str, body: &Value) -> (StatusCode, Value) {
        self.send(self.client.post(self.url(path)).json(body))
    }

    /// Send and read a JSON answer (`Null` for a body that is not JSON).
    pub fn send(&self, request: RequestBuilder) -> (StatusCode, Value) {
        let response = request.send().unwrap_or_else(|error| panic!("request failed: {error}\n{}", self.log()));
        let status = response.status();
        let text = response.text().unwrap_or_default();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// POST and read the whole SSE stream.
    pub fn stream(&self, path: &str, body: &Value) -> Stream {
        Stream::read(self.post_raw(path, body))
    }

    /// POST and return the open response, to read a stream part way.
    pub fn open_stream(&self, path: &str, body: &Value) -> SseReader {
        let response = self.post_raw(path, body);
        assert_eq!(response.status(), StatusCode::OK, "stream refused:\n{}", self.log());
        SseReader::new(response)
    }

    fn post_raw(&self, path: &str, body: &Value) -> Response {
        self.client
            .post(self.url(path))
            .json(body)
            .send()
            .unwrap_or_else(|error| panic!("request failed: {error}\n{}", self.log()))
    }

    /// A Prometheus sample's value (`name` with its labels, if any).
    pub fn metric(&self, name: &str) -> f64 {
        let text = self.client.get(self.url("/metrics")).send().and_then(Response::text).expect("metrics");
        text.lines()
            .find_map(|line| line.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
            .and_then(|value| value.trim().parse().ok())
            .unwrap_or_else(|| panic!("no metric {name} in:\n{text}"))
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The server's resident memory (VmRSS) in KiB, while it runs.
    pub fn rss_kib(&self) -> Option<u64> {
        rss_kib(self.child.id())
    }

    /// Whether the server process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Send a signal (`HUP`, `TERM`, …) to the server.
    pub fn signal(&self, name: &str) {
        let status =
            Command::new("kill").arg(format!("-{name}")).arg(self.child.id().to_string()).status().expect("kill runs");
        assert!(status.success(), "kill -{name} failed");
    }

    /// Wait for the server to exit (bounded); its exit code.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status.code();
            }
            assert!(Instant::now() < deadline, "sluice did not exit:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Wait until every slot is idle (bounded).
    pub fn wait_idle(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (_, slots) = self.get("/slots");
            let busy = slots.as_array().is_none_or(|slots| slots.iter().any(|slot| slot["is_processing"] != false));
            if !busy {
                return;
            }
            assert!(Instant::now() < deadline, "slots stayed busy: {slots}\n{}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The resident memory (VmRSS) of process `pid` in KiB, while it runs.
pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find_map(|line| line.strip_prefix("VmRSS:"))?;
    line.trim().trim_end_matches("kB").trim().parse().ok()
}

/// A whole SSE response: status, the JSON of every `data:` event, and
/// whether it ended with `data: [DONE]`.
#[derive(Debug)]
pub struct Stream {
    pub status: StatusCode,
    pub content_type: String,
    pub events: Vec<Value>,
    pub done: bool,
    /// An error body when the server answered without streaming.
    pub error: Value,
}

impl Stream {
    fn read(response: Response) -> Stream {
        let status = response.status();
        let content_type =
            response.headers().get("content-type").and_then(|value| value.to_str().ok()).unwrap_or("").to_owned();
        if status != StatusCode::OK {
            let error = serde_json::from_str(&response.text().unwrap_or_default()).unwrap_or(Value::Null);
            return Stream { status, content_type, events: Vec::new(), done: false, error };
        }
        let mut reader = SseReader::new(response);
        let mut events = Vec::new();
        let mut done = false;
        while let Some(data) = reader.next_data() {
            assert!(!done, "an event after [DONE]: {data}");
            if data == "[DONE]" {
                done = true;
            } else {
                events.push(serde_json::from_str(&data).unwrap_or_else(|_| panic!("not JSON: {data}")));
            }
        }
        Stream { status, content_type, events, done, error: Value::Null }
    }
}

/// Reads `data:` payloads off an SSE response, checking the framing:
/// every event is `data: <payload>` then a blank line; comments (`:`) are
/// skipped.
pub struct SseReader {
    lines: std::io::Lines<BufReader<Response>>,
}

impl SseReader {
    fn new(response: Response) -> Self {
        SseReader { lines: BufReader::new(response).lines() }
    }

    /// Read the events of a response sent by a client of the caller's own.
    pub fn from_response(response: Response) -> Self {
        Self::new(response)
    }

    /// The next event's payload, or `None` at the end of the stream.
    pub fn next_data(&mut self) -> Option<String> {
        loop {
            let line = self.lines.next()?.ok()?;
            if line.is_empty() || line.starts_with(':') {
                continue;
            }
            let data =
                line.strip_prefix("data: ").unwrap_or_else(|| panic!("not an SSE data line: {line:?}")).to_owned();
            let blank = self.lines.next().and_then(Result::ok);
            assert_eq!(blank.as_deref(), Some(""), "an SSE event must end with a blank line");
            return Some(data);
        }
    }
}

/// The events of a whole stream that names them (the Messages and
/// Responses APIs), as (name, data): checks each is `event: <name>` then
/// `data: <json>` with the name equal to the data's `type`, that the stream
/// ends with a whole event and has no `[DONE]`; `:` comments are skipped.
pub fn named_events(text: &str) -> Vec<(String, Value)> {
    assert!(text.ends_with("\n\n"), "the stream must end with a whole event: {text:?}");
    let mut events = Vec::new();
    for frame in text.split_terminator("\n\n") {
        let lines: Vec<&str> = frame.lines().filter(|line| !line.starts_with(':')).collect();
        if lines.is_empty() {
            continue;
        }
        let [event, data] = lines.as_slice() else { panic!("an event is `event:` then `data:`: {frame:?}") };
        let name = event.strip_prefix("event: ").unwrap_or_else(|| panic!("no event name: {frame:?}"));
        let data = data.strip_prefix("data: ").unwrap_or_else(|| panic!("no data: {frame:?}"));
        assert_ne!(data, "[DONE]", "streams with named events have no [DONE]");
        let data: Value = serde_json::from_str(data).unwrap_or_else(|_| panic!("not JSON: {data}"));
        assert_eq!(data["type"], name, "the event name is the data's type: {frame:?}");
        events.push((name.to_owned(), data));
    }
    events
}
