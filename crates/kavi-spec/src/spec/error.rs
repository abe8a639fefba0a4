use std::path::PathBuf;

use crate::diagnostic::{Diagnostic, Diagnostics};

/// Everything that can be wrong with a spec before anything runs.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("failed to read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{what} `{name}` not found (looked for {})", tried.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "))]
    NotFound {
        /// `pipeline` or `chain`.
        what: &'static str,
        name: String,
        tried: Vec<PathBuf>,
    },
    /// One or more problems located in the spec text.
    #[error("{0}")]
    Invalid(Diagnostics),
}

impl From<Diagnostic> for SpecError {
    fn from(diagnostic: Diagnostic) -> Self {
        SpecError::Invalid(Diagnostics(vec![diagnostic]))
    }
}

impl From<Vec<Diagnostic>> for SpecError {
    fn from(diagnostics: Vec<Diagnostic>) -> Self {
        SpecError::Invalid(Diagnostics(diagnostics))
    }
}
