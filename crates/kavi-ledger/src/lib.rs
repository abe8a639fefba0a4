//! The ledger: a SQLite file that records every run, every node run, the spec text that governed
//! each run, and the artifacts they produced. It is the source of truth; reports derive from it.
//!
//! Durability: WAL journal, foreign keys on, and every state change in its own transaction, so
//! a kill at any moment leaves the file consistent. A run records its [`Owner`], the kavi process
//! that holds a lock file while it lives; when a later start finds an owner's lock free while its
//! files or its unfinished rows remain, that process died: recovery stops what it left running and
//! marks its runs, node runs, builds and executions `interrupted`.
//!
//! By concern: `connection` opens the ledger on either engine (over [`db`]), `migrations`
//! brings its schema up to date, `runs`, `nodes` and `artifacts` record and read a run,
//! `recovery` cleans up after dead owners; [`journal`] (the `kavi-journal` crate below this one)
//! and its [`checkpoint`]s make edits evident, and `journaled` checks the ledger with them;
//! skills, rule sets, builds, executions and escalations have a module each.

mod artifacts;
mod builds;
mod cache;
mod claims;
pub mod cleanup;
pub mod concurrency;
mod connection;
mod copy;
pub use kavi_db as db;
mod escalations;
mod evidence;
mod executions;
mod gc;
pub use kavi_journal as journal;
pub use kavi_journal::{checkpoint, keys};
mod journaled;
mod live;
mod migrations;
mod nodes;
mod open;
mod owner;
mod recovery;
mod rules;
mod runs;
mod sandboxes;
mod schema;
mod skills;
#[doc(hidden)]
pub mod testing;
mod verifications;

use std::path::PathBuf;

use db::Db;
use serde_json::Value;

pub use artifacts::SharedArtifacts;
use artifacts::keep_artifact;
pub use builds::{BuildRow, NewBuild};
pub use cache::{CacheHit, CacheRecord, RecordedKey};
pub use claims::{Claim, DEFAULT_LEASE, lease, lease_over, set_lease};
pub use connection::{
    AnotherConnection, canonical_location, display_location, location_without_password, locks_dir,
    postgres_url,
};
pub use escalations::{APPROVAL, EscalationRow, RecordedApproval};
pub use evidence::Evidence;
pub use executions::ExecutionRecord;
pub use gc::{GcRule, Pruned, RemovedObjects};
pub use kavi_store::{Artifact, ArtifactStore, ObjectSettings, Objects};
pub use live::{LivePosition, LiveTail};
pub use nodes::{NodeArtifact, NodeRecord, NodeRunRow, final_attempts};
pub use open::open_during;
pub use owner::{
    EXTERNAL as EXTERNAL_OWNER, Owner, live_log, new_name as claimant_name, this_host,
};
pub use recovery::Recovered;
pub use rules::{NewRuleSet, RuleSetRow};
pub use runs::{GoverningFile, NewRun, RunDetail, RunFilter, RunOrigin, RunRow};
pub use sandboxes::{DEFAULT_KEEP_MAX_BYTES, NewSandbox, SandboxLimits, SandboxRow};
pub use skills::{NewSkill, PromotionRow, SkillRow, TransitionRow, Transitioned, TrustedSkill};
pub use verifications::{GateResult, VerificationRow};

#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error("failed to open the ledger at {}: {source}", path.display())]
    Open { path: PathBuf, source: db::DbError },
    #[error("failed to create the ledger at {}: {source}", path.display())]
    Create {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "the ledger at {} has schema version {found}, newer than this kavi knows ({known}); upgrade kavi",
        path.display()
    )]
    TooNew {
        path: PathBuf,
        found: usize,
        known: usize,
    },
    #[error(
        "the ledger at {} is read-only ({reason}): commands that only read it work, this one \
         records",
        path.display()
    )]
    ReadOnly { path: PathBuf, reason: String },
    #[error("ledger query failed: {0}")]
    Db(#[from] db::DbError),
    #[error("ledger file operation failed: {0}")]
    Io(#[from] std::io::Error),
    #[error(
        "no ledger at {}: nothing has been recorded in this workspace yet (the first run, or \
         `kavi skill propose`, makes it)",
        .0.display()
    )]
    Missing(PathBuf),
    #[error("no run `{0}` in the ledger")]
    RunNotFound(String),
    #[error("no rule change {0} in the ledger (`kavi policy diff` lists them)")]
    RuleChangeNotFound(i64),
    /// A decision on a rule change that another one made meanwhile no longer applies.
    #[error("{0}")]
    RuleChangeRefused(String),
    #[error("no artifact `{0}` in the ledger (or the prefix names more than one)")]
    ArtifactNotFound(String),
    #[error("no spec with hash `{0}` in the ledger")]
    SpecNotFound(String),
    #[error(
        "the spec stored under {0} no longer hashes to it: the ledger was edited outside kavi \
         (`kavi ledger verify` says what else was)"
    )]
    SpecAltered(String),
    #[error("no skill `{0}` in the ledger; propose it with `kavi skill propose`")]
    SkillNotFound(String),
    #[error("skill `{0}` is already proposed")]
    SkillExists(String),
    #[error("{0}")]
    TransitionRefused(String),
    #[error("no build {0} in the ledger; `kavi builds list SKILL` lists a skill's builds")]
    BuildNotFound(i64),
    #[error("no execution `{0}` in the ledger; `kavi executions tail` lists recent ones")]
    ExecutionNotFound(String),
    #[error("`{0}` names more than one execution; give more of its id")]
    ExecutionAmbiguous(String),
    #[error("run {0} has no escalation awaiting a decision")]
    NothingToDecide(i64),
    #[error("{0}")]
    CopyRefused(String),
    #[error("{0}")]
    Keys(String),
    /// The ledger is not the one kavi's keys folder last checkpointed where it is, or no longer
    /// holds that checkpoint (see [`Ledger::check_checkpointed_here`]).
    #[error("{0}")]
    NotCheckpointed(String),
    #[error(transparent)]
    Journal(#[from] journal::JournalError),
    #[error(
        "{0}: the ledger was edited outside kavi, and what it says of this row is not trusted \
         (`kavi ledger verify` says what else was)"
    )]
    Unjournaled(String),
    #[error(
        "the ledger at {} has schema version {found}, older than this kavi's ({known}): verify \
         it with the kavi that wrote it, or open it once with this one (any command) to upgrade",
        path.display()
    )]
    OlderSchema {
        path: PathBuf,
        found: i64,
        known: usize,
    },
    #[error(
        "the ledger at {} has schema version {found}, older than any server ledger this kavi \
         can bring up to date (from {} to {known})",
        path.display(),
        schema::FIRST_ON_A_SERVER
    )]
    ServerTooOld {
        path: PathBuf,
        found: usize,
        known: usize,
    },
}

impl LedgerError {
    /// Whether a server undid the transaction before it committed, for a conflict with another
    /// writer's or a restart (see [`db::DbError::is_undone`]): done again from its start, it
    /// goes through once.
    pub fn is_undone(&self) -> bool {
        matches!(self, LedgerError::Db(error) if error.is_undone())
    }

    /// Whether it failed for want of disk space: SQLite's "database or disk is full", or a file
    /// write's ENOSPC.
    pub fn is_disk_full(&self) -> bool {
        match self {
            LedgerError::Db(db::DbError::Sqlite(rusqlite::Error::SqliteFailure(e, _))) => {
                e.code == rusqlite::ErrorCode::DiskFull
            }
            LedgerError::Io(e) | LedgerError::Create { source: e, .. } => {
                e.kind() == std::io::ErrorKind::StorageFull
            }
            _ => false,
        }
    }
}

type Result<T, E = LedgerError> = std::result::Result<T, E>;

use kavi_db::BUSY_TIMEOUT;

/// Now, in UTC, to the millisecond (RFC 3339).
///
/// Always three fractional digits, so that the text sorts as the time does: queries order by
/// these columns, and `…00.12Z` would sort after `…00.123Z`.
pub fn now() -> String {
    format_time(jiff::Timestamp::now())
}

/// RFC 3339 in UTC to the millisecond (`2026-11-26T12:47:41.908Z`), as every time in the ledger
/// is written: fixed width, so that times compare as text. Through jiff's own RFC 3339 printer,
/// not `strftime`, which reads its format string anew each call (the writer formats two or three
/// times a node).
pub fn format_time(time: jiff::Timestamp) -> String {
    format!("{time:.3}")
}

pub struct Ledger {
    conn: Db,
    locks_dir: PathBuf,
    /// A second connection made ahead of time ([`Ledger::open_spare`]), which the next
    /// [`Ledger::another_connection`] hands out.
    spare: Option<Box<Ledger>>,
    /// Threads still closing other connections to this ledger ([`Ledger::close_after`]).
    closing: Vec<std::thread::JoinHandle<()>>,
}

impl Drop for Ledger {
    /// Waits for the threads closing other connections first: this connection then closes
    /// last, and the last one to close is the one that removes the WAL.
    fn drop(&mut self) {
        for thread in self.closing.drain(..) {
            let _ = thread.join();
        }
    }
}

pub(crate) fn json_column(row: &db::Row, index: usize) -> db::Result<Option<Value>> {
    let text: Option<String> = row.get(index)?;
    text.map(|t| serde_json::from_str(&t))
        .transpose()
        .map_err(|e| db::DbError::Conversion {
            column: index,
            message: e.to_string(),
        })
}

pub(crate) fn enum_column<T: std::str::FromStr<Err = String>>(
    row: &db::Row,
    index: usize,
) -> db::Result<T> {
    row.parse(index, |text| text.parse::<T>())
}

#[cfg(test)]
mod tests;
