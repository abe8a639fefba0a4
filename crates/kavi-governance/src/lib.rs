//! kavi's governance operations, the commands' logic without their printing: adopting rule sets
//! ([`adoption`]: propose, approve or reject, adopt, audit, and what changed in the files that
//! govern a run) and the operations on skills the adopted rules govern ([`skills`]: verify,
//! restore, revoke, re-verify after an adoption), and a person's decision on a run that stopped
//! for review ([`review`]: `kavi approve` and `kavi reject`).
//!
//! Each operation returns data the CLI prints (and serialises for `--json`), or a
//! [`GovernanceError`] whose kind decides the exit code. It sits above kavi-policy, which owns
//! the policy files and the skill lifecycle as data, so that crate stays the files' model.

pub mod adoption;
pub mod review;
mod signing;
pub mod skills;

// The lower crates under the names the moved code uses (`crate::ledger`, `crate::policy`...).
use kavi_foundation::{diagnostic, hash, identity, sandbox, template};
use kavi_ledger as ledger;
use kavi_policy as policy;
use kavi_policy::skills as skill;
use kavi_spec::{config, spec};

use std::sync::Arc;

use crate::config::Workspace;
use crate::diagnostic::{Diagnostic, SourceFile};
use crate::ledger::{ArtifactStore, LedgerError};
use crate::skill::Lifecycle;
use crate::skill::conventions::{self, Conventions};
use crate::skill::trust::{self, TrustPolicy};
use crate::spec::SpecError;
use crate::template::TemplateEngine;

/// Why a governance operation did not happen, by what the caller should do about it.
#[derive(Debug, thiserror::Error)]
pub enum GovernanceError {
    /// Refused as asked: the user's to fix.
    #[error("{0}")]
    Usage(String),
    /// Something named that does not exist.
    #[error("{0}")]
    NotFound(String),
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error("{context}: {source}")]
    Io {
        context: String,
        source: std::io::Error,
    },
}

type Result<T> = std::result::Result<T, GovernanceError>;

/// A workspace policy file's text; one that cannot be read is a spec error naming it.
pub fn read_policy(
    workspace: &Workspace,
    relative: &str,
) -> std::result::Result<Arc<SourceFile>, SpecError> {
    crate::policy::read(&workspace.root, relative)
        .map_err(|message| Diagnostic::new(message).into())
}

/// The workspace's artifact store, with an error that names it: with a server ledger or an
/// object store (`[object_store]` in kavi.toml), a cache in front of the content every machine
/// reads, and with an object store, putting every file artifact there.
pub fn open_store(workspace: &Workspace) -> Result<ArtifactStore> {
    let failed = |source| GovernanceError::Io {
        context: format!(
            "failed to open the artifact store at {}",
            workspace.config.artifacts.display()
        ),
        source,
    };
    let mut store = ArtifactStore::open(&workspace.config.artifacts).map_err(failed)?;
    let objects = match workspace.config.object_settings() {
        Some(settings) => Some(Arc::new(ledger::Objects::new(settings).map_err(failed)?)),
        None => None,
    };
    if let Some(objects) = &objects {
        store = store.with_objects(objects.clone());
    }
    Ok(
        match ledger::SharedArtifacts::of(&workspace.config.ledger, objects) {
            Some(shared) => store.in_front_of(Arc::new(shared)),
            None => store,
        },
    )
}

/// The workspace's skill lifecycle, as the files on disk have it.
pub fn load_lifecycle(workspace: &Workspace) -> Result<Lifecycle> {
    let source = read_policy(workspace, skill::LIFECYCLE_POLICY)?;
    Ok(Lifecycle::parse(&source).map_err(SpecError::from)?)
}

/// The workspace's trust policy, with the conventions it hashes a skill's files by.
pub fn load_trust(workspace: &Workspace, templates: &TemplateEngine) -> Result<TrustPolicy> {
    trust_from(|path| Ok(read_policy(workspace, path)?), templates)
}

/// The trust policy of the rule set a decision is taken under: the adopted one, as long as the
/// files on disk do not weaken it (see [`crate::policy::adoption::for_decision`]); before any set
/// is adopted, the files on disk, which the first run adopts.
pub fn decision_trust(
    workspace: &Workspace,
    ledger: &ledger::Ledger,
    templates: &TemplateEngine,
) -> Result<TrustPolicy> {
    if crate::policy::adoption::Governing::adopted(ledger)
        .map_err(GovernanceError::Usage)?
        .is_none()
    {
        return load_trust(workspace, templates);
    }
    let governing = crate::policy::adoption::for_decision(ledger, &workspace.root)
        .map_err(GovernanceError::Usage)?;
    governing_trust(&governing, templates)
}

/// The trust policy of a recorded rule set, as the ledger kept its texts.
pub fn governing_trust(
    governing: &crate::policy::adoption::Governing,
    templates: &TemplateEngine,
) -> Result<TrustPolicy> {
    trust_from(
        |path| governing.source(path).map_err(GovernanceError::Usage),
        templates,
    )
}

/// The rules a skill runs under outside a pipeline run (`kavi skill run`, `chain run`, `chat`,
/// `mcp`, the executor), read once: the files on disk unless they weaken the adopted set, then
/// the adopted copies (see [`crate::policy::adoption::for_run`]).
pub fn run_rules(workspace: &Workspace) -> Result<crate::policy::adoption::RunRules> {
    let ledger = match ledger::Ledger::open_existing(&workspace.config.ledger) {
        Ok(ledger) => Some(ledger),
        // Nothing recorded here, so nothing adopted either.
        Err(LedgerError::Missing(_)) => None,
        Err(e) => return Err(e.into()),
    };
    if let Some(ledger) = &ledger {
        adoption::check_ledger_here(workspace, ledger)?;
    }
    crate::policy::adoption::for_run(ledger.as_ref(), &workspace.root)
        .map_err(GovernanceError::Usage)
}

/// A file of the rules a skill runs under; an error naming it when they have none.
pub fn run_policy(
    rules: &crate::policy::adoption::RunRules,
    path: &str,
) -> std::result::Result<Arc<SourceFile>, SpecError> {
    rules.source(path).ok_or_else(|| {
        Diagnostic::new(format!("{path}: not a file of {}", rules.describe())).into()
    })
}

/// The trust policy of the rules a skill runs under.
pub fn run_trust(
    rules: &crate::policy::adoption::RunRules,
    templates: &TemplateEngine,
) -> Result<TrustPolicy> {
    trust_from(|path| Ok(run_policy(rules, path)?), templates)
}

fn trust_from(
    read: impl Fn(&str) -> Result<Arc<SourceFile>>,
    templates: &TemplateEngine,
) -> Result<TrustPolicy> {
    let conventions = Conventions::parse(&read(conventions::DEFAULT_POLICY)?, templates)
        .map_err(SpecError::from)?;
    Ok(TrustPolicy::parse(&read(trust::DEFAULT_POLICY)?, conventions).map_err(SpecError::from)?)
}
