//! The ledger on a PostgreSQL server, for a team that shares one: the same schema, journal and
//! verification as the SQLite file, reached through the same [`crate::Db`] as [`Postgres`].
//!
//! The client is the sync `postgres` crate, which runs a tokio runtime of its own; kavi calls
//! the ledger from inside its own runtime, where blocking on another one is refused. So each
//! connection lives on a thread of its own, and the ledger hands it work and waits.
//!
//! Write transactions take one advisory lock (`pg_advisory_xact_lock`) for their duration,
//! which is what SQLite's write lock gave: kavi's writers read, decide and write under it, so
//! two kavi processes never decide on the same state at once, on any machine. Readers do not
//! take it.

use std::cell::Cell;
use std::collections::HashMap;
use std::error::Error as StdError;
use std::sync::mpsc;
use std::thread::JoinHandle;

use bytes::BytesMut;
use postgres::types::{IsNull, ToSql, Type, to_sql_checked};

use crate::value::Value;
use crate::{Backend, Result as DbResult, Row, Storage};

/// The advisory lock every write transaction and every journal entry takes: "kavi" in ASCII.
pub const WRITE_LOCK: i64 = 0x6b61_7669;

/// How long a writer waits for [`WRITE_LOCK`]: what SQLite's busy timeout is for a file.
const LOCK_TIMEOUT: std::time::Duration = crate::BUSY_TIMEOUT;

/// Whether a ledger location names a PostgreSQL server rather than a file.
pub fn is_url(location: &str) -> bool {
    location.starts_with("postgres://") || location.starts_with("postgresql://")
}

/// A URL as messages show it: a password in it is replaced.
pub fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, tail) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    match authority.rsplit_once('@') {
        Some((credentials, host)) if credentials.contains(':') => {
            let user = credentials.split(':').next().unwrap_or_default();
            format!("{scheme}://{user}:[redacted]@{host}{tail}")
        }
        _ => url.to_owned(),
    }
}

type Job = Box<dyn FnOnce(&mut Session) + Send>;

/// The client and its prepared statements, on the connection's thread.
struct Session {
    client: postgres::Client,
    statements: HashMap<String, postgres::Statement>,
}

impl Session {
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
}

impl std::fmt::Debug for Pg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pg({})", redacted(&self.url))
    }
}

impl Pg {
    pub fn connect(url: &str) -> Result<Pg, postgres::Error> {
        let (jobs, receiver) = mpsc::channel::<Job>();
        let (ready, connected) = mpsc::channel();
        let mut config: postgres::Config = url.parse()?;
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
                // A writer waits for the write lock as long as a SQLite one would, then fails.
                let lock_timeout = format!("SET lock_timeout = '{}ms'", LOCK_TIMEOUT.as_millis());
                let client = match config
                    .connect(postgres::NoTls)
                    .and_then(|mut client| client.batch_execute(&lock_timeout).map(|()| client))
                {
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
                };
                while let Ok(job) = receiver.recv() {
                    job(&mut session);
                }
            })
            .expect("a thread can be started");
        connected
            .recv()
            .expect("the connection thread answers")
            .map(|()| Pg {
                jobs: Some(jobs),
                thread: Some(thread),
                url: url.to_owned(),
            })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// Runs `work` on the connection's thread and waits for its answer.
    fn call<T: Send + 'static>(&self, work: impl FnOnce(&mut Session) -> T + Send + 'static) -> T {
        let (answer, answered) = mpsc::sync_channel(1);
        let job: Job = Box::new(move |session| {
            let _ = answer.send(work(session));
        });
        self.jobs
            .as_ref()
            .expect("the connection is open")
            .send(job)
            .expect("the connection thread runs while the connection lives");
        answered
            .recv()
            .expect("the connection thread answers every job")
    }

    pub fn execute(&self, sql: &str, values: Vec<Value>) -> Result<u64, postgres::Error> {
        let sql = sql.to_owned();
        self.call(move |session| {
            let statement = session.statement(&sql)?;
            let params: Vec<&(dyn ToSql + Sync)> =
                values.iter().map(|v| v as &(dyn ToSql + Sync)).collect();
            session.client.execute(&statement, &params)
        })
    }

    pub fn query(&self, sql: &str, values: Vec<Value>) -> Result<Vec<Vec<Value>>, PgError> {
        let sql = sql.to_owned();
        self.call(move |session| {
            let statement = session.statement(&sql)?;
            let params: Vec<&(dyn ToSql + Sync)> =
                values.iter().map(|v| v as &(dyn ToSql + Sync)).collect();
            let rows = session.client.query(&statement, &params)?;
            rows.iter().map(row).collect()
        })
    }

    pub fn batch(&self, sql: &str) -> Result<(), postgres::Error> {
        let sql = sql.to_owned();
        self.call(move |session| session.client.batch_execute(&sql))
    }
}

impl Drop for Pg {
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(thread) = self.thread.take() {
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
    pub fn connect(url: &str) -> Result<Self, postgres::Error> {
        Ok(Postgres {
            pg: Pg::connect(url)?,
            open: Cell::new(false),
        })
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

    fn begin(&self) -> DbResult<()> {
        self.pg.batch(&format!(
            "BEGIN; SELECT pg_advisory_xact_lock({WRITE_LOCK})"
        ))?;
        self.open.set(true);
        Ok(())
    }

    fn commit(&self) -> DbResult<()> {
        self.open.set(false);
        Ok(self.pg.batch("COMMIT")?)
    }

    fn rollback(&self) {
        self.open.set(false);
        let _ = self.pg.batch("ROLLBACK");
    }
}

/// What a query on the server failed at.
#[derive(Debug, thiserror::Error)]
pub enum PgError {
    #[error("{}", describe(.0))]
    Postgres(#[from] postgres::Error),
    #[error("column {column} has type {ty}, which the ledger does not read")]
    Type { column: usize, ty: Type },
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
    fn passwords_stay_out_of_messages() {
        assert_eq!(
            redacted("postgres://kavi:hunter2@db.example:5432/ledger"),
            "postgres://kavi:[redacted]@db.example:5432/ledger"
        );
        assert_eq!(
            redacted("postgres://kavi@db.example/ledger"),
            "postgres://kavi@db.example/ledger"
        );
    }
}
