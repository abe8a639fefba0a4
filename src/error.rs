//! The top-level error, and the exit code each kind of failure maps to.

use crate::config::ConfigError;
use crate::ledger::LedgerError;
use crate::spec::SpecError;

pub use kavi_foundation::exit;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error(transparent)]
    Execution(#[from] crate::executions::ExecutionError),
    #[error(transparent)]
    Toolchain(#[from] crate::toolchains::ToolchainError),
    #[error("{0}")]
    Usage(String),
    /// Something named on the command line that a record does not have (a node of a run, an
    /// output a node did not keep).
    #[error("{0}")]
    NotFound(String),
    /// kavi could not read what it needs, for a reason already put in words.
    #[error("{0}")]
    Unusable(String),
    #[error("{context}: {source}")]
    Io {
        context: String,
        source: std::io::Error,
    },
}

impl Error {
    /// The problems this error is, each located where the spec or configuration says it: a
    /// check's `--json` lists them. An error of no file is one problem without a place.
    pub fn diagnostics(&self) -> Vec<crate::diagnostic::Diagnostic> {
        use crate::diagnostic::Diagnostic;
        match self {
            Error::Spec(SpecError::Invalid(found)) => found.0.clone(),
            Error::Config(ConfigError::Invalid(found)) => found.0.clone(),
            other => vec![Diagnostic::new(other.to_string())],
        }
    }

    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Config(_) | Error::Io { .. } | Error::Unusable(_) => exit::ENVIRONMENT,
            Error::Spec(SpecError::NotFound { .. }) => exit::NOT_FOUND,
            Error::Spec(_) => exit::INVALID_SPEC,
            Error::Ledger(e) => ledger_exit_code(e),
            Error::Execution(crate::executions::ExecutionError::Ledger(e)) => ledger_exit_code(e),
            Error::Execution(_) | Error::Toolchain(_) => exit::ENVIRONMENT,
            Error::Usage(_) => exit::USAGE,
            Error::NotFound(_) => exit::NOT_FOUND,
        }
    }
}

/// Why a skill may not run: one that does not exist is not found; one that may not run (not
/// trusted, drifted) is the caller's mistake.
impl From<crate::executions::Refusal> for Error {
    fn from(refusal: crate::executions::Refusal) -> Self {
        use crate::executions::Refusal;
        match refusal {
            Refusal::Unknown(detail) => Error::NotFound(detail),
            Refusal::Trust(detail) | Refusal::Hash(detail) => Error::Usage(detail),
            Refusal::Unreadable(detail) => Error::Unusable(detail),
        }
    }
}

/// A governance operation's error is the kind of failure it already says it is.
impl From<kavi_governance::GovernanceError> for Error {
    fn from(error: kavi_governance::GovernanceError) -> Self {
        use kavi_governance::GovernanceError;
        match error {
            GovernanceError::Usage(detail) => Error::Usage(detail),
            GovernanceError::NotFound(detail) => Error::NotFound(detail),
            GovernanceError::Spec(e) => Error::Spec(e),
            GovernanceError::Ledger(e) => Error::Ledger(e),
            GovernanceError::Io { context, source } => Error::Io { context, source },
        }
    }
}

fn ledger_exit_code(error: &LedgerError) -> i32 {
    match error {
        LedgerError::Missing(_)
        | LedgerError::RunNotFound(_)
        | LedgerError::RuleChangeNotFound(_)
        | LedgerError::ArtifactNotFound(_)
        | LedgerError::SpecNotFound(_)
        | LedgerError::SkillNotFound(_)
        | LedgerError::BuildNotFound(_)
        | LedgerError::ExecutionNotFound(_) => exit::NOT_FOUND,
        LedgerError::SkillExists(_)
        | LedgerError::NothingToDecide(_)
        | LedgerError::RuleChangeRefused(_)
        | LedgerError::CopyRefused(_)
        | LedgerError::Unjournaled(_)
        | LedgerError::ExecutionAmbiguous(_) => exit::USAGE,
        LedgerError::TransitionRefused(_) => exit::RUN_FAILED,
        _ => exit::ENVIRONMENT,
    }
}

#[cfg(test)]
mod tests {
    use super::{Error, exit};

    /// The governance layer's errors exit as the CLI's of the same kind did before it was a crate.
    #[test]
    fn a_governance_error_keeps_its_exit_code() {
        use crate::ledger::LedgerError;
        use kavi_governance::GovernanceError;
        let cases = [
            (GovernanceError::Usage("refused".into()), exit::USAGE),
            (GovernanceError::NotFound("no such".into()), exit::NOT_FOUND),
            (
                GovernanceError::Ledger(LedgerError::TransitionRefused("no".into())),
                exit::RUN_FAILED,
            ),
            (
                GovernanceError::Ledger(LedgerError::SkillNotFound("s".into())),
                exit::NOT_FOUND,
            ),
            (
                GovernanceError::Io {
                    context: "failed".into(),
                    source: std::io::Error::other("why"),
                },
                exit::ENVIRONMENT,
            ),
        ];
        for (error, code) in cases {
            let shown = error.to_string();
            let error = Error::from(error);
            assert_eq!((error.exit_code(), error.to_string()), (code, shown));
        }
    }

    /// docs/exit-codes.md lists exactly the codes kavi exits with.
    #[test]
    fn the_documented_table_is_the_one_in_code() {
        let documented: std::collections::BTreeSet<i32> = include_str!("../docs/exit-codes.md")
            .lines()
            .filter_map(|line| line.strip_prefix("| ")?.split(' ').next()?.parse().ok())
            .collect();
        let signals = [
            nix::sys::signal::Signal::SIGTERM,
            nix::sys::signal::Signal::SIGHUP,
        ];
        let in_code: std::collections::BTreeSet<i32> = [
            exit::SUCCESS,
            exit::RUN_FAILED,
            exit::USAGE,
            exit::INVALID_SPEC,
            exit::ENVIRONMENT,
            exit::NOT_FOUND,
            exit::AWAITING_REVIEW,
            exit::RETRY,
            exit::CANCELLED,
        ]
        .into_iter()
        .chain(signals.map(|signal| 128 + signal as i32))
        .collect();
        assert_eq!(documented, in_code);
    }
}
