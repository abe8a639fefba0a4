//! Checking the journal: the chain, every row against its last entry, the checkpoints; sealing
//! entries written before the journal was keyed.

use super::tables::tables;
use super::triggers::latest;
use super::{APPENDER, Backend, Db, JournalError, OptionalExtension, Result, entry_hash, params};
use crate::checkpoint;

/// What [`verify`] found: problems, each naming an entry, a row or a file.
#[derive(Debug, Default)]
pub struct Findings {
    pub entries: i64,
    /// How many entries have no MAC (see [`seal`]).
    pub unkeyed: usize,
    /// How many signed checkpoints there are.
    pub checkpoints: usize,
    pub problems: Vec<String>,
    /// The rule sets' story, a line each (filled in by `kavi ledger verify`).
    pub adoption: Vec<String>,
    /// The chain breaks: every later entry is suspect, so nothing was checked against it.
    pub broken: bool,
}

/// Recomputes the chain, checks the checkpoints (against the `trusted` key and the log beside
/// it) and every table against the chain.
pub fn verify(
    conn: &Db,
    trusted: Option<&ed25519_dalek::VerifyingKey>,
    logged: &checkpoint::Log,
) -> Result<Findings> {
    let mut findings = Findings::default();
    let key_for_macs = crate::keys::mac_key().map_err(JournalError::Keys)?;
    // The chain.
    let mut stmt = conn
        .prepare("SELECT seq, tbl, op, key, content, prev, hash, mac FROM journal ORDER BY seq")?;
    let mut expected_prev = String::new();
    let mut expected_seq = 1;
    let mut unkeyed: Vec<i64> = Vec::new();
    stmt.for_each([], |row| {
        let (seq, table, op, key_text, content, prev, hash, mac): (
            i64,
            String,
            String,
            String,
            String,
            String,
            String,
            Option<String>,
        ) = (
            row.get(0)?,
            row.get(1)?,
            row.get(2)?,
            row.get(3)?,
            row.get(4)?,
            row.get(5)?,
            row.get(6)?,
            row.get(7)?,
        );
        let key = key_text.as_str();
        findings.entries = seq;
        let problem = if seq != expected_seq {
            Some(format!(
                "journal entry {seq}: expected entry {expected_seq} here (entries were removed or inserted)"
            ))
        } else if prev != expected_prev {
            Some(format!(
                "journal entry {seq}: its `prev` is not the hash of entry {}",
                seq - 1
            ))
        } else if hash != entry_hash(&prev, seq, &table, &op, key, &content) {
            Some(format!(
                "journal entry {seq}: its hash does not match its content ({table} {key})"
            ))
        } else if mac.as_ref().is_some_and(|mac| *mac != key_for_macs.mac(&hash)) {
            Some(format!(
                "journal entry {seq}: its MAC does not hold ({table} {key}): written by a \
                 process without kavi's key, or the chain was recomputed"
            ))
        } else {
            if mac.is_none() {
                unkeyed.push(seq);
            }
            None
        };
        if let Some(problem) = problem {
            findings.problems.push(problem);
            // One break in the chain makes every later entry suspect; the first is named.
            findings.broken = true;
            return Ok(false);
        }
        expected_prev = hash;
        expected_seq += 1;
        Ok(true)
    })?;
    drop(stmt);
    // Checkpoints still match the chain, and were signed by the pinned key.
    let (checkpoints, problems) = checkpoint::verify(conn, trusted, logged)?;
    findings.checkpoints = checkpoints;
    if findings.broken {
        findings.problems.extend(problems);
        return Ok(findings);
    }
    if let (Some(first), Some(last)) = (unkeyed.first(), unkeyed.last()) {
        findings.unkeyed = unkeyed.len();
        findings.problems.push(format!(
            "{} journal entries (entry {first} to {last}) have no MAC: written before kavi keyed \
             the journal, or by a process without its key; once they are checked, `kavi ledger \
             seal` MACs them",
            unkeyed.len()
        ));
    }

    // The tables against the chain.
    let mut latest = latest(conn)?;
    let tables = tables(conn)?;
    let triggers: Vec<String> = conn
        .prepare(match conn.backend() {
            Backend::Sqlite => "SELECT name FROM sqlite_master WHERE type = 'trigger'",
            Backend::Postgres => "SELECT tgname::text FROM pg_trigger WHERE NOT tgisinternal",
        })?
        .query_map([], |row| row.get(0))?
        .collect::<kavi_db::Result<_>>()?;
    if conn.backend() == Backend::Postgres {
        for what in super::server::foreign_code(conn)? {
            findings.problems.push(format!(
                "the ledger's schema holds code kavi did not make, which could write in kavi's \
                 transactions (kavi refuses to record while it is there): {what}"
            ));
        }
    }
    if conn.backend() == Backend::Sqlite && !triggers.iter().any(|t| t == APPENDER) {
        findings.problems.push(format!(
            "the journal's appender (trigger {APPENDER}) is missing (dropped outside kavi)"
        ));
    }
    for table in &tables {
        for op in ["insert", "update", "delete"] {
            if !triggers.contains(&table.trigger_name(op)) {
                findings.problems.push(format!(
                    "table {}: its journal trigger for {op} is missing (dropped outside kavi)",
                    table.name
                ));
            }
        }
        for (key, content) in table.rows(conn)? {
            match latest.remove(&(table.name.clone(), key.clone())) {
                None => findings.problems.push(format!(
                    "table {} row {key}: not in the journal (added outside kavi)",
                    table.name
                )),
                Some((seq, op, _)) if op == "delete" => findings.problems.push(format!(
                    "table {} row {key}: journal entry {seq} deleted it, yet it is there",
                    table.name
                )),
                Some((seq, _, last)) if last != content => findings.problems.push(format!(
                    "table {} row {key}: differs from journal entry {seq} (edited outside kavi)",
                    table.name
                )),
                Some(_) => {}
            }
        }
    }
    let mut gone: Vec<_> = latest
        .into_iter()
        .filter(|(_, (_, op, _))| op != "delete")
        .collect();
    gone.sort_by_key(|(_, (seq, _, _))| *seq);
    for ((table, key), (seq, _, _)) in gone {
        findings.problems.push(format!(
            "table {table} row {key}: journal entry {seq} has it, but it is gone (deleted outside kavi)"
        ));
    }

    findings.problems.extend(problems);
    Ok(findings)
}

/// MACs the entries that have none (a ledger journaled before kavi keyed it), in one
/// transaction; returns how many. The caller checks first that nothing else is wrong. Only
/// entries before the first keyed one are sealed: that entry's MAC covers their hashes through
/// the chain, and every kavi that upgrades a ledger writes one (its identity) as it opens it. An
/// unkeyed entry after a keyed one, or none keyed at all, is what a writer without the key
/// leaves (one who stripped every MAC to pass for an old ledger), and is refused.
pub fn seal(conn: &mut Db) -> Result<usize> {
    let key = crate::keys::mac_key().map_err(JournalError::Keys)?;
    let tx = conn.transaction()?;
    let unkeyed: Vec<(i64, String)> = tx
        .prepare("SELECT seq, hash FROM journal WHERE mac IS NULL ORDER BY seq")?
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?
        .collect::<kavi_db::Result<_>>()?;
    let first_keyed: Option<i64> = tx.query_row(
        "SELECT MIN(seq) FROM journal WHERE mac IS NOT NULL",
        [],
        |row| row.get(0),
    )?;
    let after = unkeyed
        .last()
        .filter(|(seq, _)| first_keyed.is_none_or(|keyed| *seq > keyed));
    if let Some((seq, _)) = after {
        return Err(JournalError::Keys(format!(
            "journal entry {seq} has no MAC, and no keyed entry after it vouches for it: it was \
             written by a process without kavi's key, not before kavi keyed the journal; it is \
             not sealed"
        )));
    }
    for (seq, hash) in &unkeyed {
        tx.execute(
            "UPDATE journal SET mac = ?1 WHERE seq = ?2",
            params![key.mac(hash), seq],
        )?;
    }
    tx.commit()?;
    Ok(unkeyed.len())
}

/// Why the row of `table` keyed `key` (as the journal writes keys: `["name"]`) is not what the
/// journal's keyed last entry for it says, if it is not: the entry must recompute to its hash,
/// carry a MAC that holds under kavi's key, and hold the row's content as it is now. What a
/// command that acts on one row checks, rather than trust the editable row alone.
pub fn row_problem(conn: &Db, table: &str, key: &str) -> Result<Option<String>> {
    let macs = crate::keys::mac_key().map_err(JournalError::Keys)?;
    let Some(table) = tables(conn)?.into_iter().find(|t| t.name == table) else {
        return Ok(Some(format!("no table {table}")));
    };
    let current: Option<String> = conn
        .query_row(
            &format!(
                "SELECT {} FROM \"{}\" AS t WHERE {} = ?1",
                table.content_sql("t"),
                table.name,
                table.key_sql("t")
            ),
            [key],
            |row| row.get(0),
        )
        .optional()?;
    let last: Option<(i64, String, String, String, String, Option<String>)> = conn
        .query_row(
            "SELECT seq, op, content, prev, hash, mac FROM journal
             WHERE tbl = ?1 AND key = ?2 ORDER BY seq DESC LIMIT 1",
            params![table.name, key],
            |row| {
                Ok((
                    row.get(0)?,
                    row.get(1)?,
                    row.get(2)?,
                    row.get(3)?,
                    row.get(4)?,
                    row.get(5)?,
                ))
            },
        )
        .optional()?;
    let name = &table.name;
    let Some((seq, op, content, prev, hash, mac)) = last else {
        return Ok(Some(format!(
            "table {name} row {key}: not in the journal (added outside kavi)"
        )));
    };
    Ok(
        if hash != entry_hash(&prev, seq, name, &op, key, &content) {
            Some(format!(
                "journal entry {seq}: its hash does not match its content ({name} {key})"
            ))
        } else if mac.is_none_or(|mac| mac != macs.mac(&hash)) {
            Some(format!(
                "journal entry {seq} ({name} {key}) has no MAC that holds under kavi's key: written \
             by a process without the key"
            ))
        } else if op == "delete" || current.as_deref() != Some(content.as_str()) {
            Some(format!(
                "table {name} row {key}: differs from journal entry {seq} (edited outside kavi)"
            ))
        } else {
            None
        },
    )
}
