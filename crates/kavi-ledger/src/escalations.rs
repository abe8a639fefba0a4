//! Escalations: a run stopped for a person's decision, and the decision (who, when, what).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::db::{OptionalExtension, params};
use super::{Ledger, LedgerError, now};

/// The trigger of an escalation that asks for a lifecycle move.
pub const APPROVAL: &str = "APPROVAL";

/// One approval as the ledger keeps it: who gave it and the roles they held then.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedApproval {
    pub actor: String,
    pub roles: Vec<String>,
    /// `ed25519:<hex>`: the giver's own key's signature of what they approved, where the roles
    /// pin keys (`[keys]` in `policies/roles.toml`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
}

type Result<T, E = LedgerError> = std::result::Result<T, E>;

/// Whether `approval` is to be added to `approvals`: when its giver has given none yet, or gave
/// one with another signature (then removed: written by someone else under their name, it gives
/// way to their own). The same account approving again adds nothing.
fn give_way(approvals: &mut Vec<RecordedApproval>, approval: &RecordedApproval) -> bool {
    let before = approvals.len();
    approvals.retain(|a| a.actor != approval.actor || a.signature == approval.signature);
    approvals.len() < before || !approvals.iter().any(|a| a.actor == approval.actor)
}

#[derive(Debug, Clone, Serialize)]
pub struct EscalationRow {
    pub id: i64,
    pub skill: String,
    pub run_id: i64,
    pub node_id: String,
    pub triggers: Value,
    pub status: String,
    pub raised_at: String,
    pub decided_by: Option<String>,
    pub decided_at: Option<String>,
    pub comment: Option<String>,
    /// The spec hash of the escalation rules that raised it.
    pub policy: Option<String>,
    /// Each approval given so far, with the roles its giver held then.
    pub approvals: Vec<RecordedApproval>,
}

fn row(r: &super::db::Row) -> super::db::Result<EscalationRow> {
    Ok(EscalationRow {
        id: r.get(0)?,
        skill: r.get(1)?,
        run_id: r.get(2)?,
        node_id: r.get(3)?,
        triggers: super::json_column(r, 4)?.unwrap_or(Value::Null),
        status: r.get(5)?,
        raised_at: r.get(6)?,
        decided_by: r.get(7)?,
        decided_at: r.get(8)?,
        comment: r.get(9)?,
        policy: r.get(10)?,
        approvals: super::json_column(r, 11)?
            .and_then(|v| serde_json::from_value(v).ok())
            .unwrap_or_default(),
    })
}

/// `tree`: run `?1` and every run below it.
pub(super) const RUN_TREE: &str = "WITH RECURSIVE tree(id) AS (
        SELECT id FROM runs WHERE id = ?1
        UNION ALL SELECT runs.id FROM runs JOIN tree ON runs.parent_run = tree.id
    )";

const COLUMNS: &str = "id, skill, run_id, node_id, triggers, status, raised_at, decided_by, decided_at, comment, \
     policy, approvals";

impl Ledger {
    pub fn raise_escalation(
        &mut self,
        skill: &str,
        run_id: i64,
        node_id: &str,
        triggers: &Value,
        policy: Option<&str>,
    ) -> Result<i64> {
        Ok(self.conn.query_row(
            "INSERT INTO escalations (skill, run_id, node_id, triggers, status, raised_at, policy)
             VALUES (?1, ?2, ?3, ?4, 'pending', ?5, ?6) RETURNING id",
            params![skill, run_id, node_id, triggers.to_string(), now(), policy],
            |row| row.get(0),
        )?)
    }

    /// The files the `copy_back` nodes of run `run_id` and its child runs wrote, as (target
    /// folder, path relative to it).
    pub fn copied_back(&self, run_id: i64) -> Result<Vec<(String, String)>> {
        let mut stmt = self.conn.prepare(&format!(
            "{RUN_TREE}
             SELECT outputs FROM node_runs
             WHERE run_id IN (SELECT id FROM tree) AND kind = 'copy_back' AND state = 'succeeded'"
        ))?;
        let outputs = stmt
            .query_map([run_id], |r| super::json_column(r, 0))?
            .collect::<super::db::Result<Vec<_>>>()?;
        let mut paths: Vec<(String, String)> = outputs
            .into_iter()
            .flatten()
            .flat_map(|o| {
                let target = o["target"].as_str().unwrap_or_default().to_owned();
                o["copied"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|p| p.as_str().map(|p| (target.clone(), p.to_owned())))
                    .collect::<Vec<_>>()
            })
            .collect();
        paths.sort();
        paths.dedup();
        Ok(paths)
    }

    /// The newest escalation of a skill, whatever its status.
    pub fn latest_escalation(&self, skill: &str) -> Result<Option<EscalationRow>> {
        Ok(self
            .conn
            .query_row(
                &format!(
                    "SELECT {COLUMNS} FROM escalations WHERE skill = ?1 ORDER BY id DESC LIMIT 1"
                ),
                [skill],
                row,
            )
            .optional()?)
    }

    /// The escalations awaiting a decision in run `run_id` and every run below it.
    pub fn pending_escalations(&self, run_id: i64) -> Result<Vec<EscalationRow>> {
        let mut stmt = self.conn.prepare(&format!(
            "{RUN_TREE}
             SELECT {COLUMNS} FROM escalations
             WHERE run_id IN (SELECT id FROM tree) AND status = 'pending' ORDER BY id"
        ))?;
        Ok(stmt
            .query_map([run_id], row)?
            .collect::<super::db::Result<Vec<_>>>()?)
    }

    /// Adds the approval `approval_of` makes for each pending escalation of run `run_id` and
    /// its child runs (signed for that escalation, where the roles pin keys). Once per account:
    /// an account's approval stays, unless the new one carries another signature (an approval
    /// written under its name by someone else gives way to its own). Returns them as they are
    /// now.
    pub fn add_escalation_approval(
        &mut self,
        run_id: i64,
        approval_of: impl Fn(&EscalationRow) -> RecordedApproval,
    ) -> Result<Vec<EscalationRow>> {
        let tx = self.conn.transaction()?;
        let pending = {
            let mut stmt = tx.prepare(&format!(
                "{RUN_TREE}
                 SELECT {COLUMNS} FROM escalations
                 WHERE run_id IN (SELECT id FROM tree) AND status = 'pending' ORDER BY id"
            ))?;
            stmt.query_map([run_id], row)?
                .collect::<super::db::Result<Vec<_>>>()?
        };
        let mut updated = Vec::with_capacity(pending.len());
        for mut escalation in pending {
            let approval = approval_of(&escalation);
            if give_way(&mut escalation.approvals, &approval) {
                escalation.approvals.push(approval);
                let approvals =
                    serde_json::to_string(&escalation.approvals).expect("approvals serialize");
                tx.execute(
                    "UPDATE escalations SET approvals = ?2 WHERE id = ?1",
                    params![escalation.id, approvals],
                )?;
            }
            updated.push(escalation);
        }
        tx.commit()?;
        Ok(updated)
    }

    /// Adds `approval` to the approvals kept on the APPROVAL trigger of the pending escalation
    /// `escalation` that asks for the move `from -> to` (each with the account and the roles it
    /// held), read and written in one transaction so that approvals given at the same moment are
    /// all kept. Returns every approval given so far, or `None` when the account had already
    /// approved the move.
    pub fn add_move_approval(
        &mut self,
        escalation: i64,
        (from, to): (&str, &str),
        approval: &RecordedApproval,
    ) -> Result<Option<Vec<RecordedApproval>>> {
        let tx = self.conn.transaction()?;
        let row = tx
            .query_row(
                &format!("SELECT {COLUMNS} FROM escalations WHERE id = ?1 AND status = 'pending'"),
                [escalation],
                row,
            )
            .optional()?
            .ok_or(LedgerError::NothingToDecide(escalation))?;
        let mut triggers = row.triggers;
        let mut given = None;
        for t in triggers.as_array_mut().into_iter().flatten() {
            if t["trigger"] == APPROVAL && t["from"] == from && t["to"] == to {
                let mut approvals: Vec<RecordedApproval> =
                    serde_json::from_value(t["approvals"].clone()).unwrap_or_default();
                if !give_way(&mut approvals, approval) {
                    return Ok(None);
                }
                approvals.push(approval.clone());
                t["approvals"] = serde_json::json!(approvals);
                given = Some(approvals);
            }
        }
        let Some(given) = given else {
            return Err(LedgerError::NothingToDecide(row.run_id));
        };
        tx.execute(
            "UPDATE escalations SET triggers = ?2 WHERE id = ?1",
            params![escalation, triggers.to_string()],
        )?;
        tx.commit()?;
        Ok(Some(given))
    }

    /// Records `actor`'s approval of the pending escalation `escalation` and, in the same
    /// transaction, raises the next one for its run and node with `triggers`: the next move on
    /// the way to TRUSTED that needs an approval. The run keeps awaiting review.
    pub fn pass_on_escalation(
        &mut self,
        escalation: &EscalationRow,
        actor: &str,
        comment: Option<&str>,
        triggers: &Value,
    ) -> Result<i64> {
        let tx = self.conn.transaction()?;
        let now = now();
        let changed = tx.execute(
            "UPDATE escalations SET status = 'approved', decided_by = ?2, decided_at = ?3,
                 comment = ?4
             WHERE id = ?1 AND status = 'pending'",
            params![escalation.id, actor, now, comment],
        )?;
        if changed == 0 {
            return Err(LedgerError::NothingToDecide(escalation.run_id));
        }
        let id = tx.query_row(
            "INSERT INTO escalations (skill, run_id, node_id, triggers, status, raised_at, policy)
             VALUES (?1, ?2, ?3, ?4, 'pending', ?5, ?6) RETURNING id",
            params![
                escalation.skill,
                escalation.run_id,
                escalation.node_id,
                triggers.to_string(),
                now,
                escalation.policy
            ],
            |row| row.get(0),
        )?;
        tx.commit()?;
        Ok(id)
    }

    /// Records a decision on every pending escalation of a run and of its child runs (a forge
    /// attempt escalates in a child run). Returns the escalations decided; none pending is an
    /// error that says so.
    pub fn decide_escalations(
        &mut self,
        run_id: i64,
        approve: bool,
        actor: &str,
        comment: Option<&str>,
    ) -> Result<Vec<EscalationRow>> {
        let tx = self.conn.transaction()?;
        let decided = decide_in(&tx, run_id, approve, actor, comment)?;
        tx.commit()?;
        Ok(decided)
    }
}

/// [`Ledger::decide_escalations`], inside the caller's transaction.
pub(super) fn decide_in(
    tx: &super::db::Transaction<'_>,
    run_id: i64,
    approve: bool,
    actor: &str,
    comment: Option<&str>,
) -> Result<Vec<EscalationRow>> {
    let now = now();
    let status = if approve { "approved" } else { "rejected" };
    let changed = tx.execute(
        &format!(
            "{RUN_TREE}
             UPDATE escalations SET status = ?2, decided_by = ?3, decided_at = ?4, comment = ?5
             WHERE run_id IN (SELECT id FROM tree) AND status = 'pending'"
        ),
        params![run_id, status, actor, now, comment],
    )?;
    if changed == 0 {
        return Err(LedgerError::NothingToDecide(run_id));
    }
    tx.execute(
        &format!(
            "{RUN_TREE}
             UPDATE runs SET status = ?2
             WHERE id IN (SELECT id FROM tree) AND status = 'awaiting_review'"
        ),
        params![run_id, status],
    )?;
    let decided = {
        let mut stmt = tx.prepare(&format!(
            "{RUN_TREE}
             SELECT {COLUMNS} FROM escalations
             WHERE run_id IN (SELECT id FROM tree) AND decided_at = ?2 ORDER BY id"
        ))?;
        stmt.query_map(params![run_id, now], row)?
            .collect::<super::db::Result<Vec<_>>>()?
    };
    Ok(decided)
}
