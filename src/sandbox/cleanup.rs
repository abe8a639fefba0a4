//! Removing sandboxes once their time is up.
//!
//! A sandbox belongs to the run that made it. When that run succeeds its sandboxes go at once;
//! when it fails they stay for the time the sandbox policy says (`keep_failed`), so a person
//! can look, and the next `kavi pipeline run` removes them after that. A kavi that was killed
//! leaves its sandboxes `active`; they are then treated as a failed run's.

use crate::ledger::{Ledger, LedgerError, SandboxRow};

/// Removes every sandbox whose time is up and records it; returns the ones it removed.
/// A folder that cannot be removed stays listed, with the reason.
pub fn sweep(ledger: &mut Ledger) -> Result<Vec<SandboxRow>, LedgerError> {
    let mut removed = Vec::new();
    for sandbox in ledger.due_sandboxes()? {
        match super::remove(std::path::Path::new(&sandbox.path)) {
            Ok(()) => {
                ledger.sandbox_removed(sandbox.id, None)?;
                removed.push(sandbox);
            }
            Err(e) => {
                let error = format!("failed to remove {}: {e}", sandbox.path);
                tracing::warn!("{error}");
                ledger.sandbox_removed(sandbox.id, Some(&error))?;
            }
        }
    }
    Ok(removed)
}

/// A run ended: settle its sandboxes (see the module doc) and remove what is due.
pub fn settle_run(ledger: &mut Ledger, run_id: i64, succeeded: bool) -> Result<(), LedgerError> {
    ledger.settle_sandboxes(run_id, succeeded)?;
    sweep(ledger).map(drop)
}
