//! The step view's packed form (`step-view` in `wit/scheduler.wit`): the
//! host packs a [`StepView`] into one list of u32 words, the guest SDK
//! unpacks it into the records a [`Policy`](crate::Policy) reads. Both sides
//! use this module, so the layout is written down once.

use std::fmt;

use crate::{EndReason, EndedRequest, NO_SLOT_HINT, OccupiedSlot, Phase, RequestInfo, StepView, WaitingRequest};

/// Words in a request row.
pub const REQUEST_WORDS: usize = 13;
/// Words in an ended-request row.
pub const ENDED_WORDS: usize = 4;

/// The length of each section of the words: rows of occupied slots, rows of
/// waiting requests, free slot ids, rows of ended requests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub occupied: u32,
    pub waiting: u32,
    pub free: u32,
    pub ended: u32,
}

/// Words that do not hold what their counts say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Malformed {
    /// The sections need more or fewer words than there are.
    Length { expected: u64, found: usize },
    /// A phase or end reason outside its codes.
    Code { what: &'static str, value: u32 },
}

impl fmt::Display for Malformed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Malformed::Length { expected, found } => {
                write!(f, "the view's counts need {expected} words; {found} arrived")
            }
            Malformed::Code { what, value } => write!(f, "{value} is not a {what} code"),
        }
    }
}

impl std::error::Error for Malformed {}

/// Write the slots and requests of `view` into `words` (cleared first, its
/// memory kept) and return the section lengths.
pub fn pack(view: &StepView, words: &mut Vec<u32>) -> Counts {
    let rows = view.occupied.len() + view.waiting.len();
    words.clear();
    words.resize(rows * REQUEST_WORDS, 0);
    let requests = view
        .occupied
        .iter()
        .map(|slot| (&slot.request, slot.slot, phase_code(slot.phase)))
        .chain(view.waiting.iter().map(|waiting| (&waiting.request, waiting.slot_hint.unwrap_or(NO_SLOT_HINT), 0)));
    // Whole rows written into words already there: no capacity check per
    // word.
    for (row, (request, slot, phase)) in words.as_chunks_mut::<REQUEST_WORDS>().0.iter_mut().zip(requests) {
        *row = request_row(request, slot, phase);
    }
    words.extend_from_slice(&view.free_slots);
    for ended in &view.ended {
        let reason = match ended.reason {
            EndReason::Completed => 0,
            EndReason::Cancelled => 1,
            EndReason::Failed => 2,
        };
        let [low, high] = split(ended.request_id);
        words.extend_from_slice(&[low, high, ended.slot.unwrap_or(NO_SLOT_HINT), reason]);
    }
    Counts {
        occupied: count(view.occupied.len()),
        waiting: count(view.waiting.len()),
        free: count(view.free_slots.len()),
        ended: count(view.ended.len()),
    }
}

/// Replace the slots and requests of `view` with those `words` hold,
/// reusing its lists' memory; the scalars are left to the caller.
pub fn unpack(counts: Counts, words: &[u32], view: &mut StepView) -> Result<(), Malformed> {
    let section = |rows: u32, width: usize| u64::from(rows) * width as u64;
    let expected = section(counts.occupied, REQUEST_WORDS)
        + section(counts.waiting, REQUEST_WORDS)
        + u64::from(counts.free)
        + section(counts.ended, ENDED_WORDS);
    if expected != words.len() as u64 {
        return Err(Malformed::Length { expected, found: words.len() });
    }
    // The sum matched, so every section below lies within `words`.
    let (occupied, rest) = words.split_at(counts.occupied as usize * REQUEST_WORDS);
    let (waiting, rest) = rest.split_at(counts.waiting as usize * REQUEST_WORDS);
    let (free, ended) = rest.split_at(counts.free as usize);
    // Rows are read as whole arrays and the lists extended from exact-size
    // iterators: no bounds check per word and no capacity check per row,
    // which is most of a step's cost in the guest.
    let mut bad_phase = None;
    view.occupied.clear();
    view.occupied.extend(occupied.as_chunks::<REQUEST_WORDS>().0.iter().map(|row| {
        let phase = match row[12] {
            0 => Phase::Prefilling,
            1 => Phase::Ready,
            2 => Phase::Decoding,
            value => {
                bad_phase = Some(value);
                Phase::Prefilling
            }
        };
        OccupiedSlot { slot: row[11], phase, request: request(row) }
    }));
    if let Some(value) = bad_phase {
        return Err(Malformed::Code { what: "phase", value });
    }
    view.waiting.clear();
    view.waiting.extend(waiting.as_chunks::<REQUEST_WORDS>().0.iter().map(|row| {
        let hint = row[11];
        WaitingRequest { request: request(row), slot_hint: (hint != NO_SLOT_HINT).then_some(hint) }
    }));
    view.free_slots.clear();
    view.free_slots.extend_from_slice(free);
    view.ended.clear();
    for row in ended.as_chunks::<ENDED_WORDS>().0 {
        let reason = match row[3] {
            0 => EndReason::Completed,
            1 => EndReason::Cancelled,
            2 => EndReason::Failed,
            value => return Err(Malformed::Code { what: "end reason", value }),
        };
        let slot = (row[2] != NO_SLOT_HINT).then_some(row[2]);
        view.ended.push(EndedRequest { request_id: join(row[0], row[1]), slot, reason });
    }
    Ok(())
}

fn request_row(request: &RequestInfo, slot: u32, phase: u32) -> [u32; REQUEST_WORDS] {
    let [id_low, id_high] = split(request.id);
    let [arrival_low, arrival_high] = split(request.arrival_ms);
    [
        id_low,
        id_high,
        arrival_low,
        arrival_high,
        request.prompt_tokens,
        request.prompt_done,
        request.prompt_cached,
        request.generated,
        request.max_tokens,
        request.adapter_group,
        request.priority as u32,
        slot,
        phase,
    ]
}

/// A row's request (its slot and phase words are the caller's).
#[inline(always)]
fn request(row: &[u32; REQUEST_WORDS]) -> RequestInfo {
    RequestInfo {
        id: join(row[0], row[1]),
        arrival_ms: join(row[2], row[3]),
        prompt_tokens: row[4],
        prompt_done: row[5],
        prompt_cached: row[6],
        generated: row[7],
        max_tokens: row[8],
        adapter_group: row[9],
        priority: row[10] as i32,
    }
}

fn phase_code(phase: Phase) -> u32 {
    match phase {
        Phase::Prefilling => 0,
        Phase::Ready => 1,
        Phase::Decoding => 2,
    }
}

fn split(value: u64) -> [u32; 2] {
    [value as u32, (value >> 32) as u32]
}

fn join(low: u32, high: u32) -> u64 {
    u64::from(low) | u64::from(high) << 32
}

/// A section's length as its count; a list longer than `u32::MAX` (which no
/// engine holds) saturates and the guest refuses the view as malformed.
fn count(len: usize) -> u32 {
    u32::try_from(len).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{ViewBuilder, request as info};

    fn view() -> StepView {
        let mut view = ViewBuilder::new(6, 256)
            .at(9, 77)
            .occupied(0, Phase::Ready, info(5, 50).done(50))
            .occupied(2, Phase::Prefilling, info(u64::MAX - 1, 7).done(3).generated(0).priority(-3).group(9))
            .occupied(4, Phase::Decoding, info(1 << 40, 9).done(9).generated(4).max_tokens(u32::MAX))
            .waiting(info(7, 80).priority(i32::MIN).arrived(u64::MAX))
            .waiting(info(8, 80))
            .ended(3, Some(1), EndReason::Cancelled)
            .ended(u64::MAX, None, EndReason::Failed)
            .build();
        view.waiting[1].slot_hint = Some(3);
        view.waiting[0].request.prompt_cached = 16;
        view.waiting[0].request.prompt_done = 16;
        view
    }

    #[test]
    fn a_view_survives_packing() {
        let view = view();
        let mut words = vec![99; 3];
        let counts = pack(&view, &mut words);
        assert_eq!(counts, Counts { occupied: 3, waiting: 2, free: 3, ended: 2 });
        assert_eq!(words.len(), 5 * REQUEST_WORDS + 3 + 2 * ENDED_WORDS);
        // Unpacking into a view that held something else replaces it all
        // but the scalars, which are the caller's.
        let mut unpacked = self::view();
        unpacked.free_slots = vec![42; 10];
        unpacked.occupied.pop();
        unpack(counts, &words, &mut unpacked).expect("well formed");
        assert_eq!(unpacked, view);
        let mut empty = StepView::default();
        let counts = pack(&empty, &mut words);
        assert!(words.is_empty());
        unpack(counts, &words, &mut unpacked).expect("well formed");
        empty.step = view.step;
        empty.now_ms = view.now_ms;
        empty.token_budget = view.token_budget;
        assert_eq!(unpacked, empty);
    }

    #[test]
    fn the_row_layout_is_the_documented_one() {
        let view = ViewBuilder::new(2, 8).occupied(1, Phase::Decoding, info(0x1_0000_0002, 30).done(30)).build();
        let mut words = Vec::new();
        pack(&view, &mut words);
        assert_eq!(words, [2, 1, 0, 0, 30, 30, 0, 0, 128, 0, 0, 1, 2, 0]);
    }

    #[test]
    fn malformed_words_are_refused() {
        let mut words = Vec::new();
        let counts = pack(&view(), &mut words);
        let mut into = StepView::default();
        let short = Counts { free: counts.free + 1, ..counts };
        assert_eq!(
            unpack(short, &words, &mut into),
            Err(Malformed::Length { expected: words.len() as u64 + 1, found: words.len() })
        );
        let huge = Counts { occupied: u32::MAX, waiting: u32::MAX, ..counts };
        assert!(matches!(unpack(huge, &words, &mut into), Err(Malformed::Length { .. })));
        let mut bad_phase = words.clone();
        bad_phase[12] = 3;
        assert_eq!(unpack(counts, &bad_phase, &mut into), Err(Malformed::Code { what: "phase", value: 3 }));
        let mut bad_reason = words.clone();
        *bad_reason.last_mut().expect("an ended row") = 7;
        assert_eq!(unpack(counts, &bad_reason, &mut into), Err(Malformed::Code { what: "end reason", value: 7 }));
        assert_eq!(Malformed::Code { what: "phase", value: 3 }.to_string(), "3 is not a phase code");
    }
}
