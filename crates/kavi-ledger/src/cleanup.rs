//! Removing sandboxes once their time is up, and making the ones kept for review inert.
//!
//! A sandbox belongs to the run that made it. When that run succeeds its sandboxes go at once;
//! when it fails they stay for the time the sandbox policy says (`keep_failed`), so a person
//! can look, and the next `kavi pipeline run` removes them after that. A kavi that was killed
//! leaves its sandboxes `active`; they are then treated as a failed run's.
//!
//! A person looks at a kept sandbox with their own tools, as themselves: before it is kept,
//! every `.git` in it goes (a builder-written `core.fsmonitor` or hook ran when a person ran
//! `git status` there), and so does other version control's state (`.hg`: a `pre-status` hook), and one holding more than its budget (`keep_max_bytes`) is not kept at
//! all. `kavi gc` does both again for every kept sandbox, so one a kavi that was killed left
//! behind, or one that grew since, is held to the same rules.

use std::io;
use std::path::Path;

use crate::{Ledger, LedgerError, SandboxRow};

/// Removes every sandbox whose time is up and records it; returns the ones it removed.
/// A folder that cannot be removed stays listed, with the reason.
pub fn sweep(ledger: &mut Ledger) -> Result<Vec<SandboxRow>, LedgerError> {
    let mut removed = Vec::new();
    for sandbox in ledger.due_sandboxes()? {
        match kavi_foundation::sandbox::remove(Path::new(&sandbox.path)) {
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
    if !succeeded {
        for sandbox in ledger.active_sandboxes(run_id)? {
            keep_inert(ledger, &sandbox)?;
        }
    }
    ledger.settle_sandboxes(run_id, succeeded)?;
    sweep(ledger).map(drop)
}

/// Makes every kept sandbox inert and removes those over their budget; returns the ones it
/// removed (`kavi gc`).
pub fn enforce_kept(ledger: &mut Ledger) -> Result<Vec<SandboxRow>, LedgerError> {
    let kept: Vec<SandboxRow> = ledger
        .remaining_sandboxes()?
        .into_iter()
        .filter(|s| s.status == "kept")
        .collect();
    let mut removed = Vec::new();
    for sandbox in kept {
        if keep_inert(ledger, &sandbox)? == Settled::Removed {
            removed.push(sandbox);
        }
    }
    Ok(removed)
}

/// What became of a sandbox about to be kept.
#[derive(Debug, PartialEq, Eq)]
enum Settled {
    Kept,
    Removed,
    /// To be removed, but removing it failed: it stays listed, due at once.
    Left,
}

/// Neutralises a sandbox about to be kept, or removes it (recording why) when it cannot be
/// neutralised or holds more than its budget.
fn keep_inert(ledger: &mut Ledger, sandbox: &SandboxRow) -> Result<Settled, LedgerError> {
    let dir = Path::new(&sandbox.path);
    let budget = sandbox.limits.keep_max_bytes;
    let why_not = match kavi_foundation::vcs::neutralise(dir).and_then(|()| size(dir)) {
        Err(e) => format!("not kept: it could not be made inert: {e}"),
        Ok(bytes) if bytes > budget => {
            format!("not kept: it holds {bytes} bytes, over the {budget} bytes of `keep_max_bytes`")
        }
        Ok(_) => return Ok(Settled::Kept),
    };
    match kavi_foundation::sandbox::remove(dir) {
        Ok(()) => {
            tracing::warn!("sandbox {}: {why_not}", sandbox.path);
            ledger.sandbox_not_kept(sandbox.id, &why_not)?;
            Ok(Settled::Removed)
        }
        Err(e) => {
            let reason = format!("{why_not}; removing it failed: {e}");
            tracing::warn!("sandbox {}: {reason}", sandbox.path);
            ledger.sandbox_left(sandbox.id, &reason)?;
            Ok(Settled::Left)
        }
    }
}

/// What one entry costs at least, whatever it holds: an inode and its name.
const LEAST_PER_ENTRY: u64 = 4096;

/// The bytes the files under `dir` hold, links not followed (a sparse file counts at its
/// length: that is what a person copying it away would get), each entry at least
/// [`LEAST_PER_ENTRY`] (300,000 empty files hold nothing, and take the host's inodes).
fn size(dir: &Path) -> io::Result<u64> {
    let mut total: u64 = 0;
    for entry in walkdir::WalkDir::new(dir).follow_links(false) {
        let entry = entry.map_err(io::Error::other)?;
        let length = if entry.file_type().is_file() {
            entry.metadata().map_err(io::Error::other)?.len()
        } else {
            0
        };
        total = total.saturating_add(length.max(LEAST_PER_ENTRY));
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::size;

    #[test]
    fn empty_files_count_toward_a_kept_sandboxs_size() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..1000 {
            std::fs::File::create(dir.path().join(format!("f{i}"))).unwrap();
        }
        // A thousand empty files and their folder: over 4 MB, not nothing.
        assert!(size(dir.path()).unwrap() > 4_000_000);
    }
}
