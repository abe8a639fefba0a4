//! What a lifecycle move rests on, looked for by the move itself in the transaction that records
//! it: whichever node, command or approval asks for the move, a state on the way to trust is
//! recorded only when the run that makes the move (its root and every run below it) holds the
//! build or the gate run that earns it. The lifecycle policy says which moves need which; the
//! ledger finds the records.

use serde_json::Value;

use super::LedgerError;
use super::db::{OptionalExtension, Transaction, params};
use super::escalations::RUN_TREE;

type Result<T, E = LedgerError> = std::result::Result<T, E>;

/// What a move into a state must rest on, weakest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Evidence {
    /// Nothing recorded: a move back to a proposal, a drift, a rejection.
    Nothing,
    /// A build of the skill whose result was copied back, or an import of it, in the run.
    Built,
    /// A gate run in the run that passed every required gate at the hash the skill was built
    /// (or imported) at there.
    Gated,
}

/// The node kinds whose success brings a skill's files in: a `copy_back` of a build's sandbox,
/// an `imported` bundle. Their outputs name the skill and the hash of its files after them.
const BRINGS_IN: &str = "('copy_back', 'imported')";

/// Checks that `evidence` for a move of `skill` is recorded in the tree of run `run_id`.
pub(crate) fn check(
    tx: &Transaction<'_>,
    skill: &str,
    from: &str,
    to: &str,
    evidence: Evidence,
    run_id: Option<i64>,
) -> Result<()> {
    if evidence == Evidence::Nothing {
        return Ok(());
    }
    let refused = |missing: String| {
        LedgerError::TransitionRefused(format!(
            "the move {from} -> {to} of `{skill}` is earned, not declared: {missing}"
        ))
    };
    let Some(run_id) = run_id else {
        return Err(refused(
            "it is made by no run, so no build or gate run of the run stands behind it".into(),
        ));
    };
    let root: i64 = tx.query_row(
        "WITH RECURSIVE up(id, parent) AS (
             SELECT id, parent_run FROM runs WHERE id = ?1
             UNION ALL SELECT runs.id, runs.parent_run FROM runs JOIN up ON runs.id = up.parent
         )
         SELECT id FROM up WHERE parent IS NULL",
        [run_id],
        |row| row.get(0),
    )?;
    let built = built_hash(tx, root, skill)?;
    let where_ = format!("in run {root} or the runs below it");
    match evidence {
        Evidence::Nothing => Ok(()),
        Evidence::Built => built.map(|_| ()).ok_or_else(|| {
            refused(format!(
                "no build of it was copied back (a `build` node's sandbox, by a `copy_back` \
                 node naming the skill) and no bundle of it imported {where_}"
            ))
        }),
        Evidence::Gated => {
            let Some(built) = built else {
                return Err(refused(format!(
                    "it was neither built nor imported {where_}, so no gate run there judged \
                     what was built"
                )));
            };
            let verified: Option<String> = tx.query_row(
                "SELECT verified_hash FROM skills WHERE name = ?1",
                [skill],
                |row| row.get(0),
            )?;
            match newest_gate_run(tx, root, skill)? {
                // The skill's verified hash is the one promoted: a later gate run elsewhere
                // that verified other bytes leaves this run's gates nothing to rest on.
                Some((true, Some(hash))) if hash == built && verified.as_ref() == Some(&hash) => {
                    Ok(())
                }
                Some((true, Some(hash))) if hash == built => Err(refused(format!(
                    "its verified hash is now {}, set by a gate run outside run {root}",
                    verified.as_deref().unwrap_or("none")
                ))),
                Some((true, hash)) => Err(refused(format!(
                    "the newest gate run of it {where_} passed at {}, not at {built}, the hash \
                     it was built or imported at",
                    hash.as_deref().unwrap_or("no hash")
                ))),
                Some((false, _)) => Err(refused(format!(
                    "the newest gate run of it {where_} did not pass every required gate"
                ))),
                None => Err(refused(format!(
                    "no gate run of it is recorded {where_}; a `gate` node earns it"
                ))),
            }
        }
    }
}

/// The hash of `skill`'s files after the newest copy-back of a build of it, or import of it, in
/// the tree of run `root`; `None` when there is none.
fn built_hash(tx: &Transaction<'_>, root: i64, skill: &str) -> Result<Option<String>> {
    let mut stmt = tx.prepare(&format!(
        "{RUN_TREE}
         SELECT kind, outputs, finished_at FROM node_runs
         WHERE run_id IN (SELECT id FROM tree) AND kind IN {BRINGS_IN} AND state = 'succeeded'
         ORDER BY id DESC"
    ))?;
    let rows = stmt
        .query_map([root], |row| {
            Ok((
                row.get::<_, String>(0)?,
                super::json_column(row, 1)?,
                row.get::<_, Option<String>>(2)?,
            ))
        })?
        .collect::<super::db::Result<Vec<_>>>()?;
    for (kind, outputs, finished) in rows {
        let Some(outputs) = outputs.filter(|o| o["skill"] == skill) else {
            continue;
        };
        let Some(hash) = outputs["source_hash"].as_str() else {
            continue;
        };
        if kind == "imported" || built_into(tx, root, skill, &outputs, finished.as_deref())? {
            return Ok(Some(hash.to_owned()));
        }
    }
    Ok(None)
}

/// Whether the sandbox a copy-back (`outputs`) copied from holds a build of `skill` that
/// succeeded in the tree of run `root` before the copy-back finished: a sandbox filled by hand
/// is not a build.
fn built_into(
    tx: &Transaction<'_>,
    root: i64,
    skill: &str,
    outputs: &Value,
    finished: Option<&str>,
) -> Result<bool> {
    let Some(sandbox) = outputs["sandbox"].as_str() else {
        return Ok(false);
    };
    let mut stmt = tx.prepare(&format!(
        "{RUN_TREE}
         SELECT n.outputs FROM node_runs n
         WHERE n.run_id IN (SELECT id FROM tree) AND n.kind = 'build' AND n.state = 'succeeded'
           AND n.finished_at <= ?2"
    ))?;
    let builds = stmt
        .query_map(params![root, finished], |row| super::json_column(row, 0))?
        .collect::<super::db::Result<Vec<_>>>()?;
    for build in builds.into_iter().flatten() {
        if build["sandbox"].as_str() != Some(sandbox) {
            continue;
        }
        let Some(id) = build["build_id"].as_i64() else {
            continue;
        };
        let succeeded: Option<String> = tx
            .query_row(
                "SELECT status FROM builds WHERE id = ?1 AND skill = ?2",
                params![id, skill],
                |row| row.get(0),
            )
            .optional()?;
        if succeeded.as_deref() == Some("succeeded") {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Whether the newest gate set run of `skill` in the tree of run `root` passed every required
/// gate, and the hash it judged; `None` when none ran there.
fn newest_gate_run(
    tx: &Transaction<'_>,
    root: i64,
    skill: &str,
) -> Result<Option<(bool, Option<String>)>> {
    Ok(tx
        .query_row(
            &format!(
                "{RUN_TREE}
                 SELECT sum(CASE WHEN required <> 0 AND status <> 'passed' THEN 1 ELSE 0 END),
                        max(source_hash)
                 FROM verifications
                 WHERE skill = ?2 AND run_id IN (SELECT id FROM tree)
                 GROUP BY run_id, node_id
                 ORDER BY max(id) DESC
                 LIMIT 1"
            ),
            params![root, skill],
            |row| {
                let failing: i64 = row.get(0)?;
                Ok((failing == 0, row.get(1)?))
            },
        )
        .optional()?)
}
