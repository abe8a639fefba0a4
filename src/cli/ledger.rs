//! `kavi ledger`: the ledger's integrity (verify), and the signed checkpoints that pin it
//! (keygen, checkpoint, rotate-key), and sealing a journal written before it was keyed.

use std::path::Path;

use serde_json::{Value, json};

use crate::config::Workspace;
use crate::error::{Error, exit};
use crate::ledger::checkpoint::{self, Record, Rotation};
use crate::ledger::journal::Findings;
use crate::ledger::{Ledger, keys};

/// What verifying the workspace's ledger finds, and the key its checkpoints are pinned to.
pub(super) fn findings(workspace: &Workspace) -> Result<(Findings, Option<String>), Error> {
    findings_at(workspace, &workspace.config.ledger)
}

/// What verifying the ledger at `ledger_at` finds, with the workspace's artifacts: opened read
/// only, its checkpoints checked against the log kept under its identity beside the key.
fn findings_at(
    workspace: &Workspace,
    ledger_at: &Path,
) -> Result<(Findings, Option<String>), Error> {
    let ledger = Ledger::open_read_only(ledger_at)?;
    let store = super::open_store(workspace)?;
    // kavi's signing key, for a ledger whose log pins none yet; never one the workspace names.
    let trusted = checkpoint::load(&keys::signing_key())
        .ok()
        .map(|key| key.verifying_key());
    let identity = ledger.identity()?;
    let mut problems = Vec::new();
    let log = match &identity {
        Some(id) => checkpoint::logged(id).map_err(|source| Error::Io {
            context: format!(
                "failed to read the checkpoint log {}",
                keys::log_path(id).display()
            ),
            source,
        })?,
        None => {
            problems.push(
                "the ledger has no identity, so its checkpoint log cannot be found: open it once \
                 with this kavi (any command) to give it one"
                    .to_owned(),
            );
            Vec::new()
        }
    };
    if let Some(seen) = checkpoint::last_seen_at(&crate::ledger::canonical_location(ledger_at))
        && identity.as_ref() != Some(&seen)
    {
        problems.push(format!(
            "the ledger here was {seen} when last checkpointed, and is {} now: it was swapped \
             for another",
            identity.as_deref().unwrap_or("without an identity")
        ));
    }
    let pinned = checkpoint::pinned(&log).current().map(str::to_owned);
    let mut findings = ledger.verify(&store, trusted.as_ref(), &log)?;
    findings.problems.extend(problems);
    let (adoption, story) = super::policy::audit(&ledger)?;
    findings.problems.extend(adoption);
    findings.adoption = story;
    Ok((
        findings,
        pinned.or(trusted.as_ref().map(checkpoint::public_hex)),
    ))
}

fn io_error(context: String) -> impl FnOnce(std::io::Error) -> Error {
    move |source| Error::Io { context, source }
}

/// Makes the signing key (once); prints its public half.
pub fn keygen() -> Result<i32, Error> {
    let path = keys::signing_key();
    let public = checkpoint::generate(&path).map_err(io_error(format!(
        "failed to make the signing key {} (an existing key is never overwritten)",
        path.display()
    )))?;
    outln!("signing key written to {} (mode 0600)", path.display());
    outln!("public key {}", checkpoint::public_hex(&public));
    Ok(exit::SUCCESS)
}

/// Prints the signing key's public half, hex.
pub fn public_key() -> Result<i32, Error> {
    let key = checkpoint::load(&keys::signing_key()).map_err(Error::Usage)?;
    outln!("{}", checkpoint::public_hex(&key.verifying_key()));
    Ok(exit::SUCCESS)
}

/// Signs the journal's head, with the key this ledger's log pins (the first checkpoint pins
/// the key that signs it).
pub fn checkpoint(workspace: &Workspace) -> Result<i32, Error> {
    let path = keys::signing_key();
    let key = checkpoint::load(&path).map_err(Error::Usage)?;
    let ledger = Ledger::open_existing(&workspace.config.ledger)?;
    let Some(id) = ledger.identity()? else {
        return Err(Error::Usage("the ledger has no identity".into()));
    };
    let log = checkpoint::logged(&id).map_err(io_error(format!(
        "failed to read the checkpoint log {}",
        keys::log_path(&id).display()
    )))?;
    let public = checkpoint::public_hex(&key.verifying_key());
    if let Some(pinned) = checkpoint::pinned(&log).current()
        && pinned != public
    {
        return Err(Error::Usage(format!(
            "the signing key {} ({}) is not the key this ledger's checkpoints are pinned to ({}): \
             put that key back, or hand over from it with `kavi ledger rotate-key`",
            path.display(),
            checkpoint::short(&public),
            checkpoint::short(pinned)
        )));
    }
    match ledger.checkpoint(&key)? {
        Some(signed) => {
            let logging = io_error(format!(
                "failed to log the checkpoint beside the key ({})",
                keys::log_path(&id).display()
            ));
            checkpoint::log(&id, &Record::Checkpoint(signed.clone())).map_err(logging)?;
            checkpoint::remember_location(
                &id,
                &crate::ledger::canonical_location(&workspace.config.ledger),
            )
            .map_err(io_error(
                "failed to record where the ledger is, beside the key".into(),
            ))?;
            outln!(
                "checkpoint: journal entry {} ({}) signed by {}",
                signed.seq,
                crate::hash::short_hash(&signed.hash),
                checkpoint::short(&signed.public_key)
            );
        }
        None => outln!("the journal is empty: nothing to sign"),
    }
    Ok(exit::SUCCESS)
}

/// Makes a new signing key, handing over from the old one in every log that pins it.
pub fn rotate_key() -> Result<i32, Error> {
    let path = keys::signing_key();
    let old = checkpoint::load(&path).map_err(Error::Usage)?;
    let old_public = checkpoint::public_hex(&old.verifying_key());
    // The new key is made beside first: logs never name a key that is not kept.
    let fresh = path.with_extension("key.new");
    let _ = std::fs::remove_file(&fresh);
    let new = checkpoint::generate(&fresh).map_err(io_error(format!(
        "failed to make the new signing key {}",
        fresh.display()
    )))?;
    let rotation = Rotation::sign(&old, &new);
    let ledgers = keys::dir().join("ledgers");
    let mut handed = 0;
    for entry in std::fs::read_dir(&ledgers).into_iter().flatten().flatten() {
        let file = entry.path();
        let Some(id) = file
            .extension()
            .filter(|ext| *ext == "log")
            .and(file.file_stem())
            .and_then(|stem| stem.to_str())
        else {
            continue;
        };
        let log = checkpoint::logged(id).map_err(io_error(format!(
            "failed to read the checkpoint log {}",
            file.display()
        )))?;
        if checkpoint::pinned(&log).current() == Some(old_public.as_str()) {
            checkpoint::log(id, &Record::Rotate(rotation.clone())).map_err(io_error(format!(
                "failed to log the rotation in {}",
                file.display()
            )))?;
            handed += 1;
        }
    }
    let retired = path.with_extension(format!("key.{}.old", checkpoint::short(&old_public)));
    std::fs::rename(&path, &retired).map_err(io_error(format!(
        "failed to keep the old key as {}",
        retired.display()
    )))?;
    std::fs::rename(&fresh, &path).map_err(io_error(format!(
        "failed to put the new key in place at {}",
        path.display()
    )))?;
    outln!(
        "signing key {} replaced by {} (the old one kept as {}); {handed} ledger logs hand over \
         to it",
        checkpoint::short(&old_public),
        checkpoint::public_hex(&new),
        retired.display()
    );
    Ok(exit::SUCCESS)
}

/// MACs the entries of a ledger journaled before kavi keyed it, once nothing else is wrong.
pub fn seal(workspace: &Workspace) -> Result<i32, Error> {
    let (findings, _) = findings(workspace)?;
    if findings.unkeyed == 0 {
        outln!("every journal entry has its MAC: nothing to seal");
        return Ok(if findings.problems.is_empty() {
            exit::SUCCESS
        } else {
            exit::RUN_FAILED
        });
    }
    if findings.problems.len() > 1 {
        for problem in &findings.problems {
            outln!("MISMATCH  {problem}");
        }
        outln!("refused: the ledger was changed outside kavi, and sealing would vouch for it");
        return Ok(exit::RUN_FAILED);
    }
    let sealed = Ledger::open_existing(&workspace.config.ledger)?.seal()?;
    outln!("sealed {sealed} journal entries with kavi's MAC key");
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
    // The copy keeps the ledger's identity, and with it the checkpoint log beside the key.
    let store = super::open_store(workspace)?;
    let copied = Ledger::open_existing(source)?.copy_to_postgres(url, &store)?;
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
/// What `kavi ledger verify --json` prints: the review page shows it too.
pub(super) fn report(findings: &Findings, trusted: Option<&str>) -> Value {
    json!({
        "entries": findings.entries,
        "checkpoints": findings.checkpoints,
        "key": trusted,
        "unkeyed": findings.unkeyed,
        "ok": findings.problems.is_empty(),
        "problems": findings.problems,
        "adoption": findings.adoption,
    })
}

pub fn verify(workspace: &Workspace, json: bool) -> Result<i32, Error> {
    let (findings, trusted) = findings(workspace)?;
    if json {
        super::print_json(&report(&findings, trusted.as_deref()));
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
        if !findings.adoption.is_empty() {
            outln!("adoption history:");
            for line in &findings.adoption {
                outln!("  {line}");
            }
        }
        match (findings.checkpoints, &trusted) {
            (0, _) => outln!(
                "no checkpoints: the tail of the journal cut off would go unseen (`kavi ledger \
                 keygen`, then `kavi ledger checkpoint`)"
            ),
            (n, Some(key)) => outln!(
                "{n} checkpoints, signed by the pinned key {}",
                checkpoint::short(key)
            ),
            (n, None) => outln!(
                "{n} checkpoints, checked against the keys they name: no signing key at {} and \
                 no log pinning one",
                keys::signing_key().display()
            ),
        }
    }
    Ok(if findings.problems.is_empty() {
        exit::SUCCESS
    } else {
        exit::RUN_FAILED
    })
}
