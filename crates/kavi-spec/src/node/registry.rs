//! The node kinds a pipeline may name. The loader is handed a [`Registry`] (in
//! `crate::spec::LoadContext`) rather than naming the kinds, so that the spec stands below them;
//! each layer that defines kinds hands over its list, and the binary assembles them.

use std::sync::Arc;

use toml::Spanned;

use super::{NodeConfig, NodeKind};
use crate::diagnostic::{Diagnostic, SourceFile};

/// The failure kinds `retry.on` may name, as the policy that declares them checks a name.
pub trait FailureKinds {
    /// Checks `kind`, named in `file`, against the declared kinds.
    fn check_kind(&self, kind: &Spanned<String>, file: &Arc<SourceFile>) -> Result<(), Diagnostic>;
}

/// Loads the declared failure kinds for a node, recording their file as governing it.
pub type LoadFailureKinds = fn(&mut NodeConfig<'_>) -> Result<Box<dyn FailureKinds>, Diagnostic>;

/// The node kinds, by name, and how the failure kinds nodes retry on are declared.
pub struct Registry {
    kinds: Vec<&'static NodeKind>,
    failure_kinds: LoadFailureKinds,
}

impl Registry {
    /// The kinds of every group, in order: each layer that defines kinds hands over its list.
    pub fn new(groups: &[&'static [NodeKind]], failure_kinds: LoadFailureKinds) -> Self {
        Self {
            kinds: groups.iter().flat_map(|group| group.iter()).collect(),
            failure_kinds,
        }
    }

    /// Every kind, in the order they are listed to users.
    pub fn kinds(&self) -> impl Iterator<Item = &'static NodeKind> + '_ {
        self.kinds.iter().copied()
    }

    pub fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.kinds().map(|kind| kind.name)
    }

    pub fn get(&self, name: &str) -> Option<&'static NodeKind> {
        self.kinds().find(|kind| kind.name == name)
    }

    /// The help for a kind name that is none of these: the closest one, and all of them.
    pub fn unknown_help(&self, name: &str) -> String {
        let known: Vec<_> = self.names().map(|name| format!("`{name}`")).collect();
        match crate::diagnostic::closest(name, self.names()) {
            Some(close) => format!("did you mean `{close}`? known kinds: {}", known.join(", ")),
            None => format!("known kinds: {}", known.join(", ")),
        }
    }

    /// Loads the failure kinds `config`'s node may retry on.
    pub fn failure_kinds(
        &self,
        config: &mut NodeConfig<'_>,
    ) -> Result<Box<dyn FailureKinds>, Diagnostic> {
        (self.failure_kinds)(config)
    }
}
