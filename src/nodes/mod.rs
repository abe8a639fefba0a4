//! The consumers' node kinds, and the [`registry`] of every kind: the engine's
//! (`kavi_engine::nodes::KINDS`), the forge's (`kavi_forge::nodes::KINDS`), then the consumers'.
//! Each kind lives in its own module: its TOML config struct and its action together.
//!
//! The executor knows nothing about any kind: the loader asks the [`registry`] for a parser by
//! name, gets back a [`NodeAction`], and the executor calls [`NodeAction::run`] with a
//! [`NodeContext`] (the interface is `crate::node`'s). Adding a kind means adding a module and
//! one line to its layer's list.

mod chain;

pub use kavi_forge::nodes::{escalate, review};

use std::sync::LazyLock;

#[cfg(doc)]
use crate::node::{NodeAction, NodeContext};
use crate::node::{NodeKind, Registry};

/// The consumers' kinds: chains of trusted skills.
pub const CONSUMER_KINDS: &[NodeKind] = &[chain::KIND];

/// Every kind the executor can run, and the classifier's failure kinds that `retry.on` names.
static REGISTRY: LazyLock<Registry> = LazyLock::new(|| {
    Registry::new(
        &[
            kavi_engine::nodes::KINDS,
            kavi_forge::nodes::KINDS,
            CONSUMER_KINDS,
        ],
        crate::policy::classifier::load_failure_kinds,
    )
});

/// The kinds a pipeline may use: what the loader is handed in `crate::spec::LoadContext`.
pub fn registry() -> &'static Registry {
    &REGISTRY
}
