//! Migrations: bringing a ledger's schema to this kavi's version, on SQLite by replaying the
//! migrations, on a server by making it whole or stepping it up.

use std::path::{Path, PathBuf};

use super::db::{self, Db, OptionalExtension};
use super::{LedgerError, Result, journal, schema};
use kavi_db::{ddl, memory, postgres};

pub(crate) fn postgres_schema_exists(conn: &Db) -> Result<bool> {
    Ok(conn.query_row(
        "SELECT to_regclass('schema_version') IS NOT NULL",
        [],
        |row| row.get(0),
    )?)
}

/// A server's ledger is made whole at the schema's current version, from the schema SQLite
/// reaches after every migration (see [`ddl::schema`]); one made by an older kavi is
/// brought up to it by [`schema::SERVER_STEPS`], under the write lock, in one transaction.
pub(crate) fn migrate_postgres(conn: &mut Db, url: &str) -> Result<()> {
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
                for statement in ddl::schema(&sqlite_schema()?) {
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
        std::cmp::Ordering::Equal => {
            if !journal::current(conn)? {
                journal::remake(conn)?;
            }
            Ok(())
        }
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
pub(crate) fn server_sql(step: &schema::ServerStep, version: usize) -> Result<String> {
    match step {
        schema::ServerStep::Table(name) => ddl::table_named(&sqlite_schema_after(version)?, name)
            .ok_or_else(|| {
                std::io::Error::other(format!("migration {version} makes no table {name}")).into()
            }),
        schema::ServerStep::Sql(sql) => Ok((*sql).to_owned()),
    }
}

/// The schema as SQLite has it after every migration: (kind, name, SQL) in creation order.
pub(crate) fn sqlite_schema() -> Result<Vec<(String, String, String)>> {
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

pub(crate) fn migrate(conn: &mut Db, path: &Path) -> Result<()> {
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
