//! Step traces (`--record-trace FILE`): each step's view and the decision
//! applied, one JSON line each, for `sluice lab replay` and as a lab
//! workload. A writer thread does the serializing and writing; the engine
//! only hands it the step, and when the writer falls behind the step is
//! dropped and counted rather than waited for (replay sees the gap in the
//! step numbers). The file is bounded: past its size it is renamed to
//! `FILE.1` (replacing the one before) and a new `FILE` starts with a fresh
//! header, so at most twice the bound is kept.

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::thread::JoinHandle;

use serde::{Deserialize, Serialize};

use super::policy::{Decision, StepView};

/// The trace format's version, in every header.
pub const TRACE_VERSION: u32 = 1;

/// Steps the writer may fall behind before steps are dropped.
const BACKLOG: usize = 4096;

/// One line of a trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub enum TraceLine {
    /// The first line of every file.
    Header {
        version: u32,
        /// The policy deciding when the file began.
        policy: String,
        slots: u32,
        token_budget: u32,
    },
    /// The active policy changed (reload or promote) before `step`.
    Policy { step: u64, policy: String },
    /// A step's view and the decision applied (empty when the policy granted
    /// nothing or faulted).
    Step { view: StepView, applied: Decision },
}

/// Why a trace could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("{file}: {source}")]
    Read { file: String, source: std::io::Error },
    #[error("{file}:{line}: {message}")]
    Line { file: String, line: usize, message: String },
    #[error("{file}: not a sluice step trace (its first line is not a `header`)")]
    NotATrace { file: String },
    #[error("{file}: trace version {found}; this sluice reads version {TRACE_VERSION}")]
    Version { file: String, found: u32 },
}

/// Read a trace file; its first line must be a header of this version.
pub fn read_trace(path: &Path) -> Result<Vec<TraceLine>, TraceError> {
    let file = path.display().to_string();
    let reader = File::open(path).map_err(|source| TraceError::Read { file: file.clone(), source })?;
    let mut lines = Vec::new();
    for (index, line) in BufReader::new(reader).lines().enumerate() {
        let line = line.map_err(|source| TraceError::Read { file: file.clone(), source })?;
        if line.trim().is_empty() {
            continue;
        }
        let parsed: TraceLine = serde_json::from_str(&line).map_err(|error| {
            if index == 0 {
                return TraceError::NotATrace { file: file.clone() };
            }
            TraceError::Line { file: file.clone(), line: index + 1, message: error.to_string() }
        })?;
        match (&parsed, lines.is_empty()) {
            (TraceLine::Header { version, .. }, true) if *version != TRACE_VERSION => {
                return Err(TraceError::Version { file, found: *version });
            }
            (TraceLine::Header { .. }, true) => {}
            (_, true) => return Err(TraceError::NotATrace { file }),
            _ => {}
        }
        lines.push(parsed);
    }
    if lines.is_empty() {
        return Err(TraceError::NotATrace { file });
    }
    Ok(lines)
}

/// Whether `path` starts like a step trace (a `header` line).
pub fn is_step_trace(path: &Path) -> bool {
    let Ok(file) = File::open(path) else { return false };
    let mut first = String::new();
    BufReader::new(file).read_line(&mut first).is_ok() && first.trim_start().starts_with("{\"header\"")
}

/// What the trace writer is told.
enum Message {
    Line(TraceLine),
    /// The header a rotated file starts with is rebuilt from this.
    Policy(String),
}

/// The engine's end of a trace: hands lines to the writer thread.
/// Dropping it lets the writer finish what it was handed and waits for it,
/// so a trace is complete once the engine has stopped.
pub struct TraceRecorder {
    sender: Option<SyncSender<Message>>,
    writer: Option<JoinHandle<()>>,
    dropped: u64,
}

impl TraceRecorder {
    /// Start writing `path` (an existing file is moved to `path.1` first),
    /// rotating past `max_bytes`.
    pub fn start(path: &Path, max_bytes: u64, header: TraceLine) -> std::io::Result<Self> {
        let TraceLine::Header { policy, slots, token_budget, .. } = header else {
            return Err(std::io::Error::other("a trace starts with a header"));
        };
        let mut writer =
            Writer { path: path.to_owned(), max_bytes, policy, slots, token_budget, file: None, written: 0 };
        writer.rotate()?;
        let (sender, receiver) = mpsc::sync_channel(BACKLOG);
        let thread = std::thread::Builder::new().name("trace".into()).spawn(move || {
            if let Err(error) = writer.drain(&receiver) {
                tracing::error!(path = %writer.path.display(), %error, "cannot write the step trace; recording stops");
            }
        })?;
        Ok(TraceRecorder { sender: Some(sender), writer: Some(thread), dropped: 0 })
    }

    /// Record a step; `false` once the writer has stopped (recording ends).
    pub fn step(&mut self, view: StepView, applied: Decision) -> bool {
        self.send(Message::Line(TraceLine::Step { view, applied }))
    }

    /// Record that `policy` decides from `step` on.
    pub fn policy(&mut self, step: u64, policy: &str) -> bool {
        self.send(Message::Line(TraceLine::Policy { step, policy: policy.to_owned() }))
            && self.send(Message::Policy(policy.to_owned()))
    }

    /// Steps dropped because the writer was behind.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    fn send(&mut self, message: Message) -> bool {
        let Some(sender) = &self.sender else { return false };
        match sender.try_send(message) {
            Ok(()) => true,
            Err(TrySendError::Full(_)) => {
                self.dropped += 1;
                true
            }
            Err(TrySendError::Disconnected(_)) => false,
        }
    }
}

impl Drop for TraceRecorder {
    fn drop(&mut self) {
        self.sender = None;
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }
}

/// The writer thread's file.
struct Writer {
    path: PathBuf,
    max_bytes: u64,
    policy: String,
    slots: u32,
    token_budget: u32,
    file: Option<BufWriter<File>>,
    written: u64,
}

impl Writer {
    /// Write what arrives until the engine lets go, flushing whenever the
    /// queue is empty: a trace is whole up to the last step written even if
    /// the process is killed.
    fn drain(&mut self, receiver: &Receiver<Message>) -> std::io::Result<()> {
        while let Ok(mut message) = receiver.recv() {
            loop {
                self.write(message)?;
                match receiver.try_recv() {
                    Ok(next) => message = next,
                    Err(_) => break,
                }
            }
            if let Some(file) = self.file.as_mut() {
                file.flush()?;
            }
        }
        Ok(())
    }

    fn write(&mut self, message: Message) -> std::io::Result<()> {
        let line = match message {
            Message::Line(line) => line,
            Message::Policy(policy) => {
                self.policy = policy;
                return Ok(());
            }
        };
        if self.written >= self.max_bytes {
            self.rotate()?;
        }
        self.line(&line)
    }

    fn line(&mut self, line: &TraceLine) -> std::io::Result<()> {
        let mut text = serde_json::to_vec(line).map_err(std::io::Error::other)?;
        text.push(b'\n');
        let file = self.file.as_mut().ok_or_else(|| std::io::Error::other("the trace file is not open"))?;
        file.write_all(&text)?;
        self.written += text.len() as u64;
        Ok(())
    }

    /// Keep the current file as `FILE.1` and start a new one.
    fn rotate(&mut self) -> std::io::Result<()> {
        if let Some(mut file) = self.file.take() {
            file.flush()?;
        }
        if self.path.exists() {
            let mut older = self.path.clone().into_os_string();
            older.push(".1");
            std::fs::rename(&self.path, older)?;
        }
        self.file = Some(BufWriter::new(File::create(&self.path)?));
        self.written = 0;
        let header = TraceLine::Header {
            version: TRACE_VERSION,
            policy: self.policy.clone(),
            slots: self.slots,
            token_budget: self.token_budget,
        };
        self.line(&header)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::policy::Phase;
    use sluice_plugin_api::testing::{ViewBuilder, request};

    fn header() -> TraceLine {
        TraceLine::Header { version: TRACE_VERSION, policy: "continuous".into(), slots: 2, token_budget: 16 }
    }

    #[test]
    fn a_trace_reads_back_what_was_recorded_and_rotates() {
        let dir = std::env::temp_dir().join(format!("sluice-trace-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("steps.jsonl");
        let view = ViewBuilder::new(2, 16).occupied(0, Phase::Decoding, request(1, 4).done(4).generated(1)).build();
        let applied = Decision { decode: vec![0], ..Decision::default() };
        let mut recorder = TraceRecorder::start(&path, 1 << 20, header()).expect("start");
        assert!(recorder.policy(1, "cohort"));
        for _ in 0..3 {
            assert!(recorder.step(view.clone(), applied.clone()));
        }
        drop(recorder);
        let lines = read_trace(&path).expect("read");
        assert_eq!(lines.len(), 5);
        assert_eq!(lines[0], header());
        assert_eq!(lines[1], TraceLine::Policy { step: 1, policy: "cohort".into() });
        assert_eq!(lines[4], TraceLine::Step { view: view.clone(), applied: applied.clone() });
        assert!(is_step_trace(&path));

        // A tiny bound: every step starts a new file, the older one kept as .1.
        let mut recorder = TraceRecorder::start(&path, 10, header()).expect("start");
        assert!(recorder.policy(1, "cohort"));
        assert!(recorder.step(view.clone(), applied.clone()));
        drop(recorder);
        let newest = read_trace(&path).expect("newest");
        let older = read_trace(&dir.join("steps.jsonl.1")).expect("older");
        assert_eq!(older.len(), 2, "the header and the policy line");
        let cohort = TraceLine::Header { version: TRACE_VERSION, policy: "cohort".into(), slots: 2, token_budget: 16 };
        assert_eq!(newest[0], cohort);
        assert_eq!(newest[1], TraceLine::Step { view, applied });

        std::fs::write(&path, "{\"arrival_ms\": 0}\n").expect("write");
        assert!(matches!(read_trace(&path), Err(TraceError::NotATrace { .. })));
        assert!(!is_step_trace(&path));
        std::fs::write(&path, "{\"header\":{\"version\":9,\"policy\":\"p\",\"slots\":1,\"token_budget\":1}}\n")
            .expect("write");
        assert_eq!(
            read_trace(&path).unwrap_err().to_string(),
            format!("{}: trace version 9; this sluice reads version 1", path.display())
        );
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
