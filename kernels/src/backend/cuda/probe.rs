//! Which CUDA device the driver offers, probed without compiling anything.
//! The driver is loaded at run time, so a build with the feature runs on
//! machines without CUDA and says so instead of failing.

use cudarc::driver::result;

/// The name of CUDA device `index`, or why there is none to use.
pub fn probe(index: u32) -> Result<String, String> {
    // cudarc panics when the driver lacks a function it looks up: that is an
    // answer too, and is reported like the others (quietly: the start-up
    // error says it).
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let probed = std::panic::catch_unwind(|| ask_the_driver(index));
    std::panic::set_hook(hook);
    probed.unwrap_or_else(|_| Err("the CUDA driver lacks a function this build needs".into()))
}

fn ask_the_driver(index: u32) -> Result<String, String> {
    // SAFETY: only tries to open the driver library by its usual names; no
    // symbol is called and nothing is kept.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err("no CUDA driver (libcuda) on this machine".into());
    }
    result::init().map_err(|error| format!("the CUDA driver does not start: {error}"))?;
    let count = result::device::get_count().map_err(|error| format!("cannot count CUDA devices: {error}"))?;
    let ordinal = i32::try_from(index)
        .ok()
        .filter(|&ordinal| ordinal < count)
        .ok_or_else(|| format!("there is no CUDA device {index}; this machine has {count}"))?;
    let device = result::device::get(ordinal).map_err(|error| format!("CUDA device {index}: {error}"))?;
    result::device::get_name(device).map_err(|error| format!("CUDA device {index}: {error}"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn probing_never_panics() {
        // With or without a GPU: an answer, not a crash.
        let _ = super::probe(0);
        assert!(super::probe(u32::MAX).is_err(), "no machine has that many devices");
    }
}
