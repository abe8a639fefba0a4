//! The ledger's schema, as ordered migrations, each a file of SQL in `migrations/` (`07.sql`
//! makes version 7). A migration is never edited once shipped: a change is a new file at the
//! end, listed in [`MIGRATIONS`]. `schema_version` holds how many have been applied.
//!
//! A new ledger is not built by replaying them: [`CURRENT`] is the schema they reach (the
//! statements SQLite keeps for it, journal triggers included), checked against a replay by a
//! test that also rewrites it (`KAVI_BLESS=1 cargo test -p kavi-ledger schema`).
//!
//! Nor is a new ledger file built by running [`CURRENT`]: it is [`IMAGE`], the file that script
//! makes, written whole (see [`create`]). The same test checks and rewrites it.

use std::io::{self, Write};
use std::path::Path;

use super::Result;
use super::db::{Db, Transaction};
use super::journal;

/// The schema version of the first ledgers kept on a PostgreSQL server: each migration after it
/// is brought to such a ledger by the step of [`SERVER_STEPS`] at its place.
pub const FIRST_ON_A_SERVER: usize = 23;

/// What a migration does to a server's ledger.
#[derive(Debug)]
pub enum ServerStep {
    /// Makes the table of this name as the migration leaves it on SQLite, translated as a new
    /// server ledger's tables are (see [`kavi_db::ddl::schema`]): an upgraded ledger and a
    /// new one are alike.
    Table(&'static str),
    /// PostgreSQL's own statement, for a change to what is there.
    Sql(&'static str),
}

/// The migrations after [`FIRST_ON_A_SERVER`], in order, as a server's ledger takes them.
pub const SERVER_STEPS: &[&[ServerStep]] = &[
    // 24
    &[ServerStep::Table("governing_members")],
    // 25
    &[
        ServerStep::Table("cache_parts"),
        ServerStep::Sql("ALTER TABLE node_cache ALTER COLUMN parts DROP NOT NULL"),
    ],
    // 26
    &[ServerStep::Sql(
        "ALTER TABLE sandboxes ADD COLUMN keep_max_bytes BIGINT",
    )],
    // 27
    &[
        ServerStep::Sql("ALTER TABLE journal ADD COLUMN mac TEXT"),
        ServerStep::Table("ledger_identity"),
    ],
    // 28
    &[ServerStep::Sql(
        "ALTER TABLE escalations ADD COLUMN approvals TEXT",
    )],
    // 29
    &[ServerStep::Table("rule_sets")],
    // 30
    &[ServerStep::Sql(
        "ALTER TABLE skills ADD COLUMN trusted_rules BIGINT",
    )],
    // 31
    &[ServerStep::Sql(
        "ALTER TABLE promotions ADD COLUMN attestation TEXT REFERENCES artifacts(sha256)",
    )],
    // 32
    &[ServerStep::Sql(
        "ALTER TABLE runs ADD COLUMN allowed_changes TEXT",
    )],
    // 33
    &[
        ServerStep::Sql("ALTER TABLE node_runs ADD COLUMN claimed_by TEXT"),
        ServerStep::Sql("ALTER TABLE node_runs ADD COLUMN lease_until TEXT"),
        ServerStep::Sql("ALTER TABLE runs ADD COLUMN lease_until TEXT"),
    ],
    // 34
    &[ServerStep::Table("artifact_chunks")],
    // 35
    &[ServerStep::Sql(
        "ALTER TABLE runs ADD COLUMN local_settings TEXT",
    )],
    // 36
    &[
        ServerStep::Sql("CREATE INDEX verifications_skill ON verifications(skill)"),
        ServerStep::Sql("CREATE INDEX verifications_skill_run ON verifications(skill, run_id)"),
        ServerStep::Sql("CREATE INDEX executions_skill ON executions(skill, started_at, id)"),
    ],
    // 37
    &[ServerStep::Table("artifact_objects")],
    // 38
    &[ServerStep::Table("group_slots")],
    // 39
    &[ServerStep::Table("object_deletions")],
];

/// The schema every migration leads to, as one script for an empty database; `schema_version`
/// (created before, under the write lock) is not in it.
pub const CURRENT: &str = include_str!("schema.sql");

/// A ledger at the current schema with nothing recorded, as SQLite leaves the file: every
/// statement of [`CURRENT`] made, `schema_version` set, in WAL mode. Making it on the spot cost
/// a new ledger about 6 ms of CPU (parsing the script, which SQLite compiles again for its
/// catalogue) and five `fsync`s: setting WAL on an empty file goes through a rollback journal.
pub(super) const IMAGE: &[u8] = include_bytes!("schema.db");

/// Writes [`IMAGE`] at `path`, unless there is a file there. It is written beside, made
/// durable, and linked in only where nothing is: a crash never leaves part of a ledger under
/// the name, and of several kavis making the same ledger at once, one's file is everyone's.
pub(super) fn create(path: &Path) -> io::Result<()> {
    if path.symlink_metadata().is_ok() {
        return Ok(());
    }
    let parent = kavi_foundation::sandbox::folder_of(path);
    // Closed to every account that may not write the folder (SQLite gives its `-wal` and `-shm`
    // the database's mode): see `kavi_foundation::sandbox::close_to_readers`.
    let mode = 0o666 & !kavi_foundation::sandbox::closed_bits(path);
    let mut file = tempfile::Builder::new()
        .prefix(".new-ledger-")
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(mode))
        .tempfile_in(parent)?;
    file.write_all(IMAGE)?;
    file.as_file().sync_all()?;
    match file.persist_noclobber(path) {
        Ok(_) => Ok(()),
        // Another kavi linked its file first; this one is removed.
        Err(e) if e.error.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e.error),
    }
}

/// Whether the database holds nothing but `schema_version`.
pub(super) fn is_empty(conn: &Db) -> Result<bool> {
    Ok(conn.query_row(
        "SELECT NOT EXISTS (SELECT 1 FROM sqlite_master WHERE name <> 'schema_version')",
        [],
        |row| row.get(0),
    )?)
}

/// Applies the migrations after the first `current`, then journals what they changed.
pub(super) fn replay(tx: &Transaction<'_>, current: usize) -> Result<()> {
    for migration in &MIGRATIONS[current..] {
        tx.execute_batch(migration)?;
    }
    if current < MIGRATIONS.len() {
        journal::install(tx)?;
    }
    Ok(())
}

/// Each entry moves the schema from version `i` to `i + 1`. The files' text is what SQLite
/// keeps of the tables they make (indentation and comments included), so it is never reflowed.
pub const MIGRATIONS: &[&str] = &[
    include_str!("migrations/01.sql"),
    include_str!("migrations/02.sql"),
    include_str!("migrations/03.sql"),
    include_str!("migrations/04.sql"),
    include_str!("migrations/05.sql"),
    include_str!("migrations/06.sql"),
    include_str!("migrations/07.sql"),
    include_str!("migrations/08.sql"),
    include_str!("migrations/09.sql"),
    include_str!("migrations/10.sql"),
    include_str!("migrations/11.sql"),
    include_str!("migrations/12.sql"),
    include_str!("migrations/13.sql"),
    include_str!("migrations/14.sql"),
    include_str!("migrations/15.sql"),
    include_str!("migrations/16.sql"),
    include_str!("migrations/17.sql"),
    include_str!("migrations/18.sql"),
    include_str!("migrations/19.sql"),
    include_str!("migrations/20.sql"),
    include_str!("migrations/21.sql"),
    include_str!("migrations/22.sql"),
    include_str!("migrations/23.sql"),
    include_str!("migrations/24.sql"),
    include_str!("migrations/25.sql"),
    include_str!("migrations/26.sql"),
    include_str!("migrations/27.sql"),
    include_str!("migrations/28.sql"),
    include_str!("migrations/29.sql"),
    include_str!("migrations/30.sql"),
    include_str!("migrations/31.sql"),
    include_str!("migrations/32.sql"),
    include_str!("migrations/33.sql"),
    include_str!("migrations/34.sql"),
    include_str!("migrations/35.sql"),
    include_str!("migrations/36.sql"),
    include_str!("migrations/37.sql"),
    include_str!("migrations/38.sql"),
    include_str!("migrations/39.sql"),
];

/// The schema of `conn` as a script that recreates it: each statement SQLite keeps, in the order
/// they were made, without SQLite's own tables and `schema_version`.
#[cfg(test)]
fn script(conn: &Db) -> Result<String> {
    let statements: Vec<String> = conn
        .prepare(
            "SELECT sql FROM sqlite_master
             WHERE sql IS NOT NULL AND name NOT LIKE 'sqlite_%' AND name <> 'schema_version'
             ORDER BY rowid",
        )?
        .query_map([], |row| row.get(0))?
        .collect::<super::db::Result<_>>()?;
    Ok(format!(
        "-- Generated from MIGRATIONS in schema.rs: KAVI_BLESS=1 cargo test -p kavi-ledger schema\n\n{};\n",
        statements.join(";\n\n")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A migration without its server steps would leave every server's ledger refused.
    #[test]
    fn every_migration_since_server_ledgers_has_its_server_steps() {
        assert_eq!(FIRST_ON_A_SERVER + SERVER_STEPS.len(), MIGRATIONS.len());
        for (done, steps) in SERVER_STEPS.iter().enumerate() {
            let version = FIRST_ON_A_SERVER + done + 1;
            for step in *steps {
                assert!(
                    crate::migrations::server_sql(step, version).is_ok(),
                    "{step:?} of migration {version}"
                );
            }
        }
    }

    fn empty_ledger() -> Db {
        kavi_db::memory::use_mimalloc();
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        journal::register(&conn, crate::connection::mac_key().unwrap()).unwrap();
        let mut db = Db::from_sqlite(conn);
        let tx = db.transaction().unwrap();
        tx.execute_batch("CREATE TABLE schema_version (version INTEGER NOT NULL)")
            .unwrap();
        tx.commit().unwrap();
        db
    }

    /// `CURRENT` is what replaying every migration makes, statement for statement: the same
    /// tables with their columns in the same order, the same indexes and journal triggers.
    #[test]
    fn the_current_schema_is_what_the_migrations_make() {
        let mut replayed = empty_ledger();
        let tx = replayed.transaction().unwrap();
        replay(&tx, 0).unwrap();
        tx.commit().unwrap();
        let expected = script(&replayed).unwrap();
        if std::env::var_os("KAVI_BLESS").is_some() {
            let path = concat!(env!("CARGO_MANIFEST_DIR"), "/src/schema.sql");
            std::fs::write(path, &expected).unwrap();
        }
        assert!(
            CURRENT == expected,
            "crates/kavi-ledger/src/schema.sql is not what the migrations make; \
             rewrite it with KAVI_BLESS=1 cargo test -p kavi-ledger schema"
        );
        let mut fresh = empty_ledger();
        assert!(is_empty(&fresh).unwrap());
        let tx = fresh.transaction().unwrap();
        tx.execute_batch(CURRENT).unwrap();
        tx.commit().unwrap();
        assert_eq!(script(&fresh).unwrap(), expected);
        assert!(!is_empty(&fresh).unwrap());
    }

    /// `IMAGE` is the file an empty one becomes when kavi migrates it as a ledger (running
    /// `CURRENT`), byte for byte once the WAL is copied in; the ledger it makes is current.
    #[test]
    fn a_new_ledger_is_the_file_the_current_schema_makes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.db");
        // An empty file: `create` leaves it, and opening runs the script into it.
        std::fs::File::create(&path).unwrap();
        // Migrated as a ledger is opened, without the identity each ledger then makes its own.
        let mut conn = super::super::connection::connect(&path).unwrap();
        super::super::migrations::migrate(&mut conn, &path).unwrap();
        drop(conn);
        assert!(
            !dir.path().join("ledger.db-wal").exists(),
            "closing the last connection copies the WAL in"
        );
        let made = std::fs::read(&path).unwrap();
        if std::env::var_os("KAVI_BLESS").is_some() {
            let image = concat!(env!("CARGO_MANIFEST_DIR"), "/src/schema.db");
            std::fs::write(image, &made).unwrap();
        }
        assert!(
            IMAGE == made.as_slice(),
            "crates/kavi-ledger/src/schema.db is not the file the current schema makes; \
             rewrite it with KAVI_BLESS=1 cargo test -p kavi-ledger schema"
        );

        let fresh = dir.path().join("fresh.db");
        create(&fresh).unwrap();
        let mut ledger = crate::Ledger::open(&fresh).unwrap();
        assert!(journal::current(&ledger.conn).unwrap());
        let version: i64 = ledger
            .conn
            .query_row("SELECT version FROM schema_version", [], |row| row.get(0))
            .unwrap();
        assert_eq!(version, MIGRATIONS.len() as i64);
        assert_eq!(script(&ledger.conn).unwrap(), CURRENT);
        // Nothing recorded but its identity, journaled from the chain's start.
        let entries: Vec<(i64, String)> = ledger
            .conn
            .prepare("SELECT seq, tbl FROM journal")
            .unwrap()
            .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
            .unwrap()
            .collect::<crate::db::Result<_>>()
            .unwrap();
        assert_eq!(entries, [(1, "ledger_identity".to_owned())]);
        let owner = crate::owner::Owner::claim(&fresh, dir.path()).unwrap();
        let run = crate::testing::new_run(&serde_json::json!({}), &["a"], &owner);
        ledger.create_run(&run).unwrap();
        let store = crate::ArtifactStore::open(&dir.path().join("artifacts")).unwrap();
        let findings = ledger.verify(&store, None, &Vec::new()).unwrap();
        assert!(findings.problems.is_empty(), "{:?}", findings.problems);
        assert!(findings.entries > 0);
    }

    /// A file already at the path is the ledger, whatever it holds: `create` never replaces it,
    /// and leaves nothing of its own beside it.
    #[test]
    fn a_new_ledger_is_not_written_over_a_file_already_there() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.db");
        std::fs::write(&path, b"someone else's").unwrap();
        create(&path).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"someone else's");
        let new = dir.path().join("new.db");
        create(&new).unwrap();
        assert_eq!(std::fs::read(&new).unwrap(), IMAGE);
        let mut names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        assert_eq!(names, ["ledger.db", "new.db"]);
    }
}
