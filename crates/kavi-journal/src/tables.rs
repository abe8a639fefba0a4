//! The journaled tables: which they are, their columns and keys, and the SQL of their triggers.

use super::{APPEND_VIEW, Backend, Db, FIRST_ENTRY, Result, UNJOURNALED};

/// What a server's table calls the trigger of [`Table::writer_trigger_sql`]: `journal_{table}_writes`.
pub(super) const WRITES: &str = "writes";

/// The function [`Table::writer_trigger_sql`]'s triggers run: a statement that writes waits for
/// a transaction that decides under [`kavi_db::postgres::DECIDE_LOCK`], and such a transaction
/// for the statements under way, as SQLite's one write lock has them. Taken before any row
/// is, so that a writer never holds a row a deciding transaction waits for while it waits.
pub(super) const WRITER: &str = "journal_writer";

/// The function behind [`WRITER`].
pub(super) fn writer_function_sql() -> String {
    format!(
        "CREATE OR REPLACE FUNCTION {WRITER}() RETURNS trigger LANGUAGE plpgsql AS \
         $writer${}$writer$;",
        writer_function_body()
    )
}

/// The body of [`WRITER`].
pub(super) fn writer_function_body() -> String {
    format!(
        "
         BEGIN
           PERFORM pg_catalog.pg_advisory_xact_lock_shared({lock});
           RETURN NULL;
         END ",
        lock = kavi_db::postgres::DECIDE_LOCK,
    )
}

/// A journaled table: its name, columns and key.
pub(super) struct Table {
    pub(super) name: String,
    pub(super) columns: Vec<String>,
    /// Primary key columns, in key order; empty for a table keyed by rowid.
    pub(super) key: Vec<String>,
    pub(super) backend: Backend,
}

impl Table {
    /// The row's key as SQL over `row` (`NEW`, `OLD`, or the table itself).
    pub(super) fn key_sql(&self, row: &str) -> String {
        let key = if self.key.is_empty() {
            vec!["rowid".to_owned()]
        } else {
            self.key.clone()
        };
        match self.backend {
            Backend::Sqlite => {
                let parts: Vec<String> = key.iter().map(|c| format!("{row}.\"{c}\"")).collect();
                format!("json_array({})", parts.join(", "))
            }
            // The text SQLite's json_array gives: no spaces.
            Backend::Postgres => {
                let parts: Vec<String> = key
                    .iter()
                    .map(|c| format!("COALESCE(pg_catalog.to_json({row}.\"{c}\")::text, 'null')"))
                    .collect();
                format!("'[' || {} || ']'", parts.join(" || ',' || "))
            }
        }
    }

    /// The row's content as SQL: a JSON object of every column, in table order.
    pub(super) fn content_sql(&self, row: &str) -> String {
        match self.backend {
            Backend::Sqlite => {
                let parts: Vec<String> = self
                    .columns
                    .iter()
                    .map(|c| format!("'{c}', {row}.\"{c}\""))
                    .collect();
                format!("json_object({})", parts.join(", "))
            }
            // The text SQLite's json_object gives, so that an entry reads the same whichever
            // database wrote it (and a ledger copied from one to the other verifies).
            Backend::Postgres => {
                let parts: Vec<String> = self
                    .columns
                    .iter()
                    .map(|c| {
                        format!(
                            "'\"{c}\":' || COALESCE(pg_catalog.to_json({row}.\"{c}\")::text, 'null')"
                        )
                    })
                    .collect();
                if parts.is_empty() {
                    return "'{}'".to_owned();
                }
                format!("'{{' || {} || '}}'", parts.join(" || ',' || "))
            }
        }
    }

    pub(super) fn trigger_name(&self, op: &str) -> String {
        format!("journal_{}_{op}", self.name)
    }

    /// One trigger: after `op`, append the entry for the row it touched.
    pub(super) fn trigger_sql(&self, op: &str) -> String {
        let (event, row) = match op {
            "insert" => ("INSERT", "NEW"),
            "update" => ("UPDATE", "NEW"),
            _ => ("DELETE", "OLD"),
        };
        let name = &self.name;
        if self.backend == Backend::Postgres {
            // Appended at commit (a deferred constraint trigger fires then, once per change, in
            // the order of the changes, with the row as that change left it), one transaction
            // at a time: the journal lock is held from the first entry to the end of the
            // commit, not for the whole transaction. Each entry reads the head the last
            // commit left, so concurrent writers make one chain.
            return format!(
                "CREATE OR REPLACE FUNCTION \"{trigger}\"() RETURNS trigger LANGUAGE plpgsql AS \
                 $journal${body}$journal$;
                 CREATE CONSTRAINT TRIGGER \"{trigger}\" AFTER {event} ON \"{name}\"
                   DEFERRABLE INITIALLY DEFERRED
                   FOR EACH ROW EXECUTE FUNCTION \"{trigger}\"();",
                trigger = self.trigger_name(op),
                body = self.function_body(op),
            );
        }
        // The entry itself (its number, the hash before it, its own hash) is made by the
        // appender, once for all tables: see [`APPEND_VIEW`].
        format!(
            "CREATE TRIGGER \"{trigger}\" AFTER {event} ON \"{name}\" BEGIN
               INSERT INTO {APPEND_VIEW} (tbl, op, key, content)
               VALUES ('{name}', '{op}', {key}, {content});
             END;",
            trigger = self.trigger_name(op),
            key = self.key_sql(row),
            content = self.content_sql(row),
        )
    }

    /// The body of a server's trigger function for `op`: the entry, without its MAC, which kavi
    /// adds before the commit (see [`crate::server`]); the first entry's number is noted for
    /// the transaction, for kavi to find its entries by. Every call names the server's own
    /// function, and every operator has operands of its exact types: a function or operator of
    /// the same name elsewhere on the search path, a closer match for its arguments, would
    /// otherwise run instead.
    pub(super) fn function_body(&self, op: &str) -> String {
        let row = if op == "delete" { "OLD" } else { "NEW" };
        format!(
            "
                 DECLARE s BIGINT; p TEXT; k TEXT; c TEXT; h TEXT;
                 BEGIN
                   PERFORM pg_catalog.pg_advisory_xact_lock({lock});
                   SELECT COALESCE(pg_catalog.max(seq), 0) + 1 INTO s FROM journal;
                   SELECT COALESCE((SELECT hash FROM journal ORDER BY seq DESC LIMIT 1), '') INTO p;
                   k := {key};
                   c := {content};
                   h := pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(
                          p || E'\\n' || s::text || E'\\n' || '{name}' || E'\\n' || '{op}' || E'\\n'
                            || k || E'\\n' || c, 'UTF8'::name)), 'hex');
                   IF COALESCE(pg_catalog.current_setting('{FIRST_ENTRY}', true), '') = '' THEN
                     PERFORM pg_catalog.set_config('{FIRST_ENTRY}', s::text, true);
                   END IF;
                   INSERT INTO journal (seq, tbl, op, key, content, prev, hash, mac)
                   VALUES (s, '{name}', '{op}', k, c, p, h, NULL);
                   RETURN NULL;
                 END ",
            lock = kavi_db::postgres::JOURNAL_LOCK,
            key = self.key_sql(row),
            content = self.content_sql(row),
            name = self.name,
        )
    }

    /// On a server, the trigger that has every statement writing this table share the decide
    /// lock before it touches a row (see [`WRITER`]).
    pub(super) fn writer_trigger_sql(&self) -> String {
        format!(
            "CREATE TRIGGER \"{trigger}\" BEFORE INSERT OR UPDATE OR DELETE ON \"{name}\"
               FOR EACH STATEMENT EXECUTE FUNCTION {WRITER}();",
            trigger = self.trigger_name(WRITES),
            name = self.name,
        )
    }

    /// Every row as (key, content), computed as the triggers compute them.
    pub(super) fn rows(&self, conn: &Db) -> Result<Vec<(String, String)>> {
        let sql = format!(
            "SELECT {}, {} FROM \"{}\" AS t",
            self.key_sql("t"),
            self.content_sql("t"),
            self.name
        );
        let mut stmt = conn.prepare(&sql)?;
        let rows = stmt.query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?;
        Ok(rows.collect::<kavi_db::Result<_>>()?)
    }
}

pub(super) fn tables(conn: &Db) -> Result<Vec<Table>> {
    let backend = conn.backend();
    let names: Vec<String> = conn
        .prepare(match backend {
            Backend::Sqlite => "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name",
            Backend::Postgres => {
                "SELECT table_name::text FROM information_schema.tables
                 WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'
                 ORDER BY table_name"
            }
        })?
        .query_map([], |row| row.get(0))?
        .collect::<kavi_db::Result<_>>()?;
    let mut tables = Vec::new();
    for name in names {
        if UNJOURNALED.contains(&name.as_str()) {
            continue;
        }
        let (columns, key) = match backend {
            Backend::Sqlite => sqlite_columns(conn, &name)?,
            Backend::Postgres => postgres_columns(conn, &name)?,
        };
        tables.push(Table {
            name,
            columns,
            key,
            backend,
        });
    }
    Ok(tables)
}

/// A table's columns, and its primary key's in key order.
fn sqlite_columns(conn: &Db, table: &str) -> Result<(Vec<String>, Vec<String>)> {
    let mut columns = Vec::new();
    let mut key: Vec<(i64, String)> = Vec::new();
    let mut stmt = conn.prepare(&format!("PRAGMA table_info(\"{table}\")"))?;
    let infos = stmt.query_map([], |row| {
        Ok((row.get::<_, String>(1)?, row.get::<_, i64>(5)?))
    })?;
    for info in infos {
        let (column, pk) = info?;
        if pk > 0 {
            key.push((pk, column.clone()));
        }
        columns.push(column);
    }
    key.sort();
    Ok((columns, key.into_iter().map(|(_, column)| column).collect()))
}

/// The same on a server. Its `rowid` columns stand for SQLite's hidden rowid: part of no row's
/// content, the key of a table without a primary key.
fn postgres_columns(conn: &Db, table: &str) -> Result<(Vec<String>, Vec<String>)> {
    let columns = conn
        .prepare(
            "SELECT column_name::text FROM information_schema.columns
             WHERE table_schema = current_schema() AND table_name = ?1 AND column_name <> 'rowid'
             ORDER BY ordinal_position",
        )?
        .query_map([table], |row| row.get(0))?
        .collect::<kavi_db::Result<_>>()?;
    let key = conn
        .prepare(
            "SELECT a.attname::text FROM pg_index i
             JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
             WHERE i.indrelid = to_regclass(?1) AND i.indisprimary
             ORDER BY array_position(i.indkey, a.attnum)",
        )?
        .query_map([table], |row| row.get(0))?
        .collect::<kavi_db::Result<_>>()?;
    Ok((columns, key))
}
