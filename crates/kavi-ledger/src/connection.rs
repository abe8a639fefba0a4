//! Connections to the ledger: opening it (a SQLite file or a PostgreSQL server), the spare and
//! further connections a run writes on, batches of writes, and the WAL.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::db::{self, Db, OptionalExtension, params};
use super::migrations::{migrate, migrate_postgres, postgres_schema_exists};
use super::{BUSY_TIMEOUT, Ledger, LedgerError, Result, journal, keys, now, schema};
use kavi_db::{memory, postgres};

/// A connection to a ledger that is already open, not yet made (or made ahead of time): see
/// [`Ledger::another_connection`].
pub struct AnotherConnection(pub(crate) Way);

pub(crate) enum Way {
    /// Connect to this address when opened.
    To {
        address: Address,
        locks_dir: PathBuf,
    },
    /// The spare connection, already open.
    Made(Box<Ledger>),
}

#[derive(Debug)]
pub(crate) enum Address {
    File(PathBuf),
    Server(String),
}

impl AnotherConnection {
    /// Connects, on the calling thread: no migration or recovery, which the first connection did.
    pub fn open(self) -> Result<Ledger> {
        let (address, locks_dir) = match self.0 {
            Way::Made(ledger) => return Ok(*ledger),
            Way::To { address, locks_dir } => (address, locks_dir),
        };
        let conn = match &address {
            Address::File(path) => connect(path)?,
            Address::Server(url) => connect_postgres(url)?,
        };
        Ok(Ledger {
            conn,
            locks_dir,
            spare: None,
            closing: Vec::new(),
        })
    }
}

/// Where owners keep their lock files and rosters: beside the ledger file.
/// A server's ledger keeps them in a folder of this machine's own (the processes they name run
/// here), named for the server.
pub fn locks_dir(ledger: &Path) -> PathBuf {
    match postgres_url(ledger) {
        None => ledger.with_extension("locks"),
        Some(url) => {
            use sha2::Digest as _;
            let digest = format!("{:x}", sha2::Sha256::digest(url.as_bytes()));
            // In this account's own folder: a fixed name in /tmp could be made first by another
            // account, which would then refuse every run (and could not be removed).
            kavi_foundation::sandbox::cache_home()
                .join("ledger-locks")
                .join(&digest[..16])
        }
    }
}

/// The PostgreSQL URL a ledger location is, if it is one.
pub fn postgres_url(location: &Path) -> Option<&str> {
    location.to_str().filter(|text| postgres::is_url(text))
}

/// A ledger's location as indexes outside the workspace keep it: a file's canonical path, a
/// server's URL without its password.
pub fn canonical_location(ledger: &Path) -> String {
    if postgres_url(ledger).is_some() {
        return display_location(ledger);
    }
    ledger
        .canonicalize()
        .unwrap_or_else(|_| ledger.to_owned())
        .display()
        .to_string()
}

/// A ledger location with a server's password left out entirely (a `[redacted]` in its place
/// too), for a connection to complete from PGPASSWORD or `~/.pgpass`.
pub fn location_without_password(ledger: &Path) -> PathBuf {
    match postgres_url(ledger) {
        Some(url) => PathBuf::from(postgres::without_password(url)),
        None => ledger.to_owned(),
    }
}

/// How messages name a ledger location: a server's password left out.
pub fn display_location(location: &Path) -> String {
    match postgres_url(location) {
        Some(url) => postgres::redacted(url),
        None => location.display().to_string(),
    }
}

impl Ledger {
    /// Opens the ledger only if it exists: for commands that read, which must not leave a
    /// ledger behind in a folder where nothing has run.
    pub fn open_existing(path: &Path) -> Result<Self> {
        match postgres_url(path) {
            // The connection that found the schema is the ledger's: one login, not two.
            Some(url) => {
                let conn = connect_postgres(url)?;
                if !postgres_schema_exists(&conn)? {
                    return Err(LedgerError::Missing(PathBuf::from(postgres::redacted(url))));
                }
                Self::opened(conn, path)
            }
            None if !path.exists() => Err(LedgerError::Missing(path.to_owned())),
            // A ledger on read-only media, or another account's, is still read: nothing is
            // migrated or recovered, and whatever writes says so at its first write.
            None if read_only_reason(path).is_some() => Self::open_read_only(path),
            None => Self::open(path),
        }
    }

    /// Opens the ledger only if it exists, to write to it: one this account cannot write is
    /// refused, saying why, as [`Ledger::open`] refuses it, where [`Ledger::open_existing`]
    /// would read it and its first write would fail.
    pub fn open_existing_to_write(path: &Path) -> Result<Self> {
        match postgres_url(path) {
            Some(_) => Self::open_existing(path),
            None if !path.exists() => Err(LedgerError::Missing(path.to_owned())),
            None => Self::open(path),
        }
    }

    /// Opens (creating if needed) the ledger at `path`, a SQLite file, or a PostgreSQL server
    /// when `path` is a `postgres://` URL; applies pending migrations, and marks runs whose
    /// process died as interrupted.
    pub fn open(path: &Path) -> Result<Self> {
        Self::open_telling(path, || {})
    }

    /// [`Ledger::open`], calling `made` once a ledger file is there to connect to (a server's
    /// ledger never calls it): another thread may then make a connection of its own while this
    /// one is set up.
    pub(crate) fn open_telling(path: &Path, made: impl FnOnce()) -> Result<Self> {
        let conn = match postgres_url(path) {
            Some(url) => connect_postgres(url)?,
            None => {
                if let Some(reason) = read_only_reason(path).filter(|_| path.exists()) {
                    return Err(LedgerError::ReadOnly {
                        path: path.to_owned(),
                        reason,
                    });
                }
                if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                    kavi_foundation::sandbox::state_folder(parent)?;
                }
                record_files(path)?;
                schema::create(path).map_err(|source| LedgerError::Create {
                    path: path.to_owned(),
                    source,
                })?;
                close_record_files(path)?;
                made();
                connect(path)?
            }
        };
        Self::opened(conn, path)
    }

    /// The ledger on `conn`, a new connection to `path`: migrated, and recovered from the kavi
    /// processes of this machine that died.
    fn opened(mut conn: Db, path: &Path) -> Result<Self> {
        match postgres_url(path) {
            Some(url) => migrate_postgres(&mut conn, url)?,
            None => migrate(&mut conn, path)?,
        }
        let locks_dir = locks_dir(path);
        kavi_foundation::sandbox::lock_folder(&locks_dir)?;
        let mut ledger = Self {
            conn,
            locks_dir,
            spare: None,
            closing: Vec::new(),
        };
        ledger.recover_interrupted()?;
        if ledger.identity()?.is_none() {
            // Made once, journaled (and MACed) like any row: a ledger opened after this kavi's
            // upgrade gets its identity here.
            ledger.conn.execute(
                "INSERT INTO ledger_identity (id, created_at)
                 SELECT ?1, ?2 WHERE NOT EXISTS (SELECT 1 FROM ledger_identity)",
                params![uuid::Uuid::new_v4().to_string(), now()],
            )?;
        }
        Ok(ledger)
    }

    /// Opens the existing ledger at `path` only to read it: no migration, no recovery, no
    /// identity made, no file written. For `kavi ledger verify`, which must change nothing it
    /// checks, and for every command that reads a ledger this account cannot write; a ledger of
    /// an older schema is refused with what to do.
    pub fn open_read_only(path: &Path) -> Result<Self> {
        let conn = match postgres_url(path) {
            Some(url) => {
                let conn = connect_postgres(url)?;
                if !postgres_schema_exists(&conn)? {
                    return Err(LedgerError::Missing(PathBuf::from(postgres::redacted(url))));
                }
                conn
            }
            None if !path.exists() => return Err(LedgerError::Missing(path.to_owned())),
            None => {
                record_files(path)?;
                connect_read_only(path)?
            }
        };
        let found: i64 = conn
            .query_row("SELECT version FROM schema_version", [], |row| row.get(0))
            .optional()?
            .unwrap_or(0);
        let known = schema::MIGRATIONS.len();
        if found < known as i64 {
            return Err(LedgerError::OlderSchema {
                path: path.to_owned(),
                found,
                known,
            });
        }
        Ok(Self {
            conn,
            locks_dir: locks_dir(path),
            spare: None,
            closing: Vec::new(),
        })
    }

    /// The ledger's identity, made when it was first opened: what its checkpoint log is kept
    /// under. `None` for a ledger no kavi of this version has opened to write.
    pub fn identity(&self) -> Result<Option<String>> {
        Ok(self
            .conn
            .query_row("SELECT id FROM ledger_identity", [], |row| row.get(0))
            .optional()?)
    }

    /// Makes, on this thread, the connection the next [`Ledger::another_connection`] hands
    /// out: for a caller that has a thread with time to spare now, where the connection's
    /// first use would otherwise wait for it (reading the schema, every journal trigger, takes
    /// milliseconds).
    pub fn open_spare(&mut self) -> Result<()> {
        let spare = Self::spare_from(self.another_connection()?)?;
        self.spare = Some(Box::new(spare));
        Ok(())
    }

    /// The connection [`Ledger::open_spare`] makes, made by a thread that has no ledger yet:
    /// to the file at `path`, which another thread is opening.
    pub(crate) fn connect_spare(path: &Path) -> Result<Ledger> {
        Self::spare_from(AnotherConnection(Way::To {
            address: Address::File(path.to_owned()),
            locks_dir: locks_dir(path),
        }))
    }

    /// Opens `connection` and reads the schema, which a connection otherwise does when it
    /// prepares its first statement: every journal trigger, about a millisecond.
    fn spare_from(connection: AnotherConnection) -> Result<Ledger> {
        let spare = connection.open()?;
        spare
            .conn
            .execute_batch("SELECT version FROM schema_version")?;
        Ok(spare)
    }

    /// How to open one more connection to this ledger, already migrated and recovered by this
    /// one: for a thread that writes while this connection's owner goes on. The thread opens it
    /// itself, so that reading the schema is not on the caller's time; or it gets the spare
    /// one, already open.
    pub fn another_connection(&mut self) -> Result<AnotherConnection> {
        if let Some(spare) = self.spare.take() {
            return Ok(AnotherConnection(Way::Made(spare)));
        }
        let address = match (self.conn.path(), self.conn.url()) {
            (Some(path), _) => Address::File(path.to_owned()),
            (None, Some(url)) => Address::Server(url.to_owned()),
            (None, None) => {
                return Err(
                    std::io::Error::other("this ledger is not one kavi can open again").into(),
                );
            }
        };
        Ok(AnotherConnection(Way::To {
            address,
            locks_dir: self.locks_dir.clone(),
        }))
    }

    /// Has this connection copy the WAL into the ledger file whenever one of its commits leaves
    /// more than `pages` pages there (SQLite's own threshold is 1,000). A server's ledger has
    /// no WAL.
    pub fn checkpoint_every(&self, pages: u32) -> Result<()> {
        if self.conn.backend() == db::Backend::Sqlite {
            self.conn
                .execute_batch(&format!("PRAGMA wal_autocheckpoint = {pages}"))?;
        }
        Ok(())
    }

    /// Copies what the WAL holds into the ledger file now, without waiting for anyone: for a
    /// connection about to close while another stays open. A server's ledger has no WAL.
    pub fn copy_wal(&self) -> Result<()> {
        if self.conn.backend() == db::Backend::Sqlite {
            self.conn.execute_batch("PRAGMA wal_checkpoint(PASSIVE)")?;
        }
        Ok(())
    }

    /// Has this connection wait for `thread`, which is closing another connection to this
    /// ledger, before it closes itself. The thread's checkpoint runs while this one's owner
    /// goes on; this connection, closing last, finds the WAL copied and only removes it.
    pub fn close_after(&mut self, thread: std::thread::JoinHandle<()>) {
        self.closing.push(thread);
    }

    /// Starts grouping this connection's writes into one transaction, until
    /// [`Ledger::commit_batch`]: the executor's recorder writes the decisions that arrive close
    /// together in one commit. Inside a batch, a no-op. The caller must not wait on anything
    /// else while a batch is open: other kavi processes wait for its lock (on a server, only a
    /// transaction that decides under the write lock waits; see [`db::Db::begin_sharing`]).
    pub fn begin_batch(&self) -> Result<()> {
        if self.conn.is_autocommit() {
            self.conn.begin_sharing()?;
        }
        Ok(())
    }

    /// Commits the open batch, if there is one.
    pub fn commit_batch(&self) -> Result<()> {
        if !self.conn.is_autocommit() {
            self.conn.commit()?;
        }
        Ok(())
    }

    /// Gives up the open batch, if there is one, releasing its lock.
    pub fn rollback_batch(&self) {
        if !self.conn.is_autocommit() {
            self.conn.rollback();
        }
    }
}

/// A connection to the ledger file at `path`, set up as every kavi connection is.
pub(crate) fn connect(path: &Path) -> Result<Db> {
    let open_error = |source: rusqlite::Error| LedgerError::Open {
        path: path.to_owned(),
        source: source.into(),
    };
    memory::use_mimalloc();
    let conn = rusqlite::Connection::open(path).map_err(open_error)?;
    conn.busy_timeout(BUSY_TIMEOUT).map_err(open_error)?;
    enable_wal(&conn).map_err(open_error)?;
    // In WAL mode NORMAL is durable against process crashes; only power loss may drop the
    // last commits, and never corrupts the file.
    conn.pragma_update(None, "synchronous", "NORMAL")
        .map_err(open_error)?;
    conn.pragma_update(None, "foreign_keys", "ON")
        .map_err(open_error)?;
    let key = mac_key()?;
    journal::register(&conn, key).map_err(open_error)?;
    Ok(Db::from_sqlite(conn))
}

/// Why this account cannot write the ledger file at `path` (it, or the folder its journal and
/// locks are made in, is read-only to it), if it cannot.
fn read_only_reason(path: &Path) -> Option<String> {
    use nix::unistd::{AccessFlags, access};
    let folder = kavi_foundation::sandbox::folder_of(path);
    [path, folder].into_iter().find_map(|p| {
        let denied = match access(p, AccessFlags::W_OK) {
            Ok(()) => return None,
            Err(nix::errno::Errno::ENOENT) => return None,
            Err(nix::errno::Errno::EROFS) => "on a read-only file system".to_owned(),
            Err(e) => format!("not writable by this account: {}", e.desc()),
        };
        Some(format!("{} is {denied}", p.display()))
    })
}

/// A read-only connection to the ledger file at `path` (see [`Ledger::open_read_only`]): nothing is
/// written, not even the write-ahead log's index. A ledger whose last writer closed cleanly has
/// no `-wal`, and is read as the immutable file it then is; one with a `-wal` is read through it.
fn connect_read_only(path: &Path) -> Result<Db> {
    use rusqlite::OpenFlags;
    let open_error = |source: rusqlite::Error| LedgerError::Open {
        path: path.to_owned(),
        source: source.into(),
    };
    memory::use_mimalloc();
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    let immutable = !Path::new(&wal).exists();
    let mut uri = url_path(path);
    uri.push_str(if immutable {
        "?immutable=1"
    } else {
        "?mode=ro"
    });
    let conn = rusqlite::Connection::open_with_flags(
        &uri,
        OpenFlags::SQLITE_OPEN_READ_ONLY
            | OpenFlags::SQLITE_OPEN_URI
            | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(open_error)?;
    conn.busy_timeout(BUSY_TIMEOUT).map_err(open_error)?;
    let key = mac_key()?;
    journal::register(&conn, key).map_err(open_error)?;
    Ok(Db::from_sqlite(conn))
}

/// `path` as a `file:` URI, its reserved characters escaped.
fn url_path(path: &Path) -> String {
    let mut uri = String::from("file:");
    for byte in path.as_os_str().as_encoded_bytes() {
        match byte {
            b'%' | b'?' | b'#' => uri.push_str(&format!("%{byte:02X}")),
            _ => uri.push(char::from(*byte)),
        }
    }
    uri
}

/// Switches the file to WAL, retrying while another process holds a lock.
///
/// SQLite takes the lock for the switch without calling the busy handler: when several kavi
/// processes open a fresh ledger at once, the switch fails with `SQLITE_BUSY`, or silently leaves
/// the old journal mode in place (the pragma answers with the mode in force). Either way, retry
/// until the file answers `wal`.
fn enable_wal(conn: &rusqlite::Connection) -> rusqlite::Result<()> {
    let deadline = std::time::Instant::now() + BUSY_TIMEOUT;
    loop {
        let mode = conn
            .pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get::<_, String>(0));
        let busy = match &mode {
            Ok(mode) if mode.eq_ignore_ascii_case("wal") => return Ok(()),
            Ok(_) => true,
            Err(rusqlite::Error::SqliteFailure(e, _)) => {
                e.code == rusqlite::ErrorCode::DatabaseBusy
            }
            Err(_) => false,
        };
        if !busy || std::time::Instant::now() >= deadline {
            return mode.and_then(|mode| {
                Err(rusqlite::Error::SqliteFailure(
                    rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_BUSY),
                    Some(format!(
                        "the ledger stayed in journal mode `{mode}`, not WAL"
                    )),
                ))
            });
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

pub(crate) fn connect_postgres(url: &str) -> Result<Db> {
    let conn = Db::connect_postgres(url).map_err(|source| LedgerError::Open {
        path: PathBuf::from(postgres::redacted(url)),
        source,
    })?;
    let mut conn = conn;
    pin_search_path(&conn)?;
    conn.seal_with(Box::new(journal::ServerSeal::new(mac_key()?)));
    Ok(conn)
}

/// The journal's MAC key. This crate's own unit tests keep theirs apart from the account's
/// (`cfg!(test)` is this crate's, not the journal's, whose `keys::dir` decides).
pub(crate) fn mac_key() -> Result<&'static keys::MacKey> {
    if cfg!(test) {
        keys::use_unit_test_keys();
    }
    keys::mac_key().map_err(LedgerError::Keys)
}

/// Has the session search the ledger's schema alone, so that the server's own functions and
/// operators (`pg_catalog`, searched first unless the path names it later) come before any of
/// the same name elsewhere, whatever search path the login was given: one of someone else's
/// named like `md5` or `=` would otherwise answer kavi's checks (see [`journal::ServerSeal`]).
/// The statement names the server's functions itself: it runs under the login's own path, which
/// may put a schema of someone else's before `pg_catalog`.
fn pin_search_path(conn: &Db) -> Result<()> {
    // Kept for the session: a connection made again after a server's restart has it too.
    conn.set_for_session(
        "SELECT pg_catalog.set_config('search_path',
                    COALESCE(pg_catalog.quote_ident(pg_catalog.current_schema()), 'public'),
                    false)",
        params![],
    )?;
    Ok(())
}

/// Closes the SQLite ledger's files to the accounts that may not write its folder (an older
/// kavi made them readable by all; see [`kavi_foundation::sandbox::close_to_readers`]).
fn close_record_files(path: &Path) -> Result<()> {
    for file in record_file_paths(path) {
        kavi_foundation::sandbox::close_to_readers(&file)?;
    }
    Ok(())
}

fn record_file_paths(path: &Path) -> [PathBuf; 3] {
    ["", "-wal", "-shm"].map(|suffix| {
        let mut file = path.as_os_str().to_owned();
        file.push(suffix);
        PathBuf::from(file)
    })
}

/// Checks the SQLite ledger's files (the database and its write-ahead log) are kavi's record,
/// not a file another account put in its place (see [`kavi_foundation::sandbox::state_file`]).
fn record_files(path: &Path) -> Result<()> {
    for file in record_file_paths(path) {
        kavi_foundation::sandbox::state_file(&file)?;
    }
    Ok(())
}
