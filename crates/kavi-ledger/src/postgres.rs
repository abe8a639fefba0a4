//! The ledger on a PostgreSQL server, for a team that shares one: the same schema, journal and
//! verification as the SQLite file, reached through the same [`super::db::Db`].
//!
//! The client is the sync `postgres` crate, which runs a tokio runtime of its own; kavi calls
//! the ledger from inside its own runtime, where blocking on another one is refused. So each
//! connection lives on a thread of its own, and the ledger hands it work and waits.
//!
//! Write transactions take one advisory lock (`pg_advisory_xact_lock`) for their duration,
//! which is what SQLite's write lock gave: kavi's writers read, decide and write under it, so
//! two kavi processes never decide on the same state at once, on any machine. Readers do not
//! take it.

use std::collections::HashMap;
use std::error::Error as StdError;
use std::sync::mpsc;
use std::thread::JoinHandle;

use bytes::BytesMut;
use postgres::types::{IsNull, ToSql, Type, to_sql_checked};

use super::value::Value;

/// The advisory lock every write transaction and every journal entry takes: "kavi" in ASCII.
pub const WRITE_LOCK: i64 = 0x6b61_7669;

/// The session settings that hold the journal's MAC key, as HMAC's inner and outer padded
/// keys, for the triggers to MAC each entry with (see [`super::journal`]). They are set on
/// each of kavi's own connections and kept nowhere in the database: the triggers run on the
/// server, which has no function of kavi's to call, and a session without them cannot write.
pub const MAC_INNER: &str = "kavi.mac_inner";
pub const MAC_OUTER: &str = "kavi.mac_outer";

/// How long a writer waits for [`WRITE_LOCK`]: what SQLite's busy timeout is for a file.
const LOCK_TIMEOUT: std::time::Duration = super::BUSY_TIMEOUT;

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

/// The schema as PostgreSQL DDL, from SQLite's own text of it after every migration: the
/// migrations stay the one description of the schema. Integers are 64-bit, blobs `BYTEA`, and
/// an `INTEGER PRIMARY KEY` an identity; a table SQLite keys by its hidden rowid gets a `rowid`
/// identity column of its own. Tables come in an order their foreign keys allow.
pub fn schema(sqlite_schema: &[(String, String, String)]) -> Vec<String> {
    let indexes = sqlite_schema
        .iter()
        .filter(|(kind, ..)| kind == "index")
        .map(|(_, _, sql)| sql.clone());
    tables_in_order(sqlite_schema)
        .into_iter()
        .map(|(_, sql)| table(&sql))
        .chain(indexes)
        .collect()
}

/// The statement that makes table `name` of a SQLite schema on a server, as [`schema`] makes it.
pub fn table_named(sqlite_schema: &[(String, String, String)], name: &str) -> Option<String> {
    sqlite_schema
        .iter()
        .find(|(kind, table, _)| kind == "table" && table == name)
        .map(|(_, _, sql)| table(sql))
}

/// The tables of a SQLite schema as (name, SQLite's SQL), each after the tables its foreign
/// keys name: the order to create them in, or to fill them.
pub fn tables_in_order(sqlite_schema: &[(String, String, String)]) -> Vec<(String, String)> {
    let mut tables: Vec<(String, String)> = sqlite_schema
        .iter()
        .filter(|(kind, ..)| kind == "table")
        .map(|(_, name, sql)| (name.clone(), sql.clone()))
        .collect();
    let mut ordered: Vec<(String, String)> = Vec::new();
    while !tables.is_empty() {
        let ready = tables
            .iter()
            .position(|(name, sql)| {
                references(sql)
                    .iter()
                    .all(|r| r == name || ordered.iter().any(|(done, _)| done == r))
            })
            .unwrap_or(0);
        ordered.push(tables.remove(ready));
    }
    ordered
}

fn references(sql: &str) -> Vec<String> {
    sql.split("REFERENCES ")
        .skip(1)
        .filter_map(|rest| rest.split(['(', ' ']).next())
        .map(|name| name.trim_matches('"').to_owned())
        .collect()
}

fn table(sql: &str) -> String {
    let mut sql = sql.trim().to_owned();
    let without_rowid = sql.ends_with("WITHOUT ROWID");
    if without_rowid {
        sql.truncate(sql.len() - "WITHOUT ROWID".len());
        sql = sql.trim_end().to_owned();
    }
    let mut out = String::new();
    let mut has_integer_key = false;
    for line in sql.lines() {
        let mut line = line.to_owned();
        for (from, to) in [
            (
                "INTEGER PRIMARY KEY AUTOINCREMENT",
                "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY",
            ),
            (
                "INTEGER PRIMARY KEY",
                "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY",
            ),
        ] {
            if line.contains(from) {
                line = line.replace(from, to);
                has_integer_key = true;
            }
        }
        line = replace_word(&line, "INTEGER", "BIGINT");
        line = replace_word(&line, "BLOB", "BYTEA");
        line = replace_word(&line, "REAL", "DOUBLE PRECISION");
        out.push_str(&line);
        out.push('\n');
    }
    let out = out.trim_end().to_owned();
    if without_rowid || has_integer_key {
        return out;
    }
    // `rowid` exists on every SQLite table that is not WITHOUT ROWID; queries order by it.
    let close = out.rfind(')').expect("a table definition ends with `)`");
    format!(
        "{},\n    rowid BIGINT GENERATED BY DEFAULT AS IDENTITY UNIQUE\n)",
        out[..close].trim_end()
    )
}

/// `text` with the whole word `from` (outside comments) replaced by `to`.
fn replace_word(text: &str, from: &str, to: &str) -> String {
    let (code, comment) = text.split_at(text.find("--").unwrap_or(text.len()));
    let mut out = String::new();
    let mut rest = code;
    while let Some(at) = rest.find(from) {
        let before = rest[..at].chars().last();
        let after = rest[at + from.len()..].chars().next();
        let word = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        out.push_str(&rest[..at]);
        out.push_str(if word(before) || word(after) {
            from
        } else {
            to
        });
        rest = &rest[at + from.len()..];
    }
    out.push_str(rest);
    out.push_str(comment);
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

    #[test]
    fn tables_translate_and_come_in_foreign_key_order() {
        let sqlite = [
            (
                "table".to_owned(),
                "b".to_owned(),
                "CREATE TABLE b (\n    a_id INTEGER REFERENCES a(id), -- INTEGER here stays\n    data BLOB\n)".to_owned(),
            ),
            (
                "table".to_owned(),
                "a".to_owned(),
                "CREATE TABLE a (\n    id INTEGER PRIMARY KEY AUTOINCREMENT,\n    score REAL\n)".to_owned(),
            ),
            (
                "index".to_owned(),
                "b_a".to_owned(),
                "CREATE INDEX b_a ON b(a_id)".to_owned(),
            ),
        ];
        let ddl = schema(&sqlite);
        assert!(ddl[0].starts_with("CREATE TABLE a"), "{ddl:?}");
        assert!(ddl[0].contains("id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY"));
        assert!(ddl[0].contains("score DOUBLE PRECISION"));
        assert!(!ddl[0].contains("rowid"));
        assert!(ddl[1].contains("a_id BIGINT REFERENCES a(id), -- INTEGER here stays"));
        assert!(ddl[1].contains("data BYTEA"));
        assert!(ddl[1].contains("rowid BIGINT GENERATED BY DEFAULT AS IDENTITY UNIQUE"));
        assert_eq!(ddl[2], "CREATE INDEX b_a ON b(a_id)");
    }
}
