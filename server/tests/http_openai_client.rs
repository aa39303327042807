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

/// Function calling through the client: `required` and a named function
/// give calls whose arguments match the function's schema, streamed deltas
/// reassemble to the same call, and a tool result renders in the history.
const TOOLS_SCRIPT: &str = r#"
import json, sys
from openai import OpenAI

client = OpenAI(base_url=sys.argv[1] + "/v1", api_key="sk-sluice-test", max_retries=0, timeout=120)
weather = {"type": "object", "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 20},
           "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"], "additionalProperties": False}
add = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 1000},
       "b": {"type": "integer", "minimum": 0, "maximum": 1000}}, "required": ["a", "b"], "additionalProperties": False}
tools = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city", "parameters": weather}},
         {"type": "function", "function": {"name": "add", "description": "Add two numbers", "parameters": add}}]
messages = [{"role": "user", "content": "What is the weather in Paris? Also add 2 and 3."}]

def check(name, arguments):
    args = json.loads(arguments)
    if name == "get_weather":
        assert set(args) == {"city", "unit"}, args
        assert isinstance(args["city"], str) and 1 <= len(args["city"]) <= 20, args
        assert args["unit"] in ("celsius", "fahrenheit"), args
    else:
        assert name == "add", name
        assert set(args) == {"a", "b"}, args
        assert all(type(args[k]) is int and 0 <= args[k] <= 1000 for k in "ab"), args

for seed in (1, 2, 3):
    reply = client.chat.completions.create(model="sluice", messages=messages, tools=tools, tool_choice="required",
                                           max_tokens=120, temperature=0.8, seed=seed)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    calls = choice.message.tool_calls
    assert len(calls) == 1 and calls[0].type == "function" and calls[0].id.startswith("call_"), calls
    check(calls[0].function.name, calls[0].function.arguments)
    print("required", calls[0].function.name, calls[0].function.arguments)

named = {"type": "function", "function": {"name": "add"}}
reply = client.chat.completions.create(model="sluice", messages=messages, tools=tools, tool_choice=named,
                                       max_tokens=120, temperature=0)
call = reply.choices[0].message.tool_calls[0]
assert call.function.name == "add", call
check(call.function.name, call.function.arguments)
print("named", call.function.arguments)

chunks = list(client.chat.completions.create(model="sluice", messages=messages, tools=tools, tool_choice=named,
                                             max_tokens=120, temperature=0, stream=True))
name, arguments, ids, reasons = "", "", [], []
for chunk in chunks:
    if not chunk.choices:
        continue
    delta = chunk.choices[0].delta
    reasons.append(chunk.choices[0].finish_reason)
    for part in delta.tool_calls or []:
        assert part.index == 0, part
        if part.id:
            ids.append(part.id)
        name += part.function.name or ""
        arguments += part.function.arguments or ""
assert (name, arguments) == (call.function.name, call.function.arguments), (name, arguments, call)
assert len(ids) == 1 and reasons[-1] == "tool_calls", (ids, reasons)
print("streamed", name, arguments)

history = messages + [
    {"role": "assistant", "content": None, "tool_calls": [{"id": call.id, "type": "function",
     "function": {"name": "add", "arguments": call.function.arguments}}]},
    {"role": "tool", "tool_call_id": call.id, "content": "5"},
]
after = client.chat.completions.create(model="sluice", messages=history, tools=tools, max_tokens=24, temperature=0)
# The call and its result both reach the prompt.
no_result = client.chat.completions.create(model="sluice", messages=history[:-1], tools=tools, max_tokens=1,
                                           temperature=0)
plain = client.chat.completions.create(model="sluice", messages=messages, tools=tools, max_tokens=1, temperature=0)
assert after.usage.prompt_tokens > no_result.usage.prompt_tokens > plain.usage.prompt_tokens, (after.usage,
    no_result.usage, plain.usage)
print("round trip", after.choices[0].finish_reason)
print("ok")
"#;

/// gpt-oss through the client (its synthetic model and the published
/// Harmony template): `reasoning_effort` reaches the prompt, a required
/// call comes back as `tool_calls` with `reasoning_content` beside it, and
/// the call, its reasoning and its result go back as the next request's
/// history.
const GPT_OSS_SCRIPT: &str = r#"
import json, sys
from openai import OpenAI

client = OpenAI(base_url=sys.argv[1] + "/v1", api_key="sk-sluice-test", max_retries=0, timeout=120)
weather = {"type": "object", "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 12}},
           "required": ["city"], "additionalProperties": False}
tools = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city", "parameters": weather}}]
messages = [{"role": "user", "content": "What is the weather in Paris?"}]

efforts = {}
for effort in ("low", "high"):
    reply = client.chat.completions.create(model="sluice", messages=messages, max_tokens=1, temperature=0,
                                           reasoning_effort=effort)
    efforts[effort] = reply.usage.prompt_tokens
# "Reasoning: low" and "Reasoning: high" are spelled with different tokens.
assert efforts["low"] != efforts["high"], efforts
print("efforts", efforts)

reply = client.chat.completions.create(model="sluice", messages=messages, tools=tools, tool_choice="required",
                                       max_tokens=400, temperature=0)
choice = reply.choices[0]
assert choice.finish_reason == "tool_calls", choice
call = choice.message.tool_calls[0]
assert call.function.name == "get_weather" and call.id.startswith("call_"), call
args = json.loads(call.function.arguments)
assert set(args) == {"city"} and isinstance(args["city"], str), args
reasoning = (choice.message.model_extra or {}).get("reasoning_content")
print("call", call.function.arguments, "reasoning", repr(reasoning))

history = messages + [
    {"role": "assistant", "content": None, "reasoning_content": reasoning or "Look it up.",
     "tool_calls": [{"id": call.id, "type": "function",
                     "function": {"name": "get_weather", "arguments": call.function.arguments}}]},
    {"role": "tool", "tool_call_id": call.id, "content": "{\"sky\": \"clear\"}"},
]
after = client.chat.completions.create(model="sluice", messages=history, tools=tools, max_tokens=8, temperature=0)
# The call (its arguments, its reasoning) and the result reach the prompt.
assert after.usage.prompt_tokens > reply.usage.prompt_tokens + 40, (after.usage, reply.usage)
print("round trip", after.choices[0].finish_reason)
print("ok")
"#;

/// A Python with `openai`, installed on first use (once per test binary:
/// its tests run in parallel).
fn python_with_openai() -> PathBuf {
    static PYTHON: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PYTHON.get_or_init(install_openai).clone()
}

fn install_openai() -> PathBuf {
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
    run_script(SCRIPT);
}

#[test]
fn the_openai_python_client_calls_tools() {
    run_script(TOOLS_SCRIPT);
}

#[test]
fn the_openai_python_client_reasons_and_calls_tools_with_gpt_oss() {
    let path = std::env::temp_dir().join(format!("sluice-client-gpt-oss-{}.gguf", std::process::id()));
    std::fs::write(&path, sluice_tests::models::gpt_oss_for_chat().build()).expect("write the model");
    run_script_on(GPT_OSS_SCRIPT, Server::start_model(&path, &["--api-key", "sk-sluice-test"], &[]));
    std::fs::remove_file(&path).expect("clean up");
}

fn run_script(script: &str) {
    run_script_on(script, Server::start(&["--api-key", "sk-sluice-test"]));
}

fn run_script_on(script: &str, server: Server) {
    let python = python_with_openai();
    let output = Command::new(python).args(["-c", script, &server.url("")]).output().expect("the client script runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.lines().last() == Some("ok"),
        "the OpenAI client failed:\n{stdout}\n{}\nserver log:\n{}",
        String::from_utf8_lossy(&output.stderr),
        server.log()
    );
}
