//! Rule sets: the governing files (pipelines, policies, templates, chains, kavi.toml) as a set
//! hash over their texts, the one adopted, and changes proposed to it with their approvals.

use serde::Serialize;
use serde_json::Value;

use super::RecordedApproval;
use super::db::{OptionalExtension, params};
use super::{Ledger, LedgerError, now};

type Result<T, E = LedgerError> = std::result::Result<T, E>;

#[derive(Debug, Clone, Serialize)]
pub struct RuleSetRow {
    pub id: i64,
    pub set_hash: String,
    /// Path -> spec hash of each file (their texts are in `specs`).
    pub files: Value,
    /// pending | adopted | superseded | rejected
    pub status: String,
    /// first-use | weakening | strengthening | neutral
    pub class: String,
    /// Each change in words with its class (`[{change, class}]`).
    pub changes: Value,
    /// The adopted set it was proposed against.
    pub based_on: Option<i64>,
    pub proposed_by: String,
    pub proposed_at: String,
    pub message: Option<String>,
    pub approvals: Vec<RecordedApproval>,
    pub decided_by: Option<String>,
    pub decided_at: Option<String>,
}

const COLUMNS: &str = "id, set_hash, files, status, class, changes, based_on, proposed_by, \
     proposed_at, message, approvals, decided_by, decided_at";

fn row(r: &super::db::Row) -> super::db::Result<RuleSetRow> {
    Ok(RuleSetRow {
        id: r.get(0)?,
        set_hash: r.get(1)?,
        files: super::json_column(r, 2)?.unwrap_or(Value::Null),
        status: r.get(3)?,
        class: r.get(4)?,
        changes: super::json_column(r, 5)?.unwrap_or(Value::Null),
        based_on: r.get(6)?,
        proposed_by: r.get(7)?,
        proposed_at: r.get(8)?,
        message: r.get(9)?,
        approvals: super::json_column(r, 10)?
            .and_then(|v| serde_json::from_value(v).ok())
            .unwrap_or_default(),
        decided_by: r.get(11)?,
        decided_at: r.get(12)?,
    })
}

/// A set to record: its hash, files, class and changes.
pub struct NewRuleSet<'a> {
    pub set_hash: &'a str,
    pub files: &'a Value,
    pub class: &'a str,
    pub changes: &'a Value,
    pub based_on: Option<i64>,
    pub actor: &'a str,
    pub message: Option<&'a str>,
}

impl Ledger {
    /// The adopted rule set, if any was.
    pub fn adopted_rules(&self) -> Result<Option<RuleSetRow>> {
        Ok(self
            .conn
            .query_row(
                &format!("SELECT {COLUMNS} FROM rule_sets WHERE status = 'adopted'"),
                [],
                row,
            )
            .optional()?)
    }

    /// Every recorded rule set, oldest first.
    pub fn rule_sets(&self) -> Result<Vec<RuleSetRow>> {
        let mut stmt = self
            .conn
            .prepare(&format!("SELECT {COLUMNS} FROM rule_sets ORDER BY id"))?;
        Ok(stmt
            .query_map([], row)?
            .collect::<super::db::Result<Vec<_>>>()?)
    }

    pub fn rule_set(&self, id: i64) -> Result<RuleSetRow> {
        self.conn
            .query_row(
                &format!("SELECT {COLUMNS} FROM rule_sets WHERE id = ?1"),
                [id],
                row,
            )
            .optional()?
            .ok_or_else(|| LedgerError::RuleChangeNotFound(id))
    }

    /// Records a set as pending, or (`adopt`) as the adopted one in place of the one before.
    /// A `first-use` set is recorded only on a ledger with none: of kavis starting on a new
    /// ledger at once, one adopts, under the write lock, and the others find it done (the id of
    /// the first set).
    pub fn record_rule_set(&mut self, set: &NewRuleSet<'_>, adopt: bool) -> Result<i64> {
        let first_use = set.class == "first-use";
        // Almost always there is one: found by a read, without waiting for the write lock,
        // which every run's start would otherwise take, waiting for other runs' writes.
        if first_use && let Some(first) = first_rule_set(&self.conn)? {
            return Ok(first);
        }
        let tx = self.conn.transaction()?;
        if first_use && let Some(first) = first_rule_set(&tx)? {
            tx.commit()?;
            return Ok(first);
        }
        let at = now();
        if adopt {
            tx.execute(
                "UPDATE rule_sets SET status = 'superseded' WHERE status = 'adopted'",
                [],
            )?;
        }
        let (status, decided_by, decided_at) = if adopt {
            ("adopted", Some(set.actor), Some(at.as_str()))
        } else {
            ("pending", None, None)
        };
        let id = tx.query_row(
            "INSERT INTO rule_sets (set_hash, files, status, class, changes, based_on,
                 proposed_by, proposed_at, message, approvals, decided_by, decided_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, '[]', ?10, ?11) RETURNING id",
            params![
                set.set_hash,
                set.files.to_string(),
                status,
                set.class,
                set.changes.to_string(),
                set.based_on,
                set.actor,
                at,
                set.message,
                decided_by,
                decided_at
            ],
            |r| r.get(0),
        )?;
        tx.commit()?;
        Ok(id)
    }

    /// Adds an approval to a pending change (once per account), read and written in one
    /// transaction so that approvals given at the same moment are all kept; returns the change
    /// as it is now.
    pub fn approve_rule_set(&mut self, id: i64, approval: &RecordedApproval) -> Result<RuleSetRow> {
        let tx = self.conn.transaction()?;
        let mut set = pending_in(&tx, id)?;
        // An account approves once; approving again records it anew (signed now, say, where
        // what stood in its name was not, or was never its own).
        let changed = match set.approvals.iter_mut().find(|a| a.actor == approval.actor) {
            Some(given) if given == approval => false,
            Some(given) => {
                *given = approval.clone();
                true
            }
            None => {
                set.approvals.push(approval.clone());
                true
            }
        };
        if changed {
            tx.execute(
                "UPDATE rule_sets SET approvals = ?2 WHERE id = ?1",
                params![id, serde_json::json!(set.approvals).to_string()],
            )?;
        }
        tx.commit()?;
        Ok(set)
    }

    /// Decides a pending change: `adopted` (the set adopted before is superseded) or `rejected`.
    /// Under the write lock, the change must still be pending and, to be adopted, still based on
    /// the set adopted now: of two decisions at the same moment, the second is refused.
    pub fn decide_rule_set(&mut self, id: i64, status: &str, actor: &str) -> Result<()> {
        let tx = self.conn.transaction()?;
        let change = pending_in(&tx, id)?;
        if status == "adopted" {
            let adopted: Option<i64> = tx
                .query_row(
                    "SELECT id FROM rule_sets WHERE status = 'adopted'",
                    [],
                    |r| r.get(0),
                )
                .optional()?;
            if change.based_on != adopted {
                return Err(LedgerError::RuleChangeRefused(format!(
                    "rule change {id} was proposed against another adopted set than the one \
                     adopted now: propose it again"
                )));
            }
            tx.execute(
                "UPDATE rule_sets SET status = 'superseded' WHERE status = 'adopted'",
                [],
            )?;
        }
        tx.execute(
            "UPDATE rule_sets SET status = ?2, decided_by = ?3, decided_at = ?4 WHERE id = ?1",
            params![id, status, actor, now()],
        )?;
        tx.commit()?;
        Ok(())
    }
}

/// A change that is still pending, read inside the transaction `conn` holds.
fn pending_in(conn: &super::db::Db, id: i64) -> Result<RuleSetRow> {
    let set = conn
        .query_row(
            &format!("SELECT {COLUMNS} FROM rule_sets WHERE id = ?1"),
            [id],
            row,
        )
        .optional()?
        .ok_or(LedgerError::RuleChangeNotFound(id))?;
    if set.status != "pending" {
        return Err(LedgerError::RuleChangeRefused(format!(
            "rule change {id} is {}, not pending{}",
            set.status,
            set.decided_by
                .as_deref()
                .map(|by| format!(" (decided by {by})"))
                .unwrap_or_default()
        )));
    }
    Ok(set)
}

/// The first rule set recorded, if any.
fn first_rule_set(conn: &super::db::Db) -> Result<Option<i64>> {
    Ok(conn
        .query_row("SELECT min(id) FROM rule_sets", [], |r| r.get(0))
        .optional()?
        .flatten())
}
