//! Workloads: what arrives when. A trace is a JSONL file, one request per
//! line; a generator draws the same records from seeded distributions, so a
//! workload is reproducible from its description alone.

use std::collections::BTreeMap;
use std::path::Path;
use std::str::FromStr;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Exp, Gamma};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use sluice_engine::policy::RequestInfo;
use sluice_engine::trace::{TraceError, TraceLine, is_step_trace, trace_lines};

/// One request of a workload.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceRequest {
    /// Milliseconds after the start of the run.
    pub arrival_ms: f64,
    pub prompt_tokens: u32,
    pub max_tokens: u32,
    /// LoRA adapter name; requests with the same adapter share an adapter
    /// group. Against a live server a number names the adapter id sent as
    /// the request's `lora` (scale 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adapter: Option<String>,
    #[serde(default)]
    pub priority: i32,
    /// The prompt text; without it the prompt is `prompt_tokens` synthetic token ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
}

#[derive(Debug, Error)]
pub enum WorkloadError {
    #[error("{file}: {source}")]
    Read { file: String, source: std::io::Error },
    #[error("{file}:{line}: {message}")]
    Line { file: String, line: usize, message: String },
    #[error("{file}: the trace has no requests")]
    Empty { file: String },
    #[error("{0}")]
    Spec(String),
}

/// Reads a JSONL trace. Blank lines and lines starting with `#` are skipped;
/// arrivals must not go backwards, so a trace reads in time order.
pub fn read_trace(path: &Path) -> Result<Vec<TraceRequest>, WorkloadError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| WorkloadError::Read { file: file.clone(), source })?;
    parse_trace(&text, &file)
}

/// Parses JSONL trace text; `file` names it in errors.
pub fn parse_trace(text: &str, file: &str) -> Result<Vec<TraceRequest>, WorkloadError> {
    let mut requests: Vec<TraceRequest> = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let line_error = |message: String| WorkloadError::Line { file: file.to_owned(), line: index + 1, message };
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let request: TraceRequest = serde_json::from_str(trimmed).map_err(|error| line_error(error.to_string()))?;
        if !request.arrival_ms.is_finite() || request.arrival_ms < 0.0 {
            return Err(line_error(format!("arrival_ms {} is not a time ≥ 0", request.arrival_ms)));
        }
        if let Some(previous) = requests.last()
            && request.arrival_ms < previous.arrival_ms
        {
            return Err(line_error(format!(
                "arrival_ms {} is before the previous line's {}",
                request.arrival_ms, previous.arrival_ms
            )));
        }
        if request.prompt_tokens == 0 && request.prompt.as_deref().is_none_or(str::is_empty) {
            return Err(line_error("prompt_tokens is 0 and there is no prompt text".into()));
        }
        if request.max_tokens == 0 {
            return Err(line_error("max_tokens must be at least 1".into()));
        }
        requests.push(request);
    }
    if requests.is_empty() {
        return Err(WorkloadError::Empty { file: file.to_owned() });
    }
    Ok(requests)
}

/// Reads a workload file: a request trace (JSONL, one request per line) or
/// a server's step trace (`--record-trace`), whose requests it replays.
pub fn read_workload(path: &Path) -> Result<Vec<TraceRequest>, WorkloadError> {
    if !is_step_trace(path) {
        return read_trace(path);
    }
    let file = path.display().to_string();
    let spec = |error: TraceError| WorkloadError::Spec(error.to_string());
    let mut failed = None;
    let lines = trace_lines(path).map_err(spec)?.map_while(|line| line.map_err(|error| failed = Some(error)).ok());
    let requests = from_steps(lines);
    if let Some(error) = failed {
        return Err(spec(error));
    }
    if requests.is_empty() {
        return Err(WorkloadError::Empty { file });
    }
    Ok(requests)
}

/// The requests a step trace saw: arrivals (from the first), prompt
/// lengths, priorities, adapter groups, and as output length the tokens
/// each generated while recorded (so a request still running when the
/// trace ends counts what it had).
pub fn from_steps(lines: impl IntoIterator<Item = TraceLine>) -> Vec<TraceRequest> {
    let mut seen: BTreeMap<u64, (RequestInfo, u32)> = BTreeMap::new();
    for line in lines {
        let TraceLine::Step { view, applied } = line else { continue };
        for waiting in &view.waiting {
            seen.entry(waiting.request.id).or_insert((waiting.request, 0));
        }
        for occupied in &view.occupied {
            let decoded = u32::from(applied.decode.contains(&occupied.slot));
            let entry = seen.entry(occupied.request.id).or_insert((occupied.request, 0));
            entry.1 = entry.1.max(occupied.request.generated + decoded);
        }
    }
    let first = seen.values().map(|(info, _)| info.arrival_ms).min().unwrap_or(0);
    let mut requests: Vec<(u64, TraceRequest)> = seen
        .into_iter()
        .map(|(id, (info, generated))| {
            let request = TraceRequest {
                arrival_ms: (info.arrival_ms - first) as f64,
                prompt_tokens: info.prompt_tokens,
                max_tokens: generated.max(1),
                adapter: (info.adapter_group != 0).then(|| format!("group-{}", info.adapter_group)),
                priority: info.priority,
                prompt: None,
            };
            (id, request)
        })
        .collect();
    requests.sort_by(|(a_id, a), (b_id, b)| a.arrival_ms.total_cmp(&b.arrival_ms).then(a_id.cmp(b_id)));
    requests.into_iter().map(|(_, request)| request).collect()
}

/// Writes a workload as a JSONL trace.
pub fn to_jsonl(requests: &[TraceRequest]) -> String {
    requests.iter().map(|request| serde_json::to_string(request).unwrap_or_default() + "\n").collect()
}

/// A length: `N`, or `A..B` drawn uniformly from A to B inclusive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Length {
    low: u32,
    high: u32,
}

impl Length {
    pub fn fixed(n: u32) -> Self {
        Length { low: n, high: n }
    }

    fn draw(&self, rng: &mut ChaCha8Rng) -> u32 {
        rng.random_range(self.low..=self.high)
    }
}

impl FromStr for Length {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let number =
            |part: &str| part.trim().parse::<u32>().map_err(|_| format!("`{text}` is not a length (N or A..B)"));
        let (low, high) = match text.split_once("..") {
            Some((low, high)) => (number(low)?, number(high)?),
            None => (number(text)?, number(text)?),
        };
        if low == 0 || low > high {
            return Err(format!("`{text}`: lengths must be ≥ 1 and A ≤ B"));
        }
        Ok(Length { low, high })
    }
}

/// How arrivals are spaced.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Arrivals {
    /// Exponential gaps at `rate` requests per second.
    Poisson { rate: f64 },
    /// Gamma-distributed gaps at `rate` with coefficient of variation `cv`
    /// (cv > 1 is burstier than Poisson).
    Gamma { rate: f64, cv: f64 },
    /// Everything at time 0.
    Burst,
}

impl FromStr for Arrivals {
    type Err = String;

    /// `poisson:RATE`, `gamma:RATE:CV` or `burst`.
    fn from_str(text: &str) -> Result<Self, String> {
        let parts: Vec<&str> = text.split(':').collect();
        let number = |part: &str, what: &str| {
            part.parse::<f64>()
                .ok()
                .filter(|value| value.is_finite() && *value > 0.0)
                .ok_or_else(|| format!("`{text}`: {what} must be a number > 0"))
        };
        match parts.as_slice() {
            ["burst"] => Ok(Arrivals::Burst),
            ["poisson", rate] => Ok(Arrivals::Poisson { rate: number(rate, "the rate")? }),
            ["gamma", rate, cv] => Ok(Arrivals::Gamma { rate: number(rate, "the rate")?, cv: number(cv, "cv")? }),
            _ => Err(format!("`{text}` is not an arrival process (poisson:RATE, gamma:RATE:CV or burst)")),
        }
    }
}

/// A seeded workload description.
#[derive(Clone, Debug)]
pub struct Generator {
    pub arrivals: Arrivals,
    pub requests: usize,
    pub prompt_tokens: Length,
    pub max_tokens: Length,
    pub seed: u64,
}

impl Generator {
    pub fn generate(&self) -> Result<Vec<TraceRequest>, WorkloadError> {
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        let gap_ms: Box<dyn Fn(&mut ChaCha8Rng) -> f64> = match self.arrivals {
            Arrivals::Burst => Box::new(|_| 0.0),
            Arrivals::Poisson { rate } => {
                let exp = Exp::new(rate).map_err(|error| WorkloadError::Spec(format!("poisson rate: {error}")))?;
                Box::new(move |rng| exp.sample(rng) * 1000.0)
            }
            Arrivals::Gamma { rate, cv } => {
                // Mean gap 1/rate and cv → shape 1/cv², scale 1/(rate·shape).
                let shape = 1.0 / (cv * cv);
                let gamma = Gamma::new(shape, 1.0 / (rate * shape))
                    .map_err(|error| WorkloadError::Spec(format!("gamma arrivals: {error}")))?;
                Box::new(move |rng| gamma.sample(rng) * 1000.0)
            }
        };
        let mut now = 0.0;
        let mut requests = Vec::with_capacity(self.requests);
        for index in 0..self.requests {
            if index > 0 {
                now += gap_ms(&mut rng);
            }
            requests.push(TraceRequest {
                arrival_ms: (now * 1000.0).round() / 1000.0,
                prompt_tokens: self.prompt_tokens.draw(&mut rng),
                max_tokens: self.max_tokens.draw(&mut rng),
                adapter: None,
                priority: 0,
                prompt: None,
            });
        }
        Ok(requests)
    }
}

/// Synthetic prompt ids for a request without text: deterministic in the
/// request's index, spread over `low..high` (a vocabulary range that holds
/// ordinary tokens) so distinct requests share no prefix.
pub fn synthetic_prompt(index: usize, tokens: u32, low: u32, high: u32) -> Vec<u32> {
    let mut rng = ChaCha8Rng::seed_from_u64(0x5eed ^ index as u64);
    (0..tokens).map(|_| rng.random_range(low..high.max(low + 1))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_trace_gives_each_request_once_with_what_it_generated() {
        use sluice_engine::policy::{Decision, Phase};
        use sluice_plugin_api::testing::{ViewBuilder, request};
        let step =
            |view, decode: Vec<u32>| TraceLine::Step { view, applied: Decision { decode, ..Decision::default() } };
        let lines = [
            step(ViewBuilder::new(2, 64).waiting(request(7, 10).arrived(100)).build(), vec![]),
            step(
                ViewBuilder::new(2, 64)
                    .occupied(0, Phase::Decoding, request(7, 10).done(10).generated(3).arrived(100))
                    .waiting(request(8, 5).arrived(250))
                    .build(),
                vec![0],
            ),
        ];
        let requests = from_steps(lines);
        assert_eq!(requests.len(), 2);
        assert_eq!((requests[0].arrival_ms, requests[0].prompt_tokens, requests[0].max_tokens), (0.0, 10, 4));
        assert_eq!((requests[1].arrival_ms, requests[1].prompt_tokens, requests[1].max_tokens), (150.0, 5, 1));
    }

    #[test]
    fn a_trace_round_trips_and_skips_comments() {
        let text = "# arrivals\n{\"arrival_ms\": 0, \"prompt_tokens\": 10, \"max_tokens\": 4}\n\n\
                    {\"arrival_ms\": 5.5, \"prompt_tokens\": 3, \"max_tokens\": 2, \"priority\": 2, \"adapter\": \"a\"}\n";
        let trace = parse_trace(text, "t.jsonl").expect("valid trace");
        assert_eq!(trace.len(), 2);
        assert_eq!(trace[1].priority, 2);
        assert_eq!(parse_trace(&to_jsonl(&trace), "again").expect("round trip"), trace);
    }

    #[test]
    fn trace_errors_name_file_and_line() {
        let cases = [
            ("{\"arrival_ms\": 0, \"prompt_tokens\": 1}", "t.jsonl:1: missing field `max_tokens`"),
            (
                "{\"arrival_ms\": 9, \"prompt_tokens\": 1, \"max_tokens\": 1}\n{\"arrival_ms\": 2, \"prompt_tokens\": 1, \"max_tokens\": 1}",
                "t.jsonl:2: arrival_ms 2 is before",
            ),
            ("{\"arrival_ms\": -1, \"prompt_tokens\": 1, \"max_tokens\": 1}", "t.jsonl:1: arrival_ms -1"),
            ("{\"arrival_ms\": 0, \"prompt_tokens\": 0, \"max_tokens\": 1}", "t.jsonl:1: prompt_tokens is 0"),
            ("{\"arrival_ms\": 0, \"prompt_tokens\": 1, \"max_tokens\": 0}", "t.jsonl:1: max_tokens"),
            (
                "{\"arrival_ms\": 0, \"prompt_tokens\": 1, \"max_tokens\": 1, \"colour\": 1}",
                "t.jsonl:1: unknown field `colour`",
            ),
            ("\n# nothing\n", "t.jsonl: the trace has no requests"),
        ];
        for (text, expected) in cases {
            let error = parse_trace(text, "t.jsonl").expect_err(text).to_string();
            assert!(error.starts_with(expected), "{error} does not start with {expected}");
        }
    }

    #[test]
    fn generators_are_seeded() {
        let generator = Generator {
            arrivals: "poisson:4".parse().expect("arrivals"),
            requests: 50,
            prompt_tokens: "20..200".parse().expect("length"),
            max_tokens: Length::fixed(16),
            seed: 7,
        };
        let first = generator.generate().expect("generates");
        assert_eq!(first, generator.generate().expect("generates"));
        assert_ne!(first, Generator { seed: 8, ..generator.clone() }.generate().expect("generates"));
        assert!(first.windows(2).all(|pair| pair[0].arrival_ms <= pair[1].arrival_ms));
        assert!(first.iter().all(|r| (20..=200).contains(&r.prompt_tokens) && r.max_tokens == 16));
        // 49 gaps at 4/s average 250 ms; a loose bound catches a unit slip.
        let mean_gap = first[49].arrival_ms / 49.0;
        assert!((100.0..600.0).contains(&mean_gap), "mean gap {mean_gap} ms");
    }

    #[test]
    fn bad_specs_are_refused_with_the_text() {
        for text in ["0", "5..2", "x", "3..y"] {
            assert!(text.parse::<Length>().expect_err(text).contains(text));
        }
        for text in ["poisson", "poisson:0", "gamma:2", "uniform:3", "poisson:-1"] {
            assert!(text.parse::<Arrivals>().expect_err(text).contains(text));
        }
        assert_eq!("gamma:2:1.5".parse::<Arrivals>(), Ok(Arrivals::Gamma { rate: 2.0, cv: 1.5 }));
    }
}
