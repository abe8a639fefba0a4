//! The ledger's schema, as ordered migrations. A migration is never edited once shipped: a
//! change is a new entry at the end. `schema_version` holds how many have been applied.
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
    /// server ledger's tables are (see [`super::postgres::schema`]): an upgraded ledger and a
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
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    // The permissions SQLite gives a file it creates (before the umask).
    let mut file = tempfile::Builder::new()
        .prefix(".new-ledger-")
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o644))
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

/// Each entry moves the schema from version `i` to `i + 1`.
pub const MIGRATIONS: &[&str] = &[
    // 1: runs, node runs, specs, artifacts.
    r#"
    CREATE TABLE specs (
        hash        TEXT PRIMARY KEY,          -- 'sha256:<hex>' of the text
        path        TEXT NOT NULL,             -- where it was first read from
        text        TEXT NOT NULL,
        created_at  TEXT NOT NULL
    );

    CREATE TABLE artifacts (
        sha256      TEXT PRIMARY KEY,          -- hex digest of the content
        kind        TEXT NOT NULL,             -- STDOUT, STDERR, RENDERED, BUILD_PACKET, ...
        size        INTEGER NOT NULL,
        path        TEXT NOT NULL,             -- relative to the artifact store
        created_at  TEXT NOT NULL
    );

    CREATE TABLE runs (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        pipeline    TEXT NOT NULL,
        spec_path   TEXT NOT NULL,
        spec_hash   TEXT NOT NULL REFERENCES specs(hash),
        params      TEXT NOT NULL,             -- JSON object
        status      TEXT NOT NULL,
        started_at  TEXT NOT NULL,
        finished_at TEXT,
        duration_ms INTEGER,
        parent_run  INTEGER REFERENCES runs(id),
        owner       TEXT NOT NULL,             -- names the lock file held while the run is live
        error       TEXT
    );
    CREATE INDEX runs_status ON runs(status);

    CREATE TABLE node_runs (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        run_id      INTEGER NOT NULL REFERENCES runs(id),
        node_id     TEXT NOT NULL,
        kind        TEXT NOT NULL,
        state       TEXT NOT NULL,
        attempt     INTEGER NOT NULL,
        started_at  TEXT,
        finished_at TEXT,
        duration_ms INTEGER,
        exit_code   INTEGER,
        outputs     TEXT,                      -- JSON
        error       TEXT,                      -- why it failed
        reason      TEXT,                      -- why it was skipped, blocked or cancelled
        UNIQUE (run_id, node_id, attempt)
    );
    CREATE INDEX node_runs_run ON node_runs(run_id);

    CREATE TABLE node_run_artifacts (
        node_run_id INTEGER NOT NULL REFERENCES node_runs(id),
        role        TEXT NOT NULL,             -- stdout, stderr, rendered, ...
        sha256      TEXT NOT NULL REFERENCES artifacts(sha256),
        PRIMARY KEY (node_run_id, role)
    );
    "#,
    // 2: which policy texts governed each run.
    r#"
    CREATE TABLE run_policies (
        run_id      INTEGER NOT NULL REFERENCES runs(id),
        path        TEXT NOT NULL,
        spec_hash   TEXT NOT NULL REFERENCES specs(hash),
        PRIMARY KEY (run_id, path)
    );
    "#,
    // 3: skills and their lifecycle.
    r#"
    CREATE TABLE skills (
        name          TEXT PRIMARY KEY,
        description   TEXT NOT NULL,
        side_effect   TEXT NOT NULL,
        spec_artifact TEXT NOT NULL REFERENCES artifacts(sha256),  -- the SKILL_SPEC
        state         TEXT NOT NULL,
        created_at    TEXT NOT NULL,
        updated_at    TEXT NOT NULL
    );

    CREATE TABLE skill_transitions (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        skill       TEXT NOT NULL REFERENCES skills(name),
        from_state  TEXT,                      -- NULL when the skill is proposed
        to_state    TEXT NOT NULL,
        run_id      INTEGER REFERENCES runs(id),
        node_id     TEXT,
        actor       TEXT NOT NULL,
        at          TEXT NOT NULL,
        comment     TEXT
    );
    CREATE INDEX skill_transitions_skill ON skill_transitions(skill);
    "#,
    // 4: one row per gate result.
    r#"
    CREATE TABLE verifications (
        id           INTEGER PRIMARY KEY AUTOINCREMENT,
        run_id       INTEGER NOT NULL REFERENCES runs(id),
        node_id      TEXT NOT NULL,
        skill        TEXT,
        gate_id      TEXT NOT NULL,
        gate_kind    TEXT NOT NULL,
        required     INTEGER NOT NULL,
        status       TEXT NOT NULL,            -- passed | failed | error | timed_out
        failure_kind TEXT,                     -- set when not passed
        detail       TEXT,
        report       TEXT REFERENCES artifacts(sha256),
        at           TEXT NOT NULL
    );
    CREATE INDEX verifications_run ON verifications(run_id);
    "#,
    // 5: trust: the hash each verification saw, the hash a skill was verified and trusted at,
    // and every promotion.
    r#"
    ALTER TABLE verifications ADD COLUMN source_hash TEXT;
    ALTER TABLE skills ADD COLUMN verified_hash TEXT;
    ALTER TABLE skills ADD COLUMN trusted_hash TEXT;

    CREATE TABLE promotions (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        skill       TEXT NOT NULL REFERENCES skills(name),
        from_state  TEXT NOT NULL,
        to_state    TEXT NOT NULL,
        source_hash TEXT NOT NULL,
        run_id      INTEGER REFERENCES runs(id),
        node_id     TEXT,
        actor       TEXT NOT NULL,
        at          TEXT NOT NULL,
        comment     TEXT
    );
    "#,
    // 6: build attempts, with their lineage.
    r#"
    CREATE TABLE builds (
        id           INTEGER PRIMARY KEY AUTOINCREMENT,
        skill        TEXT NOT NULL REFERENCES skills(name),
        attempt      INTEGER NOT NULL,
        parent_build INTEGER REFERENCES builds(id),
        run_id       INTEGER REFERENCES runs(id),
        node_id      TEXT,
        status       TEXT NOT NULL,            -- running | succeeded | failed
        packet       TEXT REFERENCES artifacts(sha256),
        log          TEXT REFERENCES artifacts(sha256),
        exit_code    INTEGER,
        started_at   TEXT NOT NULL,
        finished_at  TEXT,
        UNIQUE (skill, attempt)
    );
    "#,
    // 7: a failed build's classification and research note, for the next attempt's packet.
    r#"
    ALTER TABLE builds ADD COLUMN failure_kind TEXT;
    ALTER TABLE builds ADD COLUMN research_note TEXT REFERENCES artifacts(sha256);
    "#,
    // 8: escalations to a person, and the decisions on them.
    r#"
    CREATE TABLE escalations (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        skill       TEXT NOT NULL REFERENCES skills(name),
        run_id      INTEGER NOT NULL REFERENCES runs(id),
        node_id     TEXT NOT NULL,
        triggers    TEXT NOT NULL,             -- JSON array of trigger names with reasons
        status      TEXT NOT NULL,             -- pending | approved | rejected
        raised_at   TEXT NOT NULL,
        decided_by  TEXT,
        decided_at  TEXT,
        comment     TEXT
    );
    CREATE INDEX escalations_skill ON escalations(skill);
    "#,
    // 9: a run started by `kavi approve` resumes the run that stopped for review.
    r#"
    ALTER TABLE runs ADD COLUMN resumed_from INTEGER REFERENCES runs(id);
    "#,
    // 10: the advisory a failed build got from the LLM gateway: a revised packet, or why not.
    r#"
    ALTER TABLE builds ADD COLUMN advisory TEXT REFERENCES artifacts(sha256);
    ALTER TABLE builds ADD COLUMN advisory_error TEXT;
    "#,
    // 11: executions of trusted skills (kavi skill run, chains, replay), linked by parent.
    r#"
    CREATE TABLE executions (
        id          TEXT PRIMARY KEY,
        parent      TEXT REFERENCES executions(id),
        skill       TEXT NOT NULL,
        source_hash TEXT,                      -- the hash the skill was run at (NULL: not reached)
        side_effect TEXT NOT NULL,
        input       TEXT,                      -- JSON
        output      TEXT,                      -- JSON
        success     INTEGER NOT NULL,
        error       TEXT,
        started_at  TEXT NOT NULL,
        finished_at TEXT NOT NULL,
        duration_ms INTEGER NOT NULL,
        chain       TEXT,                      -- the chain and step that ran it, if any
        step        TEXT,
        run_id      INTEGER REFERENCES runs(id)
    );
    CREATE INDEX executions_parent ON executions(parent);
    CREATE INDEX executions_started ON executions(started_at);
    "#,
    // 12: sandboxes kavi made, with the limits that govern them and the manifest of each tree as
    // it was before the builder ran: the diff gate's baseline, out of the builder's reach.
    r#"
    CREATE TABLE sandboxes (
        id                INTEGER PRIMARY KEY AUTOINCREMENT,
        path              TEXT NOT NULL UNIQUE,
        run_id            INTEGER NOT NULL REFERENCES runs(id),
        node_id           TEXT NOT NULL,
        policy            TEXT NOT NULL,       -- the sandbox policy file
        max_file_bytes    INTEGER NOT NULL,
        max_total_bytes   INTEGER NOT NULL,
        max_changed_files INTEGER NOT NULL,
        keep_failed_ms    INTEGER NOT NULL,    -- how long it is kept after a failed run
        status            TEXT NOT NULL,       -- active | kept | removed
        created_at        TEXT NOT NULL,
        keep_until        TEXT,
        removed_at        TEXT,
        error             TEXT                 -- why it could not be removed, if it could not
    );
    CREATE INDEX sandboxes_run ON sandboxes(run_id);
    CREATE INDEX sandboxes_status ON sandboxes(status);

    CREATE TABLE sandbox_entries (
        sandbox_id  INTEGER NOT NULL REFERENCES sandboxes(id),
        path        TEXT NOT NULL,             -- relative, `/`-separated, escaped where not UTF-8
        kind        TEXT NOT NULL,             -- file | dir | symlink | fifo | socket | ...
        mode        INTEGER NOT NULL,
        size        INTEGER NOT NULL,
        links       INTEGER NOT NULL,
        sha256      TEXT,                      -- a regular file's content
        target      TEXT,                      -- a symlink's target
        PRIMARY KEY (sandbox_id, path)
    ) WITHOUT ROWID;
    "#,
    // 13: the confinement a skill ran under (JSON: role, enforcement, paths, network).
    r#"
    ALTER TABLE executions ADD COLUMN confinement TEXT;
    "#,
    // 14: an execution is recorded when it starts, so that one cut short by a killed kavi shows
    // as interrupted; its owner names the kavi process that ran it.
    r#"
    ALTER TABLE executions ADD COLUMN status TEXT NOT NULL DEFAULT 'finished';  -- running | finished | interrupted
    ALTER TABLE executions ADD COLUMN owner TEXT;
    CREATE INDEX executions_running ON executions(status) WHERE status = 'running';
    "#,
    // 15: the proposal file a skill was proposed from, which trust re-reads and vouches for.
    // Skills proposed before it were proposed, by the shipped convention, from this path.
    r#"
    ALTER TABLE skills ADD COLUMN proposal_path TEXT;
    UPDATE skills SET proposal_path = 'proposals/' || name || '.toml';
    "#,
    // 16: the journal, a hash chain over every change (see journal.rs); its triggers are made
    // for the schema as it stands after each migration. Runs record the account that started
    // them, and escalations the policy that raised them, for the self-approval rule.
    r#"
    ALTER TABLE runs ADD COLUMN started_by TEXT;
    -- the governing set: run_policies holds every member with its role; runs and node runs
    -- carry the hash over it (see spec/governing.rs)
    ALTER TABLE run_policies ADD COLUMN role TEXT NOT NULL DEFAULT 'policy';
    ALTER TABLE runs ADD COLUMN governing_hash TEXT;
    ALTER TABLE node_runs ADD COLUMN governing_hash TEXT;
    ALTER TABLE escalations ADD COLUMN policy TEXT;   -- spec hash of the escalation rules
    CREATE TABLE journal (
        seq      INTEGER PRIMARY KEY,          -- 1, 2, 3, ... without gaps
        tbl      TEXT NOT NULL,                -- the table changed
        op       TEXT NOT NULL,                -- insert | update | delete | migrate | snapshot
        key      TEXT NOT NULL,                -- JSON array: the row's primary key (or rowid)
        content  TEXT NOT NULL,                -- JSON object: every column, after the change
        prev     TEXT NOT NULL,                -- the previous entry's hash ('' for the first)
        hash     TEXT NOT NULL                 -- sha256 hex of prev LF seq LF tbl LF op LF key LF content
    );
    CREATE TABLE checkpoints (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        seq         INTEGER NOT NULL,          -- the journal entry signed
        hash        TEXT NOT NULL,             -- its hash
        public_key  TEXT NOT NULL,             -- ed25519, hex
        signature   TEXT NOT NULL,             -- ed25519 over "kavi-checkpoint-v1" LF seq LF hash, hex
        at          TEXT NOT NULL
    );
    "#,
    // 17: the trusted tree kept at promotion, which `kavi skill restore` puts back.
    r#"
    ALTER TABLE skills ADD COLUMN trusted_tree TEXT REFERENCES artifacts(sha256);
    "#,
    // 18: versions. A skill's row describes its newest version (`version`, its spec and state)
    // and the version that runs (`trusted_version`, with trusted_hash and trusted_tree); the
    // two differ while a new version of a trusted skill is forged. Each version's spec is kept.
    r#"
    ALTER TABLE skills ADD COLUMN version INTEGER NOT NULL DEFAULT 1;
    ALTER TABLE skills ADD COLUMN trusted_version INTEGER;
    UPDATE skills SET trusted_version = 1 WHERE trusted_hash IS NOT NULL;
    CREATE TABLE skill_versions (
        skill         TEXT NOT NULL REFERENCES skills(name),
        version       INTEGER NOT NULL,
        spec_artifact TEXT NOT NULL REFERENCES artifacts(sha256),
        description   TEXT NOT NULL,
        side_effect   TEXT NOT NULL,
        proposed_at   TEXT NOT NULL,
        actor         TEXT NOT NULL,
        PRIMARY KEY (skill, version)
    );
    INSERT INTO skill_versions (skill, version, spec_artifact, description, side_effect,
                                proposed_at, actor)
        SELECT name, 1, spec_artifact, description, side_effect, created_at, 'unknown'
        FROM skills;
    ALTER TABLE promotions ADD COLUMN version INTEGER;
    UPDATE promotions SET version = 1;
    ALTER TABLE executions ADD COLUMN skill_version INTEGER;
    "#,
    // 19: the tool a gate ran from a declared toolchain, with its version (JSON).
    r#"
    ALTER TABLE verifications ADD COLUMN tool TEXT;
    "#,
    // 20: the content of small artifacts, kept in the ledger instead of files (an artifact row
    // with an empty path). Not journaled: the journaled artifact row names it by its SHA-256,
    // and `ledger verify` re-hashes it.
    r#"
    CREATE TABLE artifact_contents (
        sha256  TEXT PRIMARY KEY REFERENCES artifacts(sha256),
        content BLOB NOT NULL
    );
    "#,
    // 21: the node run a `reused` node run took its outputs from (`kavi runs resume`).
    r#"
    ALTER TABLE node_runs ADD COLUMN reused_from INTEGER REFERENCES node_runs(id);
    "#,
    // 22: the key of a node run that declared its inputs (see cache/mod.rs), its output files,
    // and for a `cached` one the node run it took its result from (not a foreign key: that run
    // may be pruned while this one stays).
    r#"
    CREATE TABLE node_cache (
        node_run_id INTEGER PRIMARY KEY REFERENCES node_runs(id),
        key         TEXT NOT NULL,             -- sha256 hex over the parts
        parts       TEXT NOT NULL,             -- JSON object: part name -> hash
        files       TEXT NOT NULL,             -- JSON object: output path -> artifact sha256
        source      INTEGER,                   -- the node run a cached one took its result from
        note        TEXT                       -- why the key was not looked up, or missed
    );
    CREATE INDEX node_cache_key ON node_cache(key);
    "#,
    // 23: who asked for a skill execution from outside kavi's commands (`mcp:<client>`).
    r#"
    ALTER TABLE executions ADD COLUMN caller TEXT;
    "#,
    // 24: a governing set kept once, under the hash its runs and node runs carry, instead of
    // once per run in run_policies: a pipeline run again over the same files adds no rows for
    // them. Runs from before keep their members in run_policies.
    r#"
    CREATE TABLE governing_members (
        set_hash    TEXT NOT NULL,             -- runs.governing_hash (see spec/governing.rs)
        path        TEXT NOT NULL,
        spec_hash   TEXT NOT NULL REFERENCES specs(hash),
        role        TEXT NOT NULL,
        PRIMARY KEY (set_hash, path)
    ) WITHOUT ROWID;
    "#,
    // 25: a key's parts kept once, under the key (the SHA-256 over them, see cache/mod.rs),
    // instead of with every node run that recorded it: a node found up to date adds no copy.
    // node_cache.parts is NULL for node runs recorded since; earlier ones keep theirs (the
    // table is made again for the column to allow NULL).
    r#"
    CREATE TABLE cache_parts (
        key         TEXT PRIMARY KEY,          -- sha256 hex over the parts
        parts       TEXT NOT NULL              -- JSON object: part name -> hash
    ) WITHOUT ROWID;
    CREATE TABLE node_cache_before_25 AS SELECT * FROM node_cache;
    DROP TABLE node_cache;
    CREATE TABLE node_cache (
        node_run_id INTEGER PRIMARY KEY REFERENCES node_runs(id),
        key         TEXT NOT NULL,             -- sha256 hex over the parts
        parts       TEXT,                      -- JSON object, for rows before 25; else in cache_parts
        files       TEXT NOT NULL,             -- JSON object: output path -> artifact sha256
        source      INTEGER,                   -- the node run a cached one took its result from
        note        TEXT                       -- why the key was not looked up, or missed
    );
    INSERT INTO node_cache (node_run_id, key, parts, files, source, note)
        SELECT node_run_id, key, parts, files, source, note FROM node_cache_before_25;
    DROP TABLE node_cache_before_25;
    CREATE INDEX node_cache_key ON node_cache(key);
    "#,
    // 26: the most a failed run's sandbox may hold and still be kept for review. NULL for
    // sandboxes made before, which are held to the default budget.
    r#"
    ALTER TABLE sandboxes ADD COLUMN keep_max_bytes INTEGER;
    "#,
    // 27: the journal's keyed MAC (NULL for entries written before, until `kavi ledger seal`),
    // and the ledger's identity: what the checkpoint log beside the key knows it by, journaled
    // and MACed like every row, so that a moved ledger keeps its log and a swapped one is seen.
    r#"
    ALTER TABLE journal ADD COLUMN mac TEXT;
    CREATE TABLE ledger_identity (
        id          TEXT PRIMARY KEY,          -- a UUID, made when the ledger is first opened
        created_at  TEXT NOT NULL
    ) WITHOUT ROWID;
    "#,
    // 28: each approval of an escalation, with the roles its giver held then (JSON array of
    // {actor, roles}): a requirement of several approvers is met one approval at a time.
    r#"
    ALTER TABLE escalations ADD COLUMN approvals TEXT;
    "#,
    // 29: rule sets: the governing files as adopted, and changes proposed to them (see
    // ledger/rules.rs). Exactly one is `adopted` once the first run adopted its set.
    r#"
    CREATE TABLE rule_sets (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        set_hash    TEXT NOT NULL,             -- set hash over (path, spec hash) of every file
        files       TEXT NOT NULL,             -- JSON object: path -> spec hash (texts in specs)
        status      TEXT NOT NULL,             -- pending | adopted | superseded | rejected
        class       TEXT NOT NULL,             -- first-use | weakening | strengthening | neutral
        changes     TEXT NOT NULL,             -- JSON array of {change, class}
        based_on    INTEGER,                   -- the adopted set it changes
        proposed_by TEXT NOT NULL,
        proposed_at TEXT NOT NULL,
        message     TEXT,
        approvals   TEXT NOT NULL,             -- JSON array of {actor, roles}
        decided_by  TEXT,
        decided_at  TEXT
    );
    "#,
    // 30: the rule set a skill's trusted version was promoted under (NULL for promotions
    // before rule sets, or before this column), which `[adoption] on_change` reads when a
    // newer set is adopted.
    r#"
    ALTER TABLE skills ADD COLUMN trusted_rules INTEGER;
    "#,
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
