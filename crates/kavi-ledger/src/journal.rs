//! The journal: a hash chain over every change the ledger records, so that an edit made
//! outside kavi is evident.
//!
//! Each table has triggers that append, in the same transaction as the change, one `journal`
//! row: its `seq` (1, 2, 3, ... without gaps), the table, the operation (`insert`, `update`,
//! `delete`; `migrate` for rows a schema migration reshaped, `snapshot` for rows written before
//! the journal existed), the row's key (a JSON array of its primary key, or its rowid), its
//! content (a JSON object of every column, after the change; before it for a delete), the
//! previous entry's hash, and its own hash:
//!
//! ```text
//! hash = hex(sha256(prev LF seq LF table LF op LF key LF content))
//! ```
//!
//! with `prev` empty for the first entry. JSON escapes every control character, so no field
//! holds a line feed, and the line is plain enough to check with `sqlite3` and `sha256sum`.
//!
//! [`verify`] recomputes the chain, checks that every row of every table is what its last entry
//! says (no row added, changed or deleted behind the triggers' back), and re-hashes every stored
//! spec and artifact file. A writer who also recomputes the chain is caught by the signed
//! checkpoints (see [`super::checkpoint`]).

use std::collections::HashMap;

use super::db::{Backend, Db, OptionalExtension, Transaction, params};
use kavi_foundation::hash::sha256_hex;
use rusqlite::functions::FunctionFlags;

use super::keys::MacKey;
use super::{ArtifactStore, Ledger, LedgerError, Result, checkpoint};

/// The SQL function the triggers hash with; registered on every connection kavi opens.
const HASH_FUNCTION: &str = "kavi_sha256";

/// The SQL function the appender MACs an entry's hash with, under the key kavi keeps outside
/// the ledger and the workspace (see [`super::keys`]): a process without the key can recompute
/// the public chain, but not the MACs.
const MAC_FUNCTION: &str = "kavi_mac";

/// Tables without journal entries: the journal itself, bookkeeping, and the content of small
/// artifacts (bound by the SHA-256 of its journaled artifact row, and re-hashed by `verify`).
const UNJOURNALED: &[&str] = &[
    "journal",
    "schema_version",
    "sqlite_sequence",
    "artifact_contents",
];

/// What a SQLite ledger's table triggers write their entries into: a view that holds nothing,
/// whose [`APPENDER`] trigger turns each row written into it into the next journal entry.
/// Every connection reads every trigger of the schema when it first prepares a statement; with
/// the entry's numbering and hashing written once here rather than in each of the 54 table
/// triggers, that text is 37 KB instead of 65 KB (opening a ledger and running a first query:
/// 0.65 ms instead of 1.2 ms), and an entry costs what it did.
const APPEND_VIEW: &str = "journal_append";

/// The trigger behind [`APPEND_VIEW`].
const APPENDER: &str = "journal_append_entry";

/// The next entry's number, as the appender and [`append`] read it.
const NEXT_SEQ: &str = "(SELECT COALESCE(MAX(seq), 0) + 1 FROM journal)";

/// The last entry's hash ('' before the first), as the appender and [`append`] read it.
const LAST_HASH: &str = "COALESCE((SELECT hash FROM journal ORDER BY seq DESC LIMIT 1), '')";

/// The view and its trigger, made before the table triggers that use them.
fn appender_sql() -> String {
    format!(
        "CREATE VIEW {APPEND_VIEW} (tbl, op, key, content) AS
           SELECT tbl, op, key, content FROM journal WHERE 1 = 0;
         {};",
        appender_trigger_sql()
    )
}

/// The appender, as SQLite keeps its text. Its entry is one row of `VALUES`, each of the
/// number and the hash before it read where it is used: an `INSERT ... SELECT` that reads the
/// table it inserts into has SQLite put the rows in a temporary table first, one opened and
/// dropped for every entry (a third of an entry's instructions, with `callgrind`).
fn appender_trigger_sql() -> String {
    let hash = format!(
        "{HASH_FUNCTION}({LAST_HASH} || char(10) || {NEXT_SEQ} || char(10) || NEW.tbl
                                   || char(10) || NEW.op || char(10) || NEW.key || char(10)
                                   || NEW.content)"
    );
    format!(
        "CREATE TRIGGER {APPENDER} INSTEAD OF INSERT ON {APPEND_VIEW} BEGIN
           INSERT INTO journal (seq, tbl, op, key, content, prev, hash, mac)
           VALUES ({NEXT_SEQ}, NEW.tbl, NEW.op, NEW.key, NEW.content, {LAST_HASH},
                   {hash}, {MAC_FUNCTION}({hash}));
         END"
    )
}

/// Registers the hash and MAC functions the triggers call. A connection without them (the
/// `sqlite3` shell, say) cannot write a journaled table unless it drops the triggers, which
/// `verify` reports; one that defines its own has no key to MAC with.
pub(super) fn register(conn: &rusqlite::Connection, key: &'static MacKey) -> rusqlite::Result<()> {
    let flags = FunctionFlags::SQLITE_UTF8 | FunctionFlags::SQLITE_DETERMINISTIC;
    // Read in place: the argument is the whole entry, its content every column of a row.
    conn.create_scalar_function(HASH_FUNCTION, 1, flags, |ctx| {
        Ok(sha256_hex(ctx.get_raw(0).as_str()?.as_bytes()))
    })?;
    conn.create_scalar_function(MAC_FUNCTION, 1, flags, move |ctx| {
        Ok(key.mac(ctx.get_raw(0).as_str()?))
    })
}

/// The MAC a PostgreSQL trigger computes: HMAC-SHA256 of `hash` written out with the server's
/// own `sha256`, from the padded keys kavi gives its session (see [`super::postgres`]). A
/// session without them (anyone else's) fails to write rather than journal unkeyed.
fn postgres_mac_sql(hash: &str) -> String {
    format!(
        "encode(sha256(decode(current_setting('{outer}'), 'hex')
                       || sha256(decode(current_setting('{inner}'), 'hex')
                                 || convert_to({hash}, 'UTF8'))), 'hex')",
        inner = super::postgres::MAC_INNER,
        outer = super::postgres::MAC_OUTER,
    )
}

/// The hash of one entry.
pub fn entry_hash(prev: &str, seq: i64, table: &str, op: &str, key: &str, content: &str) -> String {
    sha256_hex(format!("{prev}\n{seq}\n{table}\n{op}\n{key}\n{content}").as_bytes())
}

/// A journaled table: its name, columns and key.
struct Table {
    name: String,
    columns: Vec<String>,
    /// Primary key columns, in key order; empty for a table keyed by rowid.
    key: Vec<String>,
    backend: Backend,
}

impl Table {
    /// The row's key as SQL over `row` (`NEW`, `OLD`, or the table itself).
    fn key_sql(&self, row: &str) -> String {
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
                    .map(|c| format!("COALESCE(to_json({row}.\"{c}\")::text, 'null')"))
                    .collect();
                format!("'[' || {} || ']'", parts.join(" || ',' || "))
            }
        }
    }

    /// The row's content as SQL: a JSON object of every column, in table order.
    fn content_sql(&self, row: &str) -> String {
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
                        format!("'\"{c}\":' || COALESCE(to_json({row}.\"{c}\")::text, 'null')")
                    })
                    .collect();
                if parts.is_empty() {
                    return "'{}'".to_owned();
                }
                format!("'{{' || {} || '}}'", parts.join(" || ',' || "))
            }
        }
    }

    fn trigger_name(&self, op: &str) -> String {
        format!("journal_{}_{op}", self.name)
    }

    /// One trigger: after `op`, append the entry for the row it touched.
    fn trigger_sql(&self, op: &str) -> String {
        let (event, row) = match op {
            "insert" => ("INSERT", "NEW"),
            "update" => ("UPDATE", "NEW"),
            _ => ("DELETE", "OLD"),
        };
        let name = &self.name;
        if self.backend == Backend::Postgres {
            // Entries are appended one writer at a time, as SQLite's lock made them.
            return format!(
                "CREATE OR REPLACE FUNCTION \"{trigger}\"() RETURNS trigger LANGUAGE plpgsql AS $journal$
                 DECLARE s BIGINT; p TEXT; k TEXT; c TEXT; h TEXT;
                 BEGIN
                   PERFORM pg_advisory_xact_lock({lock});
                   SELECT COALESCE(MAX(seq), 0) + 1 INTO s FROM journal;
                   SELECT COALESCE((SELECT hash FROM journal ORDER BY seq DESC LIMIT 1), '') INTO p;
                   k := {key};
                   c := {content};
                   h := encode(sha256(convert_to(p || chr(10) || s || chr(10) || '{name}' || chr(10)
                                                 || '{op}' || chr(10) || k || chr(10) || c, 'UTF8')), 'hex');
                   INSERT INTO journal (seq, tbl, op, key, content, prev, hash, mac)
                   VALUES (s, '{name}', '{op}', k, c, p, h, {mac});
                   RETURN NULL;
                 END $journal$;
                 CREATE TRIGGER \"{trigger}\" AFTER {event} ON \"{name}\"
                   FOR EACH ROW EXECUTE FUNCTION \"{trigger}\"();",
                trigger = self.trigger_name(op),
                lock = super::postgres::WRITE_LOCK,
                key = self.key_sql(row),
                content = self.content_sql(row),
                mac = postgres_mac_sql("h"),
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

    /// Every row as (key, content), computed as the triggers compute them.
    fn rows(&self, conn: &Db) -> Result<Vec<(String, String)>> {
        let sql = format!(
            "SELECT {}, {} FROM \"{}\" AS t",
            self.key_sql("t"),
            self.content_sql("t"),
            self.name
        );
        let mut stmt = conn.prepare(&sql)?;
        let rows = stmt.query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?;
        Ok(rows.collect::<super::db::Result<_>>()?)
    }
}

fn tables(conn: &Db) -> Result<Vec<Table>> {
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
        .collect::<super::db::Result<_>>()?;
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
        .collect::<super::db::Result<_>>()?;
    let key = conn
        .prepare(
            "SELECT a.attname::text FROM pg_index i
             JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
             WHERE i.indrelid = to_regclass(?1) AND i.indisprimary
             ORDER BY array_position(i.indkey, a.attnum)",
        )?
        .query_map([table], |row| row.get(0))?
        .collect::<super::db::Result<_>>()?;
    Ok((columns, key))
}

/// The last entry of every row the journal knows: (table, key) → (seq, op, content).
type Latest = HashMap<(String, String), (i64, String, String)>;

fn latest(conn: &Db) -> Result<Latest> {
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
            super::keys::mac_key()
                .map_err(LedgerError::Keys)?
                .mac(&hash)
        ],
    )?;
    Ok(())
}

/// Drops the journal's triggers, for a change that [`install`] then records (or for a copy).
pub(super) fn drop_triggers(tx: &Transaction<'_>) -> Result<()> {
    if tx.backend() == Backend::Sqlite {
        tx.execute_batch(&format!(
            "DROP TRIGGER IF EXISTS {APPENDER}; DROP VIEW IF EXISTS {APPEND_VIEW};"
        ))?;
    }
    let tables = tables(tx)?;
    for table in &tables {
        for op in ["insert", "update", "delete"] {
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
pub(super) fn install(tx: &Transaction<'_>) -> Result<()> {
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
    if tx.backend() == Backend::Sqlite {
        tx.execute_batch(&appender_sql())?;
    }
    for table in tables {
        for op in ["insert", "update", "delete"] {
            tx.execute_batch(&table.trigger_sql(op))?;
        }
    }
    Ok(())
}

/// Whether the journal's triggers are the ones [`install`] makes now. A SQLite ledger made
/// before the appender (see [`APPEND_VIEW`]) has its entries written out in every table
/// trigger, and one made before its `VALUES` row (see [`appender_trigger_sql`]) another
/// appender: it is current in every other way, and [`remake`] remakes them.
pub(super) fn current(conn: &Db) -> Result<bool> {
    if conn.backend() != Backend::Sqlite {
        return Ok(true);
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

/// Remakes the triggers of a ledger made before the appender or its current text (see
/// [`current`]), under the write lock, where another kavi may have remade them first. Unlike
/// [`install`] it records no row: no migration changed any, and one that differs from its
/// last entry was edited behind the triggers (dropping the appender is how one would get here
/// on purpose), which `verify` must go on reporting.
pub(super) fn remake(conn: &mut Db) -> Result<()> {
    let tx = conn.transaction()?;
    if !current(&tx)? {
        drop_triggers(&tx)?;
        make_triggers(&tx, &tables(&tx)?)?;
    }
    Ok(tx.commit()?)
}

/// What [`verify`] found: problems, each naming an entry, a row or a file.
#[derive(Debug, Default)]
pub struct Findings {
    pub entries: i64,
    /// How many entries have no MAC (see [`seal`]).
    pub unkeyed: usize,
    /// How many signed checkpoints there are.
    pub checkpoints: usize,
    pub problems: Vec<String>,
    /// The rule sets' story, a line each (filled in by `kavi ledger verify`).
    pub adoption: Vec<String>,
}

/// Recomputes the chain and checks every table against it, every stored spec, and every
/// artifact file in `store`.
pub fn verify(
    conn: &Db,
    store: &super::ArtifactStore,
    trusted: Option<&ed25519_dalek::VerifyingKey>,
    logged: &super::checkpoint::Log,
) -> Result<Findings> {
    let mut findings = Findings::default();
    let key_for_macs = super::keys::mac_key().map_err(LedgerError::Keys)?;
    // The chain.
    let mut stmt = conn
        .prepare("SELECT seq, tbl, op, key, content, prev, hash, mac FROM journal ORDER BY seq")?;
    let mut expected_prev = String::new();
    let mut expected_seq = 1;
    let mut broken = false;
    let mut unkeyed: Vec<i64> = Vec::new();
    stmt.for_each([], |row| {
        let (seq, table, op, key_text, content, prev, hash, mac): (
            i64,
            String,
            String,
            String,
            String,
            String,
            String,
            Option<String>,
        ) = (
            row.get(0)?,
            row.get(1)?,
            row.get(2)?,
            row.get(3)?,
            row.get(4)?,
            row.get(5)?,
            row.get(6)?,
            row.get(7)?,
        );
        let key = key_text.as_str();
        findings.entries = seq;
        let problem = if seq != expected_seq {
            Some(format!(
                "journal entry {seq}: expected entry {expected_seq} here (entries were removed or inserted)"
            ))
        } else if prev != expected_prev {
            Some(format!(
                "journal entry {seq}: its `prev` is not the hash of entry {}",
                seq - 1
            ))
        } else if hash != entry_hash(&prev, seq, &table, &op, key, &content) {
            Some(format!(
                "journal entry {seq}: its hash does not match its content ({table} {key})"
            ))
        } else if mac.as_ref().is_some_and(|mac| *mac != key_for_macs.mac(&hash)) {
            Some(format!(
                "journal entry {seq}: its MAC does not hold ({table} {key}): written by a \
                 process without kavi's key, or the chain was recomputed"
            ))
        } else {
            if mac.is_none() {
                unkeyed.push(seq);
            }
            None
        };
        if let Some(problem) = problem {
            findings.problems.push(problem);
            // One break in the chain makes every later entry suspect; the first is named.
            broken = true;
            return Ok(false);
        }
        expected_prev = hash;
        expected_seq += 1;
        Ok(true)
    })?;
    drop(stmt);
    // Checkpoints still match the chain, and were signed by the pinned key.
    let (checkpoints, problems) = super::checkpoint::verify(conn, trusted, logged)?;
    findings.checkpoints = checkpoints;
    if broken {
        findings.problems.extend(problems);
        return Ok(findings);
    }
    if let (Some(first), Some(last)) = (unkeyed.first(), unkeyed.last()) {
        findings.unkeyed = unkeyed.len();
        findings.problems.push(format!(
            "{} journal entries (entry {first} to {last}) have no MAC: written before kavi keyed \
             the journal, or by a process without its key; once they are checked, `kavi ledger \
             seal` MACs them",
            unkeyed.len()
        ));
    }

    // The tables against the chain.
    let mut latest = latest(conn)?;
    let tables = tables(conn)?;
    let triggers: Vec<String> = conn
        .prepare(match conn.backend() {
            Backend::Sqlite => "SELECT name FROM sqlite_master WHERE type = 'trigger'",
            Backend::Postgres => "SELECT tgname::text FROM pg_trigger WHERE NOT tgisinternal",
        })?
        .query_map([], |row| row.get(0))?
        .collect::<super::db::Result<_>>()?;
    if conn.backend() == Backend::Sqlite && !triggers.iter().any(|t| t == APPENDER) {
        findings.problems.push(format!(
            "the journal's appender (trigger {APPENDER}) is missing (dropped outside kavi)"
        ));
    }
    for table in &tables {
        for op in ["insert", "update", "delete"] {
            if !triggers.contains(&table.trigger_name(op)) {
                findings.problems.push(format!(
                    "table {}: its journal trigger for {op} is missing (dropped outside kavi)",
                    table.name
                ));
            }
        }
        for (key, content) in table.rows(conn)? {
            match latest.remove(&(table.name.clone(), key.clone())) {
                None => findings.problems.push(format!(
                    "table {} row {key}: not in the journal (added outside kavi)",
                    table.name
                )),
                Some((seq, op, _)) if op == "delete" => findings.problems.push(format!(
                    "table {} row {key}: journal entry {seq} deleted it, yet it is there",
                    table.name
                )),
                Some((seq, _, last)) if last != content => findings.problems.push(format!(
                    "table {} row {key}: differs from journal entry {seq} (edited outside kavi)",
                    table.name
                )),
                Some(_) => {}
            }
        }
    }
    let mut gone: Vec<_> = latest
        .into_iter()
        .filter(|(_, (_, op, _))| op != "delete")
        .collect();
    gone.sort_by_key(|(_, (seq, _, _))| *seq);
    for ((table, key), (seq, _, _)) in gone {
        findings.problems.push(format!(
            "table {table} row {key}: journal entry {seq} has it, but it is gone (deleted outside kavi)"
        ));
    }

    findings.problems.extend(problems);

    // Stored specs hash to their names.
    let mut stmt = conn.prepare("SELECT hash, text FROM specs ORDER BY hash")?;
    let specs = stmt.query_map([], |row| {
        Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?))
    })?;
    for spec in specs {
        let (hash, text) = spec?;
        if kavi_foundation::hash::spec_hash(&text) != hash {
            findings
                .problems
                .push(format!("spec {hash}: its text does not hash to its name"));
        }
    }

    // Artifacts hash to their names: the content the ledger keeps, or the file.
    let mut stmt = conn.prepare(
        "SELECT a.sha256, a.size, c.content FROM artifacts a
         LEFT JOIN artifact_contents c ON c.sha256 = a.sha256 ORDER BY a.sha256",
    )?;
    let artifacts = stmt.query_map([], |row| {
        Ok((
            row.get::<_, String>(0)?,
            row.get::<_, i64>(1)?,
            row.get::<_, Option<Vec<u8>>>(2)?,
        ))
    })?;
    for artifact in artifacts {
        let (sha256, size, kept) = artifact?;
        if let Some(content) = kept {
            if sha256_hex(&content) != sha256 || i64::try_from(content.len()) != Ok(size) {
                findings.problems.push(format!(
                    "artifact {sha256}: the content the ledger keeps no longer hashes to its name"
                ));
            }
            continue;
        }
        let path = store.path_of_sha256(&sha256);
        match kavi_foundation::hash::hash_file(&path) {
            Err(e) => findings.problems.push(format!(
                "artifact {sha256}: cannot read {}: {e}",
                path.display()
            )),
            Ok((found, bytes)) if found != sha256 || i64::try_from(bytes) != Ok(size) => {
                findings.problems.push(format!(
                    "artifact {sha256}: {} no longer hashes to its name (edited on disk)",
                    path.display()
                ))
            }
            Ok(_) => {}
        }
    }
    Ok(findings)
}

/// MACs the entries that have none (a ledger journaled before kavi keyed it), in one
/// transaction; returns how many. The caller checks first that nothing else is wrong. Only
/// entries before the first keyed one are sealed: that entry's MAC covers their hashes through
/// the chain, and every kavi that upgrades a ledger writes one (its identity) as it opens it. An
/// unkeyed entry after a keyed one, or none keyed at all, is what a writer without the key
/// leaves (one who stripped every MAC to pass for an old ledger), and is refused.
pub(super) fn seal(conn: &mut Db) -> Result<usize> {
    let key = super::keys::mac_key().map_err(LedgerError::Keys)?;
    let tx = conn.transaction()?;
    let unkeyed: Vec<(i64, String)> = tx
        .prepare("SELECT seq, hash FROM journal WHERE mac IS NULL ORDER BY seq")?
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?
        .collect::<super::db::Result<_>>()?;
    let first_keyed: Option<i64> = tx.query_row(
        "SELECT MIN(seq) FROM journal WHERE mac IS NOT NULL",
        [],
        |row| row.get(0),
    )?;
    let after = unkeyed
        .last()
        .filter(|(seq, _)| first_keyed.is_none_or(|keyed| *seq > keyed));
    if let Some((seq, _)) = after {
        return Err(LedgerError::Keys(format!(
            "journal entry {seq} has no MAC, and no keyed entry after it vouches for it: it was \
             written by a process without kavi's key, not before kavi keyed the journal; it is \
             not sealed"
        )));
    }
    for (seq, hash) in &unkeyed {
        tx.execute(
            "UPDATE journal SET mac = ?1 WHERE seq = ?2",
            params![key.mac(hash), seq],
        )?;
    }
    tx.commit()?;
    Ok(unkeyed.len())
}

/// Why the row of `table` keyed `key` (as the journal writes keys: `["name"]`) is not what the
/// journal's keyed last entry for it says, if it is not: the entry must recompute to its hash,
/// carry a MAC that holds under kavi's key, and hold the row's content as it is now. What a
/// command that acts on one row checks, rather than trust the editable row alone.
pub(super) fn row_problem(conn: &Db, table: &str, key: &str) -> Result<Option<String>> {
    let macs = super::keys::mac_key().map_err(LedgerError::Keys)?;
    let Some(table) = tables(conn)?.into_iter().find(|t| t.name == table) else {
        return Ok(Some(format!("no table {table}")));
    };
    let current: Option<String> = conn
        .query_row(
            &format!(
                "SELECT {} FROM \"{}\" AS t WHERE {} = ?1",
                table.content_sql("t"),
                table.name,
                table.key_sql("t")
            ),
            [key],
            |row| row.get(0),
        )
        .optional()?;
    let last: Option<(i64, String, String, String, String, Option<String>)> = conn
        .query_row(
            "SELECT seq, op, content, prev, hash, mac FROM journal
             WHERE tbl = ?1 AND key = ?2 ORDER BY seq DESC LIMIT 1",
            params![table.name, key],
            |row| {
                Ok((
                    row.get(0)?,
                    row.get(1)?,
                    row.get(2)?,
                    row.get(3)?,
                    row.get(4)?,
                    row.get(5)?,
                ))
            },
        )
        .optional()?;
    let name = &table.name;
    let Some((seq, op, content, prev, hash, mac)) = last else {
        return Ok(Some(format!(
            "table {name} row {key}: not in the journal (added outside kavi)"
        )));
    };
    Ok(
        if hash != entry_hash(&prev, seq, name, &op, key, &content) {
            Some(format!(
                "journal entry {seq}: its hash does not match its content ({name} {key})"
            ))
        } else if mac.is_none_or(|mac| mac != macs.mac(&hash)) {
            Some(format!(
                "journal entry {seq} ({name} {key}) has no MAC that holds under kavi's key: written \
             by a process without the key"
            ))
        } else if op == "delete" || current.as_deref() != Some(content.as_str()) {
            Some(format!(
                "table {name} row {key}: differs from journal entry {seq} (edited outside kavi)"
            ))
        } else {
            None
        },
    )
}

impl Ledger {
    /// MACs the journal entries written before kavi keyed the journal (see [`seal`]).
    pub fn seal(&mut self) -> Result<usize> {
        seal(&mut self.conn)
    }

    /// Refuses a skill whose row is not what the journal's keyed last entry for it says: its
    /// code hash, state or trusted tree edited outside kavi (see [`row_problem`]).
    pub fn check_skill_journaled(&self, name: &str) -> Result<()> {
        self.check_journaled(
            "skills",
            serde_json::json!([name]),
            &format!("skill `{name}`"),
        )
    }

    /// Refuses a rule set whose row is not what the journal's keyed last entry for it says: its
    /// files, status or approvals edited outside kavi, so no decision is taken under it.
    pub fn check_rule_set_journaled(&self, id: i64) -> Result<()> {
        self.check_journaled(
            "rule_sets",
            serde_json::json!([id]),
            &format!("rule set {id}"),
        )
    }

    fn check_journaled(&self, table: &str, key: serde_json::Value, what: &str) -> Result<()> {
        match row_problem(&self.conn, table, &key.to_string())? {
            Some(problem) => Err(LedgerError::Unjournaled(format!("{what}: {problem}"))),
            None => Ok(()),
        }
    }

    /// Checks the ledger's integrity (see [`verify`]), and its checkpoints against the
    /// `trusted` key when one is known.
    pub fn verify(
        &self,
        store: &ArtifactStore,
        trusted: Option<&ed25519_dalek::VerifyingKey>,
        logged: &checkpoint::Log,
    ) -> Result<Findings> {
        verify(&self.conn, store, trusted, logged)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ArtifactStore, Ledger, schema};

    #[test]
    fn an_entry_hashes_one_plain_line_per_field() {
        let by_hand = sha256_hex(b"abc\n7\nruns\nupdate\n[1]\n{\"id\":1}");
        assert_eq!(
            entry_hash("abc", 7, "runs", "update", "[1]", "{\"id\":1}"),
            by_hand
        );
    }

    /// A ledger written before the journal existed gets one `snapshot` entry per row when it is
    /// upgraded, and verifies clean; an edit afterwards, behind the triggers, does not.
    #[test]
    fn an_older_ledger_is_snapshotted_on_upgrade_and_verifies() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.db");
        {
            crate::memory::use_mimalloc();
            let conn = rusqlite::Connection::open(&path).unwrap();
            conn.execute_batch("CREATE TABLE schema_version (version INTEGER NOT NULL)")
                .unwrap();
            for migration in &schema::MIGRATIONS[..15] {
                conn.execute_batch(migration).unwrap();
            }
            conn.execute_batch(
                "INSERT INTO schema_version VALUES (15);
                 INSERT INTO specs VALUES ('sha256:x', 'p.toml', 'text', 'now');
                 INSERT INTO runs (pipeline, spec_path, spec_hash, params, status, started_at, owner)
                 VALUES ('demo', 'p.toml', 'sha256:x', '{}', 'succeeded', 'now', 'o');",
            )
            .unwrap();
        }
        let store = ArtifactStore::open(&dir.path().join("artifacts")).unwrap();
        let ledger = Ledger::open(&path).unwrap();
        let findings = ledger.verify(&store, None, &Vec::new()).unwrap();
        // The old spec row is journaled as it is, and its wrong hash is still reported.
        assert_eq!(
            findings.problems,
            ["spec sha256:x: its text does not hash to its name"]
        );
        let ops: Vec<String> = ledger
            .conn
            .prepare("SELECT op FROM journal ORDER BY seq")
            .unwrap()
            .query_map([], |row| row.get(0))
            .unwrap()
            .collect::<crate::db::Result<_>>()
            .unwrap();
        // Then the ledger's identity, made as it is opened.
        assert_eq!(ops, ["snapshot", "snapshot", "insert"]);

        ledger
            .conn
            .execute_batch("DROP TRIGGER journal_runs_update; UPDATE runs SET status = 'failed'")
            .unwrap();
        assert_reports_run_edited(&ledger.verify(&store, None, &Vec::new()).unwrap());
    }

    /// `verify` names run 1's row as changed since its last journal entry.
    fn assert_reports_run_edited(findings: &Findings) {
        assert!(
            findings
                .problems
                .iter()
                .any(|p| p.starts_with("table runs row [1]: differs from journal entry")),
            "{:?}",
            findings.problems
        );
    }

    /// The table triggers write through one appender. Without it a write fails rather than go
    /// unjournaled, `verify` names it, and the next kavi to open the ledger makes it again.
    #[test]
    fn without_its_appender_a_ledger_refuses_writes_until_it_is_opened_again() {
        let (dir, ledger, _owner) = crate::testing::fresh_ledger();
        let store = ArtifactStore::open(&dir.path().join("artifacts")).unwrap();
        let hash = kavi_foundation::hash::spec_hash("text");
        let insert = format!("INSERT INTO specs VALUES ('{hash}', 'p.toml', 'text', 'now')");
        ledger
            .conn
            .execute_batch(&format!("DROP TRIGGER {APPENDER}"))
            .unwrap();
        let refused = ledger.conn.execute_batch(&insert).unwrap_err();
        assert!(refused.to_string().contains(APPEND_VIEW), "{refused}");
        let findings = ledger.verify(&store, None, &Vec::new()).unwrap();
        assert_eq!(
            findings.problems,
            [format!(
                "the journal's appender (trigger {APPENDER}) is missing (dropped outside kavi)"
            )]
        );
        assert!(!current(&ledger.conn).unwrap());
        drop(ledger);

        let ledger = Ledger::open(&dir.path().join("ledger.db")).unwrap();
        assert!(current(&ledger.conn).unwrap());
        ledger.conn.execute_batch(&insert).unwrap();
        let findings = ledger.verify(&store, None, &Vec::new()).unwrap();
        assert!(findings.problems.is_empty(), "{:?}", findings.problems);
        let last: (String, String) = ledger
            .conn
            .query_row(
                "SELECT tbl, op FROM journal ORDER BY seq DESC LIMIT 1",
                [],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .unwrap();
        assert_eq!(last, ("specs".to_owned(), "insert".to_owned()));
    }

    /// A ledger made by a kavi whose appender read the journal in an `INSERT ... SELECT` (a
    /// temporary table for every entry) is not current: it journals on as it is, and the next
    /// kavi to open it remakes the appender, whose entries chain on from the old ones.
    #[test]
    fn an_older_appender_is_remade_and_the_chain_goes_on() {
        let (dir, mut ledger, owner) = crate::testing::fresh_ledger();
        let store = ArtifactStore::open(&dir.path().join("artifacts")).unwrap();
        let run = |ledger: &mut Ledger| {
            ledger
                .create_run(&crate::testing::new_run(
                    &serde_json::json!({}),
                    &["a"],
                    &owner,
                ))
                .unwrap()
        };
        run(&mut ledger);
        ledger
            .conn
            .execute_batch(&format!(
                "DROP TRIGGER {APPENDER};
                 CREATE TRIGGER {APPENDER} INSTEAD OF INSERT ON {APPEND_VIEW} BEGIN
                   INSERT INTO journal (seq, tbl, op, key, content, prev, hash)
                   SELECT seq, NEW.tbl, NEW.op, NEW.key, NEW.content, prev,
                          {HASH_FUNCTION}(prev || char(10) || seq || char(10) || NEW.tbl
                                          || char(10) || NEW.op || char(10) || NEW.key
                                          || char(10) || NEW.content)
                   FROM (SELECT COALESCE((SELECT MAX(seq) FROM journal), 0) + 1 AS seq,
                                COALESCE((SELECT hash FROM journal ORDER BY seq DESC LIMIT 1),
                                         '') AS prev);
                 END;"
            ))
            .unwrap();
        assert!(!current(&ledger.conn).unwrap());
        run(&mut ledger);
        drop(ledger);

        let mut ledger = Ledger::open(&dir.path().join("ledger.db")).unwrap();
        assert!(current(&ledger.conn).unwrap());
        let entries = |ledger: &Ledger| -> i64 {
            ledger
                .conn
                .query_row("SELECT count(*) FROM journal", [], |row| row.get(0))
                .unwrap()
        };
        let before = entries(&ledger);
        run(&mut ledger);
        assert!(entries(&ledger) > before);
        // The older appender wrote no MACs, after keyed entries: said so, and not sealed, since
        // that is what a writer without the key leaves.
        let findings = ledger.verify(&store, None, &Vec::new()).unwrap();
        assert_eq!(findings.unkeyed, 2, "{:?}", findings.problems);
        let refused = ledger.seal().unwrap_err().to_string();
        assert!(
            refused.contains("no keyed entry after it vouches"),
            "{refused}"
        );
    }

    /// A ledger journaled before kavi keyed it: its entries are a prefix without MACs, which
    /// what this kavi writes follows; `seal` MACs them, and it verifies.
    #[test]
    fn entries_from_before_the_keyed_journal_are_sealed() {
        let (dir, mut ledger, owner) = crate::testing::fresh_ledger();
        let store = ArtifactStore::open(&dir.path().join("artifacts")).unwrap();
        let run = |ledger: &mut Ledger| {
            let new = crate::testing::new_run(&serde_json::json!({}), &["a"], &owner);
            ledger.create_run(&new).unwrap();
        };
        run(&mut ledger);
        // As an older kavi left it: no MACs.
        ledger
            .conn
            .execute_batch("UPDATE journal SET mac = NULL")
            .unwrap();
        let refused = ledger.seal().unwrap_err().to_string();
        assert!(refused.contains("no keyed entry after it"), "{refused}");
        run(&mut ledger);
        let findings = ledger.verify(&store, None, &Vec::new()).unwrap();
        assert!(findings.unkeyed > 0);
        assert_eq!(findings.problems.len(), 1, "{:?}", findings.problems);
        assert_eq!(ledger.seal().unwrap(), findings.unkeyed);
        let findings = ledger.verify(&store, None, &Vec::new()).unwrap();
        assert!(findings.problems.is_empty(), "{:?}", findings.problems);
    }

    /// A ledger whose triggers cannot be remade now (another process holds the write lock past
    /// the timeout, here 10 s) opens with the ones it has, and has them remade once it can.
    #[test]
    fn a_ledger_that_cannot_be_written_now_opens_with_its_older_triggers() {
        let (dir, ledger, _owner) = crate::testing::fresh_ledger();
        let path = dir.path().join("ledger.db");
        ledger
            .conn
            .execute_batch(&format!("DROP TRIGGER {APPENDER}"))
            .unwrap();
        drop(ledger);
        let holder = rusqlite::Connection::open(&path).unwrap();
        holder.execute_batch("BEGIN IMMEDIATE").unwrap();
        let ledger = Ledger::open(&path).unwrap();
        assert!(!current(&ledger.conn).unwrap());
        drop(ledger);
        holder.execute_batch("ROLLBACK").unwrap();
        let ledger = Ledger::open(&path).unwrap();
        assert!(current(&ledger.conn).unwrap());
    }

    /// Remaking the triggers records nothing: a row edited behind them (the appender and the
    /// table's trigger dropped first) is still reported after the next kavi opens the ledger,
    /// not taken into the journal as a `migrate` entry.
    #[test]
    fn remade_triggers_do_not_take_in_a_row_edited_behind_them() {
        let (dir, mut ledger, owner) = crate::testing::fresh_ledger();
        let store = ArtifactStore::open(&dir.path().join("artifacts")).unwrap();
        ledger
            .create_run(&crate::testing::new_run(
                &serde_json::json!({}),
                &["a"],
                &owner,
            ))
            .unwrap();
        ledger
            .conn
            .execute_batch(&format!(
                "DROP TRIGGER {APPENDER}; DROP TRIGGER journal_runs_update;
                 UPDATE runs SET status = 'failed'"
            ))
            .unwrap();
        drop(ledger);
        let ledger = Ledger::open(&dir.path().join("ledger.db")).unwrap();
        assert!(current(&ledger.conn).unwrap());
        assert_reports_run_edited(&ledger.verify(&store, None, &Vec::new()).unwrap());
    }
}
