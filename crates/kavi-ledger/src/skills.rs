//! Skills in the ledger: proposals and every lifecycle transition, with who and which run.

use super::db::{OptionalExtension, params};
use serde::Serialize;

use super::{Artifact, Evidence, Ledger, LedgerError, keep_artifact, now};

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
    /// The SKILL_TREE artifact kept at that promotion (the `kavi` crate's `skills::SkillTree`); none
    /// for skills promoted before trees were kept.
    pub trusted_tree: Option<String>,
    /// The newest version: the one `state`, `spec_artifact` and the working files describe.
    pub version: i64,
    /// When that version was proposed.
    pub version_proposed_at: String,
    /// The version that runs, if one may: it differs from `version` while a new version of a
    /// trusted skill is forged.
    pub trusted_version: Option<i64>,
    /// The rule set that was adopted when that version was promoted.
    pub trusted_rules: Option<i64>,
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

/// A promotion as recorded: what an attestation of it says.
#[derive(Debug, Clone, Serialize)]
pub struct PromotionRow {
    pub id: i64,
    pub skill: String,
    pub from_state: String,
    pub to_state: String,
    pub source_hash: String,
    pub run_id: Option<i64>,
    pub node_id: Option<String>,
    pub actor: String,
    pub at: String,
    pub comment: Option<String>,
    /// The version promoted; none for promotions recorded before versions.
    pub version: Option<i64>,
    /// When that version was proposed: its moves are those from then to the promotion.
    pub version_proposed_at: Option<String>,
    /// Its ATTESTATION artifact, if one was made.
    pub attestation: Option<String>,
}

/// A skill with a version that runs, as the registry lists it: its trusted version's facts.
#[derive(Debug, Clone, Serialize)]
pub struct TrustedSkill {
    pub name: String,
    pub description: String,
    pub side_effect: String,
    /// The spec of the trusted version.
    pub spec_artifact: String,
    pub proposal_path: String,
    pub trusted_hash: String,
    pub version: i64,
    /// The SKILL_TREE kept when this version was promoted.
    #[serde(skip)]
    pub trusted_tree: Option<String>,
    /// A newer version being forged, if any: the trusted version then runs from its kept tree,
    /// since the working files are the new version's. Not in the registry, which is rewritten
    /// on moves into and out of TRUSTED only.
    #[serde(skip)]
    pub newer_version: Option<i64>,
}

/// A transition that was recorded.
#[derive(Debug, Clone, Serialize)]
pub struct Transitioned {
    pub from: String,
    pub to: String,
}

const SKILL_SELECT: &str = "SELECT s.name, s.description, s.side_effect, s.spec_artifact, \
    s.proposal_path, s.state, s.created_at, s.updated_at, s.trusted_hash, s.trusted_tree, s.version, \
    s.trusted_version, v.proposed_at, s.trusted_rules \
    FROM skills s JOIN skill_versions v ON v.skill = s.name AND v.version = s.version";

/// A page of the skills by name, after `?1` when it is not NULL: a seek on the names' key (no
/// name is empty), however deep.
pub(crate) fn skills_page_sql() -> String {
    format!("{SKILL_SELECT} WHERE s.name > coalesce(CAST(?1 AS TEXT), '') ORDER BY s.name LIMIT ?2")
}

/// Every lifecycle move of a skill, oldest first.
pub(crate) const SKILL_TRANSITIONS: &str = "SELECT from_state, to_state, run_id, node_id, actor, \
    at, comment FROM skill_transitions WHERE skill = ?1 ORDER BY id";

fn skill_row(row: &super::db::Row) -> super::db::Result<SkillRow> {
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
        version: row.get(10)?,
        trusted_version: row.get(11)?,
        version_proposed_at: row.get(12)?,
        trusted_rules: row.get(13)?,
    })
}

impl Ledger {
    /// Records a proposal: its spec artifact, the skill in its initial state, and the first
    /// transition, in one transaction.
    pub fn propose_skill(&mut self, new: &NewSkill<'_>) -> Result<()> {
        let now = now();
        let tx = self.conn.transaction()?;
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
        keep_version(&tx, new, 1, &now)?;
        tx.commit()?;
        Ok(())
    }

    /// Records a new version of a skill from a changed proposal: the skill must have a trusted
    /// version and be in one of `from_states` (TRUSTED, or suspended for drift), and
    /// `check(from, new.initial_state)` must allow the move. The trusted version stays trusted
    /// (and runs, from the files kept at its promotion) until the new one is promoted. Returns
    /// the new version.
    pub fn propose_version(
        &mut self,
        new: &NewSkill<'_>,
        from_states: &[&str],
        check: impl FnOnce(&str, &str) -> Result<(), String>,
    ) -> Result<i64> {
        let tx = self.conn.transaction()?;
        let Standing {
            state: from,
            trusted_version: trusted,
            ..
        } = standing_of(&tx, new.name)?;
        // Numbers are never reused: a version that was rejected keeps its number.
        let next: i64 = tx.query_row(
            "SELECT COALESCE(MAX(version), 0) + 1 FROM skill_versions WHERE skill = ?1",
            [new.name],
            |r| r.get(0),
        )?;
        let Some(trusted) = trusted.filter(|_| from_states.contains(&from.as_str())) else {
            return Err(LedgerError::TransitionRefused(format!(
                "`{}` is {from}: a new version starts from a skill with a trusted version that \
                 is {}",
                new.name,
                from_states.join(" or ")
            )));
        };
        check(&from, new.initial_state).map_err(LedgerError::TransitionRefused)?;
        let comment = format!("version {} proposed; version {trusted} stays trusted", next);
        let now = move_state(
            &tx,
            new.name,
            &from,
            new.initial_state,
            (None, None),
            new.actor,
            Some(&comment),
        )?;
        keep_artifact(&tx, new.spec, &now)?;
        tx.execute(
            "UPDATE skills SET version = ?1, spec_artifact = ?2, description = ?3, side_effect = ?4,
                               verified_hash = NULL
             WHERE name = ?5",
            params![
                next,
                new.spec.sha256,
                new.description,
                new.side_effect,
                new.name
            ],
        )?;
        keep_version(&tx, new, next, &now)?;
        tx.commit()?;
        Ok(next)
    }

    /// Gives up the newest version of a skill whose trusted version is older: `check(from, to)`
    /// must allow the move to the lifecycle's `rejected` state `to`, and the skill then returns
    /// to its trusted version, in `trusted_state`, recorded as one transition. Returns the
    /// version it returned to.
    #[expect(
        clippy::too_many_arguments,
        reason = "one rejection's worth of facts, written together"
    )]
    pub fn abandon_version(
        &mut self,
        name: &str,
        to: &str,
        trusted_state: &str,
        check: impl FnOnce(&str, &str) -> Result<(), String>,
        origin: (Option<i64>, Option<&str>),
        actor: &str,
        comment: &str,
    ) -> Result<i64> {
        let tx = self.conn.transaction()?;
        let trusted = abandon_in(&tx, name, to, trusted_state, check, origin, actor, comment)?;
        tx.commit()?;
        Ok(trusted)
    }

    /// Rejects a run that stopped for review, in one transaction: its pending escalations (and
    /// its child runs') are decided, and each skill in `moves` goes to the lifecycle's
    /// `rejected` state, or back to its trusted version when a newer one was rejected (as
    /// [`Ledger::abandon_version`]). Either all of it is recorded or none. Returns the
    /// escalations decided and, for each skill, the version it returned to, if it did.
    #[expect(
        clippy::too_many_arguments,
        reason = "one rejection's worth of facts, written together"
    )]
    pub fn reject_run(
        &mut self,
        run_id: i64,
        actor: &str,
        comment: Option<&str>,
        rejected: Option<&str>,
        trusted_state: &str,
        moves: &[(String, String)],
        check: impl Fn(&str, &str) -> Result<(), String>,
    ) -> Result<(Vec<super::EscalationRow>, Vec<Option<i64>>)> {
        let tx = self.conn.transaction()?;
        let decided = super::escalations::decide_in(&tx, run_id, false, actor, comment)?;
        let mut returned = Vec::new();
        for (name, note) in moves {
            let Some(rejected) = rejected else {
                returned.push(None);
                continue;
            };
            let standing = standing_of(&tx, name)?;
            let origin = (Some(run_id), None);
            returned.push(
                if standing
                    .trusted_version
                    .is_some_and(|trusted| trusted < standing.version)
                {
                    Some(abandon_in(
                        &tx,
                        name,
                        rejected,
                        trusted_state,
                        &check,
                        origin,
                        actor,
                        note,
                    )?)
                } else {
                    // A rejection rests on the person's decision, recorded with it.
                    let check = |from: &str, to: &str| check(from, to).map(|()| Evidence::Nothing);
                    transition_in(&tx, name, rejected, check, origin, actor, Some(note))?;
                    None
                },
            );
        }
        tx.commit()?;
        Ok((decided, returned))
    }
}

/// [`Ledger::abandon_version`], inside the caller's transaction.
#[expect(
    clippy::too_many_arguments,
    reason = "one rejection's worth of facts, written together"
)]
fn abandon_in(
    tx: &super::db::Transaction<'_>,
    name: &str,
    to: &str,
    trusted_state: &str,
    check: impl FnOnce(&str, &str) -> Result<(), String>,
    origin: (Option<i64>, Option<&str>),
    actor: &str,
    comment: &str,
) -> Result<i64> {
    let Standing {
        state: from,
        version,
        trusted_version: trusted,
        ..
    } = standing_of(tx, name)?;
    let Some(trusted) = trusted.filter(|trusted| *trusted < version) else {
        return Err(LedgerError::TransitionRefused(format!(
            "`{name}` has no older trusted version to return to"
        )));
    };
    check(&from, to).map_err(LedgerError::TransitionRefused)?;
    let (spec, description, side_effect): (String, String, String) = tx.query_row(
        "SELECT spec_artifact, description, side_effect FROM skill_versions
         WHERE skill = ?1 AND version = ?2",
        params![name, trusted],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )?;
    let comment =
        format!("version {version} {to}: {comment}; version {trusted} is {trusted_state} again");
    move_state(
        tx,
        name,
        &from,
        trusted_state,
        origin,
        actor,
        Some(&comment),
    )?;
    tx.execute(
        "UPDATE skills SET version = ?1, spec_artifact = ?2, description = ?3,
                           side_effect = ?4, verified_hash = trusted_hash
         WHERE name = ?5",
        params![trusted, spec, description, side_effect, name],
    )?;
    Ok(trusted)
}

impl Ledger {
    /// Revokes a skill: moves it to `to` as `check` allows, and no version of it runs again.
    pub fn revoke_skill(
        &mut self,
        name: &str,
        to: &str,
        check: impl FnOnce(&str, &str) -> Result<(), String>,
        actor: &str,
        comment: &str,
    ) -> Result<Transitioned> {
        let tx = self.conn.transaction()?;
        let from = standing_of(&tx, name)?.state;
        check(&from, to).map_err(LedgerError::TransitionRefused)?;
        move_state(&tx, name, &from, to, (None, None), actor, Some(comment))?;
        tx.execute(
            "UPDATE skills SET trusted_version = NULL WHERE name = ?1",
            [name],
        )?;
        tx.commit()?;
        Ok(Transitioned {
            from,
            to: to.to_owned(),
        })
    }

    pub fn skill(&self, name: &str) -> Result<SkillRow> {
        self.conn
            .query_row(
                &format!("{SKILL_SELECT} WHERE s.name = ?1"),
                [name],
                skill_row,
            )
            .optional()?
            .ok_or_else(|| LedgerError::SkillNotFound(name.to_owned()))
    }

    /// Up to `limit` skills by name, after `after` when given: a page of the skills, read by
    /// key so that a page far down costs what the first one does.
    pub fn skills_page(&self, after: Option<&str>, limit: usize) -> Result<Vec<SkillRow>> {
        let mut stmt = self.conn.prepare(&skills_page_sql())?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = stmt.query_map(params![after, limit], skill_row)?;
        Ok(rows.collect::<super::db::Result<_>>()?)
    }

    /// The skills run `run_id` and its child runs moved, each with the states it went through
    /// in them, in order: what became of them, for the end of a forge run.
    pub fn skills_moved_by(&self, run_id: i64) -> Result<Vec<(String, Vec<String>)>> {
        let mut stmt = self.conn.prepare(&format!(
            "{}
             SELECT skill, from_state, to_state FROM skill_transitions
             WHERE run_id IN (SELECT id FROM tree) ORDER BY id",
            super::escalations::RUN_TREE
        ))?;
        let rows = stmt
            .query_map([run_id], |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, Option<String>>(1)?,
                    row.get::<_, String>(2)?,
                ))
            })?
            .collect::<super::db::Result<Vec<_>>>()?;
        let mut moved: Vec<(String, Vec<String>)> = Vec::new();
        for (skill, from, to) in rows {
            let index = match moved.iter().position(|(name, _)| *name == skill) {
                Some(index) => index,
                None => {
                    moved.push((skill, from.into_iter().collect()));
                    moved.len() - 1
                }
            };
            moved[index].1.push(to);
        }
        Ok(moved)
    }

    /// Every transition of a skill, oldest first.
    pub fn skill_transitions(&self, name: &str) -> Result<Vec<TransitionRow>> {
        let mut stmt = self.conn.prepare(SKILL_TRANSITIONS)?;
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
        Ok(rows.collect::<super::db::Result<_>>()?)
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
        let tx = self.conn.transaction()?;
        let Standing {
            state: from,
            verified_hash: verified,
            ..
        } = standing_of(&tx, name)?;
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
            "UPDATE skills SET trusted_hash = ?1, trusted_tree = ?2, trusted_version = version,
                 trusted_rules = (SELECT id FROM rule_sets WHERE status = 'adopted')
             WHERE name = ?3",
            params![current_hash, tree.first().map(|a| &a.sha256), name],
        )?;
        tx.execute(
            "INSERT INTO promotions (skill, from_state, to_state, source_hash, run_id, node_id, actor,
                                     at, comment, version)
             SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, version FROM skills WHERE name = ?1",
            params![name, from, to, current_hash, origin.0, origin.1, actor, now, comment],
        )?;
        tx.commit()?;
        Ok(Transitioned {
            from,
            to: to.to_owned(),
        })
    }

    /// The latest promotion of `name` (of its `version`, when given).
    pub fn promotion(&self, name: &str, version: Option<i64>) -> Result<PromotionRow> {
        self.conn
            .query_row(
                "SELECT id, skill, from_state, to_state, source_hash, run_id, node_id, actor, at,
                        comment, version, attestation,
                        (SELECT proposed_at FROM skill_versions v
                         WHERE v.skill = promotions.skill AND v.version = promotions.version)
                 FROM promotions WHERE skill = ?1 AND (?2 IS NULL OR version = ?2)
                 ORDER BY id DESC LIMIT 1",
                params![name, version],
                |row| {
                    Ok(PromotionRow {
                        id: row.get(0)?,
                        skill: row.get(1)?,
                        from_state: row.get(2)?,
                        to_state: row.get(3)?,
                        source_hash: row.get(4)?,
                        run_id: row.get(5)?,
                        node_id: row.get(6)?,
                        actor: row.get(7)?,
                        at: row.get(8)?,
                        comment: row.get(9)?,
                        version: row.get(10)?,
                        attestation: row.get(11)?,
                        version_proposed_at: row.get(12)?,
                    })
                },
            )
            .optional()?
            .ok_or_else(|| {
                LedgerError::SkillNotFound(match version {
                    Some(version) => format!("{name} (no promotion of version {version})"),
                    None => format!("{name} (never promoted)"),
                })
            })
    }

    /// Keeps `attestation`, a stored ATTESTATION artifact, as the attestation of promotion `id`.
    pub fn record_attestation(&mut self, id: i64, attestation: &Artifact) -> Result<()> {
        let tx = self.conn.transaction()?;
        keep_artifact(&tx, attestation, &now())?;
        tx.execute(
            "UPDATE promotions SET attestation = ?1 WHERE id = ?2",
            params![attestation.sha256, id],
        )?;
        tx.commit()?;
        Ok(())
    }

    /// Skills with a version that runs, by name: those in `trusted_state` (TRUSTED), and those
    /// whose newer version is being forged while an older one stays trusted. Drift (which
    /// leaves TRUSTED) and revocation (which withdraws the trusted version) end both.
    pub fn trusted_skills(&self, trusted_state: &str) -> Result<Vec<TrustedSkill>> {
        let mut stmt = self.conn.prepare(
            "SELECT s.name, v.description, v.side_effect, v.spec_artifact, s.proposal_path,
                    s.trusted_hash, s.trusted_version, s.trusted_tree, s.version
             FROM skills s JOIN skill_versions v
                  ON v.skill = s.name AND v.version = s.trusted_version
             WHERE s.trusted_hash IS NOT NULL
               AND (s.state = ?1 OR s.version > s.trusted_version)
             ORDER BY s.name",
        )?;
        let rows = stmt.query_map([trusted_state], |row| {
            let version: i64 = row.get(6)?;
            let newest: i64 = row.get(8)?;
            Ok(TrustedSkill {
                name: row.get(0)?,
                description: row.get(1)?,
                side_effect: row.get(2)?,
                spec_artifact: row.get(3)?,
                proposal_path: row.get(4)?,
                trusted_hash: row.get(5)?,
                version,
                trusted_tree: row.get(7)?,
                newer_version: (newest > version).then_some(newest),
            })
        })?;
        Ok(rows.collect::<super::db::Result<_>>()?)
    }

    /// Moves a skill to `to` if `check(from, to)` allows it and the [`Evidence`] it returns for
    /// the move is recorded in the tree of the origin run. Reading the current state, checking
    /// and writing happen in one transaction, so two runs cannot both move the same state.
    pub fn transition_skill(
        &mut self,
        name: &str,
        to: &str,
        check: impl FnOnce(&str, &str) -> Result<Evidence, String>,
        origin: (Option<i64>, Option<&str>),
        actor: &str,
        comment: Option<&str>,
    ) -> Result<Transitioned> {
        let tx = self.conn.transaction()?;
        let transitioned = transition_in(&tx, name, to, check, origin, actor, comment)?;
        tx.commit()?;
        Ok(transitioned)
    }
}

/// [`Ledger::transition_skill`], inside the caller's transaction.
fn transition_in(
    tx: &super::db::Transaction<'_>,
    name: &str,
    to: &str,
    check: impl FnOnce(&str, &str) -> Result<Evidence, String>,
    origin: (Option<i64>, Option<&str>),
    actor: &str,
    comment: Option<&str>,
) -> Result<Transitioned> {
    let from = standing_of(tx, name)?.state;
    let evidence = check(&from, to).map_err(LedgerError::TransitionRefused)?;
    super::evidence::check(tx, name, &from, to, evidence, origin.0)?;
    move_state(tx, name, &from, to, origin, actor, comment)?;
    Ok(Transitioned {
        from,
        to: to.to_owned(),
    })
}

/// Moves a skill's state and records the transition, inside the caller's transaction. Returns
/// the time it recorded.
fn move_state(
    tx: &super::db::Transaction<'_>,
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

/// Records one version's spec, inside the caller's transaction.
fn keep_version(
    tx: &super::db::Transaction<'_>,
    new: &NewSkill<'_>,
    version: i64,
    now: &str,
) -> Result<()> {
    tx.execute(
        "INSERT INTO skill_versions (skill, version, spec_artifact, description, side_effect,
                                     proposed_at, actor)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        params![
            new.name,
            version,
            new.spec.sha256,
            new.description,
            new.side_effect,
            now,
            new.actor
        ],
    )?;
    Ok(())
}

/// Where a skill stands in its lifecycle, as a move reads it.
struct Standing {
    state: String,
    version: i64,
    trusted_version: Option<i64>,
    verified_hash: Option<String>,
}

/// Reads where a skill stands, inside the caller's transaction.
fn standing_of(tx: &super::db::Transaction<'_>, name: &str) -> Result<Standing> {
    tx.query_row(
        "SELECT state, version, trusted_version, verified_hash FROM skills WHERE name = ?1",
        [name],
        |r| {
            Ok(Standing {
                state: r.get(0)?,
                version: r.get(1)?,
                trusted_version: r.get(2)?,
                verified_hash: r.get(3)?,
            })
        },
    )
    .optional()?
    .ok_or_else(|| LedgerError::SkillNotFound(name.to_owned()))
}
