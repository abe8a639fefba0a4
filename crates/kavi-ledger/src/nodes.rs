//! Node runs: a node run's start and end (its outputs, artifacts and key), and the order a run's
//! node runs are read back in.

use std::collections::HashMap;
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

use super::db::{OptionalExtension, params};
use super::{Artifact, CacheRecord, Ledger, Result, cache, keep_artifact, now};
use kavi_foundation::state::NodeState;

/// A run's node runs, read in the order they were recorded, grouped by node: each node where
/// it was first recorded (its pending row, in declaration order), its attempts in order. Grouped
/// here rather than by the query: SQLite's window function for it took 3.4 ms of a 1,000-node
/// run, this takes a pass over rows that are, without retries, already in order.
pub(crate) fn by_node(rows: Vec<NodeRunRow>) -> Vec<NodeRunRow> {
    let mut first_seen: HashMap<&str, usize> = HashMap::new();
    let keys: Vec<(usize, i64)> = rows
        .iter()
        .map(|row| {
            let next = first_seen.len();
            (*first_seen.entry(&row.node_id).or_insert(next), row.attempt)
        })
        .collect();
    let mut keyed: Vec<_> = keys.into_iter().zip(rows).collect();
    keyed.sort_by_key(|(key, _)| *key);
    keyed.into_iter().map(|(_, row)| row).collect()
}

/// How a node run ended, as the ledger stores it.
#[derive(Debug, Default)]
pub struct NodeRecord {
    pub exit_code: Option<i32>,
    pub outputs: Option<Value>,
    pub error: Option<String>,
    pub reason: Option<String>,
    pub duration: Option<Duration>,
    pub artifacts: Vec<(&'static str, Artifact)>,
    /// The node run whose outputs and artifacts this one reuses (`kavi runs resume`).
    pub reused_from: Option<i64>,
    /// The node's key, for a node that declares its inputs.
    pub cache: Option<CacheRecord>,
    /// When the node started, for a first attempt whose start was never written on its own
    /// (see `executor::recorder`): its pending row goes straight to how it ended.
    pub started_at: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct NodeRunRow {
    /// The node run's own id: what a later `reused_from` names.
    pub id: i64,
    pub node_id: String,
    pub kind: String,
    pub state: NodeState,
    pub attempt: i64,
    pub started_at: Option<String>,
    pub finished_at: Option<String>,
    pub duration_ms: Option<i64>,
    pub exit_code: Option<i64>,
    pub outputs: Option<Value>,
    pub error: Option<String>,
    pub reason: Option<String>,
    pub artifacts: Vec<NodeArtifact>,
    /// For a `reused` node run, the node run it took its outputs from.
    pub reused_from: Option<i64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct NodeArtifact {
    pub role: String,
    pub sha256: String,
    pub kind: String,
    pub size: i64,
    pub path: String,
}

/// The last attempt of each node. The ledger lists a node's attempts together, in order, so the
/// last row of each group is the final one.
pub fn final_attempts(nodes: &[NodeRunRow]) -> Vec<&NodeRunRow> {
    nodes
        .iter()
        .enumerate()
        .filter(|(i, n)| {
            nodes
                .get(i + 1)
                .is_none_or(|next| next.node_id != n.node_id)
        })
        .map(|(_, n)| n)
        .collect()
}

pub(crate) fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

impl Ledger {
    /// Marks a node run as running since `started_at`. Attempt 1 reuses the pending row; a retry
    /// adds a row.
    pub fn start_node(
        &self,
        run_id: i64,
        node_id: &str,
        kind: &str,
        attempt: u32,
        started_at: &str,
    ) -> Result<()> {
        self.conn
            .prepare_cached(
                "INSERT INTO node_runs (run_id, node_id, kind, state, attempt, started_at, governing_hash)
             VALUES (?1, ?2, ?3, 'running', ?4, ?5, (SELECT governing_hash FROM runs WHERE id = ?1))
             ON CONFLICT (run_id, node_id, attempt)
             DO UPDATE SET state = 'running', started_at = excluded.started_at, reason = NULL",
            )?
            .execute(params![run_id, node_id, kind, attempt, started_at])?;
        Ok(())
    }

    /// Adds a pending node run to a run that has begun: an instance of a node that runs once
    /// per item, known only once its items are.
    pub fn add_node(&self, run_id: i64, node_id: &str, kind: &str) -> Result<()> {
        self.conn
            .prepare_cached(
                "INSERT INTO node_runs (run_id, node_id, kind, state, attempt, governing_hash)
             VALUES (?1, ?2, ?3, 'pending', 1, (SELECT governing_hash FROM runs WHERE id = ?1))",
            )?
            .execute(params![run_id, node_id, kind])?;
        Ok(())
    }

    /// Records why an attempt that has not started waits (its concurrency group is full), on
    /// its pending row, added for a retry that has none yet; its start clears it.
    pub fn note_waiting(
        &self,
        run_id: i64,
        node_id: &str,
        kind: &str,
        attempt: u32,
        reason: &str,
    ) -> Result<()> {
        self.conn
            .prepare_cached(
                "INSERT INTO node_runs (run_id, node_id, kind, state, attempt, reason, governing_hash)
             VALUES (?1, ?2, ?3, 'pending', ?4, ?5, (SELECT governing_hash FROM runs WHERE id = ?1))
             ON CONFLICT (run_id, node_id, attempt)
             DO UPDATE SET reason = excluded.reason WHERE node_runs.state = 'pending'",
            )?
            .execute(params![run_id, node_id, kind, attempt, reason])?;
        Ok(())
    }

    /// Records how a node run ended, with its artifacts, atomically: in a transaction of its
    /// own, or inside the open batch as part of it (a failure then spoils the whole batch,
    /// which the caller rolls back).
    pub fn finish_node(
        &mut self,
        run_id: i64,
        node_id: &str,
        attempt: u32,
        state: NodeState,
        record: &NodeRecord,
    ) -> Result<()> {
        let own_transaction = self.conn.is_autocommit();
        self.begin_batch()?;
        let result = self.write_node_end(run_id, node_id, attempt, state, record);
        if own_transaction {
            match &result {
                Ok(()) => self.commit_batch()?,
                Err(_) => self.rollback_batch(),
            }
        }
        result
    }

    fn write_node_end(
        &self,
        run_id: i64,
        node_id: &str,
        attempt: u32,
        state: NodeState,
        record: &NodeRecord,
    ) -> Result<()> {
        let conn = &self.conn;
        let node_run_id: Option<i64> = conn.prepare_cached(
            "UPDATE node_runs SET state = ?1, finished_at = ?2, duration_ms = ?3, exit_code = ?4,
                    outputs = ?5, error = ?6, reason = ?7, reused_from = ?11,
                    started_at = COALESCE(?12, started_at)
             WHERE run_id = ?8 AND node_id = ?9 AND attempt = ?10
               AND state IN ('pending', 'running')
             RETURNING id",
        )?
        .query_row(
            params![
                state.as_str(),
                now(),
                record.duration.map(millis),
                record.exit_code,
                record.outputs.as_ref().map(Value::to_string),
                record.error.as_deref(),
                record.reason.as_deref(),
                run_id,
                node_id,
                attempt,
                record.reused_from,
                record.started_at.as_deref()
            ],
            |row| row.get(0),
        )
        .optional()?;
        let Some(node_run_id) = node_run_id else {
            // An attempt ends once: a second completion (a step run twice, a step whose claim
            // another took over when its lease ran out) leaves the decided one as it is.
            let decided: String = conn
                .prepare_cached(
                    "SELECT state FROM node_runs WHERE run_id = ?1 AND node_id = ?2 AND attempt = ?3",
                )?
                .query_row(params![run_id, node_id, attempt], |row| row.get(0))?;
            tracing::warn!(
                run_id,
                node_id,
                attempt,
                refused = state.as_str(),
                decided,
                "the attempt was decided already: this end of it is not recorded"
            );
            return Ok(());
        };
        if let Some(cache) = &record.cache {
            cache::record(conn, node_run_id, cache)?;
        }
        if let Some(reused) = record
            .reused_from
            .or(record.cache.as_ref().and_then(|c| c.source))
        {
            conn.prepare_cached(
                "INSERT INTO node_run_artifacts (node_run_id, role, sha256)
                 SELECT ?1, role, sha256 FROM node_run_artifacts WHERE node_run_id = ?2",
            )?
            .execute(params![node_run_id, reused])?;
        }
        for (role, artifact) in &record.artifacts {
            keep_artifact(conn, artifact, &now())?;
            conn.prepare_cached(
                "INSERT INTO node_run_artifacts (node_run_id, role, sha256) VALUES (?1, ?2, ?3)",
            )?
            .execute(params![node_run_id, role, artifact.sha256])?;
        }
        Ok(())
    }
}
