//! Token sampling with llama.cpp's chain and defaults: logit bias →
//! penalties → top-k → typical-p → top-p → min-p → temperature → a seeded
//! draw (mt19937 and the uniform double of the C++ standard library, so the
//! same seed draws the same numbers as llama.cpp).

use std::collections::VecDeque;

/// A sampler stage, in the order the request lists them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Penalties,
    TopK,
    TypicalP,
    TopP,
    MinP,
    Temperature,
}

impl Stage {
    /// Parse a llama.cpp sampler name (with its aliases).
    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "penalties" => Stage::Penalties,
            "top_k" | "top-k" | "topk" => Stage::TopK,
            "typ_p" | "typical_p" | "typical-p" | "typ-p" | "typical" | "typ" => Stage::TypicalP,
            "top_p" | "top-p" | "nucleus" | "topp" => Stage::TopP,
            "min_p" | "min-p" | "minp" => Stage::MinP,
            "temperature" | "temp" => Stage::Temperature,
            _ => return None,
        })
    }
}

/// The default chain (llama.cpp's, less the stages sluice does not have).
pub const DEFAULT_STAGES: [Stage; 6] =
    [Stage::Penalties, Stage::TopK, Stage::TypicalP, Stage::TopP, Stage::MinP, Stage::Temperature];

/// Sampling settings of one request; defaults are llama.cpp's.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    pub temperature: f32,
    pub top_k: i32,
    pub top_p: f32,
    pub min_p: f32,
    pub typical_p: f32,
    pub repeat_penalty: f32,
    pub repeat_last_n: usize,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    pub min_keep: usize,
    /// `None` draws a seed from the clock.
    pub seed: Option<u32>,
    /// Added to logits before anything else; `f32::NEG_INFINITY` bans.
    pub logit_bias: Vec<(u32, f32)>,
    pub stages: Vec<Stage>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            typical_p: 1.0,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            min_keep: 0,
            seed: None,
            logit_bias: Vec::new(),
            stages: DEFAULT_STAGES.to_vec(),
        }
    }
}

/// A token and its probability.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenProb {
    pub token: u32,
    pub prob: f32,
}

/// The sampler of one sequence: settings, RNG stream and token history.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: Mt19937,
    history: VecDeque<u32>,
    candidates: Vec<Candidate>,
}

#[derive(Debug, Clone, Copy)]
struct Candidate {
    token: u32,
    logit: f32,
    prob: f32,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Self {
        let seed = params.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |elapsed| elapsed.subsec_nanos() ^ elapsed.as_secs() as u32)
        });
        Sampler { rng: Mt19937::new(seed), history: VecDeque::new(), candidates: Vec::new(), params }
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// What `sample` changes (only the random stream: the history moves on
    /// `accept`), to undo a draw that was only a trial.
    pub fn checkpoint(&self) -> SamplerCheckpoint {
        SamplerCheckpoint(self.rng.clone())
    }

    /// Undo every draw since `checkpoint`.
    pub fn restore(&mut self, checkpoint: SamplerCheckpoint) {
        self.rng = checkpoint.0;
    }

    /// Record a token of the sequence (prompt or generated) for penalties.
    pub fn accept(&mut self, token: u32) {
        if self.params.repeat_last_n == 0 {
            return;
        }
        if self.history.len() == self.params.repeat_last_n {
            self.history.pop_front();
        }
        self.history.push_back(token);
    }

    /// Sample a token from `logits`; returns it with its probability after
    /// the chain. `post_probs`, when asked, receives the probabilities of the
    /// candidates left after the chain (most likely first, zero
    /// probabilities dropped), at most `n`.
    pub fn sample(&mut self, logits: &[f32], post_probs: Option<(usize, &mut Vec<TokenProb>)>) -> TokenProb {
        self.candidates.clear();
        self.candidates.extend(logits.iter().enumerate().map(|(token, &logit)| Candidate {
            token: token as u32,
            logit,
            prob: 0.0,
        }));
        let mut sorted = false;
        for &(token, bias) in &self.params.logit_bias {
            if let Some(candidate) = self.candidates.get_mut(token as usize) {
                candidate.logit += bias;
            }
        }
        let min_keep = self.params.min_keep.max(1);
        for stage in self.params.stages.clone() {
            match stage {
                Stage::Penalties => self.penalize(),
                Stage::TopK => top_k(&mut self.candidates, self.params.top_k, min_keep, &mut sorted),
                Stage::TypicalP => typical_p(&mut self.candidates, self.params.typical_p, min_keep, &mut sorted),
                Stage::TopP => top_p(&mut self.candidates, self.params.top_p, min_keep, &mut sorted),
                Stage::MinP => min_p(&mut self.candidates, self.params.min_p, min_keep, &mut sorted),
                Stage::Temperature => temperature(&mut self.candidates, self.params.temperature),
            }
        }
        softmax(&mut self.candidates);
        let draw = self.rng.next_canonical();
        let mut cumulative = 0.0f64;
        let mut chosen = self.candidates.last().map_or(TokenProb { token: 0, prob: 0.0 }, |candidate| TokenProb {
            token: candidate.token,
            prob: candidate.prob,
        });
        for candidate in &self.candidates {
            cumulative += f64::from(candidate.prob);
            if draw < cumulative {
                chosen = TokenProb { token: candidate.token, prob: candidate.prob };
                break;
            }
        }
        if let Some((n, out)) = post_probs {
            if !sorted {
                sort_descending(&mut self.candidates);
            }
            let kept = || self.candidates.iter().filter(|candidate| candidate.prob > 0.0).take(n);
            // Sized exactly: the list travels with the token event and is
            // counted against the stream window by what it holds.
            out.clear();
            out.reserve_exact(kept().count());
            out.extend(kept().map(|candidate| TokenProb { token: candidate.token, prob: candidate.prob }));
        }
        chosen
    }

    fn penalize(&mut self) {
        let params = &self.params;
        if self.history.is_empty()
            || (params.repeat_penalty == 1.0 && params.presence_penalty == 0.0 && params.frequency_penalty == 0.0)
        {
            return;
        }
        let mut counts: Vec<(u32, u32)> = Vec::new();
        for &token in &self.history {
            match counts.iter_mut().find(|(seen, _)| *seen == token) {
                Some((_, count)) => *count += 1,
                None => counts.push((token, 1)),
            }
        }
        for (token, count) in counts {
            // Candidates are still in token order here unless an earlier
            // stage sorted them; find by id to be safe.
            let Some(candidate) = self.candidates.iter_mut().find(|candidate| candidate.token == token) else {
                continue;
            };
            if candidate.logit <= 0.0 {
                candidate.logit *= params.repeat_penalty;
            } else {
                candidate.logit /= params.repeat_penalty;
            }
            candidate.logit -= count as f32 * params.frequency_penalty + params.presence_penalty;
        }
    }
}

/// The n most likely tokens of a raw softmax over all logits (llama.cpp's
/// pre-sampling probabilities), most likely first, ties by token id.
pub fn top_probs(logits: &[f32], n: usize) -> Vec<TokenProb> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&logit| f64::from((logit - max).exp())).sum();
    let mut best: Vec<Candidate> =
        logits.iter().enumerate().map(|(token, &logit)| Candidate { token: token as u32, logit, prob: 0.0 }).collect();
    keep_best(&mut best, n);
    // A list of its own, exactly as long as it is: collected from `best`,
    // Rust would reuse the vocabulary-sized buffer in place, and every
    // token event would hold that buffer (590 KB at 49,152 candidates)
    // for its few probabilities, while the stream window counted only those.
    let mut top = Vec::with_capacity(best.len());
    top.extend(best.iter().map(|candidate| TokenProb {
        token: candidate.token,
        prob: ((candidate.logit - max).exp() as f64 / sum) as f32,
    }));
    top
}

/// Keep the `n` best candidates, best first: a selection, then a sort of
/// only those (O(V + n log n); `n_probs` may ask for the whole vocabulary,
/// every token, on the engine thread).
fn keep_best(candidates: &mut Vec<Candidate>, n: usize) {
    if n < candidates.len() {
        candidates.select_nth_unstable_by(n, descending);
        candidates.truncate(n);
    }
    sort_descending(candidates);
}

/// The probability of `token` under a raw softmax over all logits.
pub fn token_prob(logits: &[f32], token: u32) -> f32 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&logit| f64::from((logit - max).exp())).sum();
    logits.get(token as usize).map_or(0.0, |&logit| (f64::from((logit - max).exp()) / sum) as f32)
}

fn sort_descending(candidates: &mut [Candidate]) {
    candidates.sort_by(descending);
}

/// Most likely first; equal logits by token id, which is the order a stable
/// sort of token-ordered candidates gives, so a partial selection under
/// this order picks exactly the candidates a full sort would.
fn descending(a: &Candidate, b: &Candidate) -> std::cmp::Ordering {
    b.logit.total_cmp(&a.logit).then(a.token.cmp(&b.token))
}

fn softmax(candidates: &mut [Candidate]) {
    let max = candidates.iter().map(|candidate| candidate.logit).fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f32;
    for candidate in candidates.iter_mut() {
        candidate.prob = (candidate.logit - max).exp();
        sum += candidate.prob;
    }
    for candidate in candidates.iter_mut() {
        candidate.prob /= sum;
    }
}

fn top_k(candidates: &mut Vec<Candidate>, k: i32, min_keep: usize, sorted: &mut bool) {
    if k <= 0 {
        return;
    }
    let k = (k as usize).max(min_keep).min(candidates.len());
    if !*sorted {
        // Sorting the whole vocabulary every token costs milliseconds.
        keep_best(candidates, k);
        *sorted = true;
    }
    candidates.truncate(k);
}

fn top_p(candidates: &mut Vec<Candidate>, p: f32, min_keep: usize, sorted: &mut bool) {
    if p >= 1.0 {
        return;
    }
    if !*sorted {
        sort_descending(candidates);
        *sorted = true;
    }
    softmax(candidates);
    let mut cumulative = 0.0f32;
    let mut keep = candidates.len();
    for (index, candidate) in candidates.iter().enumerate() {
        cumulative += candidate.prob;
        if cumulative >= p && index + 1 >= min_keep {
            keep = index + 1;
            break;
        }
    }
    candidates.truncate(keep);
}

fn min_p(candidates: &mut Vec<Candidate>, p: f32, min_keep: usize, sorted: &mut bool) {
    if p <= 0.0 || candidates.is_empty() {
        return;
    }
    if !*sorted {
        sort_descending(candidates);
        *sorted = true;
    }
    let threshold = candidates[0].logit + p.ln();
    let keep = candidates.iter().take_while(|candidate| candidate.logit >= threshold).count().max(min_keep);
    candidates.truncate(keep.min(candidates.len()));
}

fn typical_p(candidates: &mut Vec<Candidate>, p: f32, min_keep: usize, sorted: &mut bool) {
    if p >= 1.0 || candidates.is_empty() {
        return;
    }
    softmax(candidates);
    let entropy: f32 =
        -candidates.iter().filter(|c| c.prob > 0.0).map(|candidate| candidate.prob * candidate.prob.ln()).sum::<f32>();
    let mut order: Vec<(f32, usize)> = candidates
        .iter()
        .enumerate()
        .map(|(index, candidate)| ((-candidate.prob.ln() - entropy).abs(), index))
        .collect();
    order.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut cumulative = 0.0f32;
    let mut keep = order.len();
    for (rank, &(_, index)) in order.iter().enumerate() {
        cumulative += candidates[index].prob;
        if cumulative > p && rank + 1 >= min_keep {
            keep = rank + 1;
            break;
        }
    }
    let kept: Vec<Candidate> = order[..keep].iter().map(|&(_, index)| candidates[index]).collect();
    *candidates = kept;
    *sorted = false;
}

fn temperature(candidates: &mut [Candidate], temperature: f32) {
    if temperature <= 0.0 {
        // Greedy: only the most likely candidate survives (the first on
        // ties, in current order).
        let best = candidates
            .iter()
            .enumerate()
            .fold(None::<(usize, f32)>, |best, (index, candidate)| match best {
                Some((_, logit)) if logit >= candidate.logit => best,
                _ => Some((index, candidate.logit)),
            })
            .map_or(0, |(index, _)| index);
        for (index, candidate) in candidates.iter_mut().enumerate() {
            if index != best {
                candidate.logit = f32::NEG_INFINITY;
            }
        }
        return;
    }
    for candidate in candidates.iter_mut() {
        candidate.logit /= temperature;
    }
}

/// A sampler's random state at some point (see [`Sampler::checkpoint`]).
#[derive(Debug, Clone)]
pub struct SamplerCheckpoint(Mt19937);

/// The 32-bit Mersenne Twister (std::mt19937).
#[derive(Debug, Clone)]
struct Mt19937 {
    state: [u32; 624],
    index: usize,
}

impl Mt19937 {
    fn new(seed: u32) -> Self {
        let mut state = [0u32; 624];
        state[0] = seed;
        for i in 1..624 {
            state[i] = 1_812_433_253u32.wrapping_mul(state[i - 1] ^ (state[i - 1] >> 30)).wrapping_add(i as u32);
        }
        Mt19937 { state, index: 624 }
    }

    fn next_u32(&mut self) -> u32 {
        if self.index >= 624 {
            for i in 0..624 {
                let y = (self.state[i] & 0x8000_0000) | (self.state[(i + 1) % 624] & 0x7fff_ffff);
                let mut next = self.state[(i + 397) % 624] ^ (y >> 1);
                if y & 1 != 0 {
                    next ^= 0x9908_b0df;
                }
                self.state[i] = next;
            }
            self.index = 0;
        }
        let mut y = self.state[self.index];
        self.index += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }

    /// `std::generate_canonical<double, 53>` with a 32-bit engine: two
    /// draws, low word first.
    fn next_canonical(&mut self) -> f64 {
        let low = f64::from(self.next_u32());
        let high = f64::from(self.next_u32());
        let value = (low + high * 4_294_967_296.0) / 18_446_744_073_709_551_616.0;
        if value >= 1.0 { 1.0 - f64::EPSILON / 2.0 } else { value }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_by_selection_keeps_what_a_stable_full_sort_keeps() {
        // Few distinct logits: many ties straddle the cut.
        let logits: Vec<f32> = (0..5000u32).map(|i| ((i * 7919) % 13) as f32 * 0.5).collect();
        for k in [1, 3, 40, 385, 4999] {
            let mut selected: Vec<Candidate> = logits
                .iter()
                .enumerate()
                .map(|(token, &logit)| Candidate { token: token as u32, logit, prob: 0.0 })
                .collect();
            let mut sorted = false;
            top_k(&mut selected, k, 1, &mut sorted);
            let mut full = logits.iter().enumerate().map(|(token, &logit)| (token as u32, logit)).collect::<Vec<_>>();
            full.sort_by(|a, b| b.1.total_cmp(&a.1));
            full.truncate(k as usize);
            let picked: Vec<(u32, f32)> = selected.iter().map(|c| (c.token, c.logit)).collect();
            assert_eq!(picked, full, "k = {k}");
        }
    }

    #[test]
    fn mt19937_matches_the_standard_sequence() {
        // The C++ standard requires the 10000th output of a
        // default-seeded (5489) mt19937 to be 4123659995.
        let mut rng = Mt19937::new(5489);
        let first = rng.next_u32();
        assert_eq!(first, 3_499_211_612);
        for _ in 1..9999 {
            rng.next_u32();
        }
        assert_eq!(rng.next_u32(), 4_123_659_995);
    }

    #[test]
    fn a_restored_checkpoint_draws_the_same_tokens_again() {
        let logits: Vec<f32> = (0..50).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
        let mut sampler = Sampler::new(SamplingParams { temperature: 1.5, seed: Some(9), ..SamplingParams::default() });
        let checkpoint = sampler.checkpoint();
        let first: Vec<u32> = (0..20).map(|_| sampler.sample(&logits, None).token).collect();
        assert!(first.iter().any(|&token| token != first[0]), "hot sampling should vary: {first:?}");
        sampler.restore(checkpoint);
        let again: Vec<u32> = (0..20).map(|_| sampler.sample(&logits, None).token).collect();
        assert_eq!(again, first);
    }

    fn greedy() -> SamplingParams {
        SamplingParams { temperature: 0.0, seed: Some(1), ..SamplingParams::default() }
    }

    #[test]
    fn greedy_picks_the_largest_logit() {
        let mut sampler = Sampler::new(greedy());
        assert_eq!(sampler.sample(&[0.1, 2.0, -1.0, 1.9], None), TokenProb { token: 1, prob: 1.0 });
    }

    #[test]
    fn logit_bias_can_ban_the_best_token() {
        let params = SamplingParams { logit_bias: vec![(1, f32::NEG_INFINITY)], ..greedy() };
        assert_eq!(Sampler::new(params).sample(&[0.1, 2.0, -1.0, 1.9], None).token, 3);
    }

    #[test]
    fn repeat_penalty_demotes_seen_tokens() {
        let params = SamplingParams { repeat_penalty: 2.0, ..greedy() };
        let mut sampler = Sampler::new(params);
        sampler.accept(1);
        assert_eq!(sampler.sample(&[0.1, 2.0, -1.0, 1.9], None).token, 3);
    }

    #[test]
    fn same_seed_same_draws_and_post_probs_sum_to_one() {
        let logits: Vec<f32> = (0..50).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
        let params = SamplingParams { seed: Some(42), ..SamplingParams::default() };
        let draws = |params: &SamplingParams| {
            let mut sampler = Sampler::new(params.clone());
            (0..20).map(|_| sampler.sample(&logits, None).token).collect::<Vec<_>>()
        };
        assert_eq!(draws(&params), draws(&params));
        let mut probs = Vec::new();
        Sampler::new(params).sample(&logits, Some((100, &mut probs)));
        let total: f32 = probs.iter().map(|p| p.prob).sum();
        assert!((total - 1.0).abs() < 1e-5, "{total}");
        assert!(probs.windows(2).all(|pair| pair[0].prob >= pair[1].prob));
    }

    #[test]
    fn top_probs_are_a_softmax_of_raw_logits() {
        let probs = top_probs(&[0.0, 1.0, 2.0, 1.0], 3);
        let tokens: Vec<u32> = probs.iter().map(|p| p.token).collect();
        assert_eq!(tokens, vec![2, 1, 3]);
        let denom = 1.0 + 2.0 * 1f64.exp() + 2f64.exp();
        assert!((f64::from(probs[0].prob) - 2f64.exp() / denom).abs() < 1e-6);
    }

    #[test]
    fn top_probs_keep_what_a_full_sort_keeps_for_every_n() {
        // Many ties, so the order between equal logits (token id) matters.
        let logits: Vec<f32> = (0..2000u32).map(|token| ((token * 7919) % 61) as f32 / 8.0 - 3.0).collect();
        let mut sorted: Vec<(u32, f32)> = logits.iter().enumerate().map(|(token, &l)| (token as u32, l)).collect();
        sorted.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        for n in [0, 1, 2, 60, 61, 1999, 2000, 5000] {
            let tokens: Vec<u32> = top_probs(&logits, n).iter().map(|p| p.token).collect();
            let expected: Vec<u32> = sorted.iter().take(n).map(|&(token, _)| token).collect();
            assert_eq!(tokens, expected, "n = {n}");
        }
    }

    #[test]
    fn probability_lists_hold_what_they_list_not_the_vocabulary() {
        let logits: Vec<f32> = (0..49_152u32).map(|token| (token % 97) as f32 / 10.0).collect();
        let top = top_probs(&logits, 5);
        assert_eq!((top.len(), top.capacity()), (5, 5));
        let mut post = Vec::new();
        let params = SamplingParams { top_k: 0, top_p: 1.0, min_p: 0.0, ..SamplingParams::default() };
        Sampler::new(params).sample(&logits, Some((7, &mut post)));
        assert_eq!((post.len(), post.capacity()), (7, 7));
    }

    #[test]
    fn stage_names_parse_with_aliases() {
        assert_eq!(Stage::from_name("top-k"), Some(Stage::TopK));
        assert_eq!(Stage::from_name("temp"), Some(Stage::Temperature));
        assert_eq!(Stage::from_name("xtc"), None);
    }
}
