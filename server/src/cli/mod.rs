//! Subcommands that run a model directly (no server), and the policy lab.

pub mod bench;
pub mod bench_spec;
pub mod bench_vision;
pub mod generate;
#[cfg(feature = "lab")]
pub mod lab;
pub mod model_info;

/// A lab subcommand in a build without the lab: whatever its arguments,
/// it says how to get one.
#[cfg(not(feature = "lab"))]
#[derive(clap::Args)]
pub struct WithoutLab {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
    args: Vec<String>,
}

#[cfg(not(feature = "lab"))]
impl WithoutLab {
    pub fn refuse(self) -> anyhow::Result<()> {
        anyhow::bail!(
            "this sluice was built without the policy lab and its benchmarks (cargo feature `lab`); \
             build with `cargo build --release --features lab`"
        )
    }
}
