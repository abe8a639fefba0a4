//! Verifications in the ledger: one row per gate result, with the report they belong to.

use super::db::params;
use serde::Serialize;
use serde_json::Value;

use super::{Artifact, Ledger, LedgerError, keep_artifact, now};

/// The result of one gate.
#[derive(Debug, Clone, Serialize)]
pub struct GateResult {
    pub gate: String,
    pub kind: String,
    pub required: bool,
    /// `passed`, `failed`, `timed_out`, `error` (the gate could not run: a missing tool is an
    /// error), or `void` (it passed over files Python reads otherwise than the tools do).
    pub status: String,
    pub failure_kind: Option<String>,
    pub detail: Option<String>,
    /// For a gate that ran a toolchain's tool: the toolchain, the tool and its version, the
    /// declaration's hash, and whether kavi provisioned the environment or kavi.toml named it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool: Option<serde_json::Value>,
    /// What the gate saw besides its verdict: the suppressions the gate set allowed and found,
    /// a test report's counts, for a command gate with the network the connections kavi's proxy
    /// allowed and refused (`network`). In the verification report and the node's outputs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub evidence: Option<serde_json::Value>,
}

#[derive(Debug, Clone, Serialize)]
pub struct VerificationRow {
    pub run_id: i64,
    pub node_id: String,
    pub skill: Option<String>,
    pub source_hash: Option<String>,
    #[serde(flatten)]
    pub result: GateResult,
    pub report: Option<String>,
    pub at: String,
}

const VERIFICATION_COLUMNS: &str = "run_id, node_id, skill, gate_id, gate_kind, required, status, \
    failure_kind, detail, report, at, source_hash, tool, id";

fn verification_row(row: &super::db::Row) -> super::db::Result<(i64, VerificationRow)> {
    let verification = VerificationRow {
        run_id: row.get(0)?,
        node_id: row.get(1)?,
        skill: row.get(2)?,
        result: GateResult {
            gate: row.get(3)?,
            kind: row.get(4)?,
            required: row.get(5)?,
            status: row.get(6)?,
            failure_kind: row.get(7)?,
            detail: row.get(8)?,
            tool: super::json_column(row, 12)?,
            evidence: None,
        },
        report: row.get(9)?,
        at: row.get(10)?,
        source_hash: row.get(11)?,
    };
    Ok((row.get(13)?, verification))
}

/// A page of a skill's gate results, newest first, older than `?2` when it is not NULL: a seek
/// on `verifications_skill` (its entries are in id order within a skill), however deep.
pub(crate) fn skill_verifications_sql() -> String {
    format!(
        "SELECT {VERIFICATION_COLUMNS} FROM verifications
         WHERE skill = ?1 AND id < coalesce(CAST(?2 AS BIGINT), 9223372036854775807)
         ORDER BY id DESC LIMIT ?3"
    )
}

/// The tools of a skill's latest verifying run: both lookups on `verifications_skill_run`.
pub(crate) const LATEST_TOOLCHAINS: &str = "SELECT tool FROM verifications
     WHERE skill = ?1 AND tool IS NOT NULL
       AND run_id = (SELECT max(run_id) FROM verifications WHERE skill = ?1)
     ORDER BY id";

impl Ledger {
    /// Records a gate set's results and their report, in one transaction. When every required
    /// gate passed, `source_hash` becomes the skill's verified hash: the only hash it may be
    /// promoted at.
    #[expect(
        clippy::too_many_arguments,
        reason = "one row's worth of facts, written together"
    )]
    pub fn record_verifications(
        &mut self,
        run_id: i64,
        node_id: &str,
        skill: Option<&str>,
        source_hash: Option<&str>,
        passed: bool,
        results: &[GateResult],
        report: &Artifact,
    ) -> Result<(), LedgerError> {
        let now = now();
        let tx = self.conn.transaction()?;
        keep_artifact(&tx, report, &now)?;
        for r in results {
            tx.execute(
                "INSERT INTO verifications (run_id, node_id, skill, gate_id, gate_kind, required, status,
                                            failure_kind, detail, report, at, source_hash, tool)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
                params![
                    run_id,
                    node_id,
                    skill,
                    r.gate,
                    r.kind,
                    r.required,
                    r.status,
                    r.failure_kind,
                    r.detail,
                    report.sha256,
                    now,
                    source_hash,
                    r.tool.as_ref().map(serde_json::Value::to_string)
                ],
            )?;
        }
        if let (Some(skill), Some(hash), true) = (skill, source_hash, passed) {
            tx.execute(
                "UPDATE skills SET verified_hash = ?1 WHERE name = ?2",
                params![hash, skill],
            )?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Every gate result recorded by a run, in the order recorded.
    pub fn verifications(&self, run_id: i64) -> Result<Vec<VerificationRow>, LedgerError> {
        let mut stmt = self.conn.prepare(&format!(
            "SELECT {VERIFICATION_COLUMNS} FROM verifications WHERE run_id = ?1 ORDER BY id"
        ))?;
        let rows = stmt.query_map([run_id], |row| verification_row(row).map(|(_, v)| v))?;
        Ok(rows.collect::<super::db::Result<_>>()?)
    }

    /// Up to `limit` gate results of `skill`, newest first, each with its id, older than id
    /// `before` when given: a page of them, read by key.
    pub fn skill_verifications(
        &self,
        skill: &str,
        before: Option<i64>,
        limit: usize,
    ) -> Result<Vec<(i64, VerificationRow)>, LedgerError> {
        let mut stmt = self.conn.prepare(&skill_verifications_sql())?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = stmt.query_map(params![skill, before, limit], verification_row)?;
        Ok(rows.collect::<super::db::Result<_>>()?)
    }

    /// The toolchains the skill's latest verification ran its tools from, one each: toolchain,
    /// declaration hash and the hash of the locked set it was installed from.
    pub fn latest_toolchains(&self, skill: &str) -> Result<Vec<Value>, LedgerError> {
        let mut stmt = self.conn.prepare(LATEST_TOOLCHAINS)?;
        let rows = stmt.query_map([skill], |row| super::json_column(row, 0))?;
        let mut seen = Vec::new();
        for tool in rows {
            let Some(tool) = tool? else { continue };
            let entry = serde_json::json!({
                "toolchain": tool["toolchain"],
                "hash": tool["hash"],
                "lock": tool["lock"],
            });
            if !seen.contains(&entry) {
                seen.push(entry);
            }
        }
        Ok(seen)
    }

    /// The gate set runs in which every required gate passed `skill` at `source_hash`: each
    /// run, node and the report it wrote, newest first.
    pub fn passing_gate_runs(
        &self,
        skill: &str,
        source_hash: &str,
    ) -> Result<Vec<(i64, String, Option<String>)>, LedgerError> {
        let mut stmt = self.conn.prepare(
            "SELECT run_id, node_id, max(report) FROM verifications
             WHERE skill = ?1 AND source_hash = ?2
             GROUP BY run_id, node_id
             HAVING sum(CASE WHEN required <> 0 AND status <> 'passed' THEN 1 ELSE 0 END) = 0
             ORDER BY max(id) DESC",
        )?;
        let rows = stmt.query_map(params![skill, source_hash], |row| {
            Ok((row.get(0)?, row.get(1)?, row.get(2)?))
        })?;
        Ok(rows.collect::<super::db::Result<_>>()?)
    }
}
