//! Device names as operators write them (`--device`, `[model] device`).

use std::fmt;
use std::str::FromStr;

/// Where a model runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Device {
    /// The host's cores ([`super::CpuBackend`]).
    #[default]
    Cpu,
    /// CUDA device N.
    Cuda(u32),
}

impl FromStr for Device {
    type Err = String;

    /// `cpu`, `cuda` (device 0) or `cuda:N`.
    fn from_str(name: &str) -> Result<Self, Self::Err> {
        let bad = || format!("{name:?} is not a device: expected \"cpu\", \"cuda\" or \"cuda:N\"");
        match name {
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda(0)),
            _ => match name.strip_prefix("cuda:") {
                Some(index) if !index.is_empty() && index.bytes().all(|b| b.is_ascii_digit()) => {
                    index.parse().map(Device::Cuda).map_err(|_| bad())
                }
                _ => Err(bad()),
            },
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(index) => write!(f, "cuda:{index}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_print_back() {
        assert_eq!("cpu".parse(), Ok(Device::Cpu));
        assert_eq!("cuda".parse(), Ok(Device::Cuda(0)));
        assert_eq!("cuda:3".parse(), Ok(Device::Cuda(3)));
        assert_eq!(Device::Cuda(3).to_string(), "cuda:3");
        for bad in ["gpu", "cuda:", "cuda:-1", "cuda:x", "CPU", "cuda:99999999999"] {
            let error = bad.parse::<Device>().unwrap_err();
            assert!(error.contains("expected \"cpu\", \"cuda\" or \"cuda:N\""), "{bad}: {error}");
        }
    }
}
