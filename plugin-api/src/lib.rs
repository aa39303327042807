//! Guest SDK for sluice plugins.
//!
//! A plugin is a WebAssembly component of one of the worlds in `wit/`
//! (package `sluice:plugin@0.3.0`). This crate re-exports the generated
//! bindings and wraps them in two plain-Rust traits so that plugin logic is
//! ordinary code that is unit-tested natively:
//!
//! * [`Policy`] + [`export_policy!`] for the `scheduler` world,
//! * [`Fixup`] + [`export_fixup!`] for the `draft-fixup` world.
//!
//! ```
//! use sluice_plugin_api::{Decision, Policy, Settings, StepView, export_policy};
//!
//! struct DecodeOnly;
//! impl Policy for DecodeOnly {
//!     fn configure(settings: &Settings) -> Result<Self, String> {
//!         settings.expect_only(&[])?;
//!         Ok(DecodeOnly)
//!     }
//!     fn step(&mut self, view: &StepView) -> Decision {
//!         Decision { decode: view.occupied.iter().map(|s| s.slot).collect(), ..Default::default() }
//!     }
//! }
//! export_policy!(DecodeOnly);
//! ```
//!
//! The [`testing`] module builds step views for native tests; [`rules`] holds
//! the host's decision rules, which the host applies to every decision and
//! native tests can apply too.

pub mod packed;
pub mod rules;
mod settings;
pub mod testing;
mod view;

pub use settings::Settings;
pub use view::{
    Admit, Decision, EndReason, EndedRequest, NO_SLOT_HINT, OccupiedSlot, Phase, Prefill, RequestInfo, StepCosts,
    StepView, WaitingRequest,
};

/// Bindings of the `scheduler` world.
pub mod scheduler {
    wit_bindgen::generate!({
        path: "wit",
        world: "scheduler",
        pub_export_macro: true,
        export_macro_name: "export_scheduler_world",
        default_bindings_module: "sluice_plugin_api::scheduler",
        additional_derives: [PartialEq],
    });
}

/// Bindings of the `draft-fixup` world.
pub mod draft_fixup {
    wit_bindgen::generate!({
        path: "wit",
        world: "draft-fixup",
        pub_export_macro: true,
        export_macro_name: "export_draft_fixup_world",
        default_bindings_module: "sluice_plugin_api::draft_fixup",
        additional_derives: [PartialEq],
    });
}

pub use draft_fixup::exports::sluice::plugin::fixup::{Edit, MetaEntry, MetaValue, ModelInfo, TensorInfo};
pub use scheduler::exports::sluice::plugin::policy::{Setting, SettingValue};

/// A scheduling policy: plain Rust, called once per engine step.
///
/// The host validates every decision with [`rules::validate`]
/// (docs/scheduling.md); a decision that breaks a rule is a fault, so a
/// policy should only grant what the view allows.
pub trait Policy: Sized {
    /// Build the policy from its `[policy.settings]`. Reject unknown keys and
    /// bad values with a message naming the key: an error refuses the policy.
    fn configure(settings: &Settings) -> Result<Self, String>;
    /// Decide one step.
    fn step(&mut self, view: &StepView) -> Decision;
}

/// A draft-metadata fixup: plain Rust, called once per draft/target pair.
pub trait Fixup {
    /// Return the edits to apply to the draft's metadata, or an error that
    /// refuses the draft.
    fn fixup(target: &ModelInfo, draft: &ModelInfo) -> Result<Vec<Edit>, String>;
}

/// Unpack the wire's view into `view`, whose lists keep their memory from
/// step to step (the export's side of [`packed`]). The host packs every
/// view it sends, so a malformed one is a host defect: it traps, which the
/// host counts as a fault of the call.
#[doc(hidden)]
pub fn unpack_wire(wire: scheduler::exports::sluice::plugin::policy::StepView, view: &mut StepView) {
    let counts = packed::Counts { occupied: wire.occupied, waiting: wire.waiting, free: wire.free, ended: wire.ended };
    if let Err(malformed) = packed::unpack(counts, &wire.words, view) {
        panic!("the host sent a malformed view: {malformed}");
    }
    view.step = wire.step;
    view.now_ms = wire.now_ms;
    view.token_budget = wire.token_budget;
    let costs = wire.costs;
    view.costs = StepCosts {
        measured_steps: costs.measured_steps,
        base_ns: costs.base_ns,
        prefill_token_ns: costs.prefill_token_ns,
        decode_row_ns: costs.decode_row_ns,
        attention_kpair_ns: costs.attention_kpair_ns,
    };
}

/// Export a [`Policy`] as the component's `scheduler` world.
///
/// The instance state lives in a single-threaded global: the host gives every
/// instance its own store and calls `configure` before the first `step`.
#[macro_export]
macro_rules! export_policy {
    ($policy:ty) => {
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            use $crate::scheduler::exports::sluice::plugin::policy as __wit;
            struct __Exported;
            ::std::thread_local! {
                static __STATE: ::std::cell::RefCell<::std::option::Option<$policy>> =
                    const { ::std::cell::RefCell::new(::std::option::Option::None) };
                static __VIEW: ::std::cell::RefCell<$crate::StepView> =
                    ::std::cell::RefCell::new(::std::default::Default::default());
            }
            impl __wit::Guest for __Exported {
                fn configure(
                    settings: ::std::vec::Vec<__wit::Setting>,
                ) -> ::std::result::Result<(), ::std::string::String> {
                    let policy = <$policy as $crate::Policy>::configure(&$crate::Settings::new(settings))?;
                    __STATE.with(|state| *state.borrow_mut() = ::std::option::Option::Some(policy));
                    ::std::result::Result::Ok(())
                }
                fn step(wire: __wit::StepView) -> __wit::Decision {
                    __VIEW.with(|view| {
                        let mut view = view.borrow_mut();
                        $crate::unpack_wire(wire, &mut view);
                        __STATE.with(|state| {
                            let mut state = state.borrow_mut();
                            let policy = state.as_mut().expect("the host calls configure before step");
                            <$policy as $crate::Policy>::step(policy, &view).into()
                        })
                    })
                }
            }
    $crate::scheduler::export_scheduler_world!(__Exported with_types_in $crate::scheduler);
        };
    };
}

/// Export a [`Fixup`] as the component's `draft-fixup` world.
#[macro_export]
macro_rules! export_fixup {
    ($fixup:ty) => {
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            use $crate::draft_fixup::exports::sluice::plugin::fixup as __wit;
            struct __Exported;
            impl __wit::Guest for __Exported {
                fn fixup(
                    target: __wit::ModelInfo,
                    draft: __wit::ModelInfo,
                ) -> ::std::result::Result<::std::vec::Vec<__wit::Edit>, ::std::string::String> {
                    <$fixup as $crate::Fixup>::fixup(&target, &draft)
                }
            }
    $crate::draft_fixup::export_draft_fixup_world!(__Exported with_types_in $crate::draft_fixup);
        };
    };
}
