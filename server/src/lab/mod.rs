//! The policy lab: workloads, live replay against a server, replay of a
//! server's recorded steps, and the figures that compare runs. `sluice
//! bench serve` uses the same pieces.

pub mod calibrate;
pub mod live;
pub mod replay;
pub mod report;
pub mod sim;
pub mod stats;
pub mod workload;
