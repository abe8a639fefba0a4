//! The ledger's side of its journal (the `kavi-journal` crate, re-exported as [`journal`]): the
//! stored specs and artifact files checked with it, sealing, refusing a row the journal does not
//! vouch for, and signing its head.

use ed25519_dalek::{SigningKey, VerifyingKey};
use kavi_foundation::hash::{HashingSink, sha256_hex};

use crate::db::Db;
use crate::journal::{self, Findings, checkpoint};
use crate::{ArtifactStore, Ledger, LedgerError, Result, now};

impl Ledger {
    /// MACs the journal entries written before kavi keyed the journal (see [`journal::seal`]).
    pub fn seal(&mut self) -> Result<usize> {
        Ok(journal::seal(&mut self.conn)?)
    }

    /// Refuses a skill whose row is not what the journal's keyed last entry for it says: its
    /// code hash, state or trusted tree edited outside kavi (see [`journal::row_problem`]).
    pub fn check_skill_journaled(&self, name: &str) -> Result<()> {
        self.check_journaled(
            "skills",
            serde_json::json!([name]),
            &format!("skill `{name}`"),
        )
    }

    /// Refuses a rule set whose row is not what the journal's keyed last entry for it says: its
    /// files, status or approvals edited outside kavi, so no decision is taken under it.
    pub fn check_rule_set_journaled(&self, id: i64) -> Result<()> {
        self.check_journaled(
            "rule_sets",
            serde_json::json!([id]),
            &format!("rule set {id}"),
        )
    }

    fn check_journaled(&self, table: &str, key: serde_json::Value, what: &str) -> Result<()> {
        match journal::row_problem(&self.conn, table, &key.to_string())? {
            Some(problem) => Err(LedgerError::Unjournaled(format!("{what}: {problem}"))),
            None => Ok(()),
        }
    }

    /// Checks the ledger's integrity: the journal (see [`journal::verify`]), its checkpoints
    /// against the `trusted` key when one is known, then, unless the chain breaks, every stored
    /// spec and every artifact file in `store`.
    pub fn verify(
        &self,
        store: &ArtifactStore,
        trusted: Option<&VerifyingKey>,
        logged: &checkpoint::Log,
    ) -> Result<Findings> {
        let mut findings = journal::verify(&self.conn, trusted, logged)?;
        if !findings.broken {
            contents(&self.conn, store, &mut findings.problems)?;
        }
        Ok(findings)
    }

    /// That this is the ledger kavi's keys folder last checkpointed at `location` (canonical,
    /// see `canonical_location`), and that it still holds the journal entry its log's last
    /// checkpoint signed, under a signature that verifies: a ledger swapped for another (which
    /// brings the rules it adopted), or rolled back to a copy from before that checkpoint, is
    /// refused before its rules govern anything. Where nothing was checkpointed, there is
    /// nothing to hold it to. `kavi ledger checkpoint` signs the ledger there is, and so takes
    /// it on.
    pub fn check_checkpointed_here(&self, location: &str) -> Result<()> {
        let identity = self.identity()?;
        let take_on = "`kavi ledger verify` says more; put the checkpointed ledger back, or, to \
                       take this one on, sign it here with `kavi ledger checkpoint`";
        if let Some(seen) = checkpoint::last_seen_at(location)
            && identity.as_ref() != Some(&seen)
        {
            return Err(LedgerError::NotCheckpointed(format!(
                "refused: the ledger at {location} was {seen} when last checkpointed there, and \
                 is {} now: it was swapped for another, whose rules would govern here. {take_on}",
                identity.as_deref().unwrap_or("without an identity")
            )));
        }
        let Some(identity) = identity else {
            return Ok(());
        };
        let log = checkpoint::logged(&identity).map_err(|e| {
            LedgerError::Keys(format!(
                "failed to read the checkpoint log {}: {e}",
                kavi_journal::keys::log_path(&identity).display()
            ))
        })?;
        let last = log.iter().rev().find_map(|record| match record {
            Ok(checkpoint::Record::Checkpoint(signed)) => Some(signed),
            _ => None,
        });
        if let Some(signed) = last
            && let Some(problem) = signed.problem(&self.conn)?
        {
            return Err(LedgerError::NotCheckpointed(format!(
                "refused: the ledger at {location} does not hold its last checkpoint (journal \
                 entry {}): {problem}; it was rolled back to an older copy or rewritten. \
                 {take_on}",
                signed.seq
            )));
        }
        Ok(())
    }

    /// Signs the journal's head with `key` and records the checkpoint.
    pub fn checkpoint(&self, key: &SigningKey) -> Result<Option<checkpoint::Signed>> {
        Ok(checkpoint::record(&self.conn, key, &now())?)
    }
}

/// Adds to `problems` every stored spec that does not hash to its name, and every artifact
/// whose content (kept in the ledger, or its file in `store`) does not.
fn contents(conn: &Db, store: &ArtifactStore, problems: &mut Vec<String>) -> Result<()> {
    // Stored specs hash to their names.
    let mut stmt = conn.prepare("SELECT hash, text FROM specs ORDER BY hash")?;
    let specs = stmt.query_map([], |row| {
        Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?))
    })?;
    for spec in specs {
        let (hash, text) = spec?;
        if kavi_foundation::hash::spec_hash(&text) != hash {
            problems.push(format!("spec {hash}: its text does not hash to its name"));
        }
    }

    // Artifacts hash to their names: the content the ledger keeps, the object, or the file.
    let mut stmt = conn.prepare(
        "SELECT a.sha256, a.size, c.content, o.location FROM artifacts a
         LEFT JOIN artifact_contents c ON c.sha256 = a.sha256
         LEFT JOIN artifact_objects o ON o.sha256 = a.sha256 ORDER BY a.sha256",
    )?;
    let artifacts = stmt.query_map([], |row| {
        Ok((
            row.get::<_, String>(0)?,
            row.get::<_, i64>(1)?,
            row.get::<_, Option<Vec<u8>>>(2)?,
            row.get::<_, Option<String>>(3)?,
        ))
    })?;
    for artifact in artifacts {
        let (sha256, size, kept, location) = artifact?;
        if let Some(location) = location {
            if let Some(problem) = object_problem(store, &sha256, size, &location)? {
                problems.push(format!("artifact {sha256}: {problem}"));
            }
            continue;
        }
        if let Some(content) = kept {
            if sha256_hex(&content) != sha256 || i64::try_from(content.len()) != Ok(size) {
                problems.push(format!(
                    "artifact {sha256}: the content the ledger keeps no longer hashes to its name"
                ));
            }
            continue;
        }
        // On a server, the content every machine reads: this machine's file is only a cache.
        let mut shared = HashingSink::default();
        match crate::artifacts::copy_chunks(conn, &sha256, &mut shared) {
            Err(e) => {
                problems.push(format!("artifact {sha256}: {e}"));
                continue;
            }
            Ok(true) => {
                let (found, bytes) = shared.finish();
                if found != sha256 || i64::try_from(bytes) != Ok(size) {
                    problems.push(format!(
                        "artifact {sha256}: the content the ledger keeps no longer hashes to its name"
                    ));
                }
                continue;
            }
            Ok(false) => {}
        }
        let path = store.path_of_sha256(&sha256);
        match kavi_foundation::hash::hash_file(&path) {
            Err(e) => problems.push(format!(
                "artifact {sha256}: cannot read {}: {e}",
                path.display()
            )),
            Ok((found, bytes)) if found != sha256 || i64::try_from(bytes) != Ok(size) => problems
                .push(format!(
                    "artifact {sha256}: {} no longer hashes to its name (edited on disk)",
                    path.display()
                )),
            Ok(_) => {}
        }
    }
    Ok(())
}

/// What is wrong with the object store's copy of the artifact `sha256` at `location`, re-hashed
/// as it is read: missing, or no longer its content. A store that cannot be read (unreachable,
/// access refused, not configured here) is an error: nothing was found wrong with the ledger.
fn object_problem(
    store: &ArtifactStore,
    sha256: &str,
    size: i64,
    location: &str,
) -> Result<Option<String>> {
    let Some(objects) = store.objects() else {
        return Err(LedgerError::Io(std::io::Error::other(format!(
            "cannot verify artifact {sha256}: {}",
            crate::artifacts::unreachable_object(location)
        ))));
    };
    let mut read = HashingSink::default();
    match objects.copy_to(location, &mut read) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Some(format!(
            "its object {location} is missing from the object store"
        ))),
        Err(e) => Err(LedgerError::Io(std::io::Error::other(format!(
            "cannot verify artifact {sha256}: {e}"
        )))),
        Ok(()) => {
            let (found, bytes) = read.finish();
            Ok(
                (found != sha256 || i64::try_from(bytes) != Ok(size)).then(|| {
                    format!(
                        "its object {location} no longer hashes to its name (edited in the store)"
                    )
                }),
            )
        }
    }
}

#[cfg(test)]
mod tests;
