//! Runs: recording a new run with its spec, governing set and pending node runs, finishing it,
//! and reading runs back (lists, filters, a run's detail, its governing files and spec text).

use std::collections::HashMap;
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

use super::claims::lease;
use super::db::{self, OptionalExtension, params};
use super::nodes::{NodeArtifact, NodeRunRow, by_node, millis};
use super::{
    Ledger, LedgerError, Result, VerificationRow, enum_column, format_time, json_column, now,
};
use kavi_foundation::state::RunStatus;

/// The runs a [`RunFilter`] keeps, over parameters 1 (status), 2 (pipeline) and 3 (since).
const RUN_FILTER: &str = "(CAST(?1 AS TEXT) IS NULL OR status = ?1)
    AND (CAST(?2 AS TEXT) IS NULL OR pipeline = ?2)
    AND (CAST(?3 AS TEXT) IS NULL OR started_at >= ?3)
    AND (CAST(?4 AS BIGINT) IS NULL OR id < ?4)";

/// What a new run records before any node starts. Owned, so that a thread of its own can
/// record it (see the executor's recorder).
#[derive(Debug)]
pub struct NewRun {
    pub pipeline: String,
    pub spec_path: String,
    pub spec_hash: String,
    pub spec_text: String,
    pub params: Value,
    pub origin: RunOrigin,
    /// The name of the [`Owner`](crate::Owner) running it.
    pub owner: String,
    /// Every node as (id, kind); each gets a `pending` node run.
    pub nodes: Vec<(String, &'static str)>,
    /// The run's governing set (the `kavi` crate's `spec::governing`), as (role, path, hash, text).
    pub governing: Vec<(&'static str, String, String, String)>,
    /// For a resumed run started over changed rules (`--allow-changed`): the changes, a line
    /// each.
    pub allowed_changes: Option<String>,
    /// The machine-local settings it runs with, by name, credentials taken out: recorded, not
    /// governing.
    pub local_settings: Option<Value>,
}

/// Which runs to list; `None` matches all.
#[derive(Debug, Clone, Default)]
pub struct RunFilter {
    pub status: Option<RunStatus>,
    pub pipeline: Option<String>,
    /// Started at or after.
    pub since: Option<jiff::Timestamp>,
    /// Older than this run: the next page of a listing, by key rather than offset, so a deep
    /// page costs what the first does.
    pub before: Option<i64>,
}

/// Who started a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RunOrigin {
    /// A user, from the command line.
    #[default]
    User,
    /// A `pipeline` node of another run.
    Child { parent: i64 },
    /// `kavi approve`, resuming a run that stopped for review.
    Resume { of: i64 },
}

impl RunOrigin {
    fn parent_run(self) -> Option<i64> {
        match self {
            RunOrigin::Child { parent } => Some(parent),
            _ => None,
        }
    }

    fn resumed_from(self) -> Option<i64> {
        match self {
            RunOrigin::Resume { of } => Some(of),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct RunRow {
    pub id: i64,
    pub pipeline: String,
    pub spec_path: String,
    pub spec_hash: String,
    pub params: Value,
    pub status: RunStatus,
    pub started_at: String,
    pub finished_at: Option<String>,
    pub duration_ms: Option<i64>,
    pub parent_run: Option<i64>,
    /// The run this one resumed after a review (`kavi approve`).
    pub resumed_from: Option<i64>,
    pub error: Option<String>,
    /// The account that started it (see [`kavi_foundation::identity`]); none for runs recorded before.
    pub started_by: Option<String>,
    /// The hash over its governing set; none for runs recorded before it was kept.
    pub governing_hash: Option<String>,
    /// The changes of rules it was resumed over with `--allow-changed`, a line each.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allowed_changes: Option<String>,
    /// The machine-local settings it ran with (see [`NewRun::local_settings`]); none for runs
    /// recorded before they were kept.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub local_settings: Option<Value>,
}

#[derive(Debug, Clone, Serialize)]
pub struct RunDetail {
    #[serde(flatten)]
    pub run: RunRow,
    /// The files that governed the run, by role, path and hash, sorted by path.
    pub governing: Vec<GoverningFile>,
    pub nodes: Vec<NodeRunRow>,
    /// Gate results recorded by the run's `gate` nodes.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub verifications: Vec<VerificationRow>,
    /// Runs that this run's `pipeline` nodes started, in order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub children: Vec<RunRow>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct GoverningFile {
    pub role: String,
    pub path: String,
    pub spec_hash: String,
}

const RUN_COLUMNS: &str = "id, pipeline, spec_path, spec_hash, params, status, started_at, \
                           finished_at, duration_ms, parent_run, error, resumed_from, started_by, \
                           governing_hash, allowed_changes, local_settings";

fn run_row(row: &db::Row) -> db::Result<RunRow> {
    Ok(RunRow {
        id: row.get(0)?,
        pipeline: row.get(1)?,
        spec_path: row.get(2)?,
        spec_hash: row.get(3)?,
        params: json_column(row, 4)?.unwrap_or(Value::Null),
        status: enum_column(row, 5)?,
        started_at: row.get(6)?,
        finished_at: row.get(7)?,
        duration_ms: row.get(8)?,
        parent_run: row.get(9)?,
        error: row.get(10)?,
        resumed_from: row.get(11)?,
        started_by: row.get(12)?,
        governing_hash: row.get(13)?,
        allowed_changes: row.get(14)?,
        local_settings: json_column(row, 15)?,
    })
}

impl Ledger {
    /// Records a new run, its spec text, and a pending node run per node, in one transaction.
    pub fn create_run(&mut self, new: &NewRun) -> Result<i64> {
        self.create_run_announcing(new, |_| {})
    }

    /// [`Ledger::create_run`], handing the run's id to `announce` as soon as the run has one,
    /// before its governing set and its node runs are written (and, on SQLite, its spec):
    /// whoever waits for the id can go on while the rest of the transaction is written. Nothing
    /// is committed before all of it.
    pub fn create_run_announcing(
        &mut self,
        new: &NewRun,
        announce: impl FnOnce(i64),
    ) -> Result<i64> {
        let now = now();
        let governing_hash = kavi_foundation::hash::set_hash(
            new.governing
                .iter()
                .map(|(role, path, hash, _)| (*role, path.as_str(), hash.as_str())),
        );
        // On SQLite the run is written and announced before its spec, whose text and journal
        // entry were most of the wait before the first node could start (0.65 of 0.9 ms, a
        // 1,000-node pipeline into a new ledger): the run's reference to it is checked at commit.
        let spec_after_run = self.conn.backend() == db::Backend::Sqlite;
        // Every row it writes is new, or written `ON CONFLICT DO NOTHING`: nothing to decide
        // under the write lock alone, so runs start while others record.
        let tx = self.conn.sharing_transaction()?;
        let insert_spec = |tx: &db::Transaction<'_>| {
            tx.execute(
                "INSERT INTO specs (hash, path, text, created_at) VALUES (?1, ?2, ?3, ?4) ON CONFLICT DO NOTHING",
                params![new.spec_hash, new.spec_path, new.spec_text, now],
            )
        };
        if spec_after_run {
            tx.execute_batch("PRAGMA defer_foreign_keys = ON")?;
        } else {
            insert_spec(&tx)?;
        }
        let run_id: i64 = tx.query_row(
            "INSERT INTO runs (pipeline, spec_path, spec_hash, params, status, started_at, parent_run,
                               resumed_from, owner, started_by, governing_hash, allowed_changes,
                               lease_until, local_settings)
             VALUES (?1, ?2, ?3, ?4, 'running', ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)
             RETURNING id",
            params![
                new.pipeline,
                new.spec_path,
                new.spec_hash,
                new.params.to_string(),
                now,
                new.origin.parent_run(),
                new.origin.resumed_from(),
                new.owner,
                kavi_foundation::identity::actor(),
                governing_hash,
                new.allowed_changes,
                // An external run's steps hold leases of their own, on its nodes' attempts.
                (new.owner != super::EXTERNAL_OWNER).then(|| super::claims::lease_end(lease())),
                new.local_settings.as_ref().map(Value::to_string),
            ],
            |row| row.get(0),
        )?;
        announce(run_id);
        if spec_after_run {
            insert_spec(&tx)?;
        }
        // A set is kept once, under its hash: a run over the same files as an earlier one (the
        // usual case) finds every member there, with its text, and writes nothing for them.
        // Members are only ever added in whole sets, in the transaction of the run that brought
        // them; a set found short (rows deleted by hand) is completed.
        let stored: i64 = tx.query_row(
            "SELECT COUNT(*) FROM governing_members WHERE set_hash = ?1",
            [&governing_hash],
            |row| row.get(0),
        )?;
        // Each kind of row in one statement, over the rows as a JSON array (a tuple is an array
        // of its fields, in order).
        let rows = json_rows(tx.backend(), "?1");
        if usize::try_from(stored).ok() != Some(new.governing.len()) {
            // (role, path, hash, text)
            let members = serde_json::to_string(&new.governing).map_err(std::io::Error::other)?;
            tx.execute(
                &format!(
                    "INSERT INTO specs (hash, path, text, created_at)
                     SELECT e.value ->> 2, e.value ->> 1, e.value ->> 3, ?2 {rows}
                     ON CONFLICT DO NOTHING"
                ),
                params![members, now],
            )?;
            tx.execute(
                &format!(
                    "INSERT INTO governing_members (set_hash, path, spec_hash, role)
                     SELECT ?2, e.value ->> 1, e.value ->> 2, e.value ->> 0 {rows}
                     ON CONFLICT DO NOTHING"
                ),
                params![members, governing_hash],
            )?;
        }
        // (node id, kind)
        let nodes = serde_json::to_string(&new.nodes).map_err(std::io::Error::other)?;
        tx.execute(
            &format!(
                "INSERT INTO node_runs (run_id, node_id, kind, state, attempt, governing_hash)
                 SELECT ?2, e.value ->> 0, e.value ->> 1, 'pending', 1, ?3 {rows}"
            ),
            params![nodes, run_id, governing_hash],
        )?;
        tx.commit()?;
        Ok(run_id)
    }

    pub fn finish_run(
        &self,
        run_id: i64,
        status: RunStatus,
        duration: Duration,
        error: Option<&str>,
    ) -> Result<()> {
        self.conn.execute(
            "UPDATE runs SET status = ?1, finished_at = ?2, duration_ms = ?3, error = ?4 WHERE id = ?5",
            params![status.as_str(), now(), millis(duration), error, run_id],
        )?;
        Ok(())
    }

    /// Keeps a spec or policy text (by its hash) so that records can name it; kept once.
    pub fn keep_spec(&self, source: &kavi_foundation::diagnostic::SourceFile) -> Result<String> {
        let hash = source.spec_hash().to_owned();
        self.conn.execute(
            "INSERT INTO specs (hash, path, text, created_at) VALUES (?1, ?2, ?3, ?4) ON CONFLICT DO NOTHING",
            params![hash, source.path.display().to_string(), source.text, now()],
        )?;
        Ok(hash)
    }

    /// The newest runs first.
    pub fn list_runs(&self, limit: usize) -> Result<Vec<RunRow>> {
        self.find_runs(&RunFilter::default(), limit)
    }

    /// The newest runs first that match `filter`.
    pub fn find_runs(&self, filter: &RunFilter, limit: usize) -> Result<Vec<RunRow>> {
        let since = filter.since.map(format_time);
        let mut stmt = self.conn.prepare(&format!(
            "SELECT {RUN_COLUMNS} FROM runs WHERE {RUN_FILTER} ORDER BY id DESC LIMIT ?5"
        ))?;
        let rows = stmt.query_map(
            params![
                filter.status.map(RunStatus::as_str),
                filter.pipeline,
                since,
                filter.before,
                i64::try_from(limit).unwrap_or(i64::MAX)
            ],
            run_row,
        )?;
        Ok(rows.collect::<db::Result<_>>()?)
    }

    /// How many runs `filter` matches in all.
    pub fn count_runs(&self, filter: &RunFilter) -> Result<u64> {
        let since = filter.since.map(format_time);
        let count: i64 = self.conn.query_row(
            &format!("SELECT count(*) FROM runs WHERE {RUN_FILTER}"),
            params![
                filter.status.map(RunStatus::as_str),
                filter.pipeline,
                since,
                filter.before
            ],
            |row| row.get(0),
        )?;
        Ok(u64::try_from(count).unwrap_or(0))
    }

    /// The run a user started that `run_id` belongs to: itself, or the top of its parent chain.
    pub fn root_run(&self, run_id: i64) -> Result<RunRow> {
        Ok(self.conn.query_row(
            &format!(
                "WITH RECURSIVE up(id, parent) AS (
                     SELECT id, parent_run FROM runs WHERE id = ?1
                     UNION ALL SELECT runs.id, runs.parent_run FROM runs JOIN up ON runs.id = up.parent
                 )
                 SELECT {RUN_COLUMNS} FROM runs WHERE id = (SELECT id FROM up WHERE parent IS NULL)"
            ),
            [run_id],
            run_row,
        )?)
    }

    /// Resolves `latest` (the newest run a user started, not a child run) or a run id.
    pub fn resolve_run(&self, reference: &str) -> Result<i64> {
        let found: Option<i64> = if reference == "latest" {
            self.conn.query_row(
                "SELECT max(id) FROM runs WHERE parent_run IS NULL",
                [],
                |row| row.get(0),
            )?
        } else {
            match reference.parse::<i64>() {
                Ok(id) => self
                    .conn
                    .query_row("SELECT id FROM runs WHERE id = ?1", [id], |row| row.get(0))
                    .optional()?,
                Err(_) => None,
            }
        };
        found.ok_or_else(|| LedgerError::RunNotFound(reference.to_owned()))
    }

    /// Who owns run `run_id`: a kavi process's name, or [`owner::EXTERNAL`](super::owner::EXTERNAL).
    pub fn run_owner(&self, run_id: i64) -> Result<String> {
        Ok(self
            .conn
            .query_row("SELECT owner FROM runs WHERE id = ?1", [run_id], |row| {
                row.get(0)
            })?)
    }

    /// One run's row.
    pub fn run(&self, run_id: i64) -> Result<RunRow> {
        self.conn
            .query_row(
                &format!("SELECT {RUN_COLUMNS} FROM runs WHERE id = ?1"),
                [run_id],
                run_row,
            )
            .optional()?
            .ok_or_else(|| LedgerError::RunNotFound(run_id.to_string()))
    }

    pub fn run_detail(&self, run_id: i64) -> Result<RunDetail> {
        let run = self.run(run_id)?;
        let mut stmt = self.conn.prepare(
            "SELECT id, node_id, kind, state, attempt, started_at, finished_at, duration_ms,
                    exit_code, outputs, error, reason, reused_from
             FROM node_runs WHERE run_id = ?1 ORDER BY id",
        )?;
        let nodes = stmt
            .query_map([run_id], |row| {
                Ok(NodeRunRow {
                    id: row.get(0)?,
                    node_id: row.get(1)?,
                    kind: row.get(2)?,
                    state: enum_column(row, 3)?,
                    attempt: row.get(4)?,
                    started_at: row.get(5)?,
                    finished_at: row.get(6)?,
                    duration_ms: row.get(7)?,
                    exit_code: row.get(8)?,
                    outputs: json_column(row, 9)?,
                    error: row.get(10)?,
                    reason: row.get(11)?,
                    artifacts: Vec::new(),
                    reused_from: row.get(12)?,
                })
            })?
            .collect::<db::Result<Vec<_>>>()?;
        let mut nodes = by_node(nodes);
        // All the run's artifacts in one query, not one per node run: each query is its own
        // read transaction, and a 1,000-node run would take the lock 1,000 times. Read after
        // the node runs, as each node run's were: a node run never shows an artifact missing
        // that its state says it recorded.
        let position: HashMap<i64, usize> = nodes
            .iter()
            .enumerate()
            .map(|(i, node)| (node.id, i))
            .collect();
        self.conn
            .prepare(
                "SELECT l.node_run_id, l.role, a.sha256, a.kind, a.size, a.path
                 FROM node_runs n
                 JOIN node_run_artifacts l ON l.node_run_id = n.id
                 JOIN artifacts a ON a.sha256 = l.sha256
                 WHERE n.run_id = ?1",
            )?
            .for_each([run_id], |row| {
                // A node run recorded since the first read is not shown, nor are its artifacts.
                if let Some(&i) = position.get(&row.get::<_, i64>(0)?) {
                    nodes[i].artifacts.push(NodeArtifact {
                        role: row.get(1)?,
                        sha256: row.get(2)?,
                        kind: row.get(3)?,
                        size: row.get(4)?,
                        path: row.get(5)?,
                    });
                }
                Ok(true)
            })?;
        // Sorted here rather than by the query: a sort in SQLite took a temporary B-tree.
        for node in &mut nodes {
            node.artifacts.sort_unstable_by(|a, b| a.role.cmp(&b.role));
        }
        let governing = self.governing(run_id)?;
        let verifications = self.verifications(run_id)?;
        let children = self
            .conn
            .prepare(&format!(
                "SELECT {RUN_COLUMNS} FROM runs WHERE parent_run = ?1 ORDER BY id"
            ))?
            .query_map([run_id], run_row)?
            .collect::<db::Result<_>>()?;
        Ok(RunDetail {
            run,
            governing,
            nodes,
            verifications,
            children,
        })
    }

    /// The files that governed a run, sorted by path: its set's members, or for a run recorded
    /// before sets were kept once, its own rows (a member of both is listed once).
    pub fn governing(&self, run_id: i64) -> Result<Vec<GoverningFile>> {
        // Two reads in key order, merged here: as one `UNION ... ORDER BY`, SQLite sorted the
        // set in a temporary B-tree, about half the read on a set of 1,000 members.
        let read = |sql: &str| -> Result<Vec<GoverningFile>> {
            Ok(self
                .conn
                .prepare_cached(sql)?
                .query_map([run_id], |row| {
                    Ok(GoverningFile {
                        role: row.get(0)?,
                        path: row.get(1)?,
                        spec_hash: row.get(2)?,
                    })
                })?
                .collect::<db::Result<_>>()?)
        };
        let members = read(
            "SELECT role, path, spec_hash FROM governing_members
             WHERE set_hash = (SELECT governing_hash FROM runs WHERE id = ?1)
             ORDER BY path",
        )?;
        // Runs recorded before sets were kept once (schema 24) list theirs here.
        let legacy =
            read("SELECT role, path, spec_hash FROM run_policies WHERE run_id = ?1 ORDER BY path")?;
        Ok(merge_by_path(members, legacy))
    }

    /// The stored text of a spec, by its hash (`sha256:<hex>`, or a unique prefix of the hex).
    pub fn spec_text(&self, hash: &str) -> Result<(String, String)> {
        let hex = hash.strip_prefix("sha256:").unwrap_or(hash);
        let mut stmt = self
            .conn
            .prepare("SELECT hash, text FROM specs WHERE hash LIKE ?1 ORDER BY hash LIMIT 2")?;
        let found: Vec<(String, String)> = stmt
            .query_map([format!("sha256:{hex}%")], |row| {
                Ok((row.get(0)?, row.get(1)?))
            })?
            .collect::<db::Result<_>>()?;
        match found.as_slice() {
            // A spec is served only if it still is what its name says.
            [(name, text)]
                if !hex.is_empty() && kavi_foundation::hash::spec_hash(text) != *name =>
            {
                Err(LedgerError::SpecAltered(name.clone()))
            }
            [one] if !hex.is_empty() => Ok(one.clone()),
            _ => Err(LedgerError::SpecNotFound(hash.to_owned())),
        }
    }
}

/// The set's members and a legacy run's rows as one list sorted by path, a file listed the same
/// way in both once. Each list comes sorted by the database; the rare run with both is sorted
/// here, so that a server's collation cannot leave a file listed twice.
pub(crate) fn merge_by_path(
    mut members: Vec<GoverningFile>,
    legacy: Vec<GoverningFile>,
) -> Vec<GoverningFile> {
    if legacy.is_empty() {
        return members;
    }
    let listed: std::collections::HashSet<GoverningFile> = members.iter().cloned().collect();
    members.extend(legacy.into_iter().filter(|file| !listed.contains(file)));
    members.sort_by(|a, b| a.path.cmp(&b.path));
    members
}

/// `FROM` the elements of the JSON array bound at `parameter`, each as `e.value`, in the array's
/// order, `WHERE` true (so that an `ON CONFLICT` after it is not read as a join's): how a run's
/// many rows (a pending node run per node, its governing files) are written by one statement
/// rather than one each. Each statement fires the journal's triggers and, on SQLite, keeps a
/// statement journal of every page it touches; on a server, each is a round trip.
fn json_rows(backend: db::Backend, parameter: &str) -> String {
    match backend {
        db::Backend::Sqlite => format!("FROM json_each({parameter}) AS e WHERE true ORDER BY e.key"),
        db::Backend::Postgres => format!(
            "FROM json_array_elements(CAST({parameter} AS TEXT)::json) WITH ORDINALITY AS e (value, n)
             WHERE true ORDER BY e.n"
        ),
    }
}
