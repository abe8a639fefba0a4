//! Installing the journal: its triggers on every table, the snapshot of rows they have not seen,
//! and remaking them when the schema or the appender changes.

use std::collections::HashMap;

use super::tables::{Table, WRITES, tables, writer_function_sql};
use super::{
    APPEND_VIEW, APPENDER, Backend, Db, JournalError, LAST_HASH, NEXT_SEQ, OptionalExtension,
    Result, Transaction, appender_sql, appender_trigger_sql, entry_hash, params,
};

/// The last entry of every row the journal knows: (table, key) → (seq, op, content).
type Latest = HashMap<(String, String), (i64, String, String)>;

pub(super) fn latest(conn: &Db) -> Result<Latest> {
    let mut latest = Latest::new();
    let mut stmt = conn.prepare("SELECT seq, tbl, op, key, content FROM journal ORDER BY seq")?;
    let entries = stmt.query_map([], |row| {
        Ok((
            row.get::<_, i64>(0)?,
            row.get::<_, String>(1)?,
            row.get::<_, String>(2)?,
            row.get::<_, String>(3)?,
            row.get::<_, String>(4)?,
        ))
    })?;
    for entry in entries {
        let (seq, table, op, key, content) = entry?;
        latest.insert((table, key), (seq, op, content));
    }
    Ok(latest)
}

/// Appends one entry from Rust, as the triggers would.
fn append(tx: &Transaction<'_>, table: &str, op: &str, key: &str, content: &str) -> Result<()> {
    let (seq, prev): (i64, String) =
        tx.query_row(&format!("SELECT {NEXT_SEQ}, {LAST_HASH}"), [], |row| {
            Ok((row.get(0)?, row.get(1)?))
        })?;
    let hash = entry_hash(&prev, seq, table, op, key, content);
    tx.execute(
        "INSERT INTO journal (seq, tbl, op, key, content, prev, hash, mac)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        params![
            seq,
            table,
            op,
            key,
            content,
            prev,
            hash,
            crate::keys::mac_key()
                .map_err(JournalError::Keys)?
                .mac(&hash)
        ],
    )?;
    Ok(())
}

/// Drops the journal's triggers, for a change that [`install`] then records (or for a copy).
pub fn drop_triggers(tx: &Transaction<'_>) -> Result<()> {
    if tx.backend() == Backend::Sqlite {
        tx.execute_batch(&format!(
            "DROP TRIGGER IF EXISTS {APPENDER}; DROP VIEW IF EXISTS {APPEND_VIEW};"
        ))?;
    }
    let tables = tables(tx)?;
    let ops: &[&str] = match tx.backend() {
        Backend::Sqlite => &["insert", "update", "delete"],
        Backend::Postgres => &["insert", "update", "delete", WRITES],
    };
    for table in &tables {
        for op in ops {
            tx.execute_batch(&format!(
                "DROP TRIGGER IF EXISTS \"{}\"{};",
                table.trigger_name(op),
                match table.backend {
                    Backend::Sqlite => String::new(),
                    Backend::Postgres => format!(" ON \"{}\"", table.name),
                }
            ))?;
        }
    }
    Ok(())
}

/// Installs the triggers for the schema as it is now, after migrations changed it, and records
/// the rows the journal does not cover as they are: every row when the journal is new
/// (`snapshot`), the rows a migration reshaped otherwise (`migrate`).
pub fn install(tx: &Transaction<'_>) -> Result<()> {
    let fresh: bool = tx.query_row("SELECT NOT EXISTS (SELECT 1 FROM journal)", [], |row| {
        row.get(0)
    })?;
    drop_triggers(tx)?;
    let tables = tables(tx)?;
    let latest = latest(tx)?;
    let op = if fresh { "snapshot" } else { "migrate" };
    for table in &tables {
        for (key, content) in table.rows(tx)? {
            let known = latest.get(&(table.name.clone(), key.clone()));
            if known.is_none_or(|(_, _, last)| *last != content) {
                append(tx, &table.name, op, &key, &content)?;
            }
        }
    }
    make_triggers(tx, &tables)
}

/// The appender (SQLite) and every table's triggers, where none are.
fn make_triggers(tx: &Transaction<'_>, tables: &[Table]) -> Result<()> {
    match tx.backend() {
        Backend::Sqlite => tx.execute_batch(&appender_sql())?,
        Backend::Postgres => tx.execute_batch(&writer_function_sql())?,
    }
    for table in tables {
        for op in ["insert", "update", "delete"] {
            tx.execute_batch(&table.trigger_sql(op))?;
        }
        if tx.backend() == Backend::Postgres {
            tx.execute_batch(&table.writer_trigger_sql())?;
        }
    }
    Ok(())
}

/// Whether the journal's triggers are the ones [`install`] makes now. A SQLite ledger made
/// before the appender (see [`APPEND_VIEW`]) has its entries written out in every table
/// trigger, and one made before its `VALUES` row (see [`appender_trigger_sql`]) another
/// appender; a server's ledger made before entries were appended at commit has triggers that
/// append at once, under a lock held to the end of the transaction, and one made before kavi
/// MACed its entries itself has functions that MAC on the server. Either is current in
/// every other way, and [`remake`] remakes them.
pub fn current(conn: &Db) -> Result<bool> {
    if conn.backend() == Backend::Postgres {
        // Row-level journal triggers that are not deferred: the appenders of before.
        let deferred: bool = conn.query_row(
            "SELECT NOT EXISTS (SELECT 1 FROM pg_trigger
                                WHERE NOT tgisinternal AND tgname::text LIKE 'journal\\_%'
                                  AND (tgtype & 1) = 1 AND NOT tgdeferrable)",
            [],
            |row| row.get(0),
        )?;
        // Functions of before: those that MACed on the server, with a key kavi gave it.
        return Ok(deferred && !super::server::functions_differ(conn)?);
    }
    let appender: Option<String> = conn
        .query_row(
            "SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name = ?1",
            [APPENDER],
            |row| row.get(0),
        )
        .optional()?;
    Ok(appender.is_some_and(|sql| sql == appender_trigger_sql()))
}

/// Remakes the triggers of a ledger made before the appender or its current text, or of a
/// server's made before entries were appended at commit (see [`current`]), under the write lock, where another kavi may have remade them first. Unlike
/// [`install`] it records no row: no migration changed any, and one that differs from its
/// last entry was edited behind the triggers (dropping the appender is how one would get here
/// on purpose), which `verify` must go on reporting.
pub fn remake(conn: &mut Db) -> Result<()> {
    let tx = conn.transaction()?;
    if !current(&tx)? {
        drop_triggers(&tx)?;
        make_triggers(&tx, &tables(&tx)?)?;
    }
    Ok(tx.commit()?)
}
