//! The content-addressed artifact store: each artifact is a file named by its SHA-256.
//!
//! Files are written to a temporary name in the store and renamed into place, so a reader never
//! sees half an artifact, and the ledger row is written only once the file exists. Content that
//! is already stored is not written again.
//!
//! Small outputs ([`ArtifactStore::put_small`]) are not files at all: their bytes travel with the
//! artifact to the ledger, which keeps them in `artifact_contents` in the same transaction as the
//! row that records them (this crate knows no ledger: `kavi-ledger` records and reads the rows). A node that prints a line then costs a row, not a file and an fsync,
//! and the content is exactly as durable as the record of it.
//!
//! With a ledger every machine of a team shares ([`SharedContent`]), the files here are a cache
//! in front of it: an artifact this machine does not have, or whose copy no longer matches its
//! hash, is fetched from the shared copy and checked before it is read.
//!
//! With an object store ([`Objects`], kavi.toml's `[object_store]`), every file artifact is
//! also put there as it is stored, and the ledger records where: the shared copy is then the
//! object, not the ledger's.

mod objects;

pub use objects::{ObjectSettings, Objects};

use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;
use tempfile::NamedTempFile;

use kavi_foundation::files::{open_regular, temp_file_in};
use kavi_foundation::hash::{copy_hashing, hash_reader, sha256_hex};

/// An artifact in the store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Artifact {
    pub sha256: String,
    pub kind: String,
    pub size: u64,
    /// Relative to the store root; empty for content the ledger keeps (see `inline`).
    pub path: String,
    /// The content of a small artifact, which the ledger keeps instead of a file.
    #[serde(skip)]
    pub inline: Option<Arc<[u8]>>,
    /// Where this machine's store holds a file artifact it has just stored: what a shared
    /// ledger copies the content from when it records the artifact.
    #[serde(skip)]
    pub file: Option<PathBuf>,
    /// Where the object store holds this file artifact, once it was put there
    /// (`s3://BUCKET/KEY`): what the ledger records for every machine to read it from.
    #[serde(skip)]
    pub location: Option<String>,
    /// The object store this machine put it in: where whoever records it puts it again, when
    /// `kavi gc` removed the object meanwhile (see `kavi-ledger`'s `object_deletions`).
    #[serde(skip)]
    pub sent_to: Option<Arc<Objects>>,
}

/// Artifacts' content kept where every machine can read it (a server ledger), by SHA-256.
pub trait SharedContent: Send + Sync + std::fmt::Debug {
    /// Writes the content kept under `sha256` to `writer`, as it comes; `Ok(false)` when none
    /// is kept there (recorded before content was shared, or by a ledger that does not share).
    fn copy_to(&self, sha256: &str, writer: &mut dyn Write) -> Result<bool, String>;
}

/// The most an artifact kept in the ledger holds: above it, a file is cheaper than a row.
/// Measured with benches/bench.sh (docs/benchmarks.md): a node's line of output as a row costs
/// a fraction of a file's create, fsync and rename.
pub const INLINE_LIMIT: usize = 16 * 1024;

#[derive(Debug, Clone)]
pub struct ArtifactStore {
    root: PathBuf,
    shared: Option<Arc<dyn SharedContent>>,
    objects: Option<Arc<Objects>>,
}

impl ArtifactStore {
    pub fn open(root: &Path) -> io::Result<Self> {
        kavi_foundation::sandbox::state_folder(root)?;
        std::fs::create_dir_all(root.join("tmp"))?;
        Ok(Self {
            root: root.to_owned(),
            shared: None,
            objects: None,
        })
    }

    /// This store putting every file artifact in `objects` too, for every machine to read.
    pub fn with_objects(self, objects: Arc<Objects>) -> Self {
        Self {
            objects: Some(objects),
            ..self
        }
    }

    /// The object store file artifacts go to, when there is one.
    pub fn objects(&self) -> Option<&Objects> {
        self.objects.as_deref()
    }

    /// Puts the file artifact `artifact`, which this store holds, in the object store when
    /// there is one, and notes where. Content already there is not sent again.
    pub fn send(&self, artifact: &mut Artifact) -> io::Result<()> {
        if let (Some(objects), Some(file)) = (&self.objects, &artifact.file) {
            artifact.location = Some(objects.put_file(&artifact.sha256, artifact.size, file)?);
            artifact.sent_to = Some(objects.clone());
        }
        Ok(())
    }

    /// This store as a cache in front of `shared`, which every machine reads.
    pub fn in_front_of(self, shared: Arc<dyn SharedContent>) -> Self {
        Self {
            shared: Some(shared),
            ..self
        }
    }

    /// Where temporary files go before they are stored: on the store's file system, so that
    /// storing one is a rename.
    pub fn temp_dir(&self) -> PathBuf {
        self.root.join("tmp")
    }

    /// Where the digests of large input files are remembered (see `cache::DigestMemo`): kavi's
    /// state, beside what it describes.
    pub fn digests_dir(&self) -> PathBuf {
        self.root.join("digests")
    }

    fn artifact(&self, kind: &str, sha256: String, size: u64) -> Artifact {
        let path = relative_path(&sha256);
        Artifact {
            file: Some(self.root.join(&path)),
            sha256,
            kind: kind.to_owned(),
            size,
            path,
            inline: None,
            location: None,
            sent_to: None,
        }
    }

    /// Stores `bytes` in the ledger when they are small (up to [`INLINE_LIMIT`]), else as a
    /// file: the ledger writes an inline artifact's content with the row that records it.
    pub fn put_small(&self, kind: &str, bytes: &[u8]) -> io::Result<Artifact> {
        if bytes.len() > INLINE_LIMIT {
            return self.put_bytes(kind, bytes);
        }
        Ok(Artifact {
            sha256: sha256_hex(bytes),
            kind: kind.to_owned(),
            size: bytes.len() as u64,
            path: String::new(),
            inline: Some(bytes.into()),
            file: None,
            location: None,
            sent_to: None,
        })
    }

    pub fn put_bytes(&self, kind: &str, bytes: &[u8]) -> io::Result<Artifact> {
        let mut artifact = self.artifact(kind, sha256_hex(bytes), bytes.len() as u64);
        let destination = self.path_of(&artifact);
        if !holds(&destination, &artifact) {
            let mut temp = NamedTempFile::new_in(self.temp_dir())?;
            temp.write_all(bytes)?;
            self.persist(temp, &destination)?;
        }
        self.send(&mut artifact)?;
        Ok(artifact)
    }

    /// Stores everything `reader` yields: kept in the ledger when it ends within
    /// [`INLINE_LIMIT`], else copied into the store as it is hashed, so that an output of any
    /// size costs one buffer of memory and one read of each byte.
    ///
    /// The copy is made in `scratch`, a folder on the store's file system that its owner's
    /// recovery removes (the run's spill folder): a kavi killed while copying gigabytes leaves
    /// no copy behind for good.
    pub fn put_read(
        &self,
        kind: &str,
        reader: &mut impl Read,
        scratch: &Path,
    ) -> io::Result<Artifact> {
        let mut head = Vec::new();
        reader
            .take(INLINE_LIMIT as u64 + 1)
            .read_to_end(&mut head)?;
        if head.len() <= INLINE_LIMIT {
            return self.put_small(kind, &head);
        }
        let mut temp = temp_file_in(scratch, &tempfile::Builder::new())?;
        let (sha256, size) = copy_hashing(&mut head.as_slice().chain(reader), temp.as_file_mut())?;
        self.keep_file(kind, temp, sha256, size)
    }

    /// Moves a finished temporary file into the store under its hash.
    pub fn put_file(&self, kind: &str, mut temp: NamedTempFile) -> io::Result<Artifact> {
        // A writer may have left the offset anywhere.
        temp.as_file_mut().seek(SeekFrom::Start(0))?;
        let (sha256, size) = hash_reader(temp.as_file_mut())?;
        self.keep_file(kind, temp, sha256, size)
    }

    /// Moves `temp`, whose content hashes to `sha256`, into the store under that hash, unless
    /// the store has it already.
    fn keep_file(
        &self,
        kind: &str,
        temp: NamedTempFile,
        sha256: String,
        size: u64,
    ) -> io::Result<Artifact> {
        let mut artifact = self.artifact(kind, sha256, size);
        let destination = self.path_of(&artifact);
        if !holds(&destination, &artifact) {
            self.persist(temp, &destination)?;
        }
        self.send(&mut artifact)?;
        Ok(artifact)
    }

    fn persist(&self, temp: NamedTempFile, destination: &Path) -> io::Result<()> {
        std::fs::create_dir_all(destination.parent().expect("artifact path has a parent"))?;
        temp.as_file().sync_all()?;
        temp.persist(destination).map_err(|e| e.error)?;
        Ok(())
    }

    /// The absolute path of the artifact with this SHA-256 (hex).
    pub fn path_of_sha256(&self, sha256: &str) -> PathBuf {
        self.root.join(relative_path(sha256))
    }

    /// The absolute path of a stored artifact.
    pub fn path_of(&self, artifact: &Artifact) -> PathBuf {
        self.root.join(&artifact.path)
    }

    /// The text of the artifact with this SHA-256 (hex), re-hashed as it is read: the store
    /// names content by its hash, so a file that no longer matches was altered and is refused.
    pub fn read_text(&self, sha256: &str) -> Result<String, String> {
        String::from_utf8(self.read_bytes(sha256)?).map_err(|_| {
            format!(
                "artifact {} is not UTF-8 text",
                self.path_of_sha256(sha256).display()
            )
        })
    }

    /// The bytes of the artifact with this SHA-256 (hex), re-hashed as they are read.
    pub fn read_bytes(&self, sha256: &str) -> Result<Vec<u8>, String> {
        let mut bytes = Vec::new();
        self.copy_out(sha256, &mut bytes)?;
        Ok(bytes)
    }

    /// Writes the artifact with this SHA-256 (hex) to `writer`, re-hashing it on the way: an
    /// error, once all is written, when the file no longer matches its name (the writer's copy
    /// is then not to be used).
    pub fn copy_out(&self, sha256: &str, writer: &mut dyn Write) -> Result<(), String> {
        self.fetch_if_needed(sha256)?;
        let path = self.path_of_sha256(sha256);
        let (found, _) = open_regular(&path)
            .and_then(|mut file| copy_hashing(&mut file, writer))
            .map_err(|e| format!("failed to read artifact {}: {e}", path.display()))?;
        if found != sha256 {
            return Err(format!(
                "artifact {} was altered: its content no longer matches its hash",
                path.display()
            ));
        }
        Ok(())
    }

    /// With a shared copy, makes this machine's file of `sha256` hold its content: a file that
    /// is missing or no longer matches its hash is fetched again, whole, into a temporary file,
    /// checked and only then renamed into place (a reader never sees a part). The copy here is
    /// re-hashed when it is read all the same: checking it first costs a read, and a file
    /// found altered once its bytes went to a writer could no longer be replaced.
    pub fn fetch_if_needed(&self, sha256: &str) -> Result<(), String> {
        let Some(shared) = &self.shared else {
            return Ok(());
        };
        let destination = self.path_of_sha256(sha256);
        let cached = open_regular(&destination).and_then(|mut file| hash_reader(&mut file));
        if matches!(&cached, Ok((found, _)) if found == sha256) {
            return Ok(());
        }
        let failed = |e: io::Error| format!("failed to fetch artifact {sha256}: {e}");
        let mut temp = NamedTempFile::new_in(self.temp_dir()).map_err(failed)?;
        if !shared.copy_to(sha256, temp.as_file_mut())? {
            // Nothing shared to fetch: the read says what is wrong with the file here.
            return Ok(());
        }
        temp.as_file_mut()
            .seek(SeekFrom::Start(0))
            .map_err(failed)?;
        let (found, _) = hash_reader(temp.as_file_mut()).map_err(failed)?;
        if found != sha256 {
            return Err(format!(
                "artifact {sha256} in the shared store was altered: its content no longer matches its hash"
            ));
        }
        self.persist(temp, &destination).map_err(failed)
    }
}

/// Whether the store's file at `path` holds `artifact`'s content. A copy altered since it was
/// stored (or damaged on disk) does not, and whoever stores that content next replaces it:
/// otherwise every later run would find the copy unusable, and a cached node would run every
/// time. Checking costs a read of the stored copy, only when the content is stored again (a
/// node that ran and made the same output), and none when the size alone tells.
fn holds(path: &Path, artifact: &Artifact) -> bool {
    open_regular(path)
        .and_then(|mut file| {
            if file.limit() != artifact.size {
                return Ok(false);
            }
            Ok(hash_reader(&mut file)?.0 == artifact.sha256)
        })
        .unwrap_or(false)
}

/// Where an artifact lives in the store: `sha256/<first two hex>/<hex>`.
fn relative_path(sha256: &str) -> String {
    format!("sha256/{}/{}", &sha256[..2.min(sha256.len())], sha256)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kavi_foundation::hash::hash_file;

    #[test]
    fn identical_content_is_stored_once_under_its_hash() {
        let dir = tempfile::tempdir().unwrap();
        let store = ArtifactStore::open(dir.path()).unwrap();
        let a = store.put_bytes("NOTE", b"hello\n").unwrap();
        let mut temp = NamedTempFile::new_in(store.temp_dir()).unwrap();
        temp.write_all(b"hello\n").unwrap();
        let b = store.put_file("NOTE", temp).unwrap();
        assert_eq!(a, b);
        assert_eq!(
            a.sha256,
            "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03"
        );
        assert_eq!(std::fs::read(store.path_of(&a)).unwrap(), b"hello\n");
        assert_eq!(a.size, 6);
        assert_eq!(
            hash_file(&store.path_of(&a)).unwrap(),
            (a.sha256.clone(), 6)
        );
    }

    #[test]
    fn small_content_travels_with_the_artifact_and_large_content_is_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = ArtifactStore::open(dir.path()).unwrap();
        let small = store.put_small("STDOUT", b"hello\n").unwrap();
        assert_eq!(small.inline.as_deref(), Some(&b"hello\n"[..]));
        assert_eq!(small.path, "");
        assert_eq!(
            small.sha256,
            store.put_bytes("STDOUT", b"hello\n").unwrap().sha256
        );
        let large = store
            .put_small("STDOUT", &vec![b'x'; INLINE_LIMIT + 1])
            .unwrap();
        assert!(large.inline.is_none());
        assert!(store.path_of(&large).is_file());
    }

    #[test]
    fn content_read_in_is_kept_inline_when_small_and_else_copied_as_it_is_hashed() {
        let dir = tempfile::tempdir().unwrap();
        let store = ArtifactStore::open(dir.path()).unwrap();
        let at_limit = vec![b'a'; INLINE_LIMIT];
        let small = store
            .put_read("OUTPUT", &mut at_limit.as_slice(), &store.temp_dir())
            .unwrap();
        assert_eq!(small, store.put_small("OUTPUT", &at_limit).unwrap());
        assert!(small.inline.is_some());
        // One byte over the limit, and over several of the copy's buffers: the file `put_bytes`
        // makes of the same bytes, and `copy_out` gives them back.
        for size in [INLINE_LIMIT + 1, 3 * 64 * 1024 + 7] {
            let bytes: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
            let large = store
                .put_read("OUTPUT", &mut bytes.as_slice(), &store.temp_dir())
                .unwrap();
            assert!(large.inline.is_none());
            assert_eq!(large, store.put_bytes("OUTPUT", &bytes).unwrap());
            assert_eq!(std::fs::read(store.path_of(&large)).unwrap(), bytes);
            let mut copy = Vec::new();
            store.copy_out(&large.sha256, &mut copy).unwrap();
            assert_eq!(copy, bytes);
        }
        assert_eq!(std::fs::read_dir(store.temp_dir()).unwrap().count(), 0);
    }

    /// What a server ledger keeps, as a map: content by hash, which a test may alter.
    #[derive(Debug, Default)]
    struct Shared(std::sync::Mutex<std::collections::HashMap<String, Vec<u8>>>);

    impl SharedContent for Shared {
        fn copy_to(&self, sha256: &str, writer: &mut dyn Write) -> Result<bool, String> {
            match self.0.lock().unwrap().get(sha256) {
                Some(bytes) => writer
                    .write_all(bytes)
                    .map(|()| true)
                    .map_err(|e| e.to_string()),
                None => Ok(false),
            }
        }
    }

    #[test]
    fn in_front_of_a_shared_copy_a_missing_or_altered_file_is_fetched_and_checked() {
        let made = tempfile::tempdir().unwrap();
        let bytes: Vec<u8> = (0..3 * INLINE_LIMIT).map(|i| (i % 253) as u8).collect();
        let artifact = ArtifactStore::open(made.path())
            .unwrap()
            .put_bytes("OUTPUT", &bytes)
            .unwrap();
        let shared = Arc::new(Shared::default());
        shared
            .0
            .lock()
            .unwrap()
            .insert(artifact.sha256.clone(), bytes.clone());
        let elsewhere = tempfile::tempdir().unwrap();
        let store = ArtifactStore::open(elsewhere.path())
            .unwrap()
            .in_front_of(shared.clone());
        // Not on this machine: fetched, kept, read.
        assert_eq!(store.read_bytes(&artifact.sha256).unwrap(), bytes);
        let cached = store.path_of_sha256(&artifact.sha256);
        assert_eq!(std::fs::read(&cached).unwrap(), bytes);
        // The copy here altered: fetched again.
        std::fs::remove_file(&cached).unwrap();
        std::fs::write(&cached, b"altered").unwrap();
        assert_eq!(store.read_bytes(&artifact.sha256).unwrap(), bytes);
        // The shared copy altered, and none here: refused, and nothing kept.
        std::fs::remove_file(&cached).unwrap();
        shared
            .0
            .lock()
            .unwrap()
            .insert(artifact.sha256.clone(), b"altered".to_vec());
        let error = store.read_bytes(&artifact.sha256).unwrap_err();
        assert!(
            error.ends_with(
                "in the shared store was altered: its content no longer matches its hash"
            ),
            "{error}"
        );
        assert!(!cached.exists());
        // Nothing shared for it: the read says the file is missing, as without a shared copy.
        let unknown = "0".repeat(64);
        let error = store.read_bytes(&unknown).unwrap_err();
        assert!(error.starts_with("failed to read artifact"), "{error}");
        assert_eq!(std::fs::read_dir(store.temp_dir()).unwrap().count(), 0);
    }

    #[test]
    fn hashing_refuses_a_fifo_or_a_link_without_waiting_on_it() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        // Opened to read as a file is, a FIFO waits for a writer: this call would not return.
        let error = hash_file(&fifo).unwrap_err();
        assert!(
            error.to_string().ends_with("is no longer a regular file"),
            "{error}"
        );
        std::fs::write(dir.path().join("file"), "x").unwrap();
        std::os::unix::fs::symlink(dir.path().join("file"), dir.path().join("link")).unwrap();
        let error = hash_file(&dir.path().join("link")).unwrap_err();
        assert_eq!(error.raw_os_error(), Some(nix::libc::ELOOP), "{error}");
    }

    #[test]
    fn a_file_is_read_as_long_as_it_was_when_opened() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("growing.log");
        std::fs::write(&path, "first\n").unwrap();
        let mut opened = open_regular(&path).unwrap();
        // What a process still writing to it adds after the open is not read.
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b"more\n")
            .unwrap();
        let mut read = String::new();
        opened.read_to_string(&mut read).unwrap();
        assert_eq!(read, "first\n");
    }

    #[test]
    fn a_read_re_hashes_and_refuses_an_altered_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = ArtifactStore::open(dir.path()).unwrap();
        let a = store.put_bytes("NOTE", b"hello\n").unwrap();
        assert_eq!(store.read_text(&a.sha256).unwrap(), "hello\n");
        let path = store.path_of(&a);
        let mut permissions = std::fs::metadata(&path).unwrap().permissions();
        #[allow(clippy::permissions_set_readonly_false)]
        permissions.set_readonly(false);
        std::fs::set_permissions(&path, permissions).unwrap();
        std::fs::write(&path, b"hellO\n").unwrap();
        let error = store.read_text(&a.sha256).unwrap_err();
        assert!(
            error.ends_with("was altered: its content no longer matches its hash"),
            "{error}"
        );
        // Stored again, the content replaces the altered copy: same size, or another size.
        assert_eq!(store.put_bytes("NOTE", b"hello\n").unwrap(), a);
        assert_eq!(store.read_text(&a.sha256).unwrap(), "hello\n");
        for altered in [&b"hellO\n"[..], b"hello, world\n"] {
            std::fs::remove_file(&path).unwrap();
            std::fs::write(&path, altered).unwrap();
            let mut temp = NamedTempFile::new_in(store.temp_dir()).unwrap();
            temp.write_all(b"hello\n").unwrap();
            assert_eq!(store.put_file("NOTE", temp).unwrap(), a);
            assert_eq!(store.read_text(&a.sha256).unwrap(), "hello\n");
        }
    }
}
