//! The artifacts' rows: recording one the store (`kavi-store`, re-exported) has kept, and
//! finding one by its hash. A server ledger also keeps every file artifact's content, in
//! chunks, so that every machine reads what any machine made ([`SharedArtifacts`]); with an
//! object store, it records where the object is instead.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use kavi_foundation::files::open_regular;
use kavi_foundation::hash::copy_hashing;

use super::db::{self, Backend, Db, OptionalExtension, params};
use super::{Artifact, Ledger, LedgerError, Objects, Result};

/// The most one row of `artifact_chunks` holds: what a machine holds in memory at a time while
/// it shares or fetches an artifact, and far below PostgreSQL's 1 GB for a value.
pub const CHUNK_SIZE: usize = 1024 * 1024;

/// Records a stored artifact's row (once: content already recorded is left as it is), and
/// where every machine reads a file artifact's content (see [`share`]).
pub(crate) fn keep_artifact(conn: &Db, artifact: &Artifact, at: &str) -> Result<()> {
    conn.prepare_cached(
        "INSERT INTO artifacts (sha256, kind, size, path, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT DO NOTHING",
    )?
    .execute(params![
        artifact.sha256,
        artifact.kind,
        artifact.size,
        artifact.path,
        at
    ])?;
    if let Some(content) = &artifact.inline {
        conn.prepare_cached(
            "INSERT INTO artifact_contents (sha256, content) VALUES (?1, ?2) ON CONFLICT DO NOTHING",
        )?
        .execute(params![artifact.sha256, &content[..]])?;
    }
    share(conn, artifact)
}

/// Records where every machine reads a file artifact's content: the object the store put it in
/// (its location), else, on a server, the chunks of it written here.
pub(crate) fn share(conn: &Db, artifact: &Artifact) -> Result<()> {
    match &artifact.location {
        Some(location) => {
            let first = conn
                .prepare_cached(
                    "INSERT INTO artifact_objects (sha256, location) VALUES (?1, ?2)
                     ON CONFLICT DO NOTHING",
                )?
                .execute(params![artifact.sha256, location])?;
            if first == 1 {
                reclaim_object(conn, artifact)?;
            }
            Ok(())
        }
        None if conn.backend() == Backend::Postgres => share_chunks(conn, artifact),
        None => Ok(()),
    }
}

/// Takes the object of `artifact`, recorded again (no row referenced it), back from `kavi gc`,
/// which may have removed it since this machine put it in the store, or found it there: the
/// row of its removal is deleted (waiting, on a server, for a removal under way, which holds
/// that row until the object is gone), and when there was one, the object is put again from
/// this machine's file, unless it is there. An object whose location a run has recorded is
/// thus never removed after (see `Ledger::remove_objects`).
fn reclaim_object(conn: &Db, artifact: &Artifact) -> Result<()> {
    let removing = conn
        .prepare_cached("DELETE FROM object_deletions WHERE sha256 = ?1")?
        .execute([&artifact.sha256])?;
    if removing == 0 {
        return Ok(());
    }
    let (Some(objects), Some(file)) = (&artifact.sent_to, &artifact.file) else {
        return Err(LedgerError::Io(std::io::Error::other(format!(
            "artifact {}: its object was removed by `kavi gc`, and this machine has no copy \
             of it to put back",
            artifact.sha256
        ))));
    };
    objects.put_file(&artifact.sha256, artifact.size, file)?;
    Ok(())
}

/// How many chunks hold `size` bytes.
fn chunk_count(size: u64) -> u64 {
    size.div_ceil(CHUNK_SIZE as u64)
}

/// Writes the chunks of `artifact`'s content from this machine's file of it (none for content
/// kept in a row, or read from the ledger), unless the server has all of them: read one chunk
/// at a time, and hashed on the way, so that a file changed since it was stored is refused
/// rather than shared (the transaction is then undone).
fn share_chunks(conn: &Db, artifact: &Artifact) -> Result<()> {
    let Some(file) = &artifact.file else {
        return Ok(());
    };
    let shared: u64 = conn
        .prepare_cached("SELECT count(*) FROM artifact_chunks WHERE sha256 = ?1")?
        .query_row([&artifact.sha256], |row| row.get(0))?;
    if shared == chunk_count(artifact.size) {
        return Ok(());
    }
    let unshareable = |reason: String| {
        LedgerError::Io(std::io::Error::other(format!(
            "cannot share artifact {} from {}: {reason}",
            artifact.sha256,
            file.display()
        )))
    };
    let mut chunks = Chunks {
        insert: conn.prepare_cached(
            "INSERT INTO artifact_chunks (sha256, seq, content) VALUES (?1, ?2, ?3)
             ON CONFLICT DO NOTHING",
        )?,
        sha256: &artifact.sha256,
        seq: 0,
        chunk: Vec::with_capacity(CHUNK_SIZE.min(artifact.size as usize)),
    };
    let (found, size) = open_regular(file)
        .and_then(|mut reader| copy_hashing(&mut reader, &mut chunks))
        .and_then(|copied| chunks.flush().map(|()| copied))
        .map_err(|e| unshareable(e.to_string()))?;
    if found != artifact.sha256 || size != artifact.size {
        return Err(unshareable(
            "the file no longer matches its hash".to_owned(),
        ));
    }
    Ok(())
}

/// Inserts what is written to it as an artifact's chunks, each [`CHUNK_SIZE`] bytes but the
/// last (written by `flush`).
struct Chunks<'a> {
    insert: db::Statement<'a>,
    sha256: &'a str,
    seq: u64,
    chunk: Vec<u8>,
}

impl Write for Chunks<'_> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let taken = bytes.len().min(CHUNK_SIZE - self.chunk.len());
        self.chunk.extend_from_slice(&bytes[..taken]);
        if self.chunk.len() == CHUNK_SIZE {
            self.flush()?;
        }
        Ok(taken)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.chunk.is_empty() {
            return Ok(());
        }
        self.insert
            .execute(params![self.sha256, self.seq, &self.chunk[..]])
            .map_err(std::io::Error::other)?;
        self.seq += 1;
        self.chunk.clear();
        Ok(())
    }
}

/// The content every machine reads, which a machine's store keeps a cache of (see
/// `kavi_store::SharedContent`): the chunks a server ledger keeps, or the objects in the object
/// store the ledger records. It connects, to read only, the first time something is fetched:
/// most commands read nothing this machine does not have.
pub struct SharedArtifacts {
    location: PathBuf,
    objects: Option<Arc<Objects>>,
    ledger: Mutex<Option<Ledger>>,
}

impl std::fmt::Debug for SharedArtifacts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedArtifacts")
            .field("location", &super::display_location(&self.location))
            .finish_non_exhaustive()
    }
}

impl SharedArtifacts {
    /// The shared content of the ledger at `location`, when it is a server's or this machine
    /// has an object store (`objects`); `None` for a SQLite file alone, whose machine has the
    /// files.
    pub fn of(location: &Path, objects: Option<Arc<Objects>>) -> Option<Self> {
        if objects.is_none() {
            super::connection::postgres_url(location)?;
        }
        Some(Self {
            location: location.to_owned(),
            objects,
            ledger: Mutex::new(None),
        })
    }
}

impl kavi_store::SharedContent for SharedArtifacts {
    fn copy_to(&self, sha256: &str, writer: &mut dyn Write) -> Result<bool, String> {
        let mut ledger = self.ledger.lock().unwrap_or_else(|e| e.into_inner());
        if ledger.is_none() {
            *ledger = Some(Ledger::open_read_only(&self.location).map_err(|e| e.to_string())?);
        }
        let ledger = ledger.as_ref().expect("connected above");
        let failed = |e: &dyn std::fmt::Display| format!("artifact {sha256}: {e}");
        match object_location(&ledger.conn, sha256).map_err(|e| failed(&e))? {
            Some(location) => {
                let objects = self
                    .objects
                    .as_ref()
                    .ok_or_else(|| failed(&unreachable_object(&location)))?;
                objects.copy_to(&location, writer).map_err(|e| failed(&e))?;
                Ok(true)
            }
            None => copy_chunks(&ledger.conn, sha256, writer).map_err(|e| failed(&e)),
        }
    }
}

/// Where the object store keeps the artifact `sha256`, when it does.
pub(crate) fn object_location(conn: &Db, sha256: &str) -> Result<Option<String>> {
    Ok(conn
        .prepare_cached("SELECT location FROM artifact_objects WHERE sha256 = ?1")?
        .query_row([sha256], |row| row.get(0))
        .optional()?)
}

/// Why an object at `location` cannot be read on a machine with no object store configured.
pub(crate) fn unreachable_object(location: &str) -> String {
    format!(
        "its content is kept in the object store at {location}, and this machine's kavi.toml \
         names no `[object_store]` to read it from (docs/distributed.md)"
    )
}

/// Writes the chunks `conn` keeps of the artifact `sha256` to `writer`, one read at a time;
/// `false` when it keeps none (not a server, or recorded before it shared content). The bytes
/// are not checked here: whoever reads them hashes them.
pub(crate) fn copy_chunks(conn: &Db, sha256: &str, writer: &mut dyn Write) -> Result<bool> {
    let size: Option<u64> = conn
        .query_row(
            "SELECT size FROM artifacts WHERE sha256 = ?1",
            [sha256],
            |row| row.get(0),
        )
        .optional()?;
    let Some(size) = size else {
        return Ok(false);
    };
    let count = chunk_count(size);
    let mut read =
        conn.prepare_cached("SELECT content FROM artifact_chunks WHERE sha256 = ?1 AND seq = ?2")?;
    for seq in 0..count {
        let chunk: Option<Vec<u8>> = read
            .query_row(params![sha256, seq], |row| row.get(0))
            .optional()?;
        match chunk {
            Some(chunk) => writer.write_all(&chunk)?,
            // Nothing shared (the first chunk missing) is not an error: the content is then
            // only where it was made. A missing later one is.
            None if seq == 0 => return Ok(false),
            None => {
                return Err(LedgerError::Io(std::io::Error::other(format!(
                    "the ledger keeps {seq} of its {count} chunks"
                ))));
            }
        }
    }
    // An empty artifact needs no chunk to be read.
    Ok(true)
}

impl Ledger {
    /// A stored artifact's row, by its SHA-256 or a unique prefix of it.
    pub fn artifact(&self, prefix: &str) -> Result<Artifact> {
        let hex = prefix.strip_prefix("sha256:").unwrap_or(prefix);
        let found: Vec<Artifact> = self
            .conn
            .prepare("SELECT sha256, kind, size, path FROM artifacts WHERE sha256 LIKE ?1 LIMIT 2")?
            .query_map([format!("{hex}%")], |row| {
                Ok(Artifact {
                    sha256: row.get(0)?,
                    kind: row.get(1)?,
                    size: row.get(2)?,
                    path: row.get(3)?,
                    inline: None,
                    file: None,
                    location: None,
                    sent_to: None,
                })
            })?
            .collect::<db::Result<_>>()?;
        match <[Artifact; 1]>::try_from(found) {
            Ok([artifact]) if !hex.is_empty() => Ok(artifact),
            _ => Err(LedgerError::ArtifactNotFound(prefix.to_owned())),
        }
    }

    /// The bytes of an artifact the ledger keeps, checked against its hash; `None` when it is
    /// the store's file.
    pub fn kept_artifact(&self, sha256: &str) -> Result<Option<Vec<u8>>, String> {
        let kept: Option<Vec<u8>> = self
            .conn
            .query_row(
                "SELECT content FROM artifact_contents WHERE sha256 = ?1",
                [sha256],
                |row| row.get(0),
            )
            .optional()
            .map_err(|e| e.to_string())?;
        match kept {
            Some(bytes) if kavi_foundation::hash::sha256_hex(&bytes) != sha256 => Err(format!(
                "artifact {sha256} in the ledger was altered: its content no longer matches its hash"
            )),
            kept => Ok(kept),
        }
    }
}
