//! How the lab's flags name a policy (`--policy`, `--on-fault`), shared by
//! `sluice lab` and `sluice lab replay`.

use clap::builder::{PossibleValuesParser, TypedValueParser};
use sluice::config::{PolicyConfig, PolicySpec, policy_spec};
use sluice_engine::OnFault;

/// `NAME|PATH[,KEY=VALUE...]` as a policy configuration, with the rest
/// from `base`.
pub(super) fn policy_config(spec: &str, base: PolicyConfig) -> anyhow::Result<PolicyConfig> {
    let PolicySpec { plugin, settings } = policy_spec(spec, "--policy").map_err(anyhow::Error::msg)?;
    Ok(PolicyConfig { plugin, settings, ..base })
}

/// `--on-fault`: one of the config's names, listed in `--help`.
pub(super) fn on_fault_parser() -> impl TypedValueParser<Value = OnFault> {
    PossibleValuesParser::new(OnFault::ALL.map(OnFault::as_str))
        .try_map(|name: String| OnFault::named(&name).ok_or_else(|| format!("unknown value {name:?}")))
}
