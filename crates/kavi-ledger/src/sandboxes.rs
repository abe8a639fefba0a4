//! Sandboxes kavi made: where, for which run, under which limits, the manifest of each tree as
//! it was before the builder ran, and whether the folder is still there.

use std::path::Path;
use std::time::Duration;

use super::db::{OptionalExtension, params};
use serde::Serialize;

use super::nodes::millis;
use super::{Ledger, LedgerError, format_time, now};
use kavi_foundation::sandbox::manifest::{Entry, EntryKind};

type Result<T, E = LedgerError> = std::result::Result<T, E>;

/// The limits a sandbox policy sets, recorded with each sandbox so that the diff gate and
/// copy-back apply the ones the sandbox was made under.
#[derive(Debug, Clone, Serialize)]
pub struct SandboxLimits {
    pub max_file_bytes: u64,
    pub max_total_bytes: u64,
    pub max_changed_files: u64,
    /// How long a sandbox is kept after a run that did not succeed, for a person to look.
    #[serde(serialize_with = "serialize_duration")]
    pub keep_failed: Duration,
    /// The most a failed run's sandbox may hold and still be kept.
    pub keep_max_bytes: u64,
}

/// The budget of a kept sandbox whose policy named none (and of those made before there was
/// one).
pub const DEFAULT_KEEP_MAX_BYTES: u64 = 256 * 1024 * 1024;

fn serialize_duration<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&humantime::format_duration(*d).to_string())
}

pub struct NewSandbox<'a> {
    pub path: &'a Path,
    pub run_id: i64,
    pub node_id: &'a str,
    /// The policy file the limits come from, as the workspace names it.
    pub policy: &'a str,
    pub limits: SandboxLimits,
    pub manifest: &'a [Entry],
}

#[derive(Debug, Clone, Serialize)]
pub struct SandboxRow {
    pub id: i64,
    pub path: String,
    pub run_id: i64,
    pub node_id: String,
    pub policy: String,
    pub limits: SandboxLimits,
    /// `active` while its run may use it, `kept` until `keep_until`, then `removed`.
    pub status: String,
    pub created_at: String,
    pub keep_until: Option<String>,
    pub removed_at: Option<String>,
    pub error: Option<String>,
}

const SANDBOX_COLUMNS: &str = "id, path, run_id, node_id, policy, max_file_bytes, \
                               max_total_bytes, max_changed_files, keep_failed_ms, status, \
                               created_at, keep_until, removed_at, error, keep_max_bytes";

fn sandbox_row(r: &super::db::Row) -> super::db::Result<SandboxRow> {
    let unsigned = |i: usize| r.get::<_, i64>(i).map(|v| u64::try_from(v).unwrap_or(0));
    Ok(SandboxRow {
        id: r.get(0)?,
        path: r.get(1)?,
        run_id: r.get(2)?,
        node_id: r.get(3)?,
        policy: r.get(4)?,
        limits: SandboxLimits {
            max_file_bytes: unsigned(5)?,
            max_total_bytes: unsigned(6)?,
            max_changed_files: unsigned(7)?,
            keep_failed: Duration::from_millis(unsigned(8)?),
            keep_max_bytes: r
                .get::<_, Option<i64>>(14)?
                .map_or(DEFAULT_KEEP_MAX_BYTES, |v| u64::try_from(v).unwrap_or(0)),
        },
        status: r.get(9)?,
        created_at: r.get(10)?,
        keep_until: r.get(11)?,
        removed_at: r.get(12)?,
        error: r.get(13)?,
    })
}

/// An integer column from a `u64`; SQLite's integers are signed.
fn stored(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// `now` plus `keep`, in the ledger's time format.
fn after(keep: Duration) -> String {
    let now = jiff::Timestamp::now();
    let until = jiff::SignedDuration::try_from(keep)
        .ok()
        .and_then(|keep| now.checked_add(keep).ok())
        .unwrap_or(jiff::Timestamp::MAX);
    format_time(until)
}

impl Ledger {
    /// Records a new sandbox and its manifest, in one transaction.
    pub fn record_sandbox(&mut self, new: NewSandbox<'_>) -> Result<i64> {
        let tx = self.conn.transaction()?;
        let id: i64 = tx.query_row(
            "INSERT INTO sandboxes (path, run_id, node_id, policy, max_file_bytes,
                                    max_total_bytes, max_changed_files, keep_failed_ms,
                                    status, created_at, keep_max_bytes)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, 'active', ?9, ?10) RETURNING id",
            params![
                new.path.display().to_string(),
                new.run_id,
                new.node_id,
                new.policy,
                stored(new.limits.max_file_bytes),
                stored(new.limits.max_total_bytes),
                stored(new.limits.max_changed_files),
                millis(new.limits.keep_failed),
                now(),
                stored(new.limits.keep_max_bytes),
            ],
            |row| row.get(0),
        )?;
        {
            let mut insert = tx.prepare(
                "INSERT INTO sandbox_entries (sandbox_id, path, kind, mode, size, links, sha256,
                                              target)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            )?;
            for entry in new.manifest {
                insert.execute(params![
                    id,
                    entry.path,
                    entry.kind.as_str(),
                    entry.mode,
                    stored(entry.size),
                    stored(entry.links),
                    entry.sha256,
                    entry.target,
                ])?;
            }
        }
        tx.commit()?;
        Ok(id)
    }

    /// The sandbox kavi made at `path`, if it made one there.
    pub fn sandbox_at(&self, path: &Path) -> Result<Option<SandboxRow>> {
        Ok(self
            .conn
            .query_row(
                &format!("SELECT {SANDBOX_COLUMNS} FROM sandboxes WHERE path = ?1"),
                [path.display().to_string()],
                sandbox_row,
            )
            .optional()?)
    }

    /// The manifest recorded when the sandbox was made, sorted by path.
    pub fn sandbox_manifest(&self, sandbox_id: i64) -> Result<Vec<Entry>> {
        let mut stmt = self.conn.prepare(
            "SELECT path, kind, mode, size, links, sha256, target FROM sandbox_entries
             WHERE sandbox_id = ?1 ORDER BY path",
        )?;
        let rows = stmt.query_map([sandbox_id], |r| {
            let kind: String = r.get(1)?;
            Ok(Entry {
                path: r.get(0)?,
                kind: EntryKind::parse(&kind).ok_or_else(|| {
                    rusqlite::Error::FromSqlConversionFailure(
                        1,
                        rusqlite::types::Type::Text,
                        format!("unknown entry kind `{kind}`").into(),
                    )
                })?,
                mode: r.get(2)?,
                size: u64::try_from(r.get::<_, i64>(3)?).unwrap_or(0),
                links: u64::try_from(r.get::<_, i64>(4)?).unwrap_or(0),
                sha256: r.get(5)?,
                target: r.get(6)?,
            })
        })?;
        Ok(rows.collect::<super::db::Result<_>>()?)
    }

    /// A run ended: its sandboxes are due for removal now if it succeeded; otherwise they are
    /// kept for as long as their policy says.
    pub fn settle_sandboxes(&mut self, run_id: i64, succeeded: bool) -> Result<()> {
        // Each row is settled only while still `active`, under its row lock: two kavis settling
        // the same run (its own end, another's sweep of it) settle it once. Nothing to decide
        // under the write lock alone, which every run's end would otherwise take, waiting for
        // every other writer's transaction under way.
        let tx = self.conn.sharing_transaction()?;
        let active: Vec<(i64, i64)> = {
            let mut stmt = tx.prepare(
                "SELECT id, keep_failed_ms FROM sandboxes WHERE run_id = ?1 AND status = 'active'",
            )?;
            stmt.query_map([run_id], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<super::db::Result<_>>()?
        };
        for (id, keep_ms) in active {
            let keep = if succeeded {
                Duration::ZERO
            } else {
                Duration::from_millis(u64::try_from(keep_ms).unwrap_or(0))
            };
            tx.execute(
                "UPDATE sandboxes SET status = 'kept', keep_until = ?1
                 WHERE id = ?2 AND status = 'active'",
                params![after(keep), id],
            )?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Sandboxes whose time is up. A sandbox still `active` although its run is over (the kavi
    /// running it was killed) is settled first, as a failed run's.
    pub fn due_sandboxes(&mut self) -> Result<Vec<SandboxRow>> {
        let orphaned: Vec<i64> = {
            let mut stmt = self.conn.prepare(
                "SELECT DISTINCT s.run_id FROM sandboxes s JOIN runs r ON r.id = s.run_id
                 WHERE s.status = 'active' AND r.status != 'running'",
            )?;
            stmt.query_map([], |r| r.get(0))?
                .collect::<super::db::Result<_>>()?
        };
        for run_id in orphaned {
            self.settle_sandboxes(run_id, false)?;
        }
        let mut stmt = self.conn.prepare(&format!(
            "SELECT {SANDBOX_COLUMNS} FROM sandboxes
             WHERE status = 'kept' AND keep_until <= ?1 ORDER BY id"
        ))?;
        let rows = stmt.query_map([now()], sandbox_row)?;
        Ok(rows.collect::<super::db::Result<_>>()?)
    }

    /// Records that a sandbox's folder is gone, or why it could not be removed.
    pub fn sandbox_removed(&mut self, sandbox_id: i64, error: Option<&str>) -> Result<()> {
        match error {
            None => self.conn.execute(
                "UPDATE sandboxes SET status = 'removed', removed_at = ?1, error = NULL
                 WHERE id = ?2",
                params![now(), sandbox_id],
            )?,
            Some(error) => self.conn.execute(
                "UPDATE sandboxes SET error = ?1 WHERE id = ?2",
                params![error, sandbox_id],
            )?,
        };
        Ok(())
    }

    /// A run's sandboxes that are still `active`, oldest first.
    pub fn active_sandboxes(&self, run_id: i64) -> Result<Vec<SandboxRow>> {
        let mut stmt = self.conn.prepare(&format!(
            "SELECT {SANDBOX_COLUMNS} FROM sandboxes WHERE run_id = ?1 AND status = 'active'
             ORDER BY id"
        ))?;
        let rows = stmt.query_map([run_id], sandbox_row)?;
        Ok(rows.collect::<super::db::Result<_>>()?)
    }

    /// Records that a sandbox was removed instead of kept for review, and why.
    pub fn sandbox_not_kept(&mut self, sandbox_id: i64, reason: &str) -> Result<()> {
        self.conn.execute(
            "UPDATE sandboxes SET status = 'removed', removed_at = ?1, error = ?2 WHERE id = ?3",
            params![now(), reason, sandbox_id],
        )?;
        Ok(())
    }

    /// A sandbox that was not to be kept but could not be removed: it stays listed, due at
    /// once, with the reason, so the next sweep and `kavi gc` try again and `kavi doctor` shows
    /// it, rather than recorded removed while its folder is still there.
    pub fn sandbox_left(&mut self, sandbox_id: i64, reason: &str) -> Result<()> {
        self.conn.execute(
            "UPDATE sandboxes SET status = 'kept', keep_until = ?1, error = ?2 WHERE id = ?3",
            params![now(), reason, sandbox_id],
        )?;
        Ok(())
    }

    /// Every sandbox whose folder kavi has not removed, oldest first.
    pub fn remaining_sandboxes(&self) -> Result<Vec<SandboxRow>> {
        let mut stmt = self.conn.prepare(&format!(
            "SELECT {SANDBOX_COLUMNS} FROM sandboxes WHERE status != 'removed' ORDER BY id"
        ))?;
        let rows = stmt.query_map([], sandbox_row)?;
        Ok(rows.collect::<super::db::Result<_>>()?)
    }
}
