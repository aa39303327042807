//! `decision`: arbitrary decisions against arbitrary step views, both built
//! from the input's bytes (free and occupied slots in every phase, prompt
//! progress, waiting requests, budgets from 0 to `u32::MAX`; decisions at
//! random or mutated from a valid one: duplicates, slots out of range,
//! `u32::MAX`, budgets exceeded). The host's validator
//! (`sluice_plugin_api::rules::validate`) must agree with an oracle written
//! here from the rules in docs/scheduling.md, in both directions, and the
//! supervisor must hand the engine a decision only when the oracle finds it
//! valid: nothing invalid is ever applied.

use std::collections::{BTreeMap, BTreeSet};

use sluice_engine::policy::{
    Admit, Decision, OccupiedSlot, Phase, PolicyFault, Prefill, RequestInfo, SchedulingPolicy, StepView, WaitingRequest,
};
use sluice_engine::supervisor::{FaultRules, OnFault, Supervisor, Verdict};
use sluice_plugin_api::rules;
use sluice_tests::fuzz::{Fuzzer, Rng, bytes};

/// Longest input: every choice of the largest view and decision, twice.
const MAX_LEN: usize = 512;

pub fn run() {
    let mut rng = Rng::new(0xdec1_5104);
    let generated: Vec<Vec<u8>> =
        (0..32).map(|_| (0..64 + rng.below(192)).map(|_| rng.next_u64() as u8).collect()).collect();
    Fuzzer::new("decision", generated)
        .run(|rng, input, corpus| bytes::mutate(rng, input, corpus, MAX_LEN), |input| check(input));
}

fn check(input: &[u8]) -> Result<(), String> {
    let mut choices = Choices { bytes: input, at: 0 };
    let view = view(&mut choices);
    let decision = decision(&mut choices, &view);
    let extra = choices.pick(&[0, 0, 0, 1, 15, u32::MAX]);
    let verdict = oracle(&view, &decision, extra);
    let shown = || format!("view {view:?}\ndecision {decision:?}\nextra per decode {extra}");
    match (rules::validate(&view, &decision, extra), &verdict) {
        (Ok(()), Err(rule)) => return Err(format!("the validator accepts an invalid decision: {rule}\n{}", shown())),
        (Err(invalid), Ok(())) => {
            return Err(format!("the validator refuses a valid decision: {invalid}\n{}", shown()));
        }
        _ => {}
    }
    if !rules::has_runnable_work(&view) {
        return Ok(());
    }
    // The engine's path: the supervisor validates with no extra per decode.
    let applied = oracle(&view, &decision, 0);
    let rules = FaultRules { on_fault: OnFault::FailClosed, stall_steps: 64 };
    let mut supervisor = Supervisor::new(Box::new(Fixed(decision.clone())), Box::new(|| None), rules);
    let granted = !(decision.admit.is_empty() && decision.prefill.is_empty() && decision.decode.is_empty());
    match (supervisor.decide(&view, &mut ()), applied) {
        (Verdict::Run(run), Ok(())) if run == decision => Ok(()),
        (Verdict::Wait, Ok(())) if !granted => Ok(()),
        (Verdict::Closed, Err(_)) => Ok(()),
        (Verdict::Run(run), Err(rule)) => {
            Err(format!("the supervisor applies an invalid decision: {rule}\n{run:?}\n{}", shown()))
        }
        (other, applied) => {
            Err(format!("the supervisor answers {other:?} to a decision the oracle finds {applied:?}\n{}", shown()))
        }
    }
}

/// A policy that always answers the same decision.
struct Fixed(Decision);

impl SchedulingPolicy for Fixed {
    fn name(&self) -> &str {
        "fuzzed"
    }

    fn step(&mut self, _view: &StepView) -> Result<Decision, PolicyFault> {
        Ok(self.0.clone())
    }

    fn reset(&mut self) {}
}

/// The rules of docs/scheduling.md ("Host validation"), each stated over
/// whole sets rather than checked entry by entry as the validator does.
fn oracle(view: &StepView, decision: &Decision, extra_per_decode: u32) -> Result<(), String> {
    let waiting: BTreeMap<u64, u32> =
        view.waiting.iter().map(|waiting| (waiting.request.id, waiting.request.prompt_remaining())).collect();
    let free: BTreeSet<u32> = view.free_slots.iter().copied().collect();
    let phase: BTreeMap<u32, (Phase, u32)> =
        view.occupied.iter().map(|slot| (slot.slot, (slot.phase, slot.request.prompt_remaining()))).collect();

    // 1. Admissions: waiting requests into free slots, none named twice.
    let admitted_ids: Vec<u64> = decision.admit.iter().map(|admit| admit.request_id).collect();
    let admitted_slots: Vec<u32> = decision.admit.iter().map(|admit| admit.slot).collect();
    if let Some(id) = admitted_ids.iter().find(|id| !waiting.contains_key(id)) {
        return Err(format!("admits {id}, which is not waiting"));
    }
    if let Some(slot) = admitted_slots.iter().find(|slot| !free.contains(slot)) {
        return Err(format!("admits into {slot}, which is not free"));
    }
    if !distinct(&admitted_ids) || !distinct(&admitted_slots) {
        return Err("names a request or a slot twice among the admissions".into());
    }

    // 2. Prefill: prefilling or just-admitted slots, 1..=remaining, once.
    let mut remaining: BTreeMap<u32, u32> = phase
        .iter()
        .filter(|(_, (phase, _))| *phase == Phase::Prefilling)
        .map(|(&slot, &(_, left))| (slot, left))
        .collect();
    remaining.extend(decision.admit.iter().map(|admit| (admit.slot, waiting[&admit.request_id])));
    let prefilled: Vec<u32> = decision.prefill.iter().map(|prefill| prefill.slot).collect();
    if !distinct(&prefilled) {
        return Err("prefills a slot twice".into());
    }
    for prefill in &decision.prefill {
        match remaining.get(&prefill.slot) {
            None => return Err(format!("prefills {}, which is neither prefilling nor admitted", prefill.slot)),
            Some(&left) if !(1..=left).contains(&prefill.tokens) => {
                return Err(format!("prefills {} tokens of slot {}, with {left} left", prefill.tokens, prefill.slot));
            }
            Some(_) => {}
        }
    }

    // 3. Decode: ready or decoding slots, once, never also prefilled.
    if !distinct(&decision.decode) {
        return Err("decodes a slot twice".into());
    }
    for slot in &decision.decode {
        if !matches!(phase.get(slot), Some((Phase::Ready | Phase::Decoding, _))) {
            return Err(format!("decodes {slot}, which is neither ready nor decoding"));
        }
        if prefilled.contains(slot) {
            return Err(format!("prefills and decodes {slot}"));
        }
    }

    // 4. The budget.
    let prefill_tokens: u64 = decision.prefill.iter().map(|prefill| u64::from(prefill.tokens)).sum();
    let decode_tokens = decision.decode.len() as u64 * (1 + u64::from(extra_per_decode));
    if prefill_tokens + decode_tokens > u64::from(view.token_budget) {
        return Err(format!("spends {} tokens of {}", prefill_tokens + decode_tokens, view.token_budget));
    }
    Ok(())
}

fn distinct<T: Ord>(items: &[T]) -> bool {
    items.iter().collect::<BTreeSet<_>>().len() == items.len()
}

/// The input's bytes read as a sequence of choices; past the end, every
/// choice is the first option.
struct Choices<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Choices<'_> {
    fn byte(&mut self) -> u8 {
        let byte = self.bytes.get(self.at).copied().unwrap_or(0);
        self.at += 1;
        byte
    }

    fn below(&mut self, n: usize) -> usize {
        if n == 0 { 0 } else { usize::from(self.byte()) % n }
    }

    fn pick<T: Copy>(&mut self, options: &[T]) -> T {
        options[self.below(options.len())]
    }

    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.byte(), self.byte(), self.byte(), self.byte()])
    }

    /// A count or size: small mostly, at the edges sometimes.
    fn size(&mut self) -> u32 {
        match self.below(8) {
            0 => 0,
            1 => 1,
            2 => u32::MAX,
            3 => self.u32(),
            _ => self.below(64) as u32,
        }
    }
}

fn request(choices: &mut Choices<'_>, id: u64) -> RequestInfo {
    RequestInfo {
        id,
        prompt_tokens: choices.size(),
        prompt_done: 0,
        prompt_cached: 0,
        generated: 0,
        max_tokens: choices.size(),
        adapter_group: choices.below(3) as u32,
        priority: choices.pick(&[0, 1, -1, i32::MIN, i32::MAX]),
        arrival_ms: u64::from(choices.byte()),
    }
}

/// A view as the host builds them: slot ids `0..n` each free or occupied,
/// request ids unique, phases with the prompt progress they imply (a
/// prefilling slot may have its whole prompt done: a view taken as a chunk
/// completes).
fn view(choices: &mut Choices<'_>) -> StepView {
    let n_slots = 1 + choices.below(8) as u32;
    let token_budget = choices.pick(&[0, 1, 2, 7, 64, 512, u32::MAX, u32::MAX - 1]);
    let mut ids = (1u64..).map(|id| if id % 7 == 0 { u64::MAX - id } else { id });
    let mut view = StepView { step: u64::from(choices.byte()), token_budget, ..StepView::default() };
    for slot in 0..n_slots {
        let phase = match choices.below(4) {
            0 => {
                view.free_slots.push(slot);
                continue;
            }
            1 => Phase::Prefilling,
            2 => Phase::Ready,
            _ => Phase::Decoding,
        };
        let mut request = request(choices, ids.next().unwrap_or(0));
        request.prompt_done = match phase {
            Phase::Prefilling => choices.below(request.prompt_tokens as usize + 1) as u32,
            Phase::Ready | Phase::Decoding => request.prompt_tokens,
        };
        if phase == Phase::Decoding {
            request.generated = 1 + choices.below(8) as u32;
        }
        view.occupied.push(OccupiedSlot { slot, phase, request });
    }
    for _ in 0..choices.below(7) {
        let mut request = request(choices, ids.next().unwrap_or(0));
        request.prompt_done = choices.below(request.prompt_tokens as usize + 1) as u32;
        let slot_hint = if choices.below(3) == 0 { view.free_slots.first().copied() } else { None };
        view.waiting.push(WaitingRequest { request, slot_hint });
    }
    view
}

/// A slot id worth naming: any of the view's, one past them, `u32::MAX`.
fn slot(choices: &mut Choices<'_>, view: &StepView) -> u32 {
    let n_slots = (view.free_slots.len() + view.occupied.len()) as u32;
    match choices.below(8) {
        0 => n_slots,
        1 => u32::MAX,
        _ => choices.below(n_slots as usize) as u32,
    }
}

fn request_id(choices: &mut Choices<'_>, view: &StepView) -> u64 {
    let waiting: Vec<u64> = view.waiting.iter().map(|waiting| waiting.request.id).collect();
    let occupied: Vec<u64> = view.occupied.iter().map(|slot| slot.request.id).collect();
    match choices.below(8) {
        0 if !occupied.is_empty() => choices.pick(&occupied),
        1 => u64::MAX,
        2 => 0,
        _ if !waiting.is_empty() => choices.pick(&waiting),
        _ => u64::from(choices.byte()),
    }
}

/// Prefill sizes near the edges of what a slot may take.
fn tokens(choices: &mut Choices<'_>, view: &StepView, slot: u32) -> u32 {
    let left = view
        .occupied
        .iter()
        .find(|occupied| occupied.slot == slot)
        .map_or(choices.size(), |occupied| occupied.request.prompt_remaining());
    match choices.below(6) {
        0 => 0,
        1 => left,
        2 => left.saturating_add(1),
        3 => left.saturating_sub(1),
        4 => u32::MAX,
        _ => view.token_budget,
    }
}

/// At random, or a valid decision (what `continuous` grants) edited.
fn decision(choices: &mut Choices<'_>, view: &StepView) -> Decision {
    let mut decision = Decision::default();
    if choices.below(2) == 0 {
        for _ in 0..choices.below(5) {
            decision.admit.push(Admit { request_id: request_id(choices, view), slot: slot(choices, view) });
        }
        for _ in 0..choices.below(5) {
            let slot = slot(choices, view);
            decision.prefill.push(Prefill { slot, tokens: tokens(choices, view, slot) });
        }
        for _ in 0..choices.below(6) {
            decision.decode.push(slot(choices, view));
        }
        return decision;
    }
    let mut budget = view.token_budget;
    decision.decode_ready(view, &mut budget);
    decision.admit_fifo_and_prefill(view, &mut budget);
    for _ in 0..choices.below(4) {
        edit(choices, view, &mut decision);
    }
    decision
}

fn edit(choices: &mut Choices<'_>, view: &StepView, decision: &mut Decision) {
    match choices.below(8) {
        0 if !decision.admit.is_empty() => {
            let at = choices.below(decision.admit.len());
            decision.admit.push(decision.admit[at]);
        }
        1 if !decision.admit.is_empty() => {
            let at = choices.below(decision.admit.len());
            decision.admit[at].slot = slot(choices, view);
        }
        2 if !decision.prefill.is_empty() => {
            let at = choices.below(decision.prefill.len());
            decision.prefill[at].tokens = decision.prefill[at].tokens.wrapping_add(choices.pick(&[1, u32::MAX]));
        }
        3 if !decision.prefill.is_empty() => {
            let at = choices.below(decision.prefill.len());
            decision.prefill.push(decision.prefill[at]);
        }
        4 if !decision.admit.is_empty() => {
            // Decode a slot admitted in this very decision.
            let at = choices.below(decision.admit.len());
            decision.decode.push(decision.admit[at].slot);
        }
        5 if !decision.prefill.is_empty() => {
            let at = choices.below(decision.prefill.len());
            decision.decode.push(decision.prefill[at].slot);
        }
        6 => decision.decode.push(slot(choices, view)),
        _ => {
            let slot = slot(choices, view);
            decision.prefill.push(Prefill { slot, tokens: tokens(choices, view, slot) });
        }
    }
}
