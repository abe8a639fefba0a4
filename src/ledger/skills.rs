//! Skills in the ledger: proposals and every lifecycle transition, with who and which run.

use rusqlite::{OptionalExtension, TransactionBehavior, params};
use serde::Serialize;

use super::{Artifact, Ledger, LedgerError, keep_artifact, now};

type Result<T, E = LedgerError> = std::result::Result<T, E>;

pub struct NewSkill<'a> {
    pub name: &'a str,
    pub description: &'a str,
    pub side_effect: &'a str,
    pub spec: &'a Artifact,
    /// The proposal file, relative to the workspace: trust re-reads it.
    pub proposal_path: &'a str,
    pub initial_state: &'a str,
    pub actor: &'a str,
}

#[derive(Debug, Clone, Serialize)]
pub struct SkillRow {
    pub name: String,
    pub description: String,
    pub side_effect: String,
    pub spec_artifact: String,
    /// The proposal file, relative to the workspace; part of what trust vouches for.
    pub proposal_path: String,
    pub state: String,
    pub created_at: String,
    pub updated_at: String,
    /// The hash it was last promoted at, if it ever was.
    pub trusted_hash: Option<String>,
    /// The SKILL_TREE artifact kept at that promotion (see [`crate::skills::SkillTree`]); none
    /// for skills promoted before trees were kept.
    pub trusted_tree: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct TransitionRow {
    pub from_state: Option<String>,
    pub to_state: String,
    pub run_id: Option<i64>,
    pub node_id: Option<String>,
    pub actor: String,
    pub at: String,
    pub comment: Option<String>,
}

/// A trusted skill, as the registry lists it.
#[derive(Debug, Clone, Serialize)]
pub struct TrustedSkill {
    pub name: String,
    pub description: String,
    pub side_effect: String,
    pub spec_artifact: String,
    pub proposal_path: String,
    pub trusted_hash: String,
}

/// A transition that was recorded.
#[derive(Debug, Clone, Serialize)]
pub struct Transitioned {
    pub from: String,
    pub to: String,
}

impl Ledger {
    /// Records a proposal: its spec artifact, the skill in its initial state, and the first
    /// transition, in one transaction.
    pub fn propose_skill(&mut self, new: &NewSkill<'_>) -> Result<()> {
        let now = now();
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let exists: Option<String> = tx
            .query_row("SELECT name FROM skills WHERE name = ?1", [new.name], |r| {
                r.get(0)
            })
            .optional()?;
        if exists.is_some() {
            return Err(LedgerError::SkillExists(new.name.to_owned()));
        }
        keep_artifact(&tx, new.spec, &now)?;
        tx.execute(
            "INSERT INTO skills (name, description, side_effect, spec_artifact, proposal_path, state,
                                 created_at, updated_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?7)",
            params![
                new.name,
                new.description,
                new.side_effect,
                new.spec.sha256,
                new.proposal_path,
                new.initial_state,
                now
            ],
        )?;
        tx.execute(
            "INSERT INTO skill_transitions (skill, from_state, to_state, actor, at, comment)
             VALUES (?1, NULL, ?2, ?3, ?4, 'proposed')",
            params![new.name, new.initial_state, new.actor, now],
        )?;
        tx.commit()?;
        Ok(())
    }

    pub fn skill(&self, name: &str) -> Result<SkillRow> {
        self.conn
            .query_row(
                "SELECT name, description, side_effect, spec_artifact, proposal_path, state, created_at,
                        updated_at, trusted_hash, trusted_tree
                 FROM skills WHERE name = ?1",
                [name],
                |row| {
                    Ok(SkillRow {
                        name: row.get(0)?,
                        description: row.get(1)?,
                        side_effect: row.get(2)?,
                        spec_artifact: row.get(3)?,
                        proposal_path: row.get(4)?,
                        state: row.get(5)?,
                        created_at: row.get(6)?,
                        updated_at: row.get(7)?,
                        trusted_hash: row.get(8)?,
                        trusted_tree: row.get(9)?,
                    })
                },
            )
            .optional()?
            .ok_or_else(|| LedgerError::SkillNotFound(name.to_owned()))
    }

    /// Every transition of a skill, oldest first.
    pub fn skill_transitions(&self, name: &str) -> Result<Vec<TransitionRow>> {
        let mut stmt = self.conn.prepare(
            "SELECT from_state, to_state, run_id, node_id, actor, at, comment
             FROM skill_transitions WHERE skill = ?1 ORDER BY id",
        )?;
        let rows = stmt.query_map([name], |row| {
            Ok(TransitionRow {
                from_state: row.get(0)?,
                to_state: row.get(1)?,
                run_id: row.get(2)?,
                node_id: row.get(3)?,
                actor: row.get(4)?,
                at: row.get(5)?,
                comment: row.get(6)?,
            })
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Promotes a skill: `to` must be allowed from its state by `check`, and `current_hash` must
    /// equal the hash it was verified at. State, trusted hash, the promotion and the transition
    /// are written in one transaction.
    #[expect(
        clippy::too_many_arguments,
        reason = "one promotion's worth of facts, written together"
    )]
    pub fn promote_skill(
        &mut self,
        name: &str,
        to: &str,
        current_hash: &str,
        check: impl FnOnce(&str, &str) -> Result<(), String>,
        origin: (Option<i64>, Option<&str>),
        actor: &str,
        comment: Option<&str>,
        tree: &[Artifact],
    ) -> Result<Transitioned> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let (from, verified): (String, Option<String>) = tx
            .query_row(
                "SELECT state, verified_hash FROM skills WHERE name = ?1",
                [name],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?
            .ok_or_else(|| LedgerError::SkillNotFound(name.to_owned()))?;
        check(&from, to).map_err(LedgerError::TransitionRefused)?;
        match verified {
            None => {
                return Err(LedgerError::TransitionRefused(format!(
                    "`{name}` has no verified hash: no gate run passed for it"
                )));
            }
            Some(verified) if verified != current_hash => {
                return Err(LedgerError::TransitionRefused(format!(
                    "`{name}` changed since it was verified (verified {verified}, now {current_hash}); verify it again"
                )));
            }
            Some(_) => {}
        }
        let now = move_state(&tx, name, &from, to, origin, actor, comment)?;
        for artifact in tree {
            keep_artifact(&tx, artifact, &now)?;
        }
        tx.execute(
            "UPDATE skills SET trusted_hash = ?1, trusted_tree = ?2 WHERE name = ?3",
            params![current_hash, tree.first().map(|a| &a.sha256), name],
        )?;
        tx.execute(
            "INSERT INTO promotions (skill, from_state, to_state, source_hash, run_id, node_id, actor, at, comment)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            params![name, from, to, current_hash, origin.0, origin.1, actor, now, comment],
        )?;
        tx.commit()?;
        Ok(Transitioned {
            from,
            to: to.to_owned(),
        })
    }

    /// Skills with a trusted hash in the given state (TRUSTED), by name.
    pub fn trusted_skills(&self, state: &str) -> Result<Vec<TrustedSkill>> {
        let mut stmt = self.conn.prepare(
            "SELECT name, description, side_effect, spec_artifact, proposal_path, trusted_hash
             FROM skills WHERE state = ?1 AND trusted_hash IS NOT NULL ORDER BY name",
        )?;
        let rows = stmt.query_map([state], |row| {
            Ok(TrustedSkill {
                name: row.get(0)?,
                description: row.get(1)?,
                side_effect: row.get(2)?,
                spec_artifact: row.get(3)?,
                proposal_path: row.get(4)?,
                trusted_hash: row.get(5)?,
            })
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Moves a skill to `to` if `check(from, to)` allows it. Reading the current state, checking
    /// and writing happen in one transaction, so two runs cannot both move the same state.
    pub fn transition_skill(
        &mut self,
        name: &str,
        to: &str,
        check: impl FnOnce(&str, &str) -> Result<(), String>,
        origin: (Option<i64>, Option<&str>),
        actor: &str,
        comment: Option<&str>,
    ) -> Result<Transitioned> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let from: String = tx
            .query_row("SELECT state FROM skills WHERE name = ?1", [name], |r| {
                r.get(0)
            })
            .optional()?
            .ok_or_else(|| LedgerError::SkillNotFound(name.to_owned()))?;
        check(&from, to).map_err(LedgerError::TransitionRefused)?;
        move_state(&tx, name, &from, to, origin, actor, comment)?;
        tx.commit()?;
        Ok(Transitioned {
            from,
            to: to.to_owned(),
        })
    }
}

/// Moves a skill's state and records the transition, inside the caller's transaction. Returns
/// the time it recorded.
fn move_state(
    tx: &rusqlite::Transaction<'_>,
    name: &str,
    from: &str,
    to: &str,
    origin: (Option<i64>, Option<&str>),
    actor: &str,
    comment: Option<&str>,
) -> Result<String> {
    let now = now();
    tx.execute(
        "UPDATE skills SET state = ?1, updated_at = ?2 WHERE name = ?3",
        params![to, now, name],
    )?;
    tx.execute(
        "INSERT INTO skill_transitions (skill, from_state, to_state, run_id, node_id, actor, at, comment)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        params![name, from, to, origin.0, origin.1, actor, now, comment],
    )?;
    Ok(now)
}
