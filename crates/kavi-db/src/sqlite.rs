//! The ledger in a SQLite file: statements prepared once and cached, rows read where SQLite
//! holds them.

use std::path::Path;

use crate::{Backend, Result, Row, Storage, Value};

/// A connection to a SQLite file.
#[derive(Debug)]
pub struct Sqlite {
    conn: rusqlite::Connection,
}

impl Sqlite {
    pub fn new(conn: rusqlite::Connection) -> Self {
        // Every statement goes through the cache: the recorder's few run thousands of times.
        conn.set_prepared_statement_cache_capacity(64);
        Sqlite { conn }
    }
}

impl Storage for Sqlite {
    fn backend(&self) -> Backend {
        Backend::Sqlite
    }

    fn path(&self) -> Option<&Path> {
        self.conn
            .path()
            .filter(|path| !path.is_empty())
            .map(Path::new)
    }

    fn execute(&self, sql: &str, values: Vec<Value>) -> Result<usize> {
        let mut statement = self.conn.prepare_cached(sql)?;
        Ok(statement.execute(rusqlite::params_from_iter(values.iter()))?)
    }

    fn for_each(
        &self,
        sql: &str,
        values: Vec<Value>,
        read: &mut dyn FnMut(&Row) -> Result<bool>,
    ) -> Result<()> {
        let mut statement = self.conn.prepare_cached(sql)?;
        let mut rows = statement.query(rusqlite::params_from_iter(values.iter()))?;
        while let Some(row) = rows.next()? {
            if !read(&Row::from_sqlite(row))? {
                break;
            }
        }
        Ok(())
    }

    fn execute_batch(&self, sql: &str) -> Result<()> {
        Ok(self.conn.execute_batch(sql)?)
    }

    fn is_autocommit(&self) -> bool {
        self.conn.is_autocommit()
    }

    fn begin(&self) -> Result<()> {
        self.execute("BEGIN IMMEDIATE", Vec::new()).map(drop)
    }

    fn commit(&self) -> Result<()> {
        self.execute("COMMIT", Vec::new()).map(drop)
    }

    fn rollback(&self) {
        let _ = self.conn.execute_batch("ROLLBACK");
    }
}
