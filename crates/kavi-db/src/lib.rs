//! The ledger's database: one connection to a SQLite file or a PostgreSQL server, behind one
//! small interface, so that every query is written once, in SQL both speak: numbered parameters
//! (`?1`), `RETURNING`, `ON CONFLICT ... DO NOTHING`. Each engine implements [`Storage`]
//! ([`Sqlite`], [`postgres::Postgres`]); [`Db`] is written once over it. Values cross it as
//! [`Value`]s; rows are read as [`Row`]s, a SQLite one where SQLite holds it, a server's as it
//! came whole.

use std::path::Path;

pub mod ddl;
pub mod memory;
pub mod postgres;
mod row;
mod sqlite;
mod value;

use postgres::PgError;
pub use row::{ColumnIndex, FromSql, OptionalExtension, Params, Row, ToSql, ValueRef};
pub use sqlite::Sqlite;

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
    /// A [`Sealer`] refused to let the transaction commit; it was rolled back.
    #[error("{0}")]
    Refused(String),
}

impl DbError {
    /// Whether a server undid the whole transaction before it committed (a deadlock between
    /// two writers; a restart that ended the session): done again from its start, it goes
    /// through once.
    pub fn is_undone(&self) -> bool {
        matches!(self, DbError::Postgres(error) if postgres::is_undone(error))
    }
}

impl From<::postgres::Error> for DbError {
    fn from(error: ::postgres::Error) -> Self {
        DbError::Postgres(PgError::Postgres(error))
    }
}

pub type Result<T, E = DbError> = std::result::Result<T, E>;

pub use value::Value;

/// Which database a [`Db`] is connected to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// One database engine under the ledger. SQLite ([`Sqlite`]) and PostgreSQL
/// ([`postgres::Postgres`]) each implement it; everything else ([`Db`], its statements and
/// transactions) is written once over it.
pub trait Storage: std::fmt::Debug + Send {
    fn backend(&self) -> Backend;

    /// The file this connection opened, when it is a file.
    fn path(&self) -> Option<&Path> {
        None
    }

    /// The server this connection reached, when it is a server.
    fn url(&self) -> Option<&str> {
        None
    }

    /// Runs one statement; returns how many rows it changed.
    fn execute(&self, sql: &str, values: Vec<Value>) -> Result<usize>;

    /// Reads a query's rows one at a time, as they come, until `read` returns `false`.
    fn for_each(
        &self,
        sql: &str,
        values: Vec<Value>,
        read: &mut dyn FnMut(&Row) -> Result<bool>,
    ) -> Result<()>;

    /// Runs statements separated by `;`, without parameters (schema changes).
    fn execute_batch(&self, sql: &str) -> Result<()>;

    /// Whether no transaction is open.
    fn is_autocommit(&self) -> bool;

    /// Opens a transaction that takes the write lock at once.
    fn begin(&self) -> Result<()>;

    /// Opens a transaction of writes that need no decision of their own under the write lock
    /// (see [`Db::begin_sharing`]). SQLite has one writer at a time: the same as [`Storage::begin`].
    fn begin_sharing(&self) -> Result<()> {
        self.begin()
    }

    fn commit(&self) -> Result<()>;

    /// Runs the statements `first`, then commits: on a server, in one request.
    fn commit_after(&self, first: &str) -> Result<()> {
        if let Err(e) = self.execute_batch(first) {
            self.rollback();
            return Err(e);
        }
        self.commit()
    }

    /// Gives up the open transaction; called only when one is open.
    fn rollback(&self);

    /// Runs `sql`, which sets something for the session, now and on every connection the
    /// storage makes again after losing one.
    fn set_for_session(&self, sql: &str, values: Vec<Value>) -> Result<()> {
        self.execute(sql, values).map(|_| ())
    }
}

/// What a connection does to each of its transactions just before it commits (see
/// [`Db::seal_with`]): on a server, MAC the journal entries the transaction appended, with a key
/// the server never sees.
pub trait Sealer: Send {
    /// Finishes the open transaction, or refuses it ([`DbError::Refused`]), which rolls it back.
    /// Returns statements for the commit to run first, in the same request.
    fn seal(&mut self, db: &Db) -> Result<Option<String>>;
}

/// The connection's [`Sealer`], if it has one; taken out while it runs, so that it can use the
/// connection.
#[derive(Default)]
struct SealerSlot(std::cell::RefCell<Option<Box<dyn Sealer>>>);

impl std::fmt::Debug for SealerSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.borrow().is_some() {
            "sealed"
        } else {
            "unsealed"
        })
    }
}

/// A connection to the ledger's database.
#[derive(Debug)]
pub struct Db {
    storage: Box<dyn Storage>,
    sealer: SealerSlot,
}

impl Db {
    pub fn new(storage: impl Storage + 'static) -> Self {
        Db {
            storage: Box::new(storage),
            sealer: SealerSlot::default(),
        }
    }

    /// Has `sealer` finish every transaction of this connection before its commit. A statement
    /// that may write (anything but a `SELECT`) outside a transaction then runs in one of its
    /// own, so that it is sealed too.
    pub fn seal_with(&mut self, sealer: Box<dyn Sealer>) {
        *self.sealer.0.get_mut() = Some(sealer);
    }

    /// Runs the sealer on the open transaction.
    fn seal(&self) -> Result<Option<String>> {
        let Some(mut sealer) = self.sealer.0.borrow_mut().take() else {
            return Ok(None);
        };
        let sealed = sealer.seal(self);
        *self.sealer.0.borrow_mut() = Some(sealer);
        sealed
    }

    /// Whether `sql`, run now, needs a transaction of its own to be sealed in.
    fn needs_own_transaction(&self, sql: &str) -> bool {
        let select = sql
            .trim_start()
            .get(..6)
            .is_some_and(|word| word.eq_ignore_ascii_case("select"));
        !select && self.sealer.0.borrow().is_some() && self.is_autocommit()
    }

    /// Runs `work` in a transaction of its own, sealed and committed.
    fn in_own_transaction<T>(&self, work: impl FnOnce() -> Result<T>) -> Result<T> {
        self.storage.begin_sharing()?;
        match work() {
            Ok(done) => {
                self.commit()?;
                Ok(done)
            }
            Err(e) => {
                self.storage.rollback();
                Err(e)
            }
        }
    }

    pub fn from_sqlite(conn: rusqlite::Connection) -> Self {
        Db::new(Sqlite::new(conn))
    }

    pub fn connect_postgres(url: &str) -> Result<Self> {
        Ok(Db::new(postgres::Postgres::connect(url)?))
    }

    pub fn backend(&self) -> Backend {
        self.storage.backend()
    }

    /// The file this connection opened, when it is a SQLite file.
    pub fn path(&self) -> Option<&Path> {
        self.storage.path()
    }

    /// The server this connection reached, when it is a PostgreSQL one.
    pub fn url(&self) -> Option<&str> {
        self.storage.url()
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
        if self.needs_own_transaction(sql) {
            return self.in_own_transaction(|| self.storage.execute(sql, params.values()));
        }
        self.storage.execute(sql, params.values())
    }

    /// The first row a query returns, read with `read`; [`DbError::NoRows`] when it returns
    /// none (see [`OptionalExtension::optional`]).
    pub fn query_row<T>(
        &self,
        sql: &str,
        params: impl Params,
        read: impl FnOnce(&Row) -> Result<T>,
    ) -> Result<T> {
        let mut read = Some(read);
        let mut first = None;
        self.for_each_row(sql, params.values(), &mut |row| {
            if let Some(read) = read.take() {
                first = Some(read(row));
            }
            Ok(false)
        })?;
        first.unwrap_or(Err(DbError::NoRows))
    }

    /// Reads a query's rows (one that writes, `RETURNING` them, sealed like any write).
    fn for_each_row(
        &self,
        sql: &str,
        values: Vec<Value>,
        read: &mut dyn FnMut(&Row) -> Result<bool>,
    ) -> Result<()> {
        if self.needs_own_transaction(sql) {
            return self.in_own_transaction(|| self.storage.for_each(sql, values, read));
        }
        self.storage.for_each(sql, values, read)
    }

    /// Runs statements separated by `;`, without parameters (schema changes).
    pub fn execute_batch(&self, sql: &str) -> Result<()> {
        if self.needs_own_transaction(sql) {
            return self.in_own_transaction(|| self.storage.execute_batch(sql));
        }
        self.storage.execute_batch(sql)
    }

    /// Runs `sql`, a setting of the session, now and again on each connection made after a
    /// lost one (see [`Storage::set_for_session`]).
    pub fn set_for_session(&self, sql: &str, params: impl Params) -> Result<()> {
        self.storage.set_for_session(sql, params.values())
    }

    /// Whether no transaction is open on this connection.
    pub fn is_autocommit(&self) -> bool {
        self.storage.is_autocommit()
    }

    /// Opens a transaction that takes the write lock at once: a writer that read first and
    /// then found the lock taken would have to start over. On PostgreSQL the lock is the
    /// ledger's [`postgres::DECIDE_LOCK`], held alone.
    pub fn begin(&self) -> Result<()> {
        self.storage.begin()
    }

    /// Opens a transaction for writes that are right whatever other writers do meanwhile: each
    /// statement decides on the rows it writes, under their row locks (a node run's end, its
    /// artifacts). On a server, such transactions go on side by side, waiting only for one
    /// opened by [`Db::begin`] and, for a moment, for each other's journal entries at commit;
    /// on SQLite it is [`Db::begin`].
    pub fn begin_sharing(&self) -> Result<()> {
        self.storage.begin_sharing()
    }

    /// Seals the open transaction (see [`Db::seal_with`]) and commits it; a refused or failed
    /// seal rolls it back.
    pub fn commit(&self) -> Result<()> {
        match self.seal() {
            Ok(None) => self.storage.commit(),
            Ok(Some(first)) => self.storage.commit_after(&first),
            Err(e) => {
                self.storage.rollback();
                Err(e)
            }
        }
    }

    /// Gives up the open transaction, if there is one.
    pub fn rollback(&self) {
        if !self.is_autocommit() {
            self.storage.rollback();
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

    /// A transaction opened by [`Db::begin_sharing`], rolled back when dropped uncommitted.
    pub fn sharing_transaction(&mut self) -> Result<Transaction<'_>> {
        self.begin_sharing()?;
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
        self.db.for_each_row(&self.sql, params.values(), &mut read)
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
