//! The fuzz binary's global allocator: the system allocator, counting per
//! thread the bytes allocated and freed, so that a target can measure what
//! one call allocates (the GGUF reader must never allocate by a count a file
//! claims, only by what the file holds).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// Counts, then delegates to [`System`].
pub struct Counting;

thread_local! {
    /// Bytes allocated minus bytes freed on this thread (memory freed here
    /// may have been allocated elsewhere, hence signed).
    static LIVE: Cell<i64> = const { Cell::new(0) };
    /// The highest `LIVE` since the last [`measure`] began.
    static PEAK: Cell<i64> = const { Cell::new(0) };
}

fn count(delta: i64) {
    // `try_with`: a thread being torn down still frees memory.
    let _ = LIVE.try_with(|live| {
        let now = live.get() + delta;
        live.set(now);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

fn size(layout: Layout) -> i64 {
    i64::try_from(layout.size()).unwrap_or(i64::MAX)
}

// SAFETY: every call goes to `System` with the caller's arguments
// unchanged; the counting beside it touches only const-initialized
// thread-locals, which never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, which is System's.
        let pointer = unsafe { System.alloc(layout) };
        if !pointer.is_null() {
            count(size(layout));
        }
        pointer
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let pointer = unsafe { System.alloc_zeroed(layout) };
        if !pointer.is_null() {
            count(size(layout));
        }
        pointer
    }

    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        // SAFETY: `pointer` came from this allocator, that is from System, with `layout`.
        unsafe { System.dealloc(pointer, layout) };
        count(-size(layout));
    }

    unsafe fn realloc(&self, pointer: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `pointer` came from System with `layout`; the caller upholds the rest.
        let moved = unsafe { System.realloc(pointer, layout, new_size) };
        if !moved.is_null() {
            // Counted as the new block allocated while the old one was live.
            count(i64::try_from(new_size).unwrap_or(i64::MAX));
            count(-size(layout));
        }
        moved
    }
}

/// Runs `work` and returns its result with the most bytes it had allocated
/// at once on this thread (above what was live when it began).
pub fn peak_during<T>(work: impl FnOnce() -> T) -> (T, u64) {
    let start = LIVE.with(Cell::get);
    PEAK.with(|peak| peak.set(start));
    let result = work();
    let peak = PEAK.with(Cell::get);
    (result, u64::try_from(peak - start).unwrap_or(0))
}
