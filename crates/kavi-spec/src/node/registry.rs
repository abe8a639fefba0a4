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

/// Every problem of shape (unknown fields, wrong types) of a policy file whose type a layer above
/// knows, by its path; empty for any other file.
pub type PolicyProblems = fn(&Arc<SourceFile>) -> Vec<Diagnostic>;

/// The node kinds, by name, how the failure kinds nodes retry on are declared, and how a policy
/// file's every problem is found.
pub struct Registry {
    kinds: Vec<&'static NodeKind>,
    failure_kinds: LoadFailureKinds,
    policy_problems: PolicyProblems,
}

impl Registry {
    /// The kinds of every group, in order: each layer that defines kinds hands over its list.
    pub fn new(groups: &[&'static [NodeKind]], failure_kinds: LoadFailureKinds) -> Self {
        Self {
            kinds: groups.iter().flat_map(|group| group.iter()).collect(),
            failure_kinds,
            policy_problems: |_| Vec::new(),
        }
    }

    /// With `problems` finding every problem of a policy file a node reads: a kind's parser
    /// returns the first it meets, and the loader reports the others with it.
    pub fn with_policy_problems(self, problems: PolicyProblems) -> Self {
        Self {
            policy_problems: problems,
            ..self
        }
    }

    /// Every problem of shape of `source`, when it is a policy file whose type is known.
    pub fn policy_problems(&self, source: &Arc<SourceFile>) -> Vec<Diagnostic> {
        (self.policy_problems)(source)
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
