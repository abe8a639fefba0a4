//! The ledger: a SQLite file that records every run, every node run, the spec text that governed
//! each run, and the artifacts they produced. It is the source of truth; reports derive from it.
//!
//! Durability: WAL journal, foreign keys on, and every state change in its own transaction, so
//! a kill at any moment leaves the file consistent. A run records its [`Owner`], the kavi process
//! that holds a lock file while it lives; when a later start finds an owner's lock free while its
//! files or its unfinished rows remain, that process died: recovery stops what it left running and
//! marks its runs, node runs, builds and executions `interrupted`.

mod artifacts;
mod builds;
mod cache;
pub mod checkpoint;
pub mod cleanup;
mod copy;
pub mod db;
mod escalations;
mod executions;
mod gc;
pub mod journal;
pub mod keys;
mod memory;
mod open;
mod owner;
mod postgres;
mod rules;
mod sandboxes;
mod schema;
mod skills;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
mod verifications;

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::Duration;

use db::{Db, OptionalExtension, params};
use serde::Serialize;
use serde_json::Value;

pub use artifacts::{Artifact, ArtifactStore};
pub use builds::{BuildRow, NewBuild};
pub use cache::{CacheHit, CacheRecord, RecordedKey};
pub use escalations::{APPROVAL, EscalationRow, RecordedApproval};
pub use executions::ExecutionRecord;
pub use gc::{GcRule, Pruned};
pub use open::open_during;
pub use owner::{EXTERNAL as EXTERNAL_OWNER, Owner};
pub use rules::{NewRuleSet, RuleSetRow};
pub use sandboxes::{DEFAULT_KEEP_MAX_BYTES, NewSandbox, SandboxLimits, SandboxRow};
pub use skills::{NewSkill, SkillRow, TransitionRow, Transitioned, TrustedSkill};
pub use verifications::{GateResult, VerificationRow};

use kavi_foundation::state::{NodeState, RunStatus};

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

type Result<T, E = LedgerError> = std::result::Result<T, E>;

/// Records a stored artifact's row (once: content already recorded is left as it is).
fn keep_artifact(conn: &Db, artifact: &Artifact, at: &str) -> db::Result<()> {
    conn.prepare_cached(
        "INSERT INTO artifacts (sha256, kind, size, path, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT DO NOTHING",
    )?
    .execute(params![
        artifact.sha256,
        artifact.kind,
        artifact.size,
        artifact.path,
        at
    ])?;
    if let Some(content) = &artifact.inline {
        conn.prepare_cached(
            "INSERT INTO artifact_contents (sha256, content) VALUES (?1, ?2) ON CONFLICT DO NOTHING",
        )?
        .execute(params![artifact.sha256, &content[..]])?;
    }
    Ok(())
}

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

/// A connection to a ledger that is already open, not yet made (or made ahead of time): see
/// [`Ledger::another_connection`].
pub struct AnotherConnection(Way);

enum Way {
    /// Connect to this address when opened.
    To {
        address: Address,
        locks_dir: PathBuf,
    },
    /// The spare connection, already open.
    Made(Box<Ledger>),
}

#[derive(Debug)]
enum Address {
    File(PathBuf),
    Server(String),
}

impl AnotherConnection {
    /// Connects, on the calling thread: no migration or recovery, which the first connection did.
    pub fn open(self) -> Result<Ledger> {
        let (address, locks_dir) = match self.0 {
            Way::Made(ledger) => return Ok(*ledger),
            Way::To { address, locks_dir } => (address, locks_dir),
        };
        let conn = match &address {
            Address::File(path) => connect(path)?,
            Address::Server(url) => connect_postgres(url)?,
        };
        Ok(Ledger {
            conn,
            locks_dir,
            spare: None,
            closing: Vec::new(),
        })
    }
}

/// Where owners keep their lock files and rosters: beside the ledger file.
/// A server's ledger keeps them in a folder of this machine's own (the processes they name run
/// here), named for the server.
pub fn locks_dir(ledger: &Path) -> PathBuf {
    match postgres_url(ledger) {
        None => ledger.with_extension("locks"),
        Some(url) => {
            use sha2::Digest as _;
            let digest = format!("{:x}", sha2::Sha256::digest(url.as_bytes()));
            std::env::temp_dir().join(format!(
                "kavi-locks-{}-{}",
                nix::unistd::getuid(),
                &digest[..16]
            ))
        }
    }
}

/// The PostgreSQL URL a ledger location is, if it is one.
pub fn postgres_url(location: &Path) -> Option<&str> {
    location.to_str().filter(|text| postgres::is_url(text))
}

/// How messages name a ledger location: a server's password left out.
pub fn display_location(location: &Path) -> String {
    match postgres_url(location) {
        Some(url) => postgres::redacted(url),
        None => location.display().to_string(),
    }
}

/// Whether somebody holds the lock on the file at `path`; a missing file is not held.
/// The runs a [`RunFilter`] keeps, over parameters 1 (status), 2 (pipeline) and 3 (since).
const RUN_FILTER: &str = "(CAST(?1 AS TEXT) IS NULL OR status = ?1)
    AND (CAST(?2 AS TEXT) IS NULL OR pipeline = ?2)
    AND (CAST(?3 AS TEXT) IS NULL OR started_at >= ?3)";

fn held(path: &Path) -> std::io::Result<bool> {
    match File::open(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
        Ok(file) => match file.try_lock() {
            Ok(()) => Ok(false),
            Err(std::fs::TryLockError::WouldBlock) => Ok(true),
            Err(std::fs::TryLockError::Error(e)) => Err(e),
        },
    }
}

/// What recovery found of one dead owner and did about it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Recovered {
    pub owner: String,
    /// Runs it marked interrupted.
    pub runs: Vec<i64>,
    /// Leftover processes it stopped.
    pub killed: usize,
}

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
    /// The name of the [`Owner`] running it.
    pub owner: String,
    /// Every node as (id, kind); each gets a `pending` node run.
    pub nodes: Vec<(String, &'static str)>,
    /// The run's governing set (see [`crate::spec::governing`]), as (role, path, hash, text).
    pub governing: Vec<(&'static str, String, String, String)>,
}

/// Which runs to list; `None` matches all.
#[derive(Debug, Clone, Default)]
pub struct RunFilter {
    pub status: Option<RunStatus>,
    pub pipeline: Option<String>,
    /// Started at or after.
    pub since: Option<jiff::Timestamp>,
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

/// A run's node runs, read in the order they were recorded, grouped by node: each node where
/// it was first recorded (its pending row, in declaration order), its attempts in order. Grouped
/// here rather than by the query: SQLite's window function for it took 3.4 ms of a 1,000-node
/// run, this takes a pass over rows that are, without retries, already in order.
fn by_node(rows: Vec<NodeRunRow>) -> Vec<NodeRunRow> {
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

const RUN_COLUMNS: &str = "id, pipeline, spec_path, spec_hash, params, status, started_at, \
                           finished_at, duration_ms, parent_run, error, resumed_from, started_by, \
                           governing_hash";

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
    })
}

fn json_column(row: &db::Row, index: usize) -> db::Result<Option<Value>> {
    let text: Option<String> = row.get(index)?;
    text.map(|t| serde_json::from_str(&t))
        .transpose()
        .map_err(|e| db::DbError::Conversion {
            column: index,
            message: e.to_string(),
        })
}

fn enum_column<T: std::str::FromStr<Err = String>>(row: &db::Row, index: usize) -> db::Result<T> {
    row.parse(index, |text| text.parse::<T>())
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

impl Ledger {
    /// Opens the ledger only if it exists: for commands that read, which must not leave a
    /// ledger behind in a folder where nothing has run.
    pub fn open_existing(path: &Path) -> Result<Self> {
        match postgres_url(path) {
            // The connection that found the schema is the ledger's: one login, not two.
            Some(url) => {
                let conn = connect_postgres(url)?;
                if !postgres_schema_exists(&conn)? {
                    return Err(LedgerError::Missing(PathBuf::from(postgres::redacted(url))));
                }
                Self::opened(conn, path)
            }
            None if !path.exists() => Err(LedgerError::Missing(path.to_owned())),
            // A ledger on read-only media, or another account's, is still read: nothing is
            // migrated or recovered, and whatever writes says so at its first write.
            None if read_only_reason(path).is_some() => Self::open_read_only(path),
            None => Self::open(path),
        }
    }

    /// Opens (creating if needed) the ledger at `path`, a SQLite file, or a PostgreSQL server
    /// when `path` is a `postgres://` URL; applies pending migrations, and marks runs whose
    /// process died as interrupted.
    pub fn open(path: &Path) -> Result<Self> {
        Self::open_telling(path, || {})
    }

    /// [`Ledger::open`], calling `made` once a ledger file is there to connect to (a server's
    /// ledger never calls it): another thread may then make a connection of its own while this
    /// one is set up.
    fn open_telling(path: &Path, made: impl FnOnce()) -> Result<Self> {
        let conn = match postgres_url(path) {
            Some(url) => connect_postgres(url)?,
            None => {
                if let Some(reason) = read_only_reason(path).filter(|_| path.exists()) {
                    return Err(LedgerError::ReadOnly {
                        path: path.to_owned(),
                        reason,
                    });
                }
                if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                    std::fs::create_dir_all(parent)?;
                }
                schema::create(path).map_err(|source| LedgerError::Create {
                    path: path.to_owned(),
                    source,
                })?;
                made();
                connect(path)?
            }
        };
        Self::opened(conn, path)
    }

    /// The ledger on `conn`, a new connection to `path`: migrated, and recovered from the kavi
    /// processes of this machine that died.
    fn opened(mut conn: Db, path: &Path) -> Result<Self> {
        match postgres_url(path) {
            Some(url) => migrate_postgres(&mut conn, url)?,
            None => migrate(&mut conn, path)?,
        }
        let locks_dir = locks_dir(path);
        std::fs::create_dir_all(&locks_dir)?;
        let mut ledger = Self {
            conn,
            locks_dir,
            spare: None,
            closing: Vec::new(),
        };
        ledger.recover_interrupted()?;
        if ledger.identity()?.is_none() {
            // Made once, journaled (and MACed) like any row: a ledger opened after this kavi's
            // upgrade gets its identity here.
            ledger.conn.execute(
                "INSERT INTO ledger_identity (id, created_at)
                 SELECT ?1, ?2 WHERE NOT EXISTS (SELECT 1 FROM ledger_identity)",
                params![uuid::Uuid::new_v4().to_string(), now()],
            )?;
        }
        Ok(ledger)
    }

    /// Opens the existing ledger at `path` only to read it: no migration, no recovery, no
    /// identity made, no file written. For `kavi ledger verify`, which must change nothing it
    /// checks, and for every command that reads a ledger this account cannot write; a ledger of
    /// an older schema is refused with what to do.
    pub fn open_read_only(path: &Path) -> Result<Self> {
        let conn = match postgres_url(path) {
            Some(url) => {
                let conn = connect_postgres(url)?;
                if !postgres_schema_exists(&conn)? {
                    return Err(LedgerError::Missing(PathBuf::from(postgres::redacted(url))));
                }
                conn
            }
            None if !path.exists() => return Err(LedgerError::Missing(path.to_owned())),
            None => connect_read_only(path)?,
        };
        let found: i64 = conn
            .query_row("SELECT version FROM schema_version", [], |row| row.get(0))
            .optional()?
            .unwrap_or(0);
        let known = schema::MIGRATIONS.len();
        if found < known as i64 {
            return Err(LedgerError::OlderSchema {
                path: path.to_owned(),
                found,
                known,
            });
        }
        Ok(Self {
            conn,
            locks_dir: locks_dir(path),
            spare: None,
            closing: Vec::new(),
        })
    }

    /// The ledger's identity, made when it was first opened: what its checkpoint log is kept
    /// under. `None` for a ledger no kavi of this version has opened to write.
    pub fn identity(&self) -> Result<Option<String>> {
        Ok(self
            .conn
            .query_row("SELECT id FROM ledger_identity", [], |row| row.get(0))
            .optional()?)
    }

    /// MACs the journal entries written before kavi keyed the journal (see [`journal::seal`]).
    pub fn seal(&mut self) -> Result<usize> {
        journal::seal(&mut self.conn)
    }

    /// Refuses a skill whose row is not what the journal's keyed last entry for it says: its
    /// code hash, state or trusted tree edited outside kavi (see [`journal::row_problem`]).
    pub fn check_skill_journaled(&self, name: &str) -> Result<()> {
        self.check_journaled(
            "skills",
            serde_json::json!([name]),
            &format!("skill `{name}`"),
        )
    }

    /// Refuses a rule set whose row is not what the journal's keyed last entry for it says: its
    /// files, status or approvals edited outside kavi, so no decision is taken under it.
    pub fn check_rule_set_journaled(&self, id: i64) -> Result<()> {
        self.check_journaled(
            "rule_sets",
            serde_json::json!([id]),
            &format!("rule set {id}"),
        )
    }

    fn check_journaled(&self, table: &str, key: serde_json::Value, what: &str) -> Result<()> {
        match journal::row_problem(&self.conn, table, &key.to_string())? {
            Some(problem) => Err(LedgerError::Unjournaled(format!("{what}: {problem}"))),
            None => Ok(()),
        }
    }

    /// Makes, on this thread, the connection the next [`Ledger::another_connection`] hands
    /// out: for a caller that has a thread with time to spare now, where the connection's
    /// first use would otherwise wait for it (reading the schema, every journal trigger, takes
    /// milliseconds).
    pub fn open_spare(&mut self) -> Result<()> {
        let spare = Self::spare_from(self.another_connection()?)?;
        self.spare = Some(Box::new(spare));
        Ok(())
    }

    /// The connection [`Ledger::open_spare`] makes, made by a thread that has no ledger yet:
    /// to the file at `path`, which another thread is opening.
    fn connect_spare(path: &Path) -> Result<Ledger> {
        Self::spare_from(AnotherConnection(Way::To {
            address: Address::File(path.to_owned()),
            locks_dir: locks_dir(path),
        }))
    }

    /// Opens `connection` and reads the schema, which a connection otherwise does when it
    /// prepares its first statement: every journal trigger, about a millisecond.
    fn spare_from(connection: AnotherConnection) -> Result<Ledger> {
        let spare = connection.open()?;
        spare
            .conn
            .execute_batch("SELECT version FROM schema_version")?;
        Ok(spare)
    }

    /// How to open one more connection to this ledger, already migrated and recovered by this
    /// one: for a thread that writes while this connection's owner goes on. The thread opens it
    /// itself, so that reading the schema is not on the caller's time; or it gets the spare
    /// one, already open.
    pub fn another_connection(&mut self) -> Result<AnotherConnection> {
        if let Some(spare) = self.spare.take() {
            return Ok(AnotherConnection(Way::Made(spare)));
        }
        let address = match (self.conn.path(), self.conn.url()) {
            (Some(path), _) => Address::File(path.to_owned()),
            (None, Some(url)) => Address::Server(url.to_owned()),
            (None, None) => {
                return Err(
                    std::io::Error::other("this ledger is not one kavi can open again").into(),
                );
            }
        };
        Ok(AnotherConnection(Way::To {
            address,
            locks_dir: self.locks_dir.clone(),
        }))
    }

    fn owner_file(&self, owner: &str, extension: &str) -> PathBuf {
        self.locks_dir.join(format!("{owner}.{extension}"))
    }

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
        let tx = self.conn.transaction()?;
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
                               resumed_from, owner, started_by, governing_hash)
             VALUES (?1, ?2, ?3, ?4, 'running', ?5, ?6, ?7, ?8, ?9, ?10)
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
             DO UPDATE SET state = 'running', started_at = excluded.started_at",
            )?
            .execute(params![run_id, node_id, kind, attempt, started_at])?;
        Ok(())
    }

    /// Has this connection copy the WAL into the ledger file whenever one of its commits leaves
    /// more than `pages` pages there (SQLite's own threshold is 1,000). A server's ledger has
    /// no WAL.
    pub fn checkpoint_every(&self, pages: u32) -> Result<()> {
        if self.conn.backend() == db::Backend::Sqlite {
            self.conn
                .execute_batch(&format!("PRAGMA wal_autocheckpoint = {pages}"))?;
        }
        Ok(())
    }

    /// Copies what the WAL holds into the ledger file now, without waiting for anyone: for a
    /// connection about to close while another stays open. A server's ledger has no WAL.
    pub fn copy_wal(&self) -> Result<()> {
        if self.conn.backend() == db::Backend::Sqlite {
            self.conn.execute_batch("PRAGMA wal_checkpoint(PASSIVE)")?;
        }
        Ok(())
    }

    /// Has this connection wait for `thread`, which is closing another connection to this
    /// ledger, before it closes itself. The thread's checkpoint runs while this one's owner
    /// goes on; this connection, closing last, finds the WAL copied and only removes it.
    pub fn close_after(&mut self, thread: std::thread::JoinHandle<()>) {
        self.closing.push(thread);
    }

    /// Starts grouping this connection's writes into one transaction, until
    /// [`Ledger::commit_batch`]: the executor's recorder writes the decisions that arrive close
    /// together in one commit. Inside a batch, a no-op. The caller must not wait on anything
    /// else while a batch is open: other kavi processes wait for its lock.
    pub fn begin_batch(&self) -> Result<()> {
        if self.conn.is_autocommit() {
            self.conn.begin()?;
        }
        Ok(())
    }

    /// Commits the open batch, if there is one.
    pub fn commit_batch(&self) -> Result<()> {
        if !self.conn.is_autocommit() {
            self.conn.commit()?;
        }
        Ok(())
    }

    /// Gives up the open batch, if there is one, releasing its lock.
    pub fn rollback_batch(&self) {
        if !self.conn.is_autocommit() {
            self.conn.rollback();
        }
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
        let node_run_id: i64 = conn.prepare_cached(
            "UPDATE node_runs SET state = ?1, finished_at = ?2, duration_ms = ?3, exit_code = ?4,
                    outputs = ?5, error = ?6, reason = ?7, reused_from = ?11,
                    started_at = COALESCE(?12, started_at)
             WHERE run_id = ?8 AND node_id = ?9 AND attempt = ?10
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
        )?;
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

    /// Finds owners that died without cleaning up (their lock is free while their files or their
    /// unfinished rows remain), stops what they left running, marks their runs, node runs, builds
    /// and executions `interrupted` in one transaction per owner, and removes their files.
    pub fn recover_interrupted(&mut self) -> Result<Vec<Recovered>> {
        let _turn = owner::take_turn(&self.locks_dir, true)?;
        let mut owners = std::collections::BTreeSet::new();
        for entry in std::fs::read_dir(&self.locks_dir)? {
            let path = entry?.path();
            if let Some(name) = owner::name_of(&path) {
                owners.insert(name.to_owned());
            }
        }
        // Rows whose owner's files are gone already: an older kavi, or a recovery cut short.
        {
            let mut stmt = self.conn.prepare(
                "SELECT owner FROM runs WHERE status = 'running'
                 UNION SELECT owner FROM executions WHERE status = 'running' AND owner IS NOT NULL",
            )?;
            for owner in stmt.query_map([], |row| row.get::<_, String>(0))? {
                owners.insert(owner?);
            }
        }
        owners.remove(owner::EXTERNAL);
        // A shared ledger names owners on other machines: only this one's can be checked.
        owners.retain(|name| owner::runs_here(name));
        let mut recovered = Vec::new();
        for name in owners {
            let mut alive = false;
            for extension in owner::LOCKS {
                alive |= held(&self.owner_file(&name, extension))?;
            }
            if alive {
                continue;
            }
            let leftovers = match kavi_process::roster::stop_leftovers(
                &self.owner_file(&name, owner::ROSTER),
            ) {
                Ok(leftovers) => leftovers,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Default::default(),
                Err(e) => return Err(e.into()),
            };
            let runs = self.mark_interrupted(&name)?;
            if let Some(spill) = leftovers.spill {
                owner::remove_spill(&name, &spill);
            }
            for folder in &leftovers.folders {
                owner::remove_private_folder(folder);
            }
            // The lock goes last: while it is there, another kavi sees this owner as dead too.
            for extension in [owner::ROSTER, owner::LOCKS[1], owner::LOCKS[0]] {
                let _ = std::fs::remove_file(self.owner_file(&name, extension));
            }
            if !runs.is_empty() || leftovers.killed > 0 {
                tracing::warn!(
                    owner = %name,
                    runs = ?runs,
                    stopped = leftovers.killed,
                    "a kavi process was killed before it finished: its runs are marked \
                     interrupted and the processes it left running were stopped"
                );
                recovered.push(Recovered {
                    owner: name,
                    runs,
                    killed: leftovers.killed,
                });
            }
        }
        Ok(recovered)
    }

    /// Marks what `owner` left unfinished as interrupted, in one transaction; returns the runs.
    fn mark_interrupted(&mut self, owner: &str) -> Result<Vec<i64>> {
        let now = now();
        let tx = self.conn.transaction()?;
        let runs = tx
            .prepare(
                "UPDATE runs SET status = 'interrupted', finished_at = ?1,
                        error = 'the kavi process running it stopped before it finished'
                 WHERE owner = ?2 AND status = 'running' RETURNING id",
            )?
            .query_map(params![now, owner], |row| row.get::<_, i64>(0))?
            .collect::<db::Result<Vec<i64>>>()?;
        for run_id in &runs {
            tx.execute(
                "UPDATE node_runs SET state = 'interrupted', finished_at = ?1,
                        reason = 'the kavi process stopped while this node was unfinished'
                 WHERE run_id = ?2 AND state IN ('pending', 'running')",
                params![now, run_id],
            )?;
            tx.execute(
                "UPDATE builds SET status = 'interrupted', finished_at = ?1
                 WHERE run_id = ?2 AND status = 'running'",
                params![now, run_id],
            )?;
        }
        tx.execute(
            "UPDATE executions SET status = 'interrupted', finished_at = ?1,
                    error = 'the kavi process running it stopped before it finished'
             WHERE owner = ?2 AND status = 'running'",
            params![now, owner],
        )?;
        tx.commit()?;
        Ok(runs)
    }

    /// Checks the ledger's integrity (see [`journal::verify`]), and its checkpoints against the
    /// `trusted` key when one is known.
    pub fn verify(
        &self,
        store: &ArtifactStore,
        trusted: Option<&ed25519_dalek::VerifyingKey>,
        logged: &checkpoint::Log,
    ) -> Result<journal::Findings> {
        journal::verify(&self.conn, store, trusted, logged)
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
            "SELECT {RUN_COLUMNS} FROM runs WHERE {RUN_FILTER} ORDER BY id DESC LIMIT ?4"
        ))?;
        let rows = stmt.query_map(
            params![
                filter.status.map(RunStatus::as_str),
                filter.pipeline,
                since,
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
            params![filter.status.map(RunStatus::as_str), filter.pipeline, since],
            |row| row.get(0),
        )?;
        Ok(u64::try_from(count).unwrap_or(0))
    }

    /// A stored artifact's row, by its SHA-256 or a unique prefix of it.
    pub fn artifact(&self, prefix: &str) -> Result<Artifact> {
        let hex = prefix.strip_prefix("sha256:").unwrap_or(prefix);
        let found: Vec<Artifact> = self
            .conn
            .prepare("SELECT sha256, kind, size, path FROM artifacts WHERE sha256 LIKE ?1 LIMIT 2")?
            .query_map([format!("{hex}%")], |row| {
                Ok(Artifact {
                    sha256: row.get(0)?,
                    kind: row.get(1)?,
                    size: row.get(2)?,
                    path: row.get(3)?,
                    inline: None,
                })
            })?
            .collect::<db::Result<_>>()?;
        match <[Artifact; 1]>::try_from(found) {
            Ok([artifact]) if !hex.is_empty() => Ok(artifact),
            _ => Err(LedgerError::ArtifactNotFound(prefix.to_owned())),
        }
    }

    /// The bytes of an artifact the ledger keeps, checked against its hash; `None` when it is
    /// the store's file.
    pub fn kept_artifact(&self, sha256: &str) -> Result<Option<Vec<u8>>, String> {
        let kept: Option<Vec<u8>> = self
            .conn
            .query_row(
                "SELECT content FROM artifact_contents WHERE sha256 = ?1",
                [sha256],
                |row| row.get(0),
            )
            .optional()
            .map_err(|e| e.to_string())?;
        match kept {
            Some(bytes) if kavi_foundation::hash::sha256_hex(&bytes) != sha256 => Err(format!(
                "artifact {sha256} in the ledger was altered: its content no longer matches its hash"
            )),
            kept => Ok(kept),
        }
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

    /// Who owns run `run_id`: a kavi process's name, or [`owner::EXTERNAL`].
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
fn merge_by_path(
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

/// How long opening the ledger waits for another process's lock before giving up.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// A connection to the ledger file at `path`, set up as every kavi connection is.
fn connect(path: &Path) -> Result<Db> {
    let open_error = |source: rusqlite::Error| LedgerError::Open {
        path: path.to_owned(),
        source: source.into(),
    };
    memory::use_mimalloc();
    let conn = rusqlite::Connection::open(path).map_err(open_error)?;
    conn.busy_timeout(BUSY_TIMEOUT).map_err(open_error)?;
    enable_wal(&conn).map_err(open_error)?;
    // In WAL mode NORMAL is durable against process crashes; only power loss may drop the
    // last commits, and never corrupts the file.
    conn.pragma_update(None, "synchronous", "NORMAL")
        .map_err(open_error)?;
    conn.pragma_update(None, "foreign_keys", "ON")
        .map_err(open_error)?;
    let key = keys::mac_key().map_err(LedgerError::Keys)?;
    journal::register(&conn, key).map_err(open_error)?;
    Ok(Db::from_sqlite(conn))
}

/// Why this account cannot write the ledger file at `path` (it, or the folder its journal and
/// locks are made in, is read-only to it), if it cannot.
fn read_only_reason(path: &Path) -> Option<String> {
    use nix::unistd::{AccessFlags, access};
    let folder = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    [path, folder].into_iter().find_map(|p| {
        let denied = match access(p, AccessFlags::W_OK) {
            Ok(()) => return None,
            Err(nix::errno::Errno::ENOENT) => return None,
            Err(nix::errno::Errno::EROFS) => "on a read-only file system".to_owned(),
            Err(e) => format!("not writable by this account: {}", e.desc()),
        };
        Some(format!("{} is {denied}", p.display()))
    })
}

/// A read-only connection to the ledger file at `path` (see [`Ledger::open_read_only`]): nothing is
/// written, not even the write-ahead log's index. A ledger whose last writer closed cleanly has
/// no `-wal`, and is read as the immutable file it then is; one with a `-wal` is read through it.
fn connect_read_only(path: &Path) -> Result<Db> {
    use rusqlite::OpenFlags;
    let open_error = |source: rusqlite::Error| LedgerError::Open {
        path: path.to_owned(),
        source: source.into(),
    };
    memory::use_mimalloc();
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    let immutable = !Path::new(&wal).exists();
    let mut uri = url_path(path);
    uri.push_str(if immutable {
        "?immutable=1"
    } else {
        "?mode=ro"
    });
    let conn = rusqlite::Connection::open_with_flags(
        &uri,
        OpenFlags::SQLITE_OPEN_READ_ONLY
            | OpenFlags::SQLITE_OPEN_URI
            | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(open_error)?;
    conn.busy_timeout(BUSY_TIMEOUT).map_err(open_error)?;
    let key = keys::mac_key().map_err(LedgerError::Keys)?;
    journal::register(&conn, key).map_err(open_error)?;
    Ok(Db::from_sqlite(conn))
}

/// `path` as a `file:` URI, its reserved characters escaped.
fn url_path(path: &Path) -> String {
    let mut uri = String::from("file:");
    for byte in path.as_os_str().as_encoded_bytes() {
        match byte {
            b'%' | b'?' | b'#' => uri.push_str(&format!("%{byte:02X}")),
            _ => uri.push(char::from(*byte)),
        }
    }
    uri
}

/// Switches the file to WAL, retrying while another process holds a lock.
///
/// SQLite takes the lock for the switch without calling the busy handler: when several kavi
/// processes open a fresh ledger at once, the switch fails with `SQLITE_BUSY`, or silently leaves
/// the old journal mode in place (the pragma answers with the mode in force). Either way, retry
/// until the file answers `wal`.
fn enable_wal(conn: &rusqlite::Connection) -> rusqlite::Result<()> {
    let deadline = std::time::Instant::now() + BUSY_TIMEOUT;
    loop {
        let mode = conn
            .pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get::<_, String>(0));
        let busy = match &mode {
            Ok(mode) if mode.eq_ignore_ascii_case("wal") => return Ok(()),
            Ok(_) => true,
            Err(rusqlite::Error::SqliteFailure(e, _)) => {
                e.code == rusqlite::ErrorCode::DatabaseBusy
            }
            Err(_) => false,
        };
        if !busy || std::time::Instant::now() >= deadline {
            return mode.and_then(|mode| {
                Err(rusqlite::Error::SqliteFailure(
                    rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_BUSY),
                    Some(format!(
                        "the ledger stayed in journal mode `{mode}`, not WAL"
                    )),
                ))
            });
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn connect_postgres(url: &str) -> Result<Db> {
    let conn = Db::connect_postgres(url).map_err(|source| LedgerError::Open {
        path: PathBuf::from(postgres::redacted(url)),
        source,
    })?;
    postgres::key_session(&conn, keys::mac_key().map_err(LedgerError::Keys)?)?;
    Ok(conn)
}

fn postgres_schema_exists(conn: &Db) -> Result<bool> {
    Ok(conn.query_row(
        "SELECT to_regclass('schema_version') IS NOT NULL",
        [],
        |row| row.get(0),
    )?)
}

/// A server's ledger is made whole at the schema's current version, from the schema SQLite
/// reaches after every migration (see [`postgres::schema`]); one made by an older kavi is
/// brought up to it by [`schema::SERVER_STEPS`], under the write lock, in one transaction.
fn migrate_postgres(conn: &mut Db, url: &str) -> Result<()> {
    let known = schema::MIGRATIONS.len();
    let version = |conn: &Db| -> Result<Option<usize>> {
        if !postgres_schema_exists(conn)? {
            return Ok(None);
        }
        let version: i64 =
            conn.query_row("SELECT version FROM schema_version", [], |row| row.get(0))?;
        Ok(Some(usize::try_from(version).unwrap_or(usize::MAX)))
    };
    let found = match version(conn)? {
        Some(found) => found,
        None => {
            // Decided again under the write lock: another kavi may be making it too.
            let tx = conn.transaction()?;
            if version(&tx)?.is_none() {
                for statement in postgres::schema(&sqlite_schema()?) {
                    tx.execute_batch(&statement)?;
                }
                tx.execute_batch("CREATE TABLE schema_version (version BIGINT NOT NULL)")?;
                tx.execute("INSERT INTO schema_version (version) VALUES (?1)", [known])?;
                journal::install(&tx)?;
            }
            tx.commit()?;
            known
        }
    };
    let found = if (schema::FIRST_ON_A_SERVER..known).contains(&found) {
        upgrade_postgres(conn)?;
        known
    } else {
        found
    };
    let path = PathBuf::from(postgres::redacted(url));
    match found.cmp(&known) {
        std::cmp::Ordering::Equal => Ok(()),
        std::cmp::Ordering::Greater => Err(LedgerError::TooNew { path, found, known }),
        std::cmp::Ordering::Less => Err(LedgerError::ServerTooOld { path, found, known }),
    }
}

/// Takes a server's ledger from its version to the current one, each migration's steps in turn,
/// then journals what they changed and remakes the journal's triggers, as SQLite's migrations
/// do. The version is read again under the write lock: another kavi may have upgraded it.
fn upgrade_postgres(conn: &mut Db) -> Result<()> {
    let tx = conn.transaction()?;
    let version: i64 = tx.query_row("SELECT version FROM schema_version", [], |row| row.get(0))?;
    let version = usize::try_from(version).unwrap_or(usize::MAX);
    if version >= schema::MIGRATIONS.len() {
        return Ok(tx.commit()?);
    }
    // Migration `done` (counted from 0) makes version `done + 1`.
    for done in version.max(schema::FIRST_ON_A_SERVER)..schema::MIGRATIONS.len() {
        for step in schema::SERVER_STEPS[done - schema::FIRST_ON_A_SERVER] {
            tx.execute_batch(&server_sql(step, done + 1)?)?;
        }
    }
    tx.execute(
        "UPDATE schema_version SET version = ?1",
        [schema::MIGRATIONS.len()],
    )?;
    journal::install(&tx)?;
    Ok(tx.commit()?)
}

/// What `step`, of the migration that makes the schema version `version`, runs on a server. A
/// table is made as that migration left it (a later one's steps change it from there).
fn server_sql(step: &schema::ServerStep, version: usize) -> Result<String> {
    match step {
        schema::ServerStep::Table(name) => {
            postgres::table_named(&sqlite_schema_after(version)?, name).ok_or_else(|| {
                std::io::Error::other(format!("migration {version} makes no table {name}")).into()
            })
        }
        schema::ServerStep::Sql(sql) => Ok((*sql).to_owned()),
    }
}

/// The schema as SQLite has it after every migration: (kind, name, SQL) in creation order.
fn sqlite_schema() -> Result<Vec<(String, String, String)>> {
    sqlite_schema_after(schema::MIGRATIONS.len())
}

/// The schema as SQLite has it after the first `migrations` migrations.
fn sqlite_schema_after(migrations: usize) -> Result<Vec<(String, String, String)>> {
    memory::use_mimalloc();
    let conn = Db::from_sqlite(rusqlite::Connection::open_in_memory().map_err(db::DbError::from)?);
    for migration in &schema::MIGRATIONS[..migrations] {
        conn.execute_batch(migration)?;
    }
    Ok(conn
        .prepare(
            "SELECT type, name, sql FROM sqlite_master
             WHERE sql IS NOT NULL AND name NOT LIKE 'sqlite_%' ORDER BY rowid",
        )?
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))?
        .collect::<db::Result<_>>()?)
}

fn migrate(conn: &mut Db, path: &Path) -> Result<()> {
    // Almost always the schema is current: say so from a read, without taking the write lock
    // every kavi command would otherwise take (and commit) just to open the ledger.
    let has_version = conn
        .query_row(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'",
            [],
            |_| Ok(()),
        )
        .optional()?
        .is_some();
    if has_version {
        let current: Option<i64> = conn
            .query_row("SELECT version FROM schema_version", [], |row| row.get(0))
            .optional()?;
        if current == Some(schema::MIGRATIONS.len() as i64) {
            if !journal::current(conn)? {
                // The triggers it has still journal every write: a ledger this kavi cannot
                // write to now (a read-only file, a lock held past the timeout) is used as is.
                if let Err(e) = journal::remake(conn) {
                    tracing::debug!(error = %e, "the journal's triggers were left as they were");
                }
            }
            return Ok(());
        }
    }
    // Older, newer or new: decided again under the write lock, which another kavi may have
    // taken to migrate first.
    let tx = conn.transaction()?;
    tx.execute_batch("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")?;
    let current: Option<i64> = tx
        .query_row("SELECT version FROM schema_version", [], |row| row.get(0))
        .optional()?;
    let current = usize::try_from(current.unwrap_or(0)).unwrap_or(usize::MAX);
    if current > schema::MIGRATIONS.len() {
        return Err(LedgerError::TooNew {
            path: path.to_owned(),
            found: current,
            known: schema::MIGRATIONS.len(),
        });
    }
    if current == 0 && schema::is_empty(&tx)? {
        // A new ledger gets the schema the migrations reach, journal triggers included, in one
        // script: replaying them re-reads the whole schema at every ALTER TABLE, which made
        // creating a ledger most of a new workspace's first run.
        tx.execute_batch(schema::CURRENT)?;
    } else {
        schema::replay(&tx, current)?;
    }
    tx.execute("DELETE FROM schema_version", [])?;
    tx.execute(
        "INSERT INTO schema_version (version) VALUES (?1)",
        [schema::MIGRATIONS.len() as i64],
    )?;
    tx.commit()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{DEMO_HASH, DEMO_TEXT, fresh_ledger, new_run, wal_frames};

    #[test]
    fn a_sets_members_and_legacy_rows_merge_in_path_order_each_file_once() {
        let file = |path: &str, hash: &str| GoverningFile {
            role: "policy".into(),
            path: path.into(),
            spec_hash: hash.into(),
        };
        let members = vec![file("a", "1"), file("c", "3"), file("d", "4")];
        let legacy = vec![
            file("b", "2"),
            file("c", "3"),
            file("c", "9"),
            file("e", "5"),
        ];
        let merged = merge_by_path(members, legacy);
        let listed: Vec<(&str, &str)> = merged
            .iter()
            .map(|f| (f.path.as_str(), f.spec_hash.as_str()))
            .collect();
        assert_eq!(
            listed,
            [
                ("a", "1"),
                ("b", "2"),
                ("c", "3"),
                ("c", "9"),
                ("d", "4"),
                ("e", "5")
            ]
        );
        assert_eq!(
            merge_by_path(Vec::new(), vec![file("x", "1")]),
            [file("x", "1")]
        );
        // A server may sort by a collation of its own: the merge does not rely on the order.
        let merged = merge_by_path(
            vec![file("b", "2"), file("a-b", "1")],
            vec![file("a-b", "1"), file("a_c", "3")],
        );
        let paths: Vec<&str> = merged.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(paths, ["a-b", "a_c", "b"]);
    }

    #[test]
    fn times_are_written_to_the_millisecond_in_fixed_width() {
        for (ms, text) in [
            (0, "1970-01-01T00:00:00.000Z"),
            (1_795_000_000_000, "2026-11-18T11:06:40.000Z"),
            (1_795_000_000_908, "2026-11-18T11:06:40.908Z"),
            (1_795_000_000_050, "2026-11-18T11:06:40.050Z"),
            (253_402_207_199_999, "9999-12-30T21:59:59.999Z"),
        ] {
            let time = jiff::Timestamp::from_millisecond(ms).unwrap();
            assert_eq!(format_time(time), text);
            // What `strftime` wrote before: the ledger's older rows compare with these.
            assert_eq!(time.strftime("%Y-%m-%dT%H:%M:%S%.3fZ").to_string(), text);
        }
        // Below the millisecond is cut, not rounded, as before.
        let time = jiff::Timestamp::from_nanosecond(1_795_000_000_999_999_999).unwrap();
        assert_eq!(format_time(time), "2026-11-18T11:06:40.999Z");
    }

    #[test]
    fn a_runs_rows_written_in_one_statement_keep_their_order_and_exact_texts() {
        let (dir, mut ledger, owner) = fresh_ledger();
        // Texts that JSON must escape, and one that is not valid as a C string: each is stored
        // byte for byte and still hashes to its name.
        let texts = [
            "plain",
            "quote \" backslash \\ tab \t newline \n",
            "nul \0 inside",
            "unicode é ✓ 𝄞",
            "",
        ];
        let governing: Vec<(&'static str, String, String, String)> = texts
            .iter()
            .enumerate()
            .map(|(i, text)| {
                let hash = kavi_foundation::hash::spec_hash(text);
                (
                    "script",
                    format!("scripts/{i}.sh"),
                    hash,
                    (*text).to_owned(),
                )
            })
            .collect();
        // Node ids in an order that is not sorted: the rows follow the pipeline's order.
        let nodes: Vec<String> = (0..300).map(|i| format!("n{}", (i * 7) % 300)).collect();
        let names: Vec<&str> = nodes.iter().map(String::as_str).collect();
        let new = NewRun {
            governing: governing.clone(),
            ..new_run(&serde_json::json!({}), &names, &owner)
        };
        let run = ledger.create_run(&new).unwrap();

        let written: Vec<(String, String, String)> = ledger
            .conn
            .prepare("SELECT node_id, kind, state FROM node_runs WHERE run_id = ?1 ORDER BY id")
            .unwrap()
            .query_map(params![run], |row| {
                Ok((row.get(0)?, row.get(1)?, row.get(2)?))
            })
            .unwrap()
            .collect::<std::result::Result<_, _>>()
            .unwrap();
        let expected: Vec<(String, String, String)> = nodes
            .iter()
            .map(|id| (id.clone(), "exec".to_owned(), "pending".to_owned()))
            .collect();
        assert_eq!(written, expected);
        for (_, path, hash, text) in &governing {
            let (stored, stored_path): (String, String) = ledger
                .conn
                .query_row(
                    "SELECT text, path FROM specs WHERE hash = ?1",
                    params![hash],
                    |row| Ok((row.get(0)?, row.get(1)?)),
                )
                .unwrap();
            assert_eq!((&stored, &stored_path), (text, path));
        }
        let listed: Vec<String> = ledger
            .governing(run)
            .unwrap()
            .into_iter()
            .map(|file| file.path)
            .collect();
        assert_eq!(
            listed,
            (0..texts.len())
                .map(|i| format!("scripts/{i}.sh"))
                .collect::<Vec<_>>()
        );
        let store = ArtifactStore::open(&dir.path().join("artifacts")).unwrap();
        let findings = ledger.verify(&store, None, &Vec::new()).unwrap();
        assert!(findings.problems.is_empty(), "{:?}", findings.problems);
    }

    #[test]
    fn a_governing_set_is_kept_once_for_every_run_that_has_it() {
        let (dir, mut ledger, owner) = fresh_ledger();
        let params = serde_json::json!({});
        let member = |path: &str, text: &str| {
            let hash = kavi_foundation::hash::spec_hash(text);
            ("policy", path.to_owned(), hash, text.to_owned())
        };
        let run_with =
            |ledger: &mut Ledger, governing: &[(&'static str, String, String, String)]| {
                let new = NewRun {
                    governing: governing.to_vec(),
                    ..new_run(&params, &["n"], &owner)
                };
                let id = ledger.create_run(&new).unwrap();
                ledger
                    .finish_run(id, RunStatus::Succeeded, Duration::ZERO, None)
                    .unwrap();
                id
            };
        let count = |ledger: &Ledger, sql: &str| -> i64 {
            ledger.conn.query_row(sql, [], |row| row.get(0)).unwrap()
        };
        let listed = |ledger: &Ledger, run: i64| -> Vec<(String, String, String)> {
            let files = ledger.governing(run).unwrap();
            files
                .into_iter()
                .map(|f| (f.role, f.path, f.spec_hash))
                .collect()
        };
        let set = [
            member("policies/a.toml", "a = 1"),
            member("policies/b.toml", "b = 2"),
        ];
        let expected = |set: &[(&str, String, String, String)]| -> Vec<(String, String, String)> {
            set.iter()
                .map(|(role, path, hash, _)| ((*role).to_owned(), path.clone(), hash.clone()))
                .collect()
        };

        let first = run_with(&mut ledger, &set);
        let second = run_with(&mut ledger, &set);
        // The second run wrote nothing for its set: two members, two journal entries, and no
        // row per run.
        let members = "SELECT COUNT(*) FROM governing_members";
        assert_eq!(count(&ledger, members), 2);
        assert_eq!(
            count(
                &ledger,
                "SELECT COUNT(*) FROM journal WHERE tbl = 'governing_members'"
            ),
            2
        );
        assert_eq!(count(&ledger, "SELECT COUNT(*) FROM run_policies"), 0);
        assert_eq!(listed(&ledger, first), expected(&set));
        assert_eq!(listed(&ledger, second), expected(&set));

        // One file changed: another set, and the first runs still list theirs.
        let changed = [set[0].clone(), member("policies/b.toml", "b = 3")];
        let third = run_with(&mut ledger, &changed);
        assert_eq!(count(&ledger, members), 4);
        assert_eq!(listed(&ledger, third), expected(&changed));
        assert_eq!(listed(&ledger, first), expected(&set));

        // A set found short (a member deleted by hand) is completed by the next run with it.
        ledger
            .conn
            .execute(
                "DELETE FROM governing_members WHERE path = 'policies/a.toml' AND spec_hash = ?1
                 AND set_hash = (SELECT governing_hash FROM runs WHERE id = ?2)",
                params![set[0].2, first],
            )
            .unwrap();
        let fourth = run_with(&mut ledger, &set);
        assert_eq!(listed(&ledger, fourth), expected(&set));
        assert_eq!(listed(&ledger, first), expected(&set));

        // A run recorded before sets were kept once has its members in run_policies: listed,
        // and a member in both tables once.
        for (role, path, hash, _) in &set {
            ledger
                .conn
                .execute(
                    "INSERT INTO run_policies (run_id, path, spec_hash, role) VALUES (?1, ?2, ?3, ?4)",
                    params![first, path, hash, role],
                )
                .unwrap();
        }
        assert_eq!(listed(&ledger, first), expected(&set));
        ledger
            .conn
            .execute(
                "UPDATE runs SET governing_hash = NULL WHERE id = ?1",
                [first],
            )
            .unwrap();
        assert_eq!(listed(&ledger, first), expected(&set));

        // gc: the set of the pruned runs stays while a kept run names it, and goes with the
        // last one. Keep the latest run (the fourth, with the first set): the changed set goes.
        let rule = super::gc::GcRule {
            before: "9999-01-01T00:00:00Z".into(),
            keep: 1,
        };
        let pruned = ledger.prune_runs(&rule, false).unwrap();
        assert_eq!(pruned.runs, vec![first, second, third]);
        assert_eq!(count(&ledger, members), 2);
        assert_eq!(listed(&ledger, fourth), expected(&set));
        assert_eq!(count(&ledger, "SELECT COUNT(*) FROM run_policies"), 0);
        let store = ArtifactStore::open(&dir.path().join("artifacts")).unwrap();
        let findings = ledger.verify(&store, None, &Vec::new()).unwrap();
        assert!(findings.problems.is_empty(), "{:?}", findings.problems);
    }

    #[test]
    fn times_have_a_fixed_width_so_text_order_is_time_order() {
        let at = |ms: i64| format_time(jiff::Timestamp::from_millisecond(ms).unwrap());
        assert_eq!(at(1_700_000_000_120), "2023-11-14T22:13:20.120Z");
        assert_eq!(at(1_700_000_000_000), "2023-11-14T22:13:20.000Z");
        assert!(at(1_700_000_000_120) < at(1_700_000_000_123));
    }

    #[test]
    fn a_connection_told_to_checkpoint_often_leaves_few_pages_in_the_wal() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.db");
        // A table, then 20 commits of a page or more each.
        let text = "x".repeat(4096);
        let fill = |ledger: &Ledger| {
            ledger.conn.execute_batch("CREATE TABLE t (x)").unwrap();
            for _ in 0..20 {
                ledger
                    .conn
                    .execute("INSERT INTO t VALUES (?1)", params![text])
                    .unwrap();
            }
        };
        let often = Ledger::open(&path).unwrap();
        often.checkpoint_every(8).unwrap();
        fill(&often);
        let (frames, copied) = wal_frames(&path);
        assert!(frames - copied <= 8 + 2, "{frames} frames, {copied} copied");
        // SQLite's own threshold copies nothing yet.
        let seldom = Ledger::open(&dir.path().join("other.db")).unwrap();
        fill(&seldom);
        let (frames, copied) = wal_frames(&dir.path().join("other.db"));
        assert!(
            frames > 20 && copied == 0,
            "{frames} frames, {copied} copied"
        );
    }

    /// Regression: CI saw "database is locked" when several processes opened a fresh ledger at
    /// once: SQLite answers a concurrent switch to WAL with `SQLITE_BUSY` without waiting.
    #[test]
    fn many_openers_of_a_fresh_ledger_all_succeed() {
        const OPENERS: usize = 6;
        for round in 0..40 {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("ledger.db");
            let start = std::sync::Arc::new(std::sync::Barrier::new(OPENERS));
            let openers: Vec<_> = (0..OPENERS)
                .map(|_| {
                    let (path, start) = (path.clone(), start.clone());
                    std::thread::spawn(move || {
                        start.wait();
                        Ledger::open(&path).map(|_| ())
                    })
                })
                .collect();
            for opener in openers {
                if let Err(e) = opener.join().unwrap() {
                    panic!("round {round}: {e}");
                }
            }
            super::memory::use_mimalloc();
            let mode: String = rusqlite::Connection::open(&path)
                .unwrap()
                .query_row("PRAGMA journal_mode", [], |row| row.get(0))
                .unwrap();
            assert_eq!(mode, "wal");
        }
    }

    #[test]
    fn a_run_s_id_is_announced_before_any_of_it_is_committed() {
        let (_dir, mut ledger, owner) = fresh_ledger();
        let reader = ledger.another_connection().unwrap().open().unwrap();
        let mut announced = None;
        let run_id = ledger
            .create_run_announcing(&new_run(&Value::Null, &["a", "b"], &owner), |id| {
                // Another connection sees nothing of the run yet.
                assert!(matches!(reader.run(id), Err(LedgerError::RunNotFound(_))));
                announced = Some(id);
            })
            .unwrap();
        assert_eq!(announced, Some(run_id));
        // Its spec, written after the announcement on SQLite, is committed with it.
        let spec_hash = reader.run(run_id).unwrap().spec_hash;
        assert_eq!(reader.spec_text(&spec_hash).unwrap().1, DEMO_TEXT);
        let nodes = reader.run_detail(run_id).unwrap().nodes;
        let states: Vec<_> = nodes
            .iter()
            .map(|n| (n.node_id.as_str(), n.state))
            .collect();
        assert_eq!(
            states,
            [("a", NodeState::Pending), ("b", NodeState::Pending)]
        );
    }

    #[test]
    fn a_run_s_node_runs_read_back_by_node_then_attempt() {
        let (_dir, mut ledger, owner) = fresh_ledger();
        let run_id = ledger
            .create_run(&new_run(&Value::Null, &["c", "a", "b"], &owner))
            .unwrap();
        // Retries recorded after every first attempt, in another order than the nodes'.
        for (node, attempt) in [("b", 2), ("c", 2), ("b", 3)] {
            ledger
                .start_node(run_id, node, "exec", attempt, &now())
                .unwrap();
        }
        let nodes = ledger.run_detail(run_id).unwrap().nodes;
        let order: Vec<_> = nodes
            .iter()
            .map(|n| (n.node_id.as_str(), n.attempt))
            .collect();
        assert_eq!(
            order,
            [("c", 1), ("c", 2), ("a", 1), ("b", 1), ("b", 2), ("b", 3)]
        );
    }

    #[test]
    fn a_run_records_every_node_and_its_spec() {
        let (_dir, mut ledger, owner) = fresh_ledger();
        let params = serde_json::json!({"x": 1});
        let run_id = ledger
            .create_run(&new_run(&params, &["a", "b"], &owner))
            .unwrap();
        ledger.start_node(run_id, "a", "exec", 1, &now()).unwrap();
        let outputs = serde_json::json!({"exit_code": 0});
        ledger
            .finish_node(
                run_id,
                "a",
                1,
                NodeState::Succeeded,
                &NodeRecord {
                    exit_code: Some(0),
                    outputs: Some(outputs.clone()),
                    ..Default::default()
                },
            )
            .unwrap();
        let detail = ledger.run_detail(run_id).unwrap();
        assert_eq!(detail.run.status, RunStatus::Running);
        let states: Vec<_> = detail
            .nodes
            .iter()
            .map(|n| (n.node_id.as_str(), n.state))
            .collect();
        assert_eq!(
            states,
            [("a", NodeState::Succeeded), ("b", NodeState::Pending)]
        );
        assert_eq!(detail.nodes[0].outputs, Some(outputs));
        let (hash, text) = ledger.spec_text(&DEMO_HASH[..12]).unwrap();
        assert_eq!(hash, *DEMO_HASH);
        assert!(text.contains("demo"));
        assert_eq!(ledger.resolve_run("latest").unwrap(), run_id);
        assert!(matches!(
            ledger.resolve_run("99"),
            Err(LedgerError::RunNotFound(_))
        ));
    }

    /// An owner half-way through its claim (its `.claiming` file made but not locked yet) is
    /// not taken for dead: recovery waits for the claim to end, then finds the owner alive.
    #[test]
    fn recovery_waits_for_a_claim_in_progress_and_finds_its_owner_alive() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.db");
        let mut ledger = Ledger::open(&path).unwrap();
        let locks = locks_dir(&path);
        let name = format!("{}-1", std::process::id());
        let [claiming, lock] = ["claiming", "lock"].map(|e| locks.join(format!("{name}.{e}")));
        // What a claim does, stopped after its first step.
        let turn = owner::take_turn(&locks, false).unwrap();
        let held = File::create(&claiming).unwrap();
        let recovery = std::thread::spawn(move || ledger.recover_interrupted().unwrap());
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(claiming.exists(), "recovery removed a claim in progress");
        // The claim goes on: locked, renamed into place, done.
        held.lock().unwrap();
        std::fs::rename(&claiming, &lock).unwrap();
        drop(turn);
        assert_eq!(recovery.join().unwrap(), Vec::new());
        assert!(lock.exists(), "recovery removed a live owner's lock");
    }

    #[test]
    fn a_run_whose_owner_is_gone_is_marked_interrupted_and_a_live_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.db");
        let mut ledger = Ledger::open(&path).unwrap();
        let (live_owner, dead_owner) = (
            Owner::claim(&path, dir.path()).unwrap(),
            Owner::claim(&path, dir.path()).unwrap(),
        );
        let params = serde_json::json!({});
        let live = ledger
            .create_run(&new_run(&params, &["a"], &live_owner))
            .unwrap();
        let dead = ledger
            .create_run(&new_run(&params, &["a"], &dead_owner))
            .unwrap();
        ledger.start_node(dead, "a", "exec", 1, &now()).unwrap();
        let store = ArtifactStore::open(&dir.path().join("artifacts")).unwrap();
        let spec = store.put_bytes("SKILL_SPEC", b"{}").unwrap();
        ledger
            .propose_skill(&NewSkill {
                name: "s",
                description: "",
                side_effect: "READ_ONLY",
                spec: &spec,
                proposal_path: "proposals/s.toml",
                initial_state: "PROPOSED",
                actor: "test",
            })
            .unwrap();
        let build = ledger.start_build("s", dead, "a").unwrap();
        let execution = ExecutionRecord {
            execution_id: "e1".into(),
            parent_execution_id: None,
            skill: "s".into(),
            source_hash: None,
            skill_version: None,
            side_effect: "READ_ONLY".into(),
            input: None,
            output: None,
            success: false,
            error: None,
            started_at: now(),
            finished_at: now(),
            duration_ms: 0,
            chain: None,
            step: None,
            run_id: None,
            confinement: None,
            caller: None,
        };
        ledger
            .start_execution(&execution, dead_owner.name())
            .unwrap();
        // Releasing the lock is what a dying process does.
        drop(dead_owner);

        let reopened = Ledger::open(&path).unwrap();
        assert_eq!(
            reopened.run_detail(live).unwrap().run.status,
            RunStatus::Running
        );
        let detail = reopened.run_detail(dead).unwrap();
        assert_eq!(detail.run.status, RunStatus::Interrupted);
        assert_eq!(detail.nodes[0].state, NodeState::Interrupted);
        assert_eq!(reopened.build(build.id).unwrap().status, "interrupted");
        let status: String = reopened
            .conn
            .query_row("SELECT status FROM executions WHERE id = 'e1'", [], |r| {
                r.get(0)
            })
            .unwrap();
        assert_eq!(status, "interrupted");
        drop(live_owner);
    }

    #[test]
    fn migrations_are_recorded_and_a_newer_ledger_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.db");
        drop(Ledger::open(&path).unwrap());
        super::memory::use_mimalloc();
        let conn = rusqlite::Connection::open(&path).unwrap();
        let version: i64 = conn
            .query_row("SELECT version FROM schema_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(version, schema::MIGRATIONS.len() as i64);
        conn.execute("UPDATE schema_version SET version = 999", [])
            .unwrap();
        drop(conn);
        assert!(matches!(
            Ledger::open(&path),
            Err(LedgerError::TooNew { found: 999, .. })
        ));
    }
}
