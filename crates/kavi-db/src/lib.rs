//! The ledger's database: one connection to a SQLite file or a PostgreSQL server, behind one
//! small interface, so that every query is written once, in SQL both speak: numbered parameters
//! (`?1`), `RETURNING`, `ON CONFLICT ... DO NOTHING`. Values cross it as [`Value`]s; rows are
//! read as [`Row`]s, a SQLite one where SQLite holds it, a server's as it came whole.

use std::cell::Cell;
use std::path::Path;

pub mod ddl;
pub mod memory;
pub mod postgres;
mod value;

use postgres::{Pg, PgError};

/// How long opening a database waits for another process's lock before giving up, and a
/// writer for the write lock.
pub const BUSY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

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

impl From<::postgres::Error> for DbError {
    fn from(error: ::postgres::Error) -> Self {
        DbError::Postgres(PgError::Postgres(error))
    }
}

pub type Result<T, E = DbError> = std::result::Result<T, E>;

pub use value::Value;

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
#[macro_export]
macro_rules! params {
    () => { &[] as &[&dyn $crate::ToSql] };
    ($($param:expr),+ $(,)?) => { &[$(&$param as &dyn $crate::ToSql),+] as &[&dyn $crate::ToSql] };
}

/// One value of a row, borrowed from wherever the row is: a SQLite row is read where SQLite
/// keeps it, without a copy of each column first. Text read as bytes is its exact bytes.
#[derive(Clone, Copy)]
pub enum ValueRef<'a> {
    Null,
    Integer(i64),
    Real(f64),
    Text(&'a [u8]),
    Blob(&'a [u8]),
}

impl ValueRef<'_> {
    /// The value, owned; text that is not UTF-8 is read lossily, as it always was.
    pub fn to_owned_value(self) -> Value {
        match self {
            ValueRef::Null => Value::Null,
            ValueRef::Integer(n) => Value::Integer(n),
            ValueRef::Real(x) => Value::Real(x),
            ValueRef::Text(text) => Value::Text(String::from_utf8_lossy(text).into_owned()),
            ValueRef::Blob(bytes) => Value::Blob(bytes.to_vec()),
        }
    }
}

impl std::fmt::Debug for ValueRef<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.to_owned_value().fmt(f)
    }
}

impl Value {
    fn as_value_ref(&self) -> ValueRef<'_> {
        match self {
            Value::Null => ValueRef::Null,
            Value::Integer(n) => ValueRef::Integer(*n),
            Value::Real(x) => ValueRef::Real(*x),
            Value::Text(text) => ValueRef::Text(text.as_bytes()),
            Value::Blob(bytes) => ValueRef::Blob(bytes),
        }
    }
}

impl<'a> From<rusqlite::types::ValueRef<'a>> for ValueRef<'a> {
    fn from(value: rusqlite::types::ValueRef<'a>) -> Self {
        match value {
            rusqlite::types::ValueRef::Null => ValueRef::Null,
            rusqlite::types::ValueRef::Integer(n) => ValueRef::Integer(n),
            rusqlite::types::ValueRef::Real(x) => ValueRef::Real(x),
            rusqlite::types::ValueRef::Text(text) => ValueRef::Text(text),
            rusqlite::types::ValueRef::Blob(bytes) => ValueRef::Blob(bytes),
        }
    }
}

/// What a column can be read as.
pub trait FromSql: Sized {
    fn from_sql(value: ValueRef<'_>) -> Result<Self, String>;
}

impl FromSql for Value {
    fn from_sql(value: ValueRef<'_>) -> Result<Self, String> {
        Ok(value.to_owned_value())
    }
}

impl FromSql for String {
    fn from_sql(value: ValueRef<'_>) -> Result<Self, String> {
        match value {
            ValueRef::Text(text) => Ok(String::from_utf8_lossy(text).into_owned()),
            other => Err(format!("expected text, found {other:?}")),
        }
    }
}

impl FromSql for Vec<u8> {
    fn from_sql(value: ValueRef<'_>) -> Result<Self, String> {
        match value {
            ValueRef::Blob(bytes) | ValueRef::Text(bytes) => Ok(bytes.to_vec()),
            other => Err(format!("expected bytes, found {other:?}")),
        }
    }
}

impl FromSql for i64 {
    fn from_sql(value: ValueRef<'_>) -> Result<Self, String> {
        match value {
            ValueRef::Integer(n) => Ok(n),
            other => Err(format!("expected an integer, found {other:?}")),
        }
    }
}

impl FromSql for f64 {
    fn from_sql(value: ValueRef<'_>) -> Result<Self, String> {
        match value {
            ValueRef::Real(x) => Ok(x),
            // Exact below 2^53, which is all a ledger counts.
            #[allow(clippy::cast_precision_loss)]
            ValueRef::Integer(n) => Ok(n as f64),
            other => Err(format!("expected a number, found {other:?}")),
        }
    }
}

impl FromSql for bool {
    fn from_sql(value: ValueRef<'_>) -> Result<Self, String> {
        i64::from_sql(value).map(|n| n != 0)
    }
}

macro_rules! integer_from_sql {
    ($($t:ty),*) => {$(
        impl FromSql for $t {
            fn from_sql(value: ValueRef<'_>) -> Result<Self, String> {
                let n = i64::from_sql(value)?;
                <$t>::try_from(n).map_err(|_| format!("{n} is out of range"))
            }
        }
    )*};
}
integer_from_sql!(i32, u32, u64, usize);

impl<T: FromSql> FromSql for Option<T> {
    fn from_sql(value: ValueRef<'_>) -> Result<Self, String> {
        match value {
            ValueRef::Null => Ok(None),
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

/// One row of a result, read where it is: a server's, as it came whole; a SQLite row, where
/// SQLite holds it while it is read.
pub struct Row<'a> {
    cells: Cells<'a>,
}

enum Cells<'a> {
    Owned(&'a [Value]),
    Sqlite(&'a rusqlite::Row<'a>),
}

impl std::fmt::Debug for Row<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Row")
            .field("values", &self.values())
            .finish()
    }
}

/// A SQLite row's values, copied out: for rows kept after the next one is read.
fn sqlite_values(row: &rusqlite::Row<'_>) -> rusqlite::Result<Vec<Value>> {
    Ok(Row::from_sqlite(row).values())
}

impl<'a> Row<'a> {
    /// A row that came whole.
    pub fn new(values: &'a [Value]) -> Self {
        Row {
            cells: Cells::Owned(values),
        }
    }

    /// A SQLite row, read in place.
    fn from_sqlite(row: &'a rusqlite::Row<'a>) -> Self {
        Row {
            cells: Cells::Sqlite(row),
        }
    }

    /// Every column, owned.
    pub fn values(&self) -> Vec<Value> {
        match &self.cells {
            Cells::Owned(values) => values.to_vec(),
            Cells::Sqlite(row) => (0..row.as_ref().column_count())
                .map_while(|i| row.get_ref(i).ok())
                .map(|value| ValueRef::from(value).to_owned_value())
                .collect(),
        }
    }

    fn cell(&self, column: usize) -> Option<ValueRef<'_>> {
        match &self.cells {
            Cells::Owned(values) => values.get(column).map(Value::as_value_ref),
            Cells::Sqlite(row) => row.get_ref(column).ok().map(ValueRef::from),
        }
    }

    /// Column `column` as a `T`; `row.get::<_, T>(i)` names the type.
    pub fn get<I: ColumnIndex, T: FromSql>(&self, column: I) -> Result<T> {
        let column = column.index();
        let value = self.cell(column).ok_or_else(|| DbError::Conversion {
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
}

impl rusqlite::ToSql for Value {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        use rusqlite::types::ToSqlOutput;
        Ok(match self {
            Value::Null => ToSqlOutput::Owned(rusqlite::types::Value::Null),
            Value::Integer(n) => ToSqlOutput::Owned(rusqlite::types::Value::Integer(*n)),
            Value::Real(x) => ToSqlOutput::Owned(rusqlite::types::Value::Real(*x)),
            Value::Text(text) => {
                ToSqlOutput::Borrowed(rusqlite::types::ValueRef::Text(text.as_bytes()))
            }
            Value::Blob(bytes) => ToSqlOutput::Borrowed(rusqlite::types::ValueRef::Blob(bytes)),
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
    fn rows(&self, sql: &str, params: impl Params) -> Result<Vec<Vec<Value>>> {
        let values = params.values();
        match &self.conn {
            Connection::Sqlite(conn) => {
                let mut statement = conn.prepare_cached(sql)?;
                let rows = statement
                    .query_map(rusqlite::params_from_iter(values.iter()), sqlite_values)?;
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
                    Some(row) => read(&Row::from_sqlite(row)),
                }
            }
            Connection::Postgres { .. } => match self.rows(sql, params)?.first() {
                None => Err(DbError::NoRows),
                Some(row) => read(&Row::new(row)),
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
    /// ledger's advisory lock (see [`postgres`]).
    pub fn begin(&self) -> Result<()> {
        match &self.conn {
            Connection::Sqlite(_) => {
                self.execute("BEGIN IMMEDIATE", [])?;
            }
            Connection::Postgres { pg, open } => {
                pg.batch(&format!(
                    "BEGIN; SELECT pg_advisory_xact_lock({})",
                    postgres::WRITE_LOCK
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
                if !read(&Row::new(&row))? {
                    break;
                }
            }
            return Ok(());
        };
        let values = params.values();
        let mut statement = conn.prepare_cached(&self.sql)?;
        let mut rows = statement.query(rusqlite::params_from_iter(values.iter()))?;
        while let Some(row) = rows.next()? {
            if !read(&Row::from_sqlite(row))? {
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
        crate::memory::use_mimalloc();
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

    /// A SQLite row is read where SQLite holds it, and reads as a copied one does: text that is
    /// not UTF-8 lossily, a column past the last one as an error, and every column owned.
    #[test]
    fn a_row_read_in_place_reads_as_a_copied_one() {
        let db = db();
        db.execute_batch("CREATE TABLE t (s TEXT, n INTEGER, x REAL)")
            .unwrap();
        db.execute_batch("INSERT INTO t VALUES (CAST(X'61FF62' AS TEXT), NULL, 1.5)")
            .unwrap();
        let (text, missing, values) = db
            .query_row("SELECT s, n, x FROM t", [], |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, Option<i64>>(3),
                    row.values(),
                ))
            })
            .unwrap();
        assert_eq!(text, "a\u{FFFD}b");
        assert!(
            matches!(missing, Err(DbError::Conversion { column: 3, .. })),
            "{missing:?}"
        );
        assert_eq!(
            values,
            [Value::Text(text.clone()), Value::Null, Value::Real(1.5)]
        );
        let copied = Row::new(&values);
        assert_eq!(copied.get::<_, String>(0).unwrap(), text);
        assert_eq!(copied.get::<_, f64>(2).unwrap(), 1.5);
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
