//! A skill's trusted tree: the bytes its source hash covers (its proposal file and the files of
//! its folder), kept in the artifact store at promotion so that a skill whose files drifted can
//! be put back exactly as it was trusted (`kavi skill restore`).
//!
//! The tree is kept as one `SKILL_TREE` artifact, a JSON manifest naming each file's artifact by
//! its SHA-256, and one `SKILL_FILE` artifact per file. Reading it back re-hashes every artifact
//! and the whole tree, so a damaged store restores nothing.

use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::ledger::{Artifact, ArtifactStore};

/// One file of a skill's folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeFile {
    /// Relative to the folder, `/`-separated.
    pub path: String,
    pub bytes: Vec<u8>,
    pub executable: bool,
    /// Its mode and modification time as read; `None` from a tree kept before kavi recorded
    /// them. Not part of the source hash (whose definition predates them): compared beside it.
    pub meta: Option<FileMeta>,
}

/// What a file's metadata says beyond its bytes: a change to either is drift, not a new hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileMeta {
    /// Permission bits (`0o7777`).
    pub mode: u32,
    /// Modification time: seconds and nanoseconds since the epoch.
    pub mtime: (i64, i64),
}

impl FileMeta {
    pub fn of(metadata: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        Self {
            mode: metadata.mode() & 0o7777,
            mtime: (metadata.mtime(), metadata.mtime_nsec()),
        }
    }

    /// Gives `path` this mode and modification time.
    fn apply(&self, path: &Path) -> std::io::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let file = std::fs::File::options().write(true).open(path)?;
        let nanos = u32::try_from(self.mtime.1).unwrap_or(0);
        let at = u64::try_from(self.mtime.0).map_or(std::time::UNIX_EPOCH, |secs| {
            std::time::UNIX_EPOCH + std::time::Duration::new(secs, nanos)
        });
        file.set_modified(at)?;
        file.set_permissions(std::fs::Permissions::from_mode(self.mode))
    }
}

/// Everything a skill's source hash covers.
#[derive(Debug, Clone)]
pub struct SkillTree {
    /// The proposal file, relative to the workspace.
    pub proposal_path: String,
    pub proposal: Vec<u8>,
    /// The skill's folder, relative to the workspace.
    pub folder: String,
    /// In byte order of their paths.
    pub files: Vec<TreeFile>,
}

/// The manifest as stored.
#[derive(Debug, Serialize, Deserialize)]
struct Manifest {
    source_hash: String,
    proposal_path: String,
    proposal: String,
    folder: String,
    files: Vec<ManifestFile>,
}

#[derive(Debug, Serialize, Deserialize)]
struct ManifestFile {
    path: String,
    sha256: String,
    executable: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    meta: Option<FileMeta>,
}

impl SkillTree {
    /// The source hash (see [`super::trust`] for its definition).
    pub fn hash(&self) -> String {
        let mut hasher = Sha256::new();
        let mut entry = |path: &str, content: &[u8]| {
            hasher.update(path.as_bytes());
            hasher.update([0]);
            hasher.update(content.len().to_string().as_bytes());
            hasher.update([0]);
            hasher.update(content);
        };
        entry("", &self.proposal);
        for file in &self.files {
            entry(&file.path, &file.bytes);
        }
        format!("sha256:{:x}", hasher.finalize())
    }

    /// Its files as an attestation's subjects: the proposal and each file of the folder, by
    /// their paths in the workspace.
    pub fn subjects(&self) -> Vec<kavi_provenance::Subject<'_>> {
        std::iter::once(kavi_provenance::Subject {
            name: self.proposal_path.clone(),
            bytes: &self.proposal,
            executable: false,
        })
        .chain(self.files.iter().map(|file| kavi_provenance::Subject {
            name: format!("{}/{}", self.folder, file.path),
            bytes: &file.bytes,
            executable: file.executable,
        }))
        .collect()
    }

    /// Stores the tree; returns its manifest artifact first, then every artifact it stored.
    pub fn store(&self, store: &ArtifactStore) -> std::io::Result<Vec<Artifact>> {
        let proposal = store.put_bytes("SKILL_FILE", &self.proposal)?;
        let mut stored = vec![proposal.clone()];
        let mut files = Vec::with_capacity(self.files.len());
        for file in &self.files {
            let artifact = store.put_bytes("SKILL_FILE", &file.bytes)?;
            files.push(ManifestFile {
                path: file.path.clone(),
                sha256: artifact.sha256.clone(),
                executable: file.executable,
                meta: file.meta,
            });
            stored.push(artifact);
        }
        let manifest = Manifest {
            source_hash: self.hash(),
            proposal_path: self.proposal_path.clone(),
            proposal: proposal.sha256,
            folder: self.folder.clone(),
            files,
        };
        let text = serde_json::to_string_pretty(&manifest).expect("a manifest serializes");
        stored.insert(0, store.put_bytes("SKILL_TREE", text.as_bytes())?);
        Ok(stored)
    }

    /// Reads a stored tree back, re-hashing every artifact, and checks that it is the tree of
    /// `source_hash`.
    pub fn load(store: &ArtifactStore, manifest: &str, source_hash: &str) -> Result<Self, String> {
        let manifest: Manifest = serde_json::from_str(&store.read_text(manifest)?)
            .map_err(|e| format!("the trusted tree's manifest is not valid: {e}"))?;
        for path in std::iter::once(manifest.proposal_path.as_str())
            .chain(std::iter::once(manifest.folder.as_str()))
            .chain(manifest.files.iter().map(|f| f.path.as_str()))
        {
            if let Some(reason) = crate::sandbox::unsafe_path_reason(path) {
                return Err(format!("the trusted tree names `{path}`: {reason}"));
            }
        }
        let mut files = Vec::with_capacity(manifest.files.len());
        for file in &manifest.files {
            files.push(TreeFile {
                path: file.path.clone(),
                bytes: store.read_bytes(&file.sha256)?,
                executable: file.executable,
                meta: file.meta,
            });
        }
        let tree = SkillTree {
            proposal_path: manifest.proposal_path,
            proposal: store.read_bytes(&manifest.proposal)?,
            folder: manifest.folder,
            files,
        };
        let hash = tree.hash();
        if hash != source_hash || manifest.source_hash != source_hash {
            return Err(format!(
                "the stored tree hashes to {hash}, not to the trusted {source_hash}"
            ));
        }
        Ok(tree)
    }

    /// The first file whose bytes differ from `trusted`'s, with the SHA-256 of each: the
    /// evidence a drift is recorded with.
    pub fn first_difference(&self, trusted: &SkillTree) -> Option<String> {
        let sha = |bytes: &[u8]| format!("sha256:{}", kavi_foundation::hash::sha256_hex(bytes));
        if self.proposal != trusted.proposal {
            return Some(format!(
                "{}: trusted {}, found {}",
                trusted.proposal_path,
                sha(&trusted.proposal),
                sha(&self.proposal)
            ));
        }
        let found = |path: &str| self.files.iter().find(|f| f.path == path);
        trusted
            .files
            .iter()
            .find_map(|was| {
                let path = format!("{}/{}", trusted.folder, was.path);
                match found(&was.path) {
                    None => Some(format!("{path}: trusted {}, missing", sha(&was.bytes))),
                    Some(now) if now.bytes != was.bytes => Some(format!(
                        "{path}: trusted {}, found {}",
                        sha(&was.bytes),
                        sha(&now.bytes)
                    )),
                    Some(_) => None,
                }
            })
            .or_else(|| {
                let extra = self
                    .files
                    .iter()
                    .find(|now| !trusted.files.iter().any(|was| was.path == now.path))?;
                Some(format!(
                    "{}/{}: not trusted, found {}",
                    trusted.folder,
                    extra.path,
                    sha(&extra.bytes)
                ))
            })
    }

    /// How this tree's files differ from `trusted`'s in mode, if they do: the first difference,
    /// in words. Files whose trusted metadata was not recorded are not compared; the bytes are
    /// the source hash's to check. The modification time is recorded (and restored) but not
    /// compared: a team's other checkouts get the same bytes with times of their own, the bytes
    /// that run are a snapshot of the hashed ones, and no confined process can change a
    /// trusted file's time (the workspace is read-only in its view).
    pub fn metadata_drift(&self, trusted: &SkillTree) -> Option<String> {
        trusted.files.iter().find_map(|was| {
            let was_meta = was.meta?;
            let now = self.files.iter().find(|f| f.path == was.path)?.meta?;
            let path = format!("{}/{}", trusted.folder, was.path);
            if now.mode != was_meta.mode {
                Some(format!(
                    "the mode of {path} changed from {:04o} to {:04o}",
                    was_meta.mode, now.mode
                ))
            } else {
                None
            }
        })
    }

    /// Writes the tree into the workspace at `root`: the proposal file, and the folder made to
    /// hold exactly these files (others that the hash would cover are removed; excluded ones,
    /// such as caches, stay), each with its recorded mode and modification time. No path on the
    /// way may be a symlink.
    pub fn write_into(
        &self,
        root: &Path,
        is_excluded: impl Fn(&str) -> bool,
    ) -> Result<(), String> {
        let write = |relative: &str, bytes: &[u8], executable: bool| -> Result<(), String> {
            crate::sandbox::destination(root, relative)?;
            crate::sandbox::write_beneath(root, relative, bytes, executable)
                .map_err(|e| format!("failed to write {relative}: {e}"))
        };
        write(&self.proposal_path, &self.proposal, false)?;
        let folder = crate::sandbox::destination(root, &self.folder)?;
        if folder.is_dir() {
            for entry in walkdir::WalkDir::new(&folder).follow_links(false) {
                let entry = entry.map_err(|e| e.to_string())?;
                let relative = entry
                    .path()
                    .strip_prefix(&folder)
                    .expect("walkdir yields paths under its root")
                    .to_string_lossy()
                    .into_owned();
                let kept = self.files.iter().any(|f| f.path == relative);
                let unwanted = entry.file_type().is_symlink()
                    || (entry.file_type().is_file() && !kept && !is_excluded(&relative));
                if unwanted {
                    std::fs::remove_file(entry.path())
                        .map_err(|e| format!("failed to remove {}: {e}", entry.path().display()))?;
                }
            }
        }
        for file in &self.files {
            let relative = format!("{}/{}", self.folder, file.path);
            write(&relative, &file.bytes, file.executable)?;
            if let Some(meta) = &file.meta {
                meta.apply(&root.join(&relative))
                    .map_err(|e| format!("failed to set the mode and time of {relative}: {e}"))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree() -> SkillTree {
        SkillTree {
            proposal_path: "proposals/demo.toml".into(),
            proposal: b"name = \"demo\"\n".to_vec(),
            folder: "skills/demo".into(),
            files: vec![
                TreeFile {
                    path: "run.sh".into(),
                    bytes: b"#!/bin/sh\n".to_vec(),
                    executable: true,
                    meta: Some(FileMeta {
                        mode: 0o750,
                        mtime: (1_700_000_000, 5),
                    }),
                },
                TreeFile {
                    path: "skill.py".into(),
                    bytes: b"def run(d): return d\n".to_vec(),
                    executable: false,
                    meta: None,
                },
            ],
        }
    }

    #[test]
    fn a_stored_tree_comes_back_byte_for_byte_and_a_damaged_one_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let store = ArtifactStore::open(&dir.path().join("store")).unwrap();
        let tree = tree();
        let stored = tree.store(&store).unwrap();
        assert_eq!(stored[0].kind, "SKILL_TREE");
        let loaded = SkillTree::load(&store, &stored[0].sha256, &tree.hash()).unwrap();
        assert_eq!(loaded.files, tree.files);
        assert_eq!(loaded.proposal, tree.proposal);
        assert!(SkillTree::load(&store, &stored[0].sha256, "sha256:other").is_err());

        let root = dir.path().join("workspace");
        std::fs::create_dir_all(root.join("skills/demo/__pycache__")).unwrap();
        std::fs::write(root.join("skills/demo/skill.py"), "import os\n").unwrap();
        std::fs::write(root.join("skills/demo/extra.py"), "x = 1\n").unwrap();
        std::fs::write(root.join("skills/demo/__pycache__/c.pyc"), "c").unwrap();
        loaded
            .write_into(&root, |path| path.starts_with("__pycache__/"))
            .unwrap();
        assert_eq!(
            std::fs::read(root.join("skills/demo/skill.py")).unwrap(),
            b"def run(d): return d\n"
        );
        assert!(!root.join("skills/demo/extra.py").exists());
        assert!(root.join("skills/demo/__pycache__/c.pyc").exists());
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(root.join("skills/demo/run.sh"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o7777, 0o750, "the recorded mode was not put back");
        let written = std::fs::read_dir(root.join("skills/demo"))
            .unwrap()
            .flatten()
            .find(|e| e.file_name() == "run.sh")
            .unwrap();
        assert_eq!(
            FileMeta::of(&written.metadata().unwrap()),
            loaded.files[0].meta.unwrap(),
            "the recorded modification time was not put back"
        );
        assert_eq!(
            std::fs::read(root.join("proposals/demo.toml")).unwrap(),
            tree.proposal
        );

        // One damaged file in the store, and nothing comes back.
        let file = store.path_of_sha256(&stored[2].sha256);
        let mut permissions = std::fs::metadata(&file).unwrap().permissions();
        permissions.set_mode(0o644);
        std::fs::set_permissions(&file, permissions).unwrap();
        std::fs::write(&file, "#!/bin/sh\nrm -rf ~\n").unwrap();
        let error = SkillTree::load(&store, &stored[0].sha256, &tree.hash()).unwrap_err();
        assert!(error.contains("was altered"), "{error}");
    }
}
