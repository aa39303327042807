//! The policy lab: workloads, live replay against a server, and the figures
//! that compare runs. `sluice bench serve` uses the same pieces.

pub mod calibrate;
pub mod live;
pub mod report;
pub mod sim;
pub mod stats;
pub mod workload;
