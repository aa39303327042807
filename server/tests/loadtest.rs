//! The load and fault test in its 60 s form (`sluice_tests::loadtest`;
//! `cargo xtask loadtest` runs it longer): 128 clients, half streaming, a
//! fifth of the streams dropped part way, against 6 slots and a queue of
//! 12, while the `chaos` policy commits each fault in turn, failing closed
//! on one server and falling back on another, with a reload after each.
//! Every request must be answered as the rules say, and afterwards nothing
//! may be left held. The counts are printed (`--nocapture` shows them).

use sluice_tests::loadtest::{self, Options};

#[test]
fn every_request_is_answered_through_faults_and_reloads_and_nothing_leaks() {
    let report = loadtest::run(&Options::ci());
    println!("{report}");
    assert!(report.problems().is_empty(), "{report}");
}
