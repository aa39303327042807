//! The official OpenAI Python client drives chat and text completions,
//! streaming and not, against the real server. The client is installed
//! with pip into a virtual environment under `target/` the first time.

use std::path::{Path, PathBuf};
use std::process::Command;

use sluice_tests::http::Server;

/// The checks, run by the client itself; it prints one line per check.
const SCRIPT: &str = r#"
import sys
from openai import OpenAI

client = OpenAI(base_url=sys.argv[1] + "/v1", api_key="sk-sluice-test", max_retries=0, timeout=120)
messages = [{"role": "user", "content": "Say hello."}]

chat = client.chat.completions.create(model="sluice", messages=messages, max_tokens=8, temperature=0)
choice = chat.choices[0]
assert chat.object == "chat.completion", chat
assert choice.message.role == "assistant", choice
assert choice.finish_reason in ("stop", "length"), choice
assert chat.usage.completion_tokens > 0 and chat.usage.prompt_tokens > 0, chat.usage
print("chat", repr(choice.message.content))

chunks = list(client.chat.completions.create(model="sluice", messages=messages, max_tokens=8, temperature=0,
                                             stream=True, stream_options={"include_usage": True}))
text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
assert chunks[0].choices[0].delta.role == "assistant", chunks[0]
assert text == choice.message.content, (text, choice.message.content)
assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == chat.usage.completion_tokens
print("chat stream", repr(text))

completion = client.completions.create(model="sluice", prompt="The sky is", max_tokens=8, temperature=0)
assert completion.object == "text_completion", completion
print("completion", repr(completion.choices[0].text))

streamed = "".join(c.choices[0].text for c in client.completions.create(
    model="sluice", prompt="The sky is", max_tokens=8, temperature=0, stream=True) if c.choices)
assert streamed == completion.choices[0].text, (streamed, completion.choices[0].text)
print("completion stream", repr(streamed))

models = client.models.list()
assert models.data[0].id, models
print("ok")
"#;

/// A Python with `openai`, installed on first use.
fn python_with_openai() -> PathBuf {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/openai-venv");
    let python = venv.join("bin/python");
    let has_client = |python: &Path| {
        Command::new(python).args(["-c", "import openai"]).output().is_ok_and(|output| output.status.success())
    };
    if python.is_file() && has_client(&python) {
        return python;
    }
    let created = Command::new("python3").args(["-m", "venv"]).arg(&venv).output().expect("python3 runs");
    assert!(
        created.status.success(),
        "cannot create a Python virtual environment at {} (is python3-venv installed?):\n{}",
        venv.display(),
        String::from_utf8_lossy(&created.stderr)
    );
    let pip = Command::new(&python)
        .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "openai"])
        .output()
        .expect("pip runs");
    assert!(
        pip.status.success(),
        "pip could not install the `openai` package (is PyPI reachable?):\n{}",
        String::from_utf8_lossy(&pip.stderr)
    );
    assert!(has_client(&python), "`openai` installed but does not import");
    python
}

#[test]
fn the_openai_python_client_works() {
    let python = python_with_openai();
    let server = Server::start(&["--api-key", "sk-sluice-test"]);
    let output = Command::new(python).args(["-c", SCRIPT, &server.url("")]).output().expect("the client script runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.lines().last() == Some("ok"),
        "the OpenAI client failed:\n{stdout}\n{}\nserver log:\n{}",
        String::from_utf8_lossy(&output.stderr),
        server.log()
    );
}
