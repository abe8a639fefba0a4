//! Executions of trusted skills: one row per attempt to run a skill (from `kavi skill run`, a
//! chain step, or a replay), linked to the execution it follows by `parent`.

use super::db::{OptionalExtension, params};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Ledger, LedgerError};

type Result<T, E = LedgerError> = std::result::Result<T, E>;

/// What an execution did. The same shape is appended to the JSONL log, one line each.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecutionRecord {
    pub execution_id: String,
    pub parent_execution_id: Option<String>,
    pub skill: String,
    /// The hash the skill's files had when it ran; none when it was not reached.
    pub source_hash: Option<String>,
    /// The version of the skill that ran; none when it was not reached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skill_version: Option<i64>,
    pub side_effect: String,
    pub input: Option<Value>,
    pub output: Option<Value>,
    pub success: bool,
    pub error: Option<String>,
    /// UTC, RFC 3339.
    pub started_at: String,
    pub finished_at: String,
    pub duration_ms: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chain: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<i64>,
    /// The confinement the skill ran under (role, enforcement, paths, network); none when the
    /// skill was not reached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confinement: Option<Value>,
    /// Who asked for it from outside kavi's own commands: `mcp:<client name>` for a call an MCP
    /// client made through `kavi mcp`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caller: Option<String>,
}

const COLUMNS: &str = "id, parent, skill, source_hash, side_effect, input, output, success, error, \
                       started_at, finished_at, duration_ms, chain, step, run_id, confinement, skill_version, caller";

fn row(r: &super::db::Row) -> super::db::Result<ExecutionRecord> {
    row_from(r, 0)
}

/// The record in the columns of [`COLUMNS`], from column `at` on.
fn row_from(r: &super::db::Row, at: usize) -> super::db::Result<ExecutionRecord> {
    Ok(ExecutionRecord {
        execution_id: r.get(at)?,
        parent_execution_id: r.get(at + 1)?,
        skill: r.get(at + 2)?,
        source_hash: r.get(at + 3)?,
        side_effect: r.get(at + 4)?,
        input: super::json_column(r, at + 5)?,
        output: super::json_column(r, at + 6)?,
        success: r.get(at + 7)?,
        error: r.get(at + 8)?,
        started_at: r.get(at + 9)?,
        finished_at: r.get(at + 10)?,
        duration_ms: r.get(at + 11)?,
        chain: r.get(at + 12)?,
        step: r.get(at + 13)?,
        run_id: r.get(at + 14)?,
        confinement: super::json_column(r, at + 15)?,
        skill_version: r.get(at + 16)?,
        caller: r.get(at + 17)?,
    })
}

/// A page of a skill's executions, newest first, started before the one `?2` and `?3` name
/// (its start and id) when they are not NULL: a seek on `executions_skill` to that start (`9999`
/// sorts after every RFC 3339 time, in any collation), however deep the page.
pub(crate) fn skill_executions_sql() -> String {
    format!(
        "SELECT {COLUMNS} FROM executions
         WHERE skill = ?1 AND started_at <= coalesce(CAST(?2 AS TEXT), '9999')
           AND (CAST(?2 AS TEXT) IS NULL OR started_at < ?2 OR id < ?3)
         ORDER BY started_at DESC, id DESC LIMIT ?4"
    )
}

impl Ledger {
    /// Records an execution as it starts (`running`, owned by `owner`), so that a killed kavi
    /// leaves a row that recovery marks `interrupted`.
    pub fn start_execution(&self, record: &ExecutionRecord, owner: &str) -> Result<()> {
        self.write_execution(record, "running", Some(owner))
    }

    /// Records a finished execution, in place of its `running` row if it has one.
    pub fn record_execution(&self, record: &ExecutionRecord) -> Result<()> {
        self.write_execution(record, "finished", None)
    }

    fn write_execution(
        &self,
        record: &ExecutionRecord,
        status: &str,
        owner: Option<&str>,
    ) -> Result<()> {
        self.conn.execute(
            &format!(
                "INSERT INTO executions ({COLUMNS}, status, owner)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20)
                 ON CONFLICT (id) DO UPDATE SET
                     source_hash = excluded.source_hash, output = excluded.output,
                     success = excluded.success, error = excluded.error,
                     finished_at = excluded.finished_at, duration_ms = excluded.duration_ms,
                     confinement = excluded.confinement, status = excluded.status"
            ),
            params![
                record.execution_id,
                record.parent_execution_id,
                record.skill,
                record.source_hash,
                record.side_effect,
                record.input.as_ref().map(Value::to_string),
                record.output.as_ref().map(Value::to_string),
                record.success,
                record.error,
                record.started_at,
                record.finished_at,
                record.duration_ms,
                record.chain,
                record.step,
                record.run_id,
                record.confinement.as_ref().map(Value::to_string),
                record.skill_version,
                record.caller,
                status,
                owner,
            ],
        )?;
        Ok(())
    }

    /// An execution by its id, or by a prefix of it that names only one.
    pub fn execution(&self, id: &str) -> Result<ExecutionRecord> {
        let found = self.executions_by_prefix(id, 2)?;
        // Ids have one length, so a whole id is never the prefix of another.
        match found.as_slice() {
            [one] if !id.is_empty() => Ok(one.clone()),
            [_, _] => Err(LedgerError::ExecutionAmbiguous(id.to_owned())),
            _ => Err(LedgerError::ExecutionNotFound(id.to_owned())),
        }
    }

    /// Up to `limit` executions whose ids start with `prefix`, by id.
    pub fn executions_by_prefix(&self, prefix: &str, limit: usize) -> Result<Vec<ExecutionRecord>> {
        let pattern = format!("{}%", prefix.replace(['%', '_'], ""));
        let mut stmt = self.conn.prepare(&format!(
            "SELECT {COLUMNS} FROM executions WHERE id LIKE ?1 ORDER BY id LIMIT ?2"
        ))?;
        let found = stmt
            .query_map(
                params![pattern, i64::try_from(limit).unwrap_or(i64::MAX)],
                row,
            )?
            .collect::<super::db::Result<Vec<_>>>()?;
        Ok(found)
    }

    /// A page of the executions that have ended, newest first, each with its key: the next
    /// page is the one `before` the last key. By key rather than offset, so that records
    /// added while someone pages do not shift the pages.
    pub fn finished_executions(
        &self,
        before: Option<i64>,
        limit: usize,
    ) -> Result<Vec<(i64, ExecutionRecord)>> {
        let mut stmt = self.conn.prepare(&format!(
            "SELECT rowid, {COLUMNS} FROM executions
             WHERE status <> 'running' AND (CAST(?1 AS BIGINT) IS NULL OR rowid < ?1)
             ORDER BY rowid DESC LIMIT ?2"
        ))?;
        let rows = stmt.query_map(
            params![before, i64::try_from(limit).unwrap_or(i64::MAX)],
            |r| Ok((r.get(0)?, row_from(r, 1)?)),
        )?;
        Ok(rows.collect::<super::db::Result<_>>()?)
    }

    /// The newest execution, if any.
    pub fn latest_execution(&self) -> Result<Option<ExecutionRecord>> {
        Ok(self
            .conn
            .query_row(
                &format!(
                    "SELECT {COLUMNS} FROM executions ORDER BY started_at DESC, rowid DESC LIMIT 1"
                ),
                [],
                row,
            )
            .optional()?)
    }

    /// Up to `limit` executions of `skill`, newest first, started before the execution
    /// `before` names (its start and id) when given: a page of them, read by key.
    pub fn skill_executions(
        &self,
        skill: &str,
        before: Option<(&str, &str)>,
        limit: usize,
    ) -> Result<Vec<ExecutionRecord>> {
        let mut stmt = self.conn.prepare(&skill_executions_sql())?;
        let (started, id) = before.unzip();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = stmt.query_map(params![skill, started, id, limit], row)?;
        Ok(rows.collect::<super::db::Result<_>>()?)
    }

    /// Every execution in the tree `id` belongs to: up to its root through the parents, then
    /// all descendants of the root, ordered by start time.
    pub fn execution_tree(&self, id: &str) -> Result<Vec<ExecutionRecord>> {
        let id = &self.execution(id)?.execution_id;
        let mut stmt = self.conn.prepare(&format!(
            "WITH RECURSIVE
                 up(id, parent) AS (
                     SELECT id, parent FROM executions WHERE id = ?1
                     UNION ALL SELECT e.id, e.parent FROM executions e JOIN up ON e.id = up.parent
                 ),
                 down(id) AS (
                     SELECT id FROM up WHERE parent IS NULL
                     UNION ALL SELECT e.id FROM executions e JOIN down ON e.parent = down.id
                 )
             SELECT {COLUMNS} FROM executions WHERE id IN (SELECT id FROM down)
             ORDER BY started_at, rowid"
        ))?;
        let rows = stmt.query_map([id], row)?;
        Ok(rows.collect::<super::db::Result<_>>()?)
    }
}
