//! `cargo xtask loadtest [--seconds N] [--clients N] [--seed N]`: the load
//! and fault test (`sluice_tests::loadtest`) at any length, 300 s by
//! default; `cargo xtask test` runs its 60 s form (server/tests/loadtest.rs).

use crate::models;
use crate::workspace::{cargo, run};

pub fn loadtest(args: &[String]) -> anyhow::Result<()> {
    models::fetch_model()?;
    // The features the tests build with, so that neither build undoes the other.
    run(cargo().args(["build", "--release", "--package", "sluice"]).args(crate::workspace::FEATURES))?;
    run(cargo().args(["run", "--release", "--package", "sluice-tests", "--bin", "loadtest", "--"]).args(args))
}
