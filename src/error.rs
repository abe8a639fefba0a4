//! The top-level error, and the exit code each kind of failure maps to.

use crate::config::ConfigError;
use crate::ledger::LedgerError;
use crate::spec::SpecError;

/// Documented exit codes (see docs/exit-codes.md).
pub mod exit {
    /// Everything asked for succeeded.
    pub const SUCCESS: i32 = 0;
    /// A run finished, and failed: a node failed, timed out or was blocked.
    pub const RUN_FAILED: i32 = 1;
    /// The command line was wrong (unknown flag, bad `--set`, ...).
    pub const USAGE: i32 = 2;
    /// A spec is invalid: malformed TOML, unknown field, cycle, missing parameter, ...
    pub const INVALID_SPEC: i32 = 3;
    /// The workspace could not be used: configuration, ledger, or file system.
    pub const ENVIRONMENT: i32 = 4;
    /// A run or record named on the command line does not exist.
    pub const NOT_FOUND: i32 = 5;
    /// The run stopped for a person's decision (`kavi approve` / `kavi reject`).
    pub const AWAITING_REVIEW: i32 = 6;
    /// The run was cancelled (Ctrl-C); 128 + SIGINT, as shells report it. SIGTERM and SIGHUP
    /// cancel the same way and exit 128 + their number (see `cli::cancelled_exit_code`).
    pub const CANCELLED: i32 = 130;
}

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
    #[error("{context}: {source}")]
    Io {
        context: String,
        source: std::io::Error,
    },
}

impl Error {
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Config(_) | Error::Io { .. } => exit::ENVIRONMENT,
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

fn ledger_exit_code(error: &LedgerError) -> i32 {
    match error {
        LedgerError::Missing(_)
        | LedgerError::RunNotFound(_)
        | LedgerError::ArtifactNotFound(_)
        | LedgerError::SpecNotFound(_)
        | LedgerError::SkillNotFound(_)
        | LedgerError::BuildNotFound(_)
        | LedgerError::ExecutionNotFound(_) => exit::NOT_FOUND,
        LedgerError::SkillExists(_)
        | LedgerError::NothingToDecide(_)
        | LedgerError::ExecutionAmbiguous(_) => exit::USAGE,
        LedgerError::TransitionRefused(_) => exit::RUN_FAILED,
        _ => exit::ENVIRONMENT,
    }
}
