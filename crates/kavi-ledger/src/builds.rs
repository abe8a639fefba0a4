//! Build attempts: each is its own row with an attempt number and a parent build, so a skill's
//! lineage of attempts can be read back.

use super::db::{OptionalExtension, params};
use serde::Serialize;

use super::{Artifact, Ledger, LedgerError, keep_artifact, now};

type Result<T, E = LedgerError> = std::result::Result<T, E>;

/// A build that was just started.
#[derive(Debug, Clone, Serialize)]
pub struct NewBuild {
    pub id: i64,
    pub attempt: i64,
    pub parent_build: Option<i64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct BuildRow {
    pub id: i64,
    pub skill: String,
    pub attempt: i64,
    pub parent_build: Option<i64>,
    pub run_id: Option<i64>,
    pub status: String,
    pub packet: Option<String>,
    pub log: Option<String>,
    pub exit_code: Option<i64>,
    pub started_at: String,
    pub finished_at: Option<String>,
    pub failure_kind: Option<String>,
    pub research_note: Option<String>,
    /// The ADVISORY artifact: the gateway's revised packet for the next attempt.
    pub advisory: Option<String>,
    /// Why the gateway gave no usable advisory (unreachable, timed out, nonsense).
    pub advisory_error: Option<String>,
}

const BUILD_COLUMNS: &str = "id, skill, attempt, parent_build, run_id, status, packet, log, \
                             exit_code, started_at, finished_at, failure_kind, research_note, \
                             advisory, advisory_error";

fn build_row(r: &super::db::Row) -> super::db::Result<BuildRow> {
    Ok(BuildRow {
        id: r.get(0)?,
        skill: r.get(1)?,
        attempt: r.get(2)?,
        parent_build: r.get(3)?,
        run_id: r.get(4)?,
        status: r.get(5)?,
        packet: r.get(6)?,
        log: r.get(7)?,
        exit_code: r.get(8)?,
        started_at: r.get(9)?,
        finished_at: r.get(10)?,
        failure_kind: r.get(11)?,
        research_note: r.get(12)?,
        advisory: r.get(13)?,
        advisory_error: r.get(14)?,
    })
}

/// A skill's builds, first attempt first: in the order of the key `UNIQUE (skill, attempt)`.
pub(crate) fn skill_builds_sql() -> String {
    format!("SELECT {BUILD_COLUMNS} FROM builds WHERE skill = ?1 ORDER BY attempt")
}

impl Ledger {
    /// Starts the next build attempt of a skill; its parent is the skill's previous build.
    pub fn start_build(&mut self, skill: &str, run_id: i64, node_id: &str) -> Result<NewBuild> {
        let tx = self.conn.transaction()?;
        let exists: Option<String> = tx
            .query_row("SELECT name FROM skills WHERE name = ?1", [skill], |r| {
                r.get(0)
            })
            .optional()?;
        if exists.is_none() {
            return Err(LedgerError::SkillNotFound(skill.to_owned()));
        }
        let previous: Option<(i64, i64)> = tx
            .query_row(
                "SELECT id, attempt FROM builds WHERE skill = ?1 ORDER BY attempt DESC LIMIT 1",
                [skill],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        let attempt = previous.map_or(1, |(_, a)| a + 1);
        let parent_build = previous.map(|(id, _)| id);
        let id: i64 = tx.query_row(
            "INSERT INTO builds (skill, attempt, parent_build, run_id, node_id, status, started_at)
             VALUES (?1, ?2, ?3, ?4, ?5, 'running', ?6) RETURNING id",
            params![skill, attempt, parent_build, run_id, node_id, now()],
            |row| row.get(0),
        )?;
        tx.commit()?;
        Ok(NewBuild {
            id,
            attempt,
            parent_build,
        })
    }

    /// Records how a build ended, with its packet and log.
    pub fn finish_build(
        &mut self,
        id: i64,
        succeeded: bool,
        exit_code: Option<i32>,
        packet: &Artifact,
        log: Option<&Artifact>,
    ) -> Result<()> {
        let now = now();
        let tx = self.conn.transaction()?;
        for artifact in [Some(packet), log].into_iter().flatten() {
            keep_artifact(&tx, artifact, &now)?;
        }
        tx.execute(
            "UPDATE builds SET status = ?1, exit_code = ?2, packet = ?3, log = ?4, finished_at = ?5 WHERE id = ?6",
            params![
                if succeeded { "succeeded" } else { "failed" },
                exit_code,
                packet.sha256,
                log.map(|l| l.sha256.as_str()),
                now,
                id
            ],
        )?;
        tx.commit()?;
        Ok(())
    }

    /// Records what a failed build's attempt was classified as, with its research note.
    pub fn record_research(
        &mut self,
        build_id: i64,
        failure_kind: &str,
        note: &Artifact,
    ) -> Result<()> {
        let tx = self.conn.transaction()?;
        keep_artifact(&tx, note, &now())?;
        tx.execute(
            "UPDATE builds SET failure_kind = ?1, research_note = ?2 WHERE id = ?3",
            params![failure_kind, note.sha256, build_id],
        )?;
        tx.commit()?;
        Ok(())
    }

    /// Records the advisory a build got: the revised packet, or why there is none.
    pub fn record_advisory(
        &mut self,
        build_id: i64,
        advisory: std::result::Result<&Artifact, &str>,
    ) -> Result<()> {
        let tx = self.conn.transaction()?;
        let (sha, error) = match advisory {
            Ok(artifact) => {
                keep_artifact(&tx, artifact, &now())?;
                (Some(artifact.sha256.as_str()), None)
            }
            Err(error) => (None, Some(error)),
        };
        tx.execute(
            "UPDATE builds SET advisory = ?1, advisory_error = ?2 WHERE id = ?3",
            params![sha, error, build_id],
        )?;
        tx.commit()?;
        Ok(())
    }

    /// A skill's builds, first attempt first.
    pub fn builds(&self, skill: &str) -> Result<Vec<BuildRow>> {
        let mut stmt = self.conn.prepare(&skill_builds_sql())?;
        let rows = stmt.query_map([skill], build_row)?;
        Ok(rows.collect::<super::db::Result<_>>()?)
    }

    /// One build, by id.
    pub fn build(&self, id: i64) -> Result<BuildRow> {
        self.conn
            .query_row(
                &format!("SELECT {BUILD_COLUMNS} FROM builds WHERE id = ?1"),
                [id],
                build_row,
            )
            .optional()?
            .ok_or(LedgerError::BuildNotFound(id))
    }
}
