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
//! [`verify`] recomputes the chain and checks that every row of every table is what its last
//! entry says (no row added, changed or deleted behind the triggers' back); the ledger then
//! re-hashes every stored spec and artifact file, knowing where they are kept. A writer who also
//! recomputes the chain is caught by the signed checkpoints (see [`checkpoint`]).
//!
//! This crate knows the ledger only as a database: the tables it journals it reads from the
//! schema, naming only its own and those it leaves out; `kavi-ledger` calls into it on every
//! migration, every connection it opens, and for `kavi ledger verify`.

pub mod checkpoint;
pub mod keys;
mod server;
mod tables;
mod triggers;
mod verify;

use kavi_db::{Backend, Db, OptionalExtension, Transaction, params};
use kavi_foundation::hash::sha256_hex;
use rusqlite::functions::FunctionFlags;

use keys::MacKey;

pub use server::ServerSeal;
pub use triggers::{current, drop_triggers, install, remake};
pub use verify::{Findings, row_problem, seal, verify};

/// What goes wrong in the journal: the database, or kavi's keys.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("ledger query failed: {0}")]
    Db(#[from] kavi_db::DbError),
    #[error("{0}")]
    Keys(String),
}

pub type Result<T, E = JournalError> = std::result::Result<T, E>;

/// On a server, the transaction setting where the journal's triggers note the number of the
/// first entry they append, for kavi to find and MAC the transaction's entries before its
/// commit (see [`server`]). The server never holds the key.
const FIRST_ENTRY: &str = "kavi.journal_first";

/// The SQL function the triggers hash with; registered on every connection kavi opens.
pub const HASH_FUNCTION: &str = "kavi_sha256";

/// The SQL function the appender MACs an entry's hash with, under the key kavi keeps outside
/// the ledger and the workspace (see [`keys`]): a process without the key can recompute
/// the public chain, but not the MACs.
const MAC_FUNCTION: &str = "kavi_mac";

/// Tables without journal entries: the journal itself, bookkeeping (the slots of concurrency
/// groups, held a while and deciding nothing the runs' rows do not record; the objects gc
/// removes from the object store), and the content of
/// artifacts kept in the ledger (bound by the SHA-256 of its journaled artifact row, and
/// re-hashed by `verify`).
const UNJOURNALED: &[&str] = &[
    "journal",
    "schema_version",
    "sqlite_sequence",
    "artifact_contents",
    "artifact_chunks",
    "group_slots",
    "object_deletions",
];

/// What a SQLite ledger's table triggers write their entries into: a view that holds nothing,
/// whose [`APPENDER`] trigger turns each row written into it into the next journal entry.
/// Every connection reads every trigger of the schema when it first prepares a statement; with
/// the entry's numbering and hashing written once here rather than in each of the 54 table
/// triggers, that text is 37 KB instead of 65 KB (opening a ledger and running a first query:
/// 0.65 ms instead of 1.2 ms), and an entry costs what it did.
pub const APPEND_VIEW: &str = "journal_append";

/// The trigger behind [`APPEND_VIEW`].
pub const APPENDER: &str = "journal_append_entry";

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
pub fn register(conn: &rusqlite::Connection, key: &'static MacKey) -> rusqlite::Result<()> {
    let flags = FunctionFlags::SQLITE_UTF8 | FunctionFlags::SQLITE_DETERMINISTIC;
    // The appender names an entry's hash twice, for its `hash` column and as its MAC's
    // argument, and SQLite evaluates each: the last entry hashed is kept with its hash, so
    // that the same entry asked for again is compared, not hashed again.
    let last = std::cell::RefCell::new((Vec::<u8>::new(), String::new()));
    // Read in place: the argument is the whole entry, its content every column of a row.
    conn.create_scalar_function(HASH_FUNCTION, 1, flags, move |ctx| {
        let entry = ctx.get_raw(0).as_str()?.as_bytes();
        let mut last = last.borrow_mut();
        if last.0 != entry {
            last.1 = sha256_hex(entry);
            last.0.clear();
            // Held until the next entry, and no longer: a long spec's text is not kept.
            last.0.shrink_to(64 * 1024);
            last.0.extend_from_slice(entry);
        }
        Ok(last.1.clone())
    })?;
    conn.create_scalar_function(MAC_FUNCTION, 1, flags, move |ctx| {
        Ok(key.mac(ctx.get_raw(0).as_str()?))
    })
}

/// The hash of one entry.
pub fn entry_hash(prev: &str, seq: i64, table: &str, op: &str, key: &str, content: &str) -> String {
    sha256_hex(format!("{prev}\n{seq}\n{table}\n{op}\n{key}\n{content}").as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_function_hashes_each_entry_it_is_given_though_it_keeps_the_last() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        let key: &'static MacKey = Box::leak(Box::new(MacKey::new(&[7; 32])));
        register(&conn, key).unwrap();
        // One call a row: an entry, the same again, another, then the first.
        let mut stmt = conn
            .prepare(&format!(
                "SELECT {HASH_FUNCTION}(column1) FROM (VALUES ('a'), ('a'), ('b'), ('a'))"
            ))
            .unwrap();
        let hashes: Vec<String> = stmt
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        let (a, b) = (sha256_hex(b"a"), sha256_hex(b"b"));
        assert_eq!(hashes, [a.clone(), a.clone(), b, a]);
    }

    #[test]
    fn an_entry_hashes_one_plain_line_per_field() {
        let by_hand = sha256_hex(b"abc\n7\nruns\nupdate\n[1]\n{\"id\":1}");
        assert_eq!(
            entry_hash("abc", 7, "runs", "update", "[1]", "{\"id\":1}"),
            by_hand
        );
    }
}
