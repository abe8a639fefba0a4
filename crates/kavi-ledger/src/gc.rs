//! Pruning old runs: the rows of runs nobody needs any more, and the artifacts only they used.
//!
//! What is evidence stays: a run whose tree (it and its child runs) any skill record names (a
//! transition, promotion, build, escalation, verification or execution) is kept whatever its
//! age, as is one that is still running, waits for review, or was resumed by a run that is kept.
//! Rows are deleted through kavi's own connection, so the journal records each deletion and
//! `kavi ledger verify` still holds afterwards.

use super::db::params;
use serde::Serialize;

use super::{Ledger, Objects, Result};

/// Which runs to prune: finished before `before` and not among the `keep` latest.
#[derive(Debug, Clone)]
pub struct GcRule {
    /// An RFC 3339 time; runs that finished before it may go.
    pub before: String,
    /// How many of the latest runs (started by a person, with their children) always stay.
    pub keep: u32,
}

/// What pruning removed, or would remove.
#[derive(Debug, Default, Serialize)]
pub struct Pruned {
    /// The runs started by a person, each with its child runs.
    pub runs: Vec<i64>,
    pub child_runs: usize,
    pub node_runs: usize,
    /// Artifacts only these runs used: (SHA-256, size, stored as a file).
    pub artifacts: Vec<(String, u64, bool)>,
    /// Old runs kept because a skill's record names them, or their sandbox is still on disk.
    pub kept_as_evidence: usize,
}

/// What removing pruned artifacts' objects from the object store did.
#[derive(Debug, Default, Serialize)]
pub struct RemovedObjects {
    pub removed: usize,
    /// Objects left in the store for a later gc: (SHA-256, why).
    pub left: Vec<(String, String)>,
}

/// `tree`: the runs of `gc_roots` and every run below them.
const PRUNED_TREE: &str = "WITH RECURSIVE tree(id) AS (
        SELECT id FROM gc_roots
        UNION ALL SELECT runs.id FROM runs JOIN tree ON runs.parent_run = tree.id
    )";

/// Tables whose rows are a skill's history: a run they name is evidence.
const EVIDENCE: &[&str] = &[
    "skill_transitions",
    "promotions",
    "builds",
    "escalations",
    "verifications",
    "executions",
];

impl Ledger {
    /// Runs that are running now (after recovery marked those of dead kavis interrupted).
    pub fn live_runs(&self) -> Result<Vec<i64>> {
        Ok(self
            .conn
            .prepare("SELECT id FROM runs WHERE status IN ('pending', 'running') ORDER BY id")?
            .query_map([], |r| r.get(0))?
            .collect::<super::db::Result<_>>()?)
    }

    /// How many kept sandboxes are due for removal, without settling or removing anything
    /// (for `--dry-run`).
    pub fn due_sandbox_count(&self) -> Result<usize> {
        Ok(self.conn.query_row(
            "SELECT count(*) FROM sandboxes WHERE status = 'kept' AND keep_until <= ?1",
            [super::now()],
            |r| r.get(0),
        )?)
    }

    /// Removes from the object store (`objects`, this machine's) the objects of the artifacts
    /// pruned here and by earlier gcs that left some. Each goes in a transaction of its own that
    /// holds the object's row of `object_deletions` until it is gone, and only while no row
    /// references the object: a run that records the same content meanwhile waits for that
    /// transaction, then puts the object back (see `artifacts::reclaim_object`), and a run that
    /// recorded it before has taken the row, so the object stays. Safe with a team: no grace
    /// period, no clock. An object that cannot be removed now (no store here, the store
    /// failing) is left for the next gc.
    pub fn remove_objects(&mut self, objects: Option<&Objects>) -> Result<RemovedObjects> {
        let due: Vec<(String, String)> = self
            .conn
            .prepare(
                "SELECT sha256, location FROM object_deletions WHERE deleted_at IS NULL
                 ORDER BY sha256",
            )?
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<super::db::Result<_>>()?;
        let mut done = RemovedObjects::default();
        for (sha256, location) in due {
            let Some(objects) = objects else {
                done.left.push((
                    sha256,
                    "this machine's kavi.toml names no `[object_store]`".to_owned(),
                ));
                continue;
            };
            let tx = self.conn.sharing_transaction()?;
            let taken = tx.execute(
                "UPDATE object_deletions SET deleted_at = ?1
                 WHERE sha256 = ?2 AND deleted_at IS NULL
                   AND sha256 NOT IN (SELECT sha256 FROM artifact_objects)",
                params![super::now(), sha256],
            )?;
            if taken == 0 {
                continue;
            }
            match objects.delete(&sha256, &location) {
                Ok(()) => {
                    tx.commit()?;
                    done.removed += 1;
                }
                // Rolled back: the row stays due.
                Err(e) => done.left.push((sha256, e.to_string())),
            }
        }
        Ok(done)
    }

    /// Prunes what `rule` allows, in one transaction; with `dry_run`, says what it would prune
    /// and changes nothing. Artifact files are the caller's to remove, after this returns.
    pub fn prune_runs(&mut self, rule: &GcRule, dry_run: bool) -> Result<Pruned> {
        let tx = self.conn.transaction()?;
        tx.execute_batch(
            "DROP TABLE IF EXISTS gc_roots;
             CREATE TEMP TABLE gc_roots (id BIGINT PRIMARY KEY);
             DROP TABLE IF EXISTS gc_tree;
             CREATE TEMP TABLE gc_tree (root BIGINT, id BIGINT PRIMARY KEY);",
        )?;
        // Candidates: finished runs a person started, old enough and not among the latest.
        tx.execute(
            "INSERT INTO gc_roots
             SELECT id FROM runs
             WHERE parent_run IS NULL
               AND status NOT IN ('pending', 'running', 'awaiting_review')
               AND finished_at IS NOT NULL AND finished_at < ?1
               AND id NOT IN (SELECT id FROM runs WHERE parent_run IS NULL
                              ORDER BY id DESC LIMIT ?2)",
            params![rule.before, rule.keep],
        )?;
        // Each candidate's tree, to drop whole trees that hold evidence.
        tx.execute(
            "INSERT INTO gc_tree
             WITH RECURSIVE tree(root, id) AS (
                 SELECT id, id FROM gc_roots
                 UNION ALL SELECT tree.root, runs.id FROM runs JOIN tree ON runs.parent_run = tree.id
             )
             SELECT root, id FROM tree",
            [],
        )?;
        let named_by_evidence = EVIDENCE
            .iter()
            .map(|table| format!("SELECT run_id FROM {table} WHERE run_id IS NOT NULL"))
            .collect::<Vec<_>>()
            .join(" UNION ");
        let kept_as_evidence = tx.execute(
            &format!(
                "DELETE FROM gc_roots WHERE id IN (
                     SELECT root FROM gc_tree WHERE id IN ({named_by_evidence})
                     UNION
                     -- a sandbox still on disk is removed by its sweep, which needs its row
                     SELECT root FROM gc_tree WHERE id IN
                         (SELECT run_id FROM sandboxes WHERE status != 'removed'))"
            ),
            [],
        )?;
        // A run resumed by one that stays must stay too, and so on down the line of resumes.
        loop {
            tx.execute(
                "DELETE FROM gc_tree WHERE root NOT IN (SELECT id FROM gc_roots)",
                [],
            )?;
            let kept = tx.execute(
                "DELETE FROM gc_roots WHERE id IN (
                     SELECT root FROM gc_tree WHERE id IN (
                         SELECT resumed_from FROM runs
                         WHERE resumed_from IS NOT NULL AND id NOT IN (SELECT id FROM gc_tree)))",
                [],
            )?;
            if kept == 0 {
                break;
            }
        }
        let mut pruned = Pruned {
            kept_as_evidence,
            ..Pruned::default()
        };
        pruned.runs = tx
            .prepare("SELECT id FROM gc_roots ORDER BY id")?
            .query_map([], |r| r.get(0))?
            .collect::<super::db::Result<_>>()?;
        let tree_size: usize = tx.query_row(
            &format!("{PRUNED_TREE} SELECT count(*) FROM tree"),
            [],
            |r| r.get(0),
        )?;
        pruned.child_runs = tree_size - pruned.runs.len();
        pruned.node_runs = tx.query_row(
            &format!(
                "{PRUNED_TREE} SELECT count(*) FROM node_runs WHERE run_id IN (SELECT id FROM tree)"
            ),
            [],
            |r| r.get(0),
        )?;
        // Artifacts these runs produced that nothing else refers to: no other node run, no
        // column that references artifacts, and no kept node's outputs.
        let referencing: Vec<(String, String)> = tx
            .prepare(match tx.backend() {
                super::db::Backend::Sqlite => {
                    "SELECT m.name, f.\"from\" FROM sqlite_master m
                     JOIN pragma_foreign_key_list(m.name) f
                     WHERE m.type = 'table' AND f.\"table\" = 'artifacts'
                       AND m.name NOT IN ('node_run_artifacts', 'artifact_contents', 'artifact_chunks',
                                          'artifact_objects')"
                }
                super::db::Backend::Postgres => {
                    "SELECT tc.table_name::text, kcu.column_name::text
                     FROM information_schema.table_constraints tc
                     JOIN information_schema.key_column_usage kcu
                       ON kcu.constraint_name = tc.constraint_name
                      AND kcu.table_schema = tc.table_schema
                     JOIN information_schema.constraint_column_usage ccu
                       ON ccu.constraint_name = tc.constraint_name
                      AND ccu.table_schema = tc.table_schema
                     WHERE tc.constraint_type = 'FOREIGN KEY' AND ccu.table_name = 'artifacts'
                       AND tc.table_schema = current_schema()
                       AND tc.table_name NOT IN ('node_run_artifacts', 'artifact_contents',
                                                'artifact_chunks', 'artifact_objects')"
                }
            })?
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<super::db::Result<_>>()?;
        let referenced_elsewhere = referencing
            .iter()
            // NOT IN a list holding NULL is never true: leave the NULLs out.
            .map(|(table, column)| {
                format!("SELECT {column} FROM {table} WHERE {column} IS NOT NULL")
            })
            .collect::<Vec<_>>()
            .join(" UNION ");
        pruned.artifacts = tx
            .prepare(&format!(
                "{PRUNED_TREE},
                 ours(id) AS (SELECT id FROM node_runs WHERE run_id IN (SELECT id FROM tree))
                 SELECT DISTINCT a.sha256, a.size, a.path != '' FROM node_run_artifacts nra
                 JOIN artifacts a ON a.sha256 = nra.sha256
                 WHERE nra.node_run_id IN (SELECT id FROM ours)
                   AND a.sha256 NOT IN (SELECT sha256 FROM node_run_artifacts
                                        WHERE node_run_id NOT IN (SELECT id FROM ours))
                   AND a.sha256 NOT IN ({referenced_elsewhere})
                   AND NOT EXISTS (SELECT 1 FROM node_runs n
                                   WHERE n.id NOT IN (SELECT id FROM ours)
                                     AND n.outputs LIKE '%' || a.sha256 || '%')
                 ORDER BY a.sha256"
            ))?
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
            .collect::<super::db::Result<_>>()?;
        if dry_run {
            return Ok(pruned);
        }
        tx.execute_batch(&format!(
            "DROP TABLE IF EXISTS gc_artifacts;
             CREATE TEMP TABLE gc_artifacts AS SELECT sha256 FROM artifacts WHERE 1 = 0;
             DROP TABLE IF EXISTS gc_runs;
             CREATE TEMP TABLE gc_runs AS {PRUNED_TREE} SELECT id FROM tree;"
        ))?;
        {
            let mut insert = tx.prepare("INSERT INTO gc_artifacts (sha256) VALUES (?1)")?;
            for (sha256, _, _) in &pruned.artifacts {
                insert.execute([sha256])?;
            }
        }
        tx.execute_batch(
            "DELETE FROM node_cache WHERE node_run_id IN
                 (SELECT id FROM node_runs WHERE run_id IN (SELECT id FROM gc_runs));
             -- a key's parts go with the last node run that recorded it
             DELETE FROM cache_parts WHERE key NOT IN (SELECT key FROM node_cache);
             DELETE FROM node_run_artifacts WHERE node_run_id IN
                 (SELECT id FROM node_runs WHERE run_id IN (SELECT id FROM gc_runs));
             DELETE FROM node_runs WHERE run_id IN (SELECT id FROM gc_runs);
             DELETE FROM run_policies WHERE run_id IN (SELECT id FROM gc_runs);
             DELETE FROM sandbox_entries WHERE sandbox_id IN
                 (SELECT id FROM sandboxes WHERE run_id IN (SELECT id FROM gc_runs));
             DELETE FROM sandboxes WHERE run_id IN (SELECT id FROM gc_runs);
             -- foreign keys are checked at the end of each statement, so parents, children
             -- and the runs that resumed one another go together
             DELETE FROM runs WHERE id IN (SELECT id FROM gc_runs);
             -- a governing set goes with the last run that named it (a node run names its
             -- run's set)
             DELETE FROM governing_members WHERE set_hash NOT IN
                 (SELECT governing_hash FROM runs WHERE governing_hash IS NOT NULL);
             DELETE FROM artifact_contents WHERE sha256 IN (SELECT sha256 FROM gc_artifacts);
             DELETE FROM artifact_chunks WHERE sha256 IN (SELECT sha256 FROM gc_artifacts);
             -- an object no row references is to be removed from the store (`remove_objects`),
             -- once this commits; a run that records it again before then takes it back
             INSERT INTO object_deletions (sha256, location)
                 SELECT sha256, location FROM artifact_objects
                 WHERE sha256 IN (SELECT sha256 FROM gc_artifacts)
             ON CONFLICT (sha256) DO UPDATE SET location = excluded.location, deleted_at = NULL;
             DELETE FROM artifact_objects WHERE sha256 IN (SELECT sha256 FROM gc_artifacts);
             DELETE FROM artifacts WHERE sha256 IN (SELECT sha256 FROM gc_artifacts);
             DROP TABLE gc_artifacts;
             DROP TABLE gc_runs;",
        )?;
        tx.commit()?;
        Ok(pruned)
    }
}
