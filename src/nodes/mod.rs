//! The [`registry`] of every node kind a pipeline may use, assembled here, where every layer is
//! in reach: the engine's (`kavi_engine::nodes::KINDS`), the forge's (`kavi_forge::nodes::KINDS`),
//! then the consumers' (`kavi_consumer::nodes::KINDS`). Each kind lives in its layer's `nodes`
//! module: its TOML config struct and its action together.
//!
//! The executor knows nothing about any kind: the loader asks the [`registry`] for a parser by
//! name, gets back a [`NodeAction`], and the executor calls [`NodeAction::run`] with a
//! [`NodeContext`] (the interface is `crate::node`'s). Adding a kind means adding a module and
//! one line to its layer's `KINDS`.

pub use kavi_forge::nodes::{escalate, review};

use std::sync::LazyLock;

use crate::node::Registry;
#[cfg(doc)]
use crate::node::{NodeAction, NodeContext};

/// Every kind the executor can run, and the classifier's failure kinds that `retry.on` names.
static REGISTRY: LazyLock<Registry> = LazyLock::new(|| {
    Registry::new(
        &[
            kavi_engine::nodes::KINDS,
            kavi_forge::nodes::KINDS,
            kavi_consumer::nodes::KINDS,
        ],
        crate::policy::classifier::load_failure_kinds,
    )
    .with_policy_problems(crate::schemas::policy_problems)
});

/// The kinds a pipeline may use: what the loader is handed in `crate::spec::LoadContext`.
pub fn registry() -> &'static Registry {
    &REGISTRY
}

#[cfg(test)]
mod tests {
    use crate::diagnostic::SourceFile;
    use crate::policy::classifier::{Classifier, DEFAULT_POLICY};

    /// The shipped classifier's rules name node kinds the registry has: the classifier's own
    /// tests, below the kinds, check it against a list of names, not against the kinds.
    #[test]
    fn the_shipped_classifier_names_only_registered_kinds() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/policies/classifier.toml");
        let text = std::fs::read_to_string(path).unwrap();
        let kinds: Vec<&str> = super::registry().names().collect();
        if let Err(problem) = Classifier::parse(&SourceFile::new(DEFAULT_POLICY, text), &kinds) {
            panic!("{problem}");
        }
    }
}
