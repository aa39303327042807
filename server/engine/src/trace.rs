//! Step traces (`--record-trace FILE`): each step's view and the active
//! policy's decision, one JSON line each, for `sluice lab replay` and as a lab
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
    Header(TraceHeader),
    /// The active policy changed (reload, promotion, or a fallback taking
    /// over) before `step`.
    Policy { step: u64, policy: String },
    /// A step's view and the active policy's validated decision (empty when
    /// it granted nothing or faulted).
    Step { view: StepView, applied: Decision },
}

/// What a trace file starts with: the format, the policy deciding when the
/// file began, the engine's shape, and the rules policies ran under (the
/// defaults of a replay).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceHeader {
    pub version: u32,
    pub policy: String,
    pub slots: u32,
    pub token_budget: u32,
    pub fuel: u64,
    pub deadline_ms: u64,
    pub memory_mb: u64,
    pub stall_steps: u32,
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

/// The lines of a trace file, read as they are used; the first must be a
/// header of this version. A last line cut short (the server was killed
/// while writing it) ends the trace instead of failing it.
pub fn trace_lines(path: &Path) -> Result<impl Iterator<Item = Result<TraceLine, TraceError>>, TraceError> {
    let file = path.display().to_string();
    let reader = File::open(path).map_err(|source| TraceError::Read { file: file.clone(), source })?;
    let mut lines = BufReader::new(reader);
    let mut number = 0;
    let mut next = move || -> Option<Result<TraceLine, TraceError>> {
        loop {
            let mut line = String::new();
            number += 1;
            match lines.read_line(&mut line) {
                Ok(0) => return None,
                Ok(_) if line.trim().is_empty() => continue,
                // Cut short: no newline, and not a whole line of JSON.
                Ok(_) if !line.ends_with('\n') && serde_json::from_str::<TraceLine>(&line).is_err() => return None,
                Ok(_) => {}
                Err(source) => return Some(Err(TraceError::Read { file: file.clone(), source })),
            }
            let parsed = serde_json::from_str::<TraceLine>(&line).map_err(|error| TraceError::Line {
                file: file.clone(),
                line: number,
                message: error.to_string(),
            });
            return Some(parsed);
        }
    };
    let name = path.display().to_string();
    match next() {
        Some(Ok(TraceLine::Header(header))) if header.version != TRACE_VERSION => {
            Err(TraceError::Version { file: name, found: header.version })
        }
        Some(Ok(header @ TraceLine::Header(_))) => Ok(std::iter::once(Ok(header)).chain(std::iter::from_fn(next))),
        Some(Err(TraceError::Read { file, source })) => Err(TraceError::Read { file, source }),
        _ => Err(TraceError::NotATrace { file: name }),
    }
}

/// A trace file's header.
pub fn read_header(path: &Path) -> Result<TraceHeader, TraceError> {
    match trace_lines(path)?.next() {
        Some(Ok(TraceLine::Header(header))) => Ok(header),
        _ => Err(TraceError::NotATrace { file: path.display().to_string() }),
    }
}

/// Every line of a trace file (see [`trace_lines`]).
pub fn read_trace(path: &Path) -> Result<Vec<TraceLine>, TraceError> {
    trace_lines(path)?.collect()
}

/// Whether `path` starts like a step trace (its first line is a `header`).
pub fn is_step_trace(path: &Path) -> bool {
    let Ok(file) = File::open(path) else { return false };
    let first = BufReader::new(file).lines().map_while(Result::ok).find(|line| !line.trim().is_empty());
    first.is_some_and(|line| line.trim_start().starts_with("{\"header\""))
}

/// The engine's end of a trace: hands lines to the writer thread.
/// Dropping it lets the writer finish what it was handed and waits for it.
pub struct TraceRecorder {
    sender: Option<SyncSender<TraceLine>>,
    writer: Option<JoinHandle<()>>,
    dropped: u64,
    /// The policy the trace last named.
    policy: String,
}

impl TraceRecorder {
    /// Start writing `path` (an existing file is moved to `path.1` first),
    /// rotating past `max_bytes`.
    pub fn start(path: &Path, max_bytes: u64, header: TraceHeader) -> std::io::Result<Self> {
        let policy = header.policy.clone();
        let mut writer = Writer { path: path.to_owned(), max_bytes, header, file: None, written: 0 };
        writer.rotate()?;
        let (sender, receiver) = mpsc::sync_channel(BACKLOG);
        let thread = std::thread::Builder::new().name("trace".into()).spawn(move || {
            if let Err(error) = writer.drain(&receiver) {
                tracing::error!(path = %writer.path.display(), %error, "cannot write the step trace; recording stops");
            }
        })?;
        Ok(TraceRecorder { sender: Some(sender), writer: Some(thread), dropped: 0, policy })
    }

    /// Record a step, or count it dropped when the writer is behind;
    /// `false` once the writer has stopped (recording ends).
    pub fn step(&mut self, view: StepView, applied: Decision) -> bool {
        let Some(sender) = &self.sender else { return false };
        match sender.try_send(TraceLine::Step { view, applied }) {
            Ok(()) => true,
            Err(TrySendError::Full(_)) => {
                self.dropped += 1;
                true
            }
            Err(TrySendError::Disconnected(_)) => false,
        }
    }

    /// Record that `policy` decides from `step` on, if the trace names
    /// another. Rare, so it waits for room rather than be dropped.
    pub fn policy(&mut self, step: u64, policy: &str) -> bool {
        if policy == self.policy {
            return true;
        }
        policy.clone_into(&mut self.policy);
        let Some(sender) = &self.sender else { return false };
        sender.send(TraceLine::Policy { step, policy: policy.to_owned() }).is_ok()
    }

    /// Steps dropped because the writer was behind.
    pub fn dropped(&self) -> u64 {
        self.dropped
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
    /// What a new file starts with; its policy follows the policy lines.
    header: TraceHeader,
    file: Option<BufWriter<File>>,
    written: u64,
}

impl Writer {
    /// Write what arrives until the engine lets go, flushing whenever the
    /// queue is empty: a trace is whole up to the last step written even if
    /// the process is killed.
    fn drain(&mut self, receiver: &Receiver<TraceLine>) -> std::io::Result<()> {
        while let Ok(mut line) = receiver.recv() {
            loop {
                self.write(line)?;
                match receiver.try_recv() {
                    Ok(next) => line = next,
                    Err(_) => break,
                }
            }
            if let Some(file) = self.file.as_mut() {
                file.flush()?;
            }
        }
        Ok(())
    }

    fn write(&mut self, line: TraceLine) -> std::io::Result<()> {
        if self.written >= self.max_bytes {
            self.rotate()?;
        }
        self.line(&line)?;
        if let TraceLine::Policy { policy, .. } = line {
            self.header.policy = policy;
        }
        Ok(())
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
        self.line(&TraceLine::Header(self.header.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Phase;
    use sluice_plugin_api::testing::{ViewBuilder, request};

    fn header(policy: &str) -> TraceHeader {
        TraceHeader {
            version: TRACE_VERSION,
            policy: policy.into(),
            slots: 2,
            token_budget: 16,
            fuel: 1000,
            deadline_ms: 5,
            memory_mb: 1,
            stall_steps: 64,
        }
    }

    #[test]
    fn a_trace_reads_back_what_was_recorded_and_rotates() {
        let dir = std::env::temp_dir().join(format!("sluice-trace-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("steps.jsonl");
        let view = ViewBuilder::new(2, 16).occupied(0, Phase::Decoding, request(1, 4).done(4).generated(1)).build();
        let applied = Decision { decode: vec![0], ..Decision::default() };
        let step = TraceLine::Step { view, applied };
        let TraceLine::Step { view, applied } = step.clone() else { unreachable!() };
        let mut recorder = TraceRecorder::start(&path, 1 << 20, header("continuous")).expect("start");
        assert!(recorder.policy(1, "continuous"), "the same policy again writes nothing");
        assert!(recorder.policy(1, "cohort"));
        for _ in 0..3 {
            assert!(recorder.step(view.clone(), applied.clone()));
        }
        drop(recorder);
        let lines = read_trace(&path).expect("read");
        assert_eq!(lines.len(), 5);
        assert_eq!(lines[0], TraceLine::Header(header("continuous")));
        assert_eq!(lines[1], TraceLine::Policy { step: 1, policy: "cohort".into() });
        assert_eq!(lines[4], step);
        assert!(is_step_trace(&path));

        // A tiny bound: every line starts a new file, the older one kept as
        // .1, each new header naming the policy deciding by then.
        let mut recorder = TraceRecorder::start(&path, 10, header("continuous")).expect("start");
        assert!(recorder.policy(1, "cohort"));
        assert!(recorder.step(view.clone(), applied.clone()));
        drop(recorder);
        let older = read_trace(&dir.join("steps.jsonl.1")).expect("older");
        assert_eq!(
            older,
            [TraceLine::Header(header("continuous")), TraceLine::Policy { step: 1, policy: "cohort".into() }]
        );
        assert_eq!(read_trace(&path).expect("newest"), [TraceLine::Header(header("cohort")), step.clone()]);

        // A last line cut short ends the trace; a bad line elsewhere fails it.
        let whole = std::fs::read_to_string(&path).expect("trace");
        std::fs::write(&path, format!("{whole}{{\"step\":{{\"vi")).expect("write");
        assert_eq!(read_trace(&path).expect("cut short").len(), 2);
        std::fs::write(&path, format!("{whole}{{\"step\":{{\"vi\n")).expect("write");
        let bad = read_trace(&path).unwrap_err().to_string();
        assert!(bad.starts_with(&format!("{}:3: ", path.display())), "{bad}");
        std::fs::write(&path, "{\"arrival_ms\": 0}\n").expect("write");
        assert!(matches!(read_trace(&path), Err(TraceError::NotATrace { .. })));
        assert!(!is_step_trace(&path));
        let future = TraceLine::Header(TraceHeader { version: 9, ..header("p") });
        std::fs::write(&path, serde_json::to_string(&future).expect("json") + "\n").expect("write");
        let version = read_trace(&path).unwrap_err().to_string();
        assert_eq!(version, format!("{}: trace version 9; this sluice reads version 1", path.display()));
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
