//! `kavi gc`: prune old runs, the artifacts only they used, expired sandboxes (and kept ones
//! over their budget, the rest made inert again), old temporary
//! files and the remembered digests of inputs no longer there. What a skill's history names is
//! never pruned (see `ledger::gc`).

use std::path::Path;
use std::time::{Duration, SystemTime};

use serde_json::json;

use super::output::plural;
use crate::config::Workspace;
use crate::error::{Error, exit};
use crate::ledger::{ArtifactStore, GcRule, Ledger, LedgerError, RemovedObjects};

/// A temporary file older than this was left by a kavi that died mid-write; a live one is
/// younger (the store renames its files into place as soon as they are written).
const STALE_TEMP: Duration = Duration::from_secs(24 * 60 * 60);

pub struct Options {
    pub older_than: String,
    pub keep: u32,
    pub dry_run: bool,
    pub json: bool,
}

pub fn run(workspace: &Workspace, options: &Options) -> Result<i32, Error> {
    let age = humantime::parse_duration(&options.older_than)
        .map_err(|e| Error::Usage(format!("--older-than {:?}: {e}", options.older_than)))?;
    let before = jiff::Timestamp::now()
        .checked_sub(jiff::SignedDuration::try_from(age).unwrap_or(jiff::SignedDuration::MAX))
        .unwrap_or(jiff::Timestamp::MIN);
    // No ledger: nothing was recorded, so there is nothing to remove, and gc makes nothing.
    let mut ledger = match Ledger::open_existing(&workspace.config.ledger) {
        Err(LedgerError::Missing(_)) => {
            outln!("nothing recorded in this workspace yet; nothing to remove");
            return Ok(exit::SUCCESS);
        }
        ledger => ledger?,
    };
    if let Some(run) = ledger.live_runs()?.first() {
        return Err(Error::Unusable(format!(
            "run {run} is running; gc removes nothing while a run is live (its artifacts could \
             be the ones pruned)"
        )));
    }
    let store = super::open_store(workspace)?;
    let sandboxes = if options.dry_run {
        ledger.due_sandbox_count()?
    } else {
        // Kept ones too: made inert again, and gone when they hold more than their budget.
        crate::ledger::cleanup::sweep(&mut ledger)?.len()
            + crate::ledger::cleanup::enforce_kept(&mut ledger)?.len()
    };
    let rule = GcRule {
        before: crate::ledger::format_time(before),
        keep: options.keep,
    };
    let pruned = ledger.prune_runs(&rule, options.dry_run)?;
    let mut freed: u64 = pruned.artifacts.iter().map(|(_, size, _)| size).sum();
    let objects = if options.dry_run {
        RemovedObjects::default()
    } else {
        for (sha256, _, as_file) in &pruned.artifacts {
            if *as_file {
                remove_quietly(&store.path_of_sha256(sha256));
            }
        }
        ledger.remove_objects(store.objects())?
    };
    let (temp_files, temp_bytes) = stale_temp_files(&store, options.dry_run);
    freed += temp_bytes;
    let (digests, digest_bytes) =
        crate::cache::DigestMemo::of_store(&store).forget_gone(&workspace.root, options.dry_run);
    freed += digest_bytes;
    let verb = if options.dry_run {
        "would remove"
    } else {
        "removed"
    };
    if options.json {
        super::print_json(&json!({
            "dry_run": options.dry_run,
            "runs": pruned.runs,
            "child_runs": pruned.child_runs,
            "node_runs": pruned.node_runs,
            "artifacts": pruned.artifacts.iter().map(|(sha, _, _)| sha).collect::<Vec<_>>(),
            "objects_removed": objects.removed,
            "objects_left": objects.left.len(),
            "sandboxes": sandboxes,
            "temp_files": temp_files,
            "input_digests": digests,
            "bytes": freed,
            "kept_as_evidence": pruned.kept_as_evidence,
        }));
        return Ok(exit::SUCCESS);
    }
    let runs = match (pruned.runs.first(), pruned.runs.last()) {
        (Some(first), Some(last)) if first != last => format!(
            "{} ({first} to {last}, with {})",
            plural(pruned.runs.len(), "run"),
            plural(pruned.child_runs, "child run")
        ),
        (Some(only), _) => format!(
            "run {only} (with {})",
            plural(pruned.child_runs, "child run")
        ),
        _ => "no runs".to_owned(),
    };
    outln!(
        "{verb} {runs}, {}, {}, {} and {}: {}",
        plural(pruned.node_runs, "node run"),
        plural(pruned.artifacts.len(), "artifact"),
        if sandboxes == 1 {
            "1 sandbox".to_owned()
        } else {
            format!("{sandboxes} sandboxes")
        },
        plural(temp_files, "temporary file"),
        bytes(freed)
    );
    if objects.removed > 0 {
        outln!(
            "removed {} from the object store",
            plural(objects.removed, "object")
        );
    }
    if let Some((sha256, why)) = objects.left.first() {
        outln!(
            "left {} in the object store for a later gc (artifact {sha256}: {why})",
            plural(objects.left.len(), "object")
        );
    }
    if digests > 0 {
        let forget = if options.dry_run {
            "would forget"
        } else {
            "forgot"
        };
        outln!(
            "{forget} the remembered digests of {} no longer in the workspace",
            plural(digests, "large input")
        );
    }
    if pruned.kept_as_evidence > 0 {
        outln!(
            "kept {} older than {} that a skill's record names or whose sandbox is kept",
            plural(pruned.kept_as_evidence, "run"),
            options.older_than
        );
    }
    Ok(exit::SUCCESS)
}

/// Entries of the store's temporary folder older than [`STALE_TEMP`]: their count and size,
/// removed unless `dry_run`.
fn stale_temp_files(store: &ArtifactStore, dry_run: bool) -> (usize, u64) {
    let Ok(entries) = std::fs::read_dir(store.temp_dir()) else {
        return (0, 0);
    };
    let now = SystemTime::now();
    let mut found = (0, 0);
    for entry in entries.flatten() {
        let Ok(meta) = entry.metadata() else { continue };
        let old = meta
            .modified()
            .ok()
            .and_then(|at| now.duration_since(at).ok())
            .is_some_and(|age| age > STALE_TEMP);
        if !old || !meta.is_file() {
            continue;
        }
        found.0 += 1;
        found.1 += meta.len();
        if !dry_run {
            remove_quietly(&entry.path());
        }
    }
    found
}

/// Removes a file that should go; one already gone is what was wanted.
fn remove_quietly(path: &Path) {
    if let Err(e) = std::fs::remove_file(path)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!("failed to remove {}: {e}", path.display());
    }
}

/// `1.2 MiB`, `340 KiB`, `12 bytes`.
fn bytes(n: u64) -> String {
    const KIB: f64 = 1024.0;
    match n as f64 {
        b if b >= KIB * KIB => format!("{:.1} MiB", b / (KIB * KIB)),
        b if b >= KIB => format!("{:.0} KiB", b / KIB),
        _ => plural(n as usize, "byte"),
    }
}
