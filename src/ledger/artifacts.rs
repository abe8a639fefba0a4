//! The content-addressed artifact store: each artifact is a file named by its SHA-256.
//!
//! Files are written to a temporary name in the store and renamed into place, so a reader never
//! sees half an artifact, and the ledger row is written only once the file exists.

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;
use sha2::{Digest, Sha256};
use tempfile::NamedTempFile;

/// An artifact in the store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Artifact {
    pub sha256: String,
    pub kind: String,
    pub size: u64,
    /// Relative to the store root.
    pub path: String,
}

#[derive(Debug, Clone)]
pub struct ArtifactStore {
    root: PathBuf,
}

impl ArtifactStore {
    pub fn open(root: &Path) -> io::Result<Self> {
        std::fs::create_dir_all(root.join("tmp"))?;
        Ok(Self {
            root: root.to_owned(),
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// A file to write an artifact into before it is known; hand it to [`Self::put_file`].
    pub fn temp_file(&self) -> io::Result<NamedTempFile> {
        NamedTempFile::new_in(self.root.join("tmp"))
    }

    pub fn put_bytes(&self, kind: &str, bytes: &[u8]) -> io::Result<Artifact> {
        let mut temp = self.temp_file()?;
        temp.write_all(bytes)?;
        self.put_file(kind, temp)
    }

    /// Moves a finished temporary file into the store under its hash.
    pub fn put_file(&self, kind: &str, temp: NamedTempFile) -> io::Result<Artifact> {
        let (sha256, size) = hash_file(temp.path())?;
        let relative = format!("sha256/{}/{}", &sha256[..2], sha256);
        let destination = self.root.join(&relative);
        if !destination.exists() {
            std::fs::create_dir_all(destination.parent().expect("artifact path has a parent"))?;
            temp.as_file().sync_all()?;
            temp.persist(&destination).map_err(|e| e.error)?;
        }
        Ok(Artifact {
            sha256,
            kind: kind.to_owned(),
            size,
            path: relative,
        })
    }

    /// The absolute path of a stored artifact.
    pub fn path_of(&self, artifact: &Artifact) -> PathBuf {
        self.root.join(&artifact.path)
    }
}

/// SHA-256 (hex) and size of a file, read in chunks.
pub fn hash_file(path: &Path) -> io::Result<(String, u64)> {
    let mut file = File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buffer = [0u8; 64 * 1024];
    let mut size = 0u64;
    loop {
        let n = file.read(&mut buffer)?;
        if n == 0 {
            break;
        }
        hasher.update(&buffer[..n]);
        size += n as u64;
    }
    Ok((format!("{:x}", hasher.finalize()), size))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identical_content_is_stored_once_under_its_hash() {
        let dir = tempfile::tempdir().unwrap();
        let store = ArtifactStore::open(dir.path()).unwrap();
        let a = store.put_bytes("NOTE", b"hello\n").unwrap();
        let b = store.put_bytes("NOTE", b"hello\n").unwrap();
        assert_eq!(a, b);
        assert_eq!(
            a.sha256,
            "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03"
        );
        assert_eq!(std::fs::read(store.path_of(&a)).unwrap(), b"hello\n");
        assert_eq!(a.size, 6);
    }
}
