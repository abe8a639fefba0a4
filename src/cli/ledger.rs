//! `kavi ledger`: the ledger's integrity (verify), and the signed checkpoints that pin it
//! (keygen, checkpoint).

use std::path::Path;

use serde_json::json;

use crate::config::Workspace;
use crate::error::{Error, exit};
use crate::ledger::journal::Findings;
use crate::ledger::{Ledger, checkpoint};

/// The configured signing key's path, refused when it lies in the workspace: whoever can edit
/// the workspace could then sign.
fn key_path(workspace: &Workspace) -> Result<&Path, Error> {
    let path = workspace.config.signing_key.as_path();
    let root = workspace
        .root
        .canonicalize()
        .unwrap_or_else(|_| workspace.root.clone());
    let resolved = path
        .parent()
        .and_then(|parent| parent.canonicalize().ok())
        .map_or_else(
            || path.to_owned(),
            |parent| parent.join(path.file_name().unwrap_or_default()),
        );
    if resolved.starts_with(&root) {
        return Err(Error::Usage(format!(
            "refused signing key {}: it lies in the workspace, where anyone who can edit the \
             workspace could read it; set `signing_key` to a path outside {}",
            path.display(),
            root.display()
        )));
    }
    Ok(path)
}

/// What verifying the workspace's ledger finds, and the key its checkpoints were checked with.
pub(super) fn findings(
    workspace: &Workspace,
) -> Result<(Findings, Option<ed25519_dalek::VerifyingKey>), Error> {
    findings_at(workspace, &workspace.config.ledger)
}

/// What verifying the ledger at `location` finds, with the workspace's artifacts and key.
fn findings_at(
    workspace: &Workspace,
    location: &Path,
) -> Result<(Findings, Option<ed25519_dalek::VerifyingKey>), Error> {
    let ledger = Ledger::open_existing(location)?;
    let store = super::open_store(workspace)?;
    // The key the checkpoints must be signed with; without one, they are checked against the
    // keys they name, which a writer could have swapped for their own.
    let trusted = checkpoint::load(&workspace.config.signing_key)
        .ok()
        .map(|key| key.verifying_key());
    let logged = checkpoint::logged(&workspace.config.signing_key, &ledger_id(location));
    let findings = ledger.verify(&store, trusted.as_ref(), &logged)?;
    Ok((findings, trusted))
}

/// How the checkpoint log names a ledger: its canonical path, or its server's URL without a
/// password.
fn ledger_id(ledger: &Path) -> std::path::PathBuf {
    if crate::ledger::postgres_url(ledger).is_some() {
        return crate::ledger::display_location(ledger).into();
    }
    ledger.canonicalize().unwrap_or_else(|_| ledger.to_owned())
}

/// Makes the signing key (once); prints its public half.
pub fn keygen(workspace: &Workspace) -> Result<i32, Error> {
    let path = key_path(workspace)?;
    let public = checkpoint::generate(path).map_err(|source| Error::Io {
        context: format!(
            "failed to make the signing key {} (an existing key is never overwritten)",
            path.display()
        ),
        source,
    })?;
    outln!("signing key written to {} (mode 0600)", path.display());
    outln!("public key {}", checkpoint::public_hex(&public));
    Ok(exit::SUCCESS)
}

/// Signs the journal's head.
pub fn checkpoint(workspace: &Workspace) -> Result<i32, Error> {
    let path = key_path(workspace)?;
    let key = checkpoint::load(path).map_err(Error::Usage)?;
    let ledger = Ledger::open_existing(&workspace.config.ledger)?;
    match ledger.checkpoint(&key)? {
        Some(signed) => {
            checkpoint::log(path, &ledger_id(&workspace.config.ledger), &signed).map_err(
                |source| Error::Io {
                    context: format!(
                        "failed to log the checkpoint beside the key ({})",
                        checkpoint::log_path(path).display()
                    ),
                    source,
                },
            )?;
            outln!(
                "checkpoint: journal entry {} ({}) signed by {}",
                signed.seq,
                crate::ledger::short_hash(&signed.hash),
                &signed.public_key[..16]
            );
        }
        None => outln!("the journal is empty: nothing to sign"),
    }
    Ok(exit::SUCCESS)
}

/// Copies the workspace's SQLite ledger into the empty PostgreSQL database at `url`: only a
/// ledger that verifies is copied, and the copy is verified in turn. The checkpoints logged
/// beside the signing key are logged for the copy too.
pub fn migrate(workspace: &Workspace, url: &str) -> Result<i32, Error> {
    let target = Path::new(url);
    if crate::ledger::postgres_url(target).is_none() {
        return Err(Error::Usage(format!(
            "--to takes a PostgreSQL URL (postgres://user@host/database), not `{url}`"
        )));
    }
    let source = &workspace.config.ledger;
    let (before, _) = findings_at(workspace, source)?;
    if !before.problems.is_empty() {
        for problem in &before.problems {
            outln!("MISMATCH  {problem}");
        }
        outln!(
            "refused: the ledger does not verify, and a copy would carry what was changed              outside kavi"
        );
        return Ok(exit::RUN_FAILED);
    }
    let copied = Ledger::open_existing(source)?.copy_to_postgres(url)?;
    let key = &workspace.config.signing_key;
    for signed in checkpoint::logged(key, &ledger_id(source)) {
        checkpoint::log(key, &ledger_id(target), &signed).map_err(|source| Error::Io {
            context: "failed to log the copied checkpoints beside the key".into(),
            source,
        })?;
    }
    let rows: usize = copied.iter().map(|(_, rows)| rows).sum();
    let count = |table: &str| {
        copied
            .iter()
            .find(|(name, _)| name == table)
            .map_or(0, |(_, rows)| *rows)
    };
    let shown = crate::ledger::display_location(target);
    outln!(
        "copied {rows} rows of {} tables to {shown}: {} runs, {} journal entries, {} checkpoints",
        copied.len(),
        count("runs"),
        count("journal"),
        count("checkpoints")
    );
    let (after, _) = findings_at(workspace, target)?;
    for problem in &after.problems {
        outln!("MISMATCH  {problem}");
    }
    if !after.problems.is_empty() {
        outln!("the copy does not verify");
        return Ok(exit::RUN_FAILED);
    }
    outln!(
        "the copy verifies: {} journal entries chain, and every row, spec and artifact matches",
        after.entries
    );
    outln!("use it: `ledger = \"{shown}\"` in kavi.toml (with its password), or KAVI_LEDGER");
    Ok(exit::SUCCESS)
}

/// Verifies the journal, the tables, the stored specs, the artifact files and the checkpoints;
/// exit 1 when any does not match, each problem named.
pub fn verify(workspace: &Workspace, json: bool) -> Result<i32, Error> {
    let (findings, trusted) = findings(workspace)?;
    if json {
        super::print_json(&json!({
            "entries": findings.entries,
            "checkpoints": findings.checkpoints,
            "key": trusted.as_ref().map(checkpoint::public_hex),
            "ok": findings.problems.is_empty(),
            "problems": findings.problems,
        }));
    } else {
        for problem in &findings.problems {
            outln!("MISMATCH  {problem}");
        }
        if findings.problems.is_empty() {
            outln!(
                "ok: {} journal entries chain, and every row, spec and artifact matches them",
                findings.entries
            );
        } else {
            outln!(
                "{} problems: this ledger was changed outside kavi",
                findings.problems.len()
            );
        }
        match (findings.checkpoints, &trusted) {
            (0, _) => outln!(
                "no checkpoints: a rewrite of the whole chain would go unseen (`kavi ledger \
                 keygen`, then `kavi ledger checkpoint`)"
            ),
            (n, Some(key)) => outln!(
                "{n} checkpoints, signed by the configured key {}",
                &checkpoint::public_hex(key)[..16]
            ),
            (n, None) => outln!(
                "{n} checkpoints, checked against the keys they name: no signing key at {} to \
                 check them against",
                workspace.config.signing_key.display()
            ),
        }
    }
    Ok(if findings.problems.is_empty() {
        exit::SUCCESS
    } else {
        exit::RUN_FAILED
    })
}
