//! The ledger's connection to its database, a SQLite file or a PostgreSQL server, behind one
//! small interface, so that every query is written once, in SQL both speak: numbered parameters
//! (`?1`), `RETURNING`, `ON CONFLICT ... DO NOTHING`. Values cross it as [`Value`]s; rows come
//! back whole, as [`Row`]s.

use std::cell::Cell;
use std::path::Path;

use super::postgres::{Pg, PgError};

use rusqlite::types::ValueRef;

/// What a query failed at.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error(transparent)]
    Sqlite(#[from] rusqlite::Error),
    #[error(transparent)]
    Postgres(#[from] PgError),
    #[error("the query returned no rows")]
    NoRows,
    #[error("column {column}: {message}")]
    Conversion { column: usize, message: String },
}

impl From<postgres::Error> for DbError {
    fn from(error: postgres::Error) -> Self {
        DbError::Postgres(PgError::Postgres(error))
    }
}

pub type Result<T, E = DbError> = std::result::Result<T, E>;

/// One value, as the database holds it.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Integer(i64),
    Real(f64),
    Text(String),
    Blob(Vec<u8>),
}

/// What can be bound to a parameter.
pub trait ToSql {
    fn to_sql(&self) -> Value;
}

impl ToSql for Value {
    fn to_sql(&self) -> Value {
        self.clone()
    }
}

impl ToSql for str {
    fn to_sql(&self) -> Value {
        Value::Text(self.to_owned())
    }
}

impl ToSql for String {
    fn to_sql(&self) -> Value {
        Value::Text(self.clone())
    }
}

impl ToSql for [u8] {
    fn to_sql(&self) -> Value {
        Value::Blob(self.to_vec())
    }
}

impl ToSql for Vec<u8> {
    fn to_sql(&self) -> Value {
        Value::Blob(self.clone())
    }
}

impl ToSql for bool {
    fn to_sql(&self) -> Value {
        Value::Integer(i64::from(*self))
    }
}

impl ToSql for f64 {
    fn to_sql(&self) -> Value {
        Value::Real(*self)
    }
}

macro_rules! integer_to_sql {
    ($($t:ty),*) => {$(
        impl ToSql for $t {
            fn to_sql(&self) -> Value {
                Value::Integer(i64::try_from(*self).unwrap_or(i64::MAX))
            }
        }
    )*};
}
integer_to_sql!(i32, i64, u32, u64, usize);

impl<T: ToSql + ?Sized> ToSql for &T {
    fn to_sql(&self) -> Value {
        (**self).to_sql()
    }
}

impl<T: ToSql> ToSql for Option<T> {
    fn to_sql(&self) -> Value {
        self.as_ref().map_or(Value::Null, ToSql::to_sql)
    }
}

/// The parameters of one query: `params![a, b]`.
macro_rules! params {
    () => { &[] as &[&dyn $crate::ledger::db::ToSql] };
    ($($param:expr),+ $(,)?) => { &[$(&$param as &dyn $crate::ledger::db::ToSql),+] as &[&dyn $crate::ledger::db::ToSql] };
}
pub(crate) use params;

/// What a column can be read as.
pub trait FromSql: Sized {
    fn from_sql(value: &Value) -> Result<Self, String>;
}

impl FromSql for Value {
    fn from_sql(value: &Value) -> Result<Self, String> {
        Ok(value.clone())
    }
}

impl FromSql for String {
    fn from_sql(value: &Value) -> Result<Self, String> {
        match value {
            Value::Text(text) => Ok(text.clone()),
            other => Err(format!("expected text, found {other:?}")),
        }
    }
}

impl FromSql for Vec<u8> {
    fn from_sql(value: &Value) -> Result<Self, String> {
        match value {
            Value::Blob(bytes) => Ok(bytes.clone()),
            Value::Text(text) => Ok(text.as_bytes().to_vec()),
            other => Err(format!("expected bytes, found {other:?}")),
        }
    }
}

impl FromSql for i64 {
    fn from_sql(value: &Value) -> Result<Self, String> {
        match value {
            Value::Integer(n) => Ok(*n),
            other => Err(format!("expected an integer, found {other:?}")),
        }
    }
}

impl FromSql for f64 {
    fn from_sql(value: &Value) -> Result<Self, String> {
        match value {
            Value::Real(x) => Ok(*x),
            // Exact below 2^53, which is all a ledger counts.
            #[allow(clippy::cast_precision_loss)]
            Value::Integer(n) => Ok(*n as f64),
            other => Err(format!("expected a number, found {other:?}")),
        }
    }
}

impl FromSql for bool {
    fn from_sql(value: &Value) -> Result<Self, String> {
        i64::from_sql(value).map(|n| n != 0)
    }
}

macro_rules! integer_from_sql {
    ($($t:ty),*) => {$(
        impl FromSql for $t {
            fn from_sql(value: &Value) -> Result<Self, String> {
                let n = i64::from_sql(value)?;
                <$t>::try_from(n).map_err(|_| format!("{n} is out of range"))
            }
        }
    )*};
}
integer_from_sql!(i32, u32, u64, usize);

impl<T: FromSql> FromSql for Option<T> {
    fn from_sql(value: &Value) -> Result<Self, String> {
        match value {
            Value::Null => Ok(None),
            value => T::from_sql(value).map(Some),
        }
    }
}

/// How a column is named: by its position (only, so that a literal `0` is one).
pub trait ColumnIndex {
    fn index(self) -> usize;
}

impl ColumnIndex for usize {
    fn index(self) -> usize {
        self
    }
}

/// One row of a result, whole.
#[derive(Debug, Clone)]
pub struct Row {
    values: Vec<Value>,
}

impl Row {
    pub fn new(values: Vec<Value>) -> Row {
        Row { values }
    }

    pub fn values(&self) -> &[Value] {
        &self.values
    }

    /// Column `column` as a `T`; `row.get::<_, T>(i)` names the type.
    pub fn get<I: ColumnIndex, T: FromSql>(&self, column: I) -> Result<T> {
        let column = column.index();
        let value = self.values.get(column).ok_or_else(|| DbError::Conversion {
            column,
            message: "no such column".into(),
        })?;
        T::from_sql(value).map_err(|message| DbError::Conversion { column, message })
    }

    /// Reads a column with `parse`, reporting its failure as the column's.
    pub fn parse<T, E: std::fmt::Display>(
        &self,
        column: usize,
        parse: impl FnOnce(String) -> Result<T, E>,
    ) -> Result<T> {
        parse(self.get(column)?).map_err(|e| DbError::Conversion {
            column,
            message: e.to_string(),
        })
    }

    fn from_sqlite(row: &rusqlite::Row<'_>) -> rusqlite::Result<Row> {
        let count = row.as_ref().column_count();
        let mut values = Vec::with_capacity(count);
        for i in 0..count {
            values.push(match row.get_ref(i)? {
                ValueRef::Null => Value::Null,
                ValueRef::Integer(n) => Value::Integer(n),
                ValueRef::Real(x) => Value::Real(x),
                ValueRef::Text(text) => Value::Text(String::from_utf8_lossy(text).into_owned()),
                ValueRef::Blob(bytes) => Value::Blob(bytes.to_vec()),
            });
        }
        Ok(Row { values })
    }
}

impl rusqlite::ToSql for Value {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        use rusqlite::types::ToSqlOutput;
        Ok(match self {
            Value::Null => ToSqlOutput::Owned(rusqlite::types::Value::Null),
            Value::Integer(n) => ToSqlOutput::Owned(rusqlite::types::Value::Integer(*n)),
            Value::Real(x) => ToSqlOutput::Owned(rusqlite::types::Value::Real(*x)),
            Value::Text(text) => ToSqlOutput::Borrowed(ValueRef::Text(text.as_bytes())),
            Value::Blob(bytes) => ToSqlOutput::Borrowed(ValueRef::Blob(bytes)),
        })
    }
}

/// The parameters of a query: `params![a, b]`, an array of one type (`[run_id]`), or `[]`.
pub trait Params {
    fn values(self) -> Vec<Value>;
}

impl Params for &[&dyn ToSql] {
    fn values(self) -> Vec<Value> {
        self.iter().map(|p| p.to_sql()).collect()
    }
}

impl Params for [&dyn ToSql; 0] {
    fn values(self) -> Vec<Value> {
        Vec::new()
    }
}

macro_rules! array_params {
    ($($n:literal)*) => {$(
        impl<T: ToSql> Params for [T; $n] {
            fn values(self) -> Vec<Value> {
                self.iter().map(ToSql::to_sql).collect()
            }
        }
    )*};
}
array_params!(1 2 3 4 5 6 7 8);

/// `None` for a query that returned no rows, as for `SELECT ... WHERE` that matched nothing.
pub trait OptionalExtension<T> {
    fn optional(self) -> Result<Option<T>>;
}

impl<T> OptionalExtension<T> for Result<T> {
    fn optional(self) -> Result<Option<T>> {
        match self {
            Ok(value) => Ok(Some(value)),
            Err(DbError::NoRows) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// Which database a [`Db`] is connected to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

#[derive(Debug)]
enum Connection {
    Sqlite(rusqlite::Connection),
    Postgres {
        pg: Pg,
        /// A transaction is open (the server keeps no flag the client can read without asking).
        open: Cell<bool>,
    },
}

/// A connection to the ledger's database.
#[derive(Debug)]
pub struct Db {
    conn: Connection,
}

impl Db {
    pub fn from_sqlite(conn: rusqlite::Connection) -> Self {
        // Every statement goes through the cache: the recorder's few run thousands of times.
        conn.set_prepared_statement_cache_capacity(64);
        Db {
            conn: Connection::Sqlite(conn),
        }
    }

    pub fn connect_postgres(url: &str) -> Result<Self> {
        Ok(Db {
            conn: Connection::Postgres {
                pg: Pg::connect(url)?,
                open: Cell::new(false),
            },
        })
    }

    pub fn backend(&self) -> Backend {
        match self.conn {
            Connection::Sqlite(_) => Backend::Sqlite,
            Connection::Postgres { .. } => Backend::Postgres,
        }
    }

    /// The file this connection opened, when it is a SQLite file.
    pub fn path(&self) -> Option<&Path> {
        match &self.conn {
            Connection::Sqlite(conn) => conn.path().filter(|path| !path.is_empty()).map(Path::new),
            Connection::Postgres { .. } => None,
        }
    }

    /// The server this connection reached, when it is a PostgreSQL one.
    pub fn url(&self) -> Option<&str> {
        match &self.conn {
            Connection::Sqlite(_) => None,
            Connection::Postgres { pg, .. } => Some(pg.url()),
        }
    }

    /// A statement to run once or several times.
    pub fn prepare(&self, sql: &str) -> Result<Statement<'_>> {
        Ok(Statement {
            db: self,
            sql: sql.to_owned(),
        })
    }

    /// The same as [`Db::prepare`]: every statement is cached.
    pub fn prepare_cached(&self, sql: &str) -> Result<Statement<'_>> {
        self.prepare(sql)
    }

    /// Runs one statement; returns how many rows it changed.
    pub fn execute(&self, sql: &str, params: impl Params) -> Result<usize> {
        let values = params.values();
        match &self.conn {
            Connection::Sqlite(conn) => {
                let mut statement = conn.prepare_cached(sql)?;
                Ok(statement.execute(rusqlite::params_from_iter(values.iter()))?)
            }
            Connection::Postgres { pg, .. } => {
                Ok(usize::try_from(pg.execute(sql, values)?).unwrap_or(usize::MAX))
            }
        }
    }

    /// Every row a query returns.
    fn rows(&self, sql: &str, params: impl Params) -> Result<Vec<Row>> {
        let values = params.values();
        match &self.conn {
            Connection::Sqlite(conn) => {
                let mut statement = conn.prepare_cached(sql)?;
                let rows = statement
                    .query_map(rusqlite::params_from_iter(values.iter()), Row::from_sqlite)?;
                Ok(rows.collect::<rusqlite::Result<_>>()?)
            }
            Connection::Postgres { pg, .. } => Ok(pg.query(sql, values)?),
        }
    }

    /// The first row a query returns, read with `read`; [`DbError::NoRows`] when it returns
    /// none (see [`OptionalExtension::optional`]).
    pub fn query_row<T>(
        &self,
        sql: &str,
        params: impl Params,
        read: impl FnOnce(&Row) -> Result<T>,
    ) -> Result<T> {
        match &self.conn {
            Connection::Sqlite(conn) => {
                let values = params.values();
                let mut statement = conn.prepare_cached(sql)?;
                let mut rows = statement.query(rusqlite::params_from_iter(values.iter()))?;
                match rows.next()? {
                    None => Err(DbError::NoRows),
                    Some(row) => read(&Row::from_sqlite(row)?),
                }
            }
            Connection::Postgres { .. } => match self.rows(sql, params)?.first() {
                None => Err(DbError::NoRows),
                Some(row) => read(row),
            },
        }
    }

    /// Runs statements separated by `;`, without parameters (schema changes).
    pub fn execute_batch(&self, sql: &str) -> Result<()> {
        match &self.conn {
            Connection::Sqlite(conn) => Ok(conn.execute_batch(sql)?),
            Connection::Postgres { pg, .. } => Ok(pg.batch(sql)?),
        }
    }

    /// Whether no transaction is open on this connection.
    pub fn is_autocommit(&self) -> bool {
        match &self.conn {
            Connection::Sqlite(conn) => conn.is_autocommit(),
            Connection::Postgres { open, .. } => !open.get(),
        }
    }

    /// Opens a transaction that takes the write lock at once: a writer that read first and
    /// then found the lock taken would have to start over. On PostgreSQL the lock is the
    /// ledger's advisory lock (see [`super::postgres`]).
    pub fn begin(&self) -> Result<()> {
        match &self.conn {
            Connection::Sqlite(_) => {
                self.execute("BEGIN IMMEDIATE", [])?;
            }
            Connection::Postgres { pg, open } => {
                pg.batch(&format!(
                    "BEGIN; SELECT pg_advisory_xact_lock({})",
                    super::postgres::WRITE_LOCK
                ))?;
                open.set(true);
            }
        }
        Ok(())
    }

    pub fn commit(&self) -> Result<()> {
        match &self.conn {
            Connection::Sqlite(_) => {
                self.execute("COMMIT", [])?;
            }
            Connection::Postgres { pg, open } => {
                open.set(false);
                pg.batch("COMMIT")?;
            }
        }
        Ok(())
    }

    /// Gives up the open transaction, if there is one.
    pub fn rollback(&self) {
        if self.is_autocommit() {
            return;
        }
        match &self.conn {
            Connection::Sqlite(conn) => {
                let _ = conn.execute_batch("ROLLBACK");
            }
            Connection::Postgres { pg, open } => {
                open.set(false);
                let _ = pg.batch("ROLLBACK");
            }
        }
    }

    /// A transaction that takes the write lock at once, rolled back when dropped uncommitted.
    pub fn transaction(&mut self) -> Result<Transaction<'_>> {
        self.begin()?;
        Ok(Transaction {
            db: self,
            done: false,
        })
    }
}

/// A statement of a [`Db`].
pub struct Statement<'db> {
    db: &'db Db,
    sql: String,
}

impl Statement<'_> {
    pub fn execute(&mut self, params: impl Params) -> Result<usize> {
        self.db.execute(&self.sql, params)
    }

    /// Each row read with `read`, to collect (`.collect::<Result<Vec<_>>>()`). On SQLite each
    /// row is read as it comes, so that no more than one is held besides what `read` makes:
    /// reading back a 1,000-node run held all of its rows at once before.
    pub fn query_map<T>(
        &mut self,
        params: impl Params,
        mut read: impl FnMut(&Row) -> Result<T>,
    ) -> Result<std::vec::IntoIter<Result<T>>> {
        let mut read_rows = Vec::new();
        self.for_each(params, |row| {
            read_rows.push(read(row));
            Ok(true)
        })?;
        Ok(read_rows.into_iter())
    }

    pub fn query_row<T>(
        &mut self,
        params: impl Params,
        read: impl FnOnce(&Row) -> Result<T>,
    ) -> Result<T> {
        self.db.query_row(&self.sql, params, read)
    }

    /// Reads the rows one at a time, as they come (a query too large to hold whole), until
    /// `read` returns `false`.
    pub fn for_each(
        &mut self,
        params: impl Params,
        mut read: impl FnMut(&Row) -> Result<bool>,
    ) -> Result<()> {
        let Connection::Sqlite(conn) = &self.db.conn else {
            for row in self.db.rows(&self.sql, params)? {
                if !read(&row)? {
                    break;
                }
            }
            return Ok(());
        };
        let values = params.values();
        let mut statement = conn.prepare_cached(&self.sql)?;
        let mut rows = statement.query(rusqlite::params_from_iter(values.iter()))?;
        while let Some(row) = rows.next()? {
            if !read(&Row::from_sqlite(row)?)? {
                break;
            }
        }
        Ok(())
    }

    /// Whether the query returns a row.
    pub fn exists(&mut self, params: impl Params) -> Result<bool> {
        self.query_row(params, |_| Ok(()))
            .optional()
            .map(|row| row.is_some())
    }
}

/// An open transaction: its statements run on the [`Db`] it derefs to.
pub struct Transaction<'db> {
    db: &'db mut Db,
    done: bool,
}

impl Transaction<'_> {
    pub fn commit(mut self) -> Result<()> {
        self.done = true;
        self.db.commit()
    }
}

impl std::ops::Deref for Transaction<'_> {
    type Target = Db;
    fn deref(&self) -> &Db {
        self.db
    }
}

impl Drop for Transaction<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.db.rollback();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn db() -> Db {
        crate::ledger::memory::use_mimalloc();
        Db::from_sqlite(rusqlite::Connection::open_in_memory().unwrap())
    }

    #[test]
    fn values_cross_both_ways() {
        let db = db();
        db.execute_batch("CREATE TABLE t (i INTEGER, s TEXT, b BLOB, n INTEGER)")
            .unwrap();
        let none: Option<i64> = None;
        db.execute(
            "INSERT INTO t VALUES (?1, ?2, ?3, ?4)",
            params![7u32, "seven", vec![7u8], none],
        )
        .unwrap();
        let (i, s, b, n) = db
            .query_row("SELECT i, s, b, n FROM t", [], |row| {
                Ok((
                    row.get::<_, u32>(0)?,
                    row.get::<_, String>(1)?,
                    row.get::<_, Vec<u8>>(2)?,
                    row.get::<_, Option<i64>>(3)?,
                ))
            })
            .unwrap();
        assert_eq!((i, s.as_str(), b, n), (7, "seven", vec![7], None));
        let wrong = db.query_row("SELECT s FROM t", [], |row| row.get::<_, i64>(0));
        assert!(
            matches!(wrong, Err(DbError::Conversion { column: 0, .. })),
            "{wrong:?}"
        );
        assert!(matches!(
            db.query_row("SELECT i FROM t WHERE i = 8", [], |row| row
                .get::<_, i64>(0)),
            Err(DbError::NoRows)
        ));
    }

    #[test]
    fn a_dropped_transaction_rolls_back() {
        let mut db = db();
        db.execute_batch("CREATE TABLE t (i INTEGER)").unwrap();
        {
            let tx = db.transaction().unwrap();
            tx.execute("INSERT INTO t VALUES (1)", []).unwrap();
        }
        let tx = db.transaction().unwrap();
        tx.execute("INSERT INTO t VALUES (2)", params![]).unwrap();
        tx.commit().unwrap();
        let all = db
            .prepare("SELECT i FROM t")
            .unwrap()
            .query_map([], |row| row.get::<_, i64>(0))
            .unwrap()
            .collect::<Result<Vec<_>>>()
            .unwrap();
        assert_eq!(all, [2]);
        assert!(db.is_autocommit());
    }
}
