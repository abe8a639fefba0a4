//! The ledger on a PostgreSQL server, for a team that shares one: the same schema, journal and
//! verification as the SQLite file, reached through the same [`crate::Db`] as [`Postgres`].
//!
//! The client is the sync `postgres` crate, which runs a tokio runtime of its own; kavi calls
//! the ledger from inside its own runtime, where blocking on another one is refused. So each
//! connection lives on a thread of its own, and the ledger hands it work and waits.
//!
//! Writers do not wait for one another, except for a moment at each commit: the journal's hash
//! chain is one sequence, so its entries are appended at commit, one transaction at a time
//! ([`JOURNAL_LOCK`], taken by the journal's triggers). Rows themselves are guarded by the
//! server's row locks: kavi's writes that race (claims, node ends, artifacts) are single
//! statements that one writer wins (`ON CONFLICT`, a `WHERE` on the row's state).
//!
//! A transaction that reads, decides and then writes on what it read ([`crate::Db::transaction`]:
//! migrations, recovery, `gc`, skills) holds [`DECIDE_LOCK`] alone for its duration, which is
//! what SQLite's write lock gives: no other kavi writes meanwhile, on any machine. Every other
//! writing statement shares that lock (the journal's triggers take it before the statement
//! touches a row), so they go on side by side and wait only for such a transaction. Readers
//! take neither.
//!
//! Nothing waits on the server forever (see [`Timeouts`]): a server that takes the connection and
//! never answers, or stops answering midway, is an error after the time the URL allows. A
//! connection the server closed (a restart) is made again before the next statement, with the
//! session's settings, unless a transaction was open on it (see [`Session::reconnect_if_lost`]).

use std::cell::Cell;
use std::collections::HashMap;
use std::error::Error as StdError;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::BytesMut;
use postgres::types::{IsNull, ToSql, Type, to_sql_checked};

use crate::value::Value;
use crate::{Backend, Result as DbResult, Row, Storage};

/// The advisory lock a transaction that decides on what it read holds alone, and every
/// writing statement shares: "kavi" in ASCII. An older kavi takes it alone for every write
/// transaction, and so still waits for, and is waited for by, a newer one.
pub const DECIDE_LOCK: i64 = 0x6b61_7669;

/// The advisory lock a transaction holds from appending its journal entries, at its commit,
/// until the commit is done: "kjnl" in ASCII.
pub const JOURNAL_LOCK: i64 = 0x6b6a_6e6c;

/// The transaction setting that holds the server's snapshot as a transaction of kavi's began:
/// which transactions had committed by then (the journal's seal asks whether its code changed
/// since).
pub const BEGAN: &str = "kavi.began";

/// How long kavi waits on the server, from the URL's query (`?connect_timeout=5&lock_timeout=30s`):
/// `connect_timeout` is libpq's (seconds); `statement_timeout` and `lock_timeout` are kavi's,
/// in PostgreSQL's units (a number is milliseconds; `500ms`, `30s`, `2min`), and are set on
/// the session. The connection's thread is waited for no longer than a statement may take plus
/// `connect_timeout`: past that the server is taken for gone, even if its socket is open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// Reaching the server and being let in (TCP, startup, authentication).
    pub connect: Duration,
    /// One statement.
    pub statement: Duration,
    /// A writer waiting for [`DECIDE_LOCK`], [`JOURNAL_LOCK`] or a row another holds.
    pub lock: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect: Duration::from_secs(10),
            statement: Duration::from_secs(120),
            // What SQLite's busy timeout is for a file.
            lock: crate::BUSY_TIMEOUT,
        }
    }
}

impl Timeouts {
    /// How long a call waits for the connection's thread to answer: connecting again after a
    /// lost connection takes up to a statement's time (see [`Session::reconnect_if_lost`]).
    fn answer(&self) -> Duration {
        self.statement * 2 + self.connect
    }
}

/// The URL as the client reads it (kavi's own settings taken out) and the timeouts it sets.
pub fn settings(url: &str) -> Result<(String, Timeouts), PgError> {
    let mut timeouts = Timeouts::default();
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_owned(), timeouts));
    };
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let bad = |why: &str| PgError::Setting(format!("`{key}={value}` in the ledger URL: {why}"));
        match key {
            "statement_timeout" => timeouts.statement = pg_duration(value).map_err(|e| bad(&e))?,
            "lock_timeout" => timeouts.lock = pg_duration(value).map_err(|e| bad(&e))?,
            "connect_timeout" => {
                let seconds: u64 = value
                    .parse()
                    .map_err(|_| bad("a whole number of seconds is expected"))?;
                timeouts.connect = Duration::from_secs(seconds);
                kept.push(pair);
            }
            _ => kept.push(pair),
        }
    }
    let url = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok((url, timeouts))
}

/// A duration as PostgreSQL's settings take one: a number of milliseconds, or with a unit.
fn pg_duration(value: &str) -> Result<Duration, String> {
    let duration = match value.parse::<u64>() {
        Ok(millis) => Duration::from_millis(millis),
        Err(_) => humantime::parse_duration(value).map_err(|e| e.to_string())?,
    };
    if duration.is_zero() {
        return Err("kavi never waits on the server without a bound: give a duration".to_owned());
    }
    Ok(duration)
}

/// Whether a ledger location names a PostgreSQL server rather than a file.
pub fn is_url(location: &str) -> bool {
    location.starts_with("postgres://") || location.starts_with("postgresql://")
}

/// A URL as messages show it: a password in it is replaced.
pub fn redacted(url: &str) -> String {
    password_shown_as(url, Some("[redacted]"))
}

/// `url` with no password at all (`postgres://user@host/db`): what libpq completes from
/// PGPASSWORD or `~/.pgpass` when it connects. Also drops a `[redacted]` written in its place.
pub fn without_password(url: &str) -> String {
    password_shown_as(url, None)
}

fn password_shown_as(url: &str, shown: Option<&str>) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, tail) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    match authority.rsplit_once('@') {
        Some((credentials, host)) if credentials.contains(':') => {
            let user = credentials.split(':').next().unwrap_or_default();
            match shown {
                Some(shown) => format!("{scheme}://{user}:{shown}@{host}{tail}"),
                None => format!("{scheme}://{user}@{host}{tail}"),
            }
        }
        _ => url.to_owned(),
    }
}

type Job = Box<dyn FnOnce(&mut Session) + Send>;

/// The client and its prepared statements, on the connection's thread.
struct Session {
    client: postgres::Client,
    statements: HashMap<String, postgres::Statement>,
    /// How to connect again, and what each new connection is given first: the timeouts, then
    /// the settings kavi gave this session (see [`Pg::set_for_session`]).
    config: postgres::Config,
    timeouts: Timeouts,
    settings: Vec<(String, Vec<Value>)>,
    /// A transaction is open: a connection lost now loses it, and is not made again under it.
    in_transaction: bool,
    /// The open transaction's id, for telling whether it committed when the server ended the
    /// session as its commit was asked (see [`Session::commit`]).
    xid: Option<i64>,
}

impl Session {
    fn connect(
        config: &postgres::Config,
        timeouts: Timeouts,
    ) -> Result<postgres::Client, postgres::Error> {
        let setup = format!(
            "SET lock_timeout = '{}ms'; SET statement_timeout = '{}ms'",
            timeouts.lock.as_millis(),
            timeouts.statement.as_millis()
        );
        let mut client = config.connect(postgres::NoTls)?;
        client.batch_execute(&setup)?;
        Ok(client)
    }

    /// Connects again (see [`Session::reconnect`]) when the server closed the connection (it
    /// restarted, or a proxy or the network dropped it) while no transaction was open.
    fn reconnect_if_lost(&mut self) {
        if !self.client.is_closed() || self.in_transaction {
            return;
        }
        self.reconnect();
    }

    /// `work`, once more on a connection made again when the server ended the session before
    /// doing it (it shut down or restarted, and said so): outside a transaction, such a
    /// statement was not carried out, so doing it again does it once. Inside one, a session
    /// that ended (said so, or the connection closed) took the transaction with it: the error
    /// is [`PgError::Lost`], and the whole transaction is for the caller to do again. Any other
    /// failure (a connection that broke midway, whose statement may have been carried out) is
    /// the caller's.
    fn retrying<T>(
        &mut self,
        work: impl Fn(&mut Session) -> Result<T, postgres::Error>,
    ) -> Result<T, PgError> {
        let in_transaction = self.in_transaction;
        match work(self) {
            Err(e) if !in_transaction && ended_by_server(&e) => {
                self.reconnect();
                Ok(work(self)?)
            }
            Err(e) if in_transaction && (ended_by_server(&e) || self.client.is_closed()) => {
                Err(PgError::Lost(describe(&e)))
            }
            result => Ok(result?),
        }
    }

    /// Makes the connection again, trying with a growing pause for as long as a statement may
    /// take, and gives it this session's settings. A connection that cannot be made again
    /// leaves the client as it was: the statement then fails, saying why.
    fn reconnect(&mut self) {
        let deadline = std::time::Instant::now() + self.timeouts.statement;
        let mut pause = Duration::from_millis(100);
        loop {
            match self.connect_again() {
                Ok(()) => {
                    tracing::info!("the connection to the ledger's server was made again");
                    return;
                }
                Err(e) if std::time::Instant::now() + pause >= deadline => {
                    tracing::warn!(
                        error = %describe(&e),
                        "the ledger's server closed the connection and could not be reached again within {}s",
                        self.timeouts.statement.as_secs()
                    );
                    return;
                }
                Err(_) => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_secs(5));
                }
            }
        }
    }

    /// Opens a transaction with `sql` and learns its id.
    fn begin(&mut self, sql: &str) -> Result<(), postgres::Error> {
        let answers = self
            .client
            .simple_query(&format!("{sql}; SELECT txid_current()"))?;
        self.xid = answers.iter().rev().find_map(|answer| match answer {
            postgres::SimpleQueryMessage::Row(row) => row.get(0)?.parse().ok(),
            _ => None,
        });
        Ok(())
    }

    /// Ends the open transaction with `sql`, which commits it. When the server ended the
    /// session as the commit was asked (a restart; a shutdown that cut short the wait for a
    /// synchronous replica, after the commit was made), whether it committed is asked of the
    /// server, on a connection made again: committed, it is not an error; not, the server's
    /// error stands, and doing the whole transaction again does it once; not known, it is
    /// [`PgError::Unsettled`].
    fn commit(&mut self, sql: &str) -> Result<(), PgError> {
        let xid = self.xid.take();
        let error = match self.client.batch_execute(sql) {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        let ended = ended_by_server(&error) || self.client.is_closed();
        let Some(xid) = xid.filter(|_| ended) else {
            return Err(error.into());
        };
        self.reconnect();
        // The ended session's process may still be rolling back: the answer is waited for.
        let deadline = std::time::Instant::now() + self.timeouts.statement;
        let status = loop {
            let status = self
                .client
                .query_one("SELECT txid_status($1)", &[&xid])
                .map(|row| row.get::<_, Option<String>>(0));
            match status.as_ref().map(Option::as_deref) {
                Ok(Some("in progress")) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                _ => break status,
            }
        };
        match status.as_ref().map(Option::as_deref) {
            Ok(Some("committed")) => {
                tracing::info!("the server ended the session as it committed, and had committed");
                Ok(())
            }
            Ok(Some("aborted")) => Err(PgError::Lost(describe(&error))),
            _ => Err(PgError::Unsettled {
                ended: describe(&error),
                status: match status {
                    Ok(status) => format!("the server says {status:?}"),
                    Err(e) => describe(&e),
                },
            }),
        }
    }

    fn connect_again(&mut self) -> Result<(), postgres::Error> {
        let mut client = Session::connect(&self.config, self.timeouts)?;
        for (sql, values) in &self.settings {
            let params: Vec<&(dyn ToSql + Sync)> =
                values.iter().map(|v| v as &(dyn ToSql + Sync)).collect();
            client.execute(&numbered_parameters(sql), &params)?;
        }
        self.client = client;
        self.statements.clear();
        Ok(())
    }

    fn statement(&mut self, sql: &str) -> Result<postgres::Statement, postgres::Error> {
        if let Some(statement) = self.statements.get(sql) {
            return Ok(statement.clone());
        }
        let statement = self.client.prepare(&numbered_parameters(sql))?;
        self.statements.insert(sql.to_owned(), statement.clone());
        Ok(statement)
    }
}

/// One connection to the server.
pub struct Pg {
    jobs: Option<mpsc::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
    url: String,
    timeouts: Timeouts,
    /// The thread stopped answering: it is left to its socket rather than waited for.
    stuck: Cell<bool>,
}

impl std::fmt::Debug for Pg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pg({})", redacted(&self.url))
    }
}

impl Pg {
    pub fn connect(url: &str) -> Result<Pg, PgError> {
        let (jobs, receiver) = mpsc::channel::<Job>();
        let (ready, connected) = mpsc::channel();
        let (client_url, timeouts) = settings(url)?;
        let mut config: postgres::Config = client_url.parse()?;
        // The client's own bound covers reaching the socket only, not a server that takes the
        // connection and never answers: the wait below bounds the whole of it.
        config.connect_timeout(timeouts.connect);
        // As libpq does: a URL without a password takes PGPASSWORD's, so that the password
        // can stay out of kavi.toml and of the commands that name the ledger.
        if config.get_password().is_none()
            && let Some(password) = std::env::var_os("PGPASSWORD")
        {
            config.password(password.as_encoded_bytes());
        }
        let thread = std::thread::Builder::new()
            .name("kavi-postgres".into())
            .spawn(move || {
                let client = match Session::connect(&config, timeouts) {
                    Ok(client) => client,
                    Err(e) => {
                        let _ = ready.send(Err(e));
                        return;
                    }
                };
                let _ = ready.send(Ok(()));
                let mut session = Session {
                    client,
                    statements: HashMap::new(),
                    config,
                    timeouts,
                    settings: Vec::new(),
                    in_transaction: false,
                    xid: None,
                };
                while let Ok(job) = receiver.recv() {
                    session.reconnect_if_lost();
                    job(&mut session);
                }
            })
            .expect("a thread can be started");
        match connected.recv_timeout(timeouts.connect) {
            Ok(Ok(())) => Ok(Pg {
                jobs: Some(jobs),
                thread: Some(thread),
                url: url.to_owned(),
                timeouts,
                stuck: Cell::new(false),
            }),
            Ok(Err(e)) => Err(e.into()),
            // The thread stays behind, stuck on a socket the process drops when it exits.
            Err(_) => Err(PgError::Silent {
                doing: "let kavi in",
                after: timeouts.connect,
            }),
        }
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// Runs `sql` now, and again on each connection made after a lost one: a setting of the
    /// session, which a new connection would not have.
    pub fn set_for_session(&self, sql: &str, values: Vec<Value>) -> Result<(), PgError> {
        let sql = sql.to_owned();
        Ok(self.call(move |session| {
            let params: Vec<&(dyn ToSql + Sync)> =
                values.iter().map(|v| v as &(dyn ToSql + Sync)).collect();
            let result = session.client.execute(&numbered_parameters(&sql), &params);
            session.settings.push((sql, values));
            result.map(|_| ())
        })??)
    }

    /// Opens a transaction with `sql`; while it is open, a lost connection is not made again
    /// under it.
    fn open_transaction(&self, sql: &str) -> Result<(), PgError> {
        let sql = sql.to_owned();
        self.call(move |session| {
            // A session that ended as the transaction opened began nothing: to the caller, the
            // transaction is undone, as if it had ended a moment later.
            let result =
                session
                    .retrying(|session| session.begin(&sql))
                    .map_err(|error| match error {
                        PgError::Postgres(error) if session.client.is_closed() => {
                            PgError::Lost(describe(&error))
                        }
                        error => error,
                    });
            session.in_transaction = result.is_ok();
            result
        })?
    }

    /// Ends the open transaction with `sql`, which commits it (see [`Session::commit`]).
    fn commit(&self, sql: &str) -> Result<(), PgError> {
        let sql = sql.to_owned();
        self.call(move |session| {
            session.in_transaction = false;
            session.commit(&sql)
        })?
    }

    /// Gives up the open transaction; a connection lost meanwhile has lost it already.
    fn roll_back(&self) {
        let _ = self.call(|session| {
            session.in_transaction = false;
            session.xid = None;
            let _ = session.client.batch_execute("ROLLBACK");
        });
    }

    /// Runs `work` on the connection's thread and waits for its answer, as long as making a lost
    /// connection again and a statement may take, and a little more: a server that stops
    /// answering is an error, not a hang.
    fn call<T: Send + 'static>(
        &self,
        work: impl FnOnce(&mut Session) -> T + Send + 'static,
    ) -> Result<T, PgError> {
        let (answer, answered) = mpsc::sync_channel(1);
        let job: Job = Box::new(move |session| {
            let _ = answer.send(work(session));
        });
        let silent = PgError::Silent {
            doing: "answer",
            after: self.timeouts.answer(),
        };
        if self
            .jobs
            .as_ref()
            .is_none_or(|jobs| jobs.send(job).is_err())
        {
            return Err(silent);
        }
        answered.recv_timeout(self.timeouts.answer()).map_err(|_| {
            self.stuck.set(true);
            silent
        })
    }

    pub fn execute(&self, sql: &str, values: Vec<Value>) -> Result<u64, PgError> {
        let sql = sql.to_owned();
        self.call(move |session| {
            session.retrying(|session| {
                let statement = session.statement(&sql)?;
                let params: Vec<&(dyn ToSql + Sync)> =
                    values.iter().map(|v| v as &(dyn ToSql + Sync)).collect();
                session.client.execute(&statement, &params)
            })
        })?
    }

    pub fn query(&self, sql: &str, values: Vec<Value>) -> Result<Vec<Vec<Value>>, PgError> {
        let sql = sql.to_owned();
        let rows = self.call(move |session| {
            session.retrying(|session| {
                let statement = session.statement(&sql)?;
                let params: Vec<&(dyn ToSql + Sync)> =
                    values.iter().map(|v| v as &(dyn ToSql + Sync)).collect();
                session.client.query(&statement, &params)
            })
        })??;
        rows.iter().map(row).collect()
    }

    pub fn batch(&self, sql: &str) -> Result<(), PgError> {
        let sql = sql.to_owned();
        self.call(move |session| session.retrying(|session| session.client.batch_execute(&sql)))?
    }
}

impl Drop for Pg {
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(thread) = self.thread.take().filter(|_| !self.stuck.get()) {
            let _ = thread.join();
        }
    }
}

/// A connection to a PostgreSQL server, as the ledger's [`Storage`].
#[derive(Debug)]
pub struct Postgres {
    pg: Pg,
    /// A transaction is open (the server keeps no flag the client can read without asking).
    open: Cell<bool>,
}

impl Postgres {
    pub fn connect(url: &str) -> Result<Self, PgError> {
        Ok(Postgres {
            pg: Pg::connect(url)?,
            open: Cell::new(false),
        })
    }

    fn open_transaction(&self, sql: &str) -> DbResult<()> {
        self.pg.open_transaction(&format!(
            "{sql}; SELECT set_config('{BEGAN}', pg_current_snapshot()::text, true)"
        ))?;
        self.open.set(true);
        Ok(())
    }
}

impl Storage for Postgres {
    fn backend(&self) -> Backend {
        Backend::Postgres
    }

    fn url(&self) -> Option<&str> {
        Some(self.pg.url())
    }

    fn execute(&self, sql: &str, values: Vec<Value>) -> DbResult<usize> {
        Ok(usize::try_from(self.pg.execute(sql, values)?).unwrap_or(usize::MAX))
    }

    /// The server's rows come whole, then are read one at a time.
    fn for_each(
        &self,
        sql: &str,
        values: Vec<Value>,
        read: &mut dyn FnMut(&Row) -> DbResult<bool>,
    ) -> DbResult<()> {
        for row in self.pg.query(sql, values)? {
            if !read(&Row::new(&row))? {
                break;
            }
        }
        Ok(())
    }

    fn execute_batch(&self, sql: &str) -> DbResult<()> {
        Ok(self.pg.batch(sql)?)
    }

    fn is_autocommit(&self) -> bool {
        !self.open.get()
    }

    /// Holding [`DECIDE_LOCK`] alone, it has no writer beside it to let go first, so its
    /// journal entries are appended as its rows change (`SET CONSTRAINTS ALL IMMEDIATE`), as all
    /// were before entries were appended at commit: a table it writes and then alters or drops (a
    /// migration, the journal's triggers made again) has no entry still to come, which the
    /// server refuses ("pending trigger events").
    fn begin(&self) -> DbResult<()> {
        self.open_transaction(&format!(
            "BEGIN; SELECT pg_advisory_xact_lock({DECIDE_LOCK}); SET CONSTRAINTS ALL IMMEDIATE"
        ))
    }

    /// Its statements share [`DECIDE_LOCK`] as they write (the journal's triggers take it).
    fn begin_sharing(&self) -> DbResult<()> {
        self.open_transaction("BEGIN")
    }

    fn commit(&self) -> DbResult<()> {
        self.open.set(false);
        Ok(self.pg.commit("COMMIT")?)
    }

    /// One request. A statement of `first` that fails leaves the rest of the request unrun and
    /// the transaction aborted: it is rolled back.
    fn commit_after(&self, first: &str) -> DbResult<()> {
        self.open.set(false);
        let committed = self.pg.commit(&format!("{first}; COMMIT"));
        if committed.is_err() {
            self.pg.roll_back();
        }
        Ok(committed?)
    }

    fn rollback(&self) {
        self.open.set(false);
        self.pg.roll_back();
    }

    fn set_for_session(&self, sql: &str, values: Vec<Value>) -> DbResult<()> {
        Ok(self.pg.set_for_session(sql, values)?)
    }
}

/// What a query on the server failed at.
#[derive(Debug, thiserror::Error)]
pub enum PgError {
    #[error("{}", describe(.0))]
    Postgres(#[from] postgres::Error),
    #[error("column {column} has type {ty}, which the ledger does not read")]
    Type { column: usize, ty: Type },
    #[error(
        "the server did not {doing} within {}s (the ledger URL's `connect_timeout` and \
         `statement_timeout` set how long kavi waits)",
        after.as_secs_f64()
    )]
    Silent {
        doing: &'static str,
        after: Duration,
    },
    #[error("{0}")]
    Setting(String),
    #[error("{0} (the session ended, and its transaction with it)")]
    Lost(String),
    #[error(
        "the server ended the session as a commit was asked ({ended}), and whether it committed \
         cannot be told ({status})"
    )]
    Unsettled { ended: String, status: String },
}

/// Whether the server undid the whole transaction before it committed: it aborted it for a
/// conflict with another (a deadlock, SQLSTATE 40P01, or a serialization failure, 40001), or
/// the session ended under it ([`PgError::Lost`]; a commit it ended is asked about, see
/// [`Session::commit`]; a statement outside a transaction that the server refused with
/// [`ended_by_server`] was not carried out either). Done again from its start, it goes
/// through once.
pub(crate) fn is_undone(error: &PgError) -> bool {
    use postgres::error::SqlState;
    match error {
        PgError::Lost(_) => true,
        PgError::Postgres(error) => {
            ended_by_server(error)
                || error.code().is_some_and(|code| {
                    [
                        SqlState::T_R_DEADLOCK_DETECTED,
                        SqlState::T_R_SERIALIZATION_FAILURE,
                    ]
                    .contains(code)
                })
        }
        _ => false,
    }
}

/// Whether the server ended the session itself before doing what was asked: an administrator's
/// shutdown or restart, or a crash of another backend (SQLSTATE 57P01, 57P02).
fn ended_by_server(error: &postgres::Error) -> bool {
    use postgres::error::SqlState;
    error
        .code()
        .is_some_and(|code| [SqlState::ADMIN_SHUTDOWN, SqlState::CRASH_SHUTDOWN].contains(code))
}

/// The server's own message: the client's error says only `db error`, and keeps it as its source.
fn describe(error: &postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => match db.detail() {
            Some(detail) => format!("{}: {detail}", db.message()),
            None => db.message().to_owned(),
        },
        None => error
            .source()
            .map_or_else(|| error.to_string(), |source| format!("{error}: {source}")),
    }
}

/// A row's values, as the ledger reads them.
fn row(row: &postgres::Row) -> Result<Vec<Value>, PgError> {
    let mut values = Vec::with_capacity(row.len());
    for (i, column) in row.columns().iter().enumerate() {
        let ty = column.type_();
        let value = match *ty {
            Type::INT8 => row.get::<_, Option<i64>>(i).map(Value::Integer),
            Type::INT4 => row
                .get::<_, Option<i32>>(i)
                .map(|n| Value::Integer(n.into())),
            Type::INT2 => row
                .get::<_, Option<i16>>(i)
                .map(|n| Value::Integer(n.into())),
            Type::BOOL => row
                .get::<_, Option<bool>>(i)
                .map(|b| Value::Integer(b.into())),
            Type::FLOAT8 => row.get::<_, Option<f64>>(i).map(Value::Real),
            Type::FLOAT4 => row.get::<_, Option<f32>>(i).map(|x| Value::Real(x.into())),
            Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME => {
                row.get::<_, Option<String>>(i).map(Value::Text)
            }
            Type::BYTEA => row.get::<_, Option<Vec<u8>>>(i).map(Value::Blob),
            _ => {
                return Err(PgError::Type {
                    column: i,
                    ty: ty.clone(),
                });
            }
        };
        values.push(value.unwrap_or(Value::Null));
    }
    Ok(values)
}

/// A value bound to a parameter of whatever type the server gave it: the ledger's SQL is
/// written once, and SQLite does not type its parameters.
impl ToSql for Value {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn StdError + Sync + Send>> {
        match self {
            Value::Null => Ok(IsNull::Yes),
            Value::Integer(n) => match *ty {
                Type::INT8 => n.to_sql(ty, out),
                Type::INT4 => i32::try_from(*n)?.to_sql(ty, out),
                Type::INT2 => i16::try_from(*n)?.to_sql(ty, out),
                Type::BOOL => (*n != 0).to_sql(ty, out),
                #[allow(clippy::cast_precision_loss, reason = "exact below 2^53")]
                Type::FLOAT8 => (*n as f64).to_sql(ty, out),
                _ => n.to_string().to_sql(ty, out),
            },
            Value::Real(x) => x.to_sql(ty, out),
            Value::Text(text) => text.to_sql(ty, out),
            Value::Blob(bytes) => bytes.to_sql(ty, out),
        }
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    to_sql_checked!();
}

/// The ledger's SQL with SQLite's `?N` parameters as PostgreSQL's `$N`, outside quotes.
pub fn numbered_parameters(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut quote: Option<char> = None;
    for c in sql.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '\'' | '"') => quote = Some(c),
            (None, '?') => {
                out.push('$');
                continue;
            }
            _ => {}
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_are_numbered_outside_quotes() {
        assert_eq!(
            numbered_parameters("SELECT '?1', \"a?\" FROM t WHERE a = ?1 AND b = ?12"),
            "SELECT '?1', \"a?\" FROM t WHERE a = $1 AND b = $12"
        );
    }

    #[test]
    fn the_urls_timeouts_are_read_and_kavis_own_taken_out_of_it() {
        let (url, timeouts) = settings(
            "postgres://kavi@db/ledger?connect_timeout=3&statement_timeout=2500&lock_timeout=30s",
        )
        .unwrap();
        assert_eq!(url, "postgres://kavi@db/ledger?connect_timeout=3");
        assert_eq!(
            timeouts,
            Timeouts {
                connect: Duration::from_secs(3),
                statement: Duration::from_millis(2500),
                lock: Duration::from_secs(30),
            }
        );
        let (url, timeouts) = settings("postgres://kavi@db/ledger").unwrap();
        assert_eq!(url, "postgres://kavi@db/ledger");
        assert_eq!(timeouts, Timeouts::default());
        for bad in [
            "statement_timeout=0",
            "lock_timeout=soon",
            "connect_timeout=1.5",
        ] {
            let error = settings(&format!("postgres://db/ledger?{bad}")).unwrap_err();
            assert!(error.to_string().contains(bad), "{error}");
        }
    }

    #[test]
    fn passwords_stay_out_of_messages() {
        assert_eq!(
            redacted("postgres://kavi:hunter2@db.example:5432/ledger"),
            "postgres://kavi:[redacted]@db.example:5432/ledger"
        );
        assert_eq!(
            redacted("postgres://kavi@db.example/ledger"),
            "postgres://kavi@db.example/ledger"
        );
        // A location remembered as shown connects with PGPASSWORD, not with the placeholder.
        assert_eq!(
            without_password("postgres://kavi:[redacted]@db.example:5432/ledger"),
            "postgres://kavi@db.example:5432/ledger"
        );
    }
}
