//! A trusted skill's snapshot: the files its source hash covers, written read-only into a fresh
//! folder kavi owns, hashed again there, and run from there.
//!
//! Running from the workspace path left a gap between hashing a file and the interpreter opening
//! it (a loop rewriting `skill.py` won that race), and let files the hash leaves out (`*.pyc`,
//! `__pycache__/`) sit beside the trusted ones. A snapshot holds the bytes that were hashed, in
//! memory, and nothing else: an excluded file never reaches it.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::trust::{SkillTree, read_folder};

/// The skill's folder at `path()/folder()`, exactly the trusted files, read-only.
#[derive(Debug)]
pub struct Snapshot {
    dir: kavi_foundation::sandbox::PrivateFolder,
    folder: String,
    /// The proposal's text, which the source hash covers but the snapshot does not hold.
    proposal: Vec<u8>,
    hash: String,
}

impl Snapshot {
    /// Writes `tree`'s folder into a new private folder and checks that it hashes to `hash`.
    /// `track` writes the new folder down before anything is put in it (see
    /// [`crate::ledger::Owner::track`]).
    pub fn make(
        tree: &SkillTree,
        hash: &str,
        track: impl FnOnce(&std::path::Path) -> std::io::Result<()>,
    ) -> Result<Self, String> {
        Self::make_in(Self::new_folder(track)?, tree, hash)
    }

    /// A new, empty private folder for a snapshot; `track` writes it down before anything is
    /// put in it (see [`crate::ledger::Owner::track`]).
    pub fn new_folder(
        track: impl FnOnce(&std::path::Path) -> std::io::Result<()>,
    ) -> Result<kavi_foundation::sandbox::PrivateFolder, String> {
        kavi_foundation::sandbox::private_folder(&std::env::temp_dir(), "kavi-snapshot-")
            .and_then(|dir| track(dir.path()).map(|()| dir))
            .map_err(|e| format!("cannot make the snapshot folder: {e}"))
    }

    /// [`Snapshot::make`] into `dir`, an empty folder from [`Snapshot::new_folder`]: one that a
    /// sandbox started before its skill was known already shows, read-only, where the skill's
    /// files are expected.
    pub fn make_in(
        dir: kavi_foundation::sandbox::PrivateFolder,
        tree: &SkillTree,
        hash: &str,
    ) -> Result<Self, String> {
        Self::make_with(dir, tree, hash, |_| Ok(()))
    }

    /// A snapshot laid out as the workspace is, for the gates to judge exactly the bytes that
    /// were hashed, under exactly the rules that were recorded: the skill's folder and its
    /// proposal, and every file of `governed` (path beneath the workspace, text: the texts the
    /// run recorded as governing it), each a read-only copy, and nothing else of the workspace.
    /// A file swapped in the workspace while the gates run, a tool's configuration included, is
    /// not what they read; nor is one nothing records (a `string.pyi` at the workspace's root,
    /// which mypy would take for the standard library's).
    pub fn make_view(
        tree: &SkillTree,
        hash: &str,
        track: impl FnOnce(&std::path::Path) -> std::io::Result<()>,
        governed: &[(String, String)],
    ) -> Result<Self, String> {
        Self::make_with(Self::new_folder(track)?, tree, hash, |root| {
            write_read_only(root, &tree.proposal_path, &tree.proposal, false).map_err(|e| {
                format!("cannot write {} into the snapshot: {e}", tree.proposal_path)
            })?;
            let own = |path: &str| {
                Path::new(path)
                    .components()
                    .next()
                    .map(|c| c.as_os_str().to_owned())
            };
            let folder = own(&tree.folder);
            for (path, text) in governed {
                // The skill's own files are the hashed ones, whatever else names them.
                if own(path) == folder || *path == tree.proposal_path {
                    continue;
                }
                write_read_only(root, path, text.as_bytes(), false)
                    .map_err(|e| format!("cannot write {path} into the snapshot: {e}"))?;
            }
            Ok(())
        })
    }

    fn make_with(
        dir: kavi_foundation::sandbox::PrivateFolder,
        tree: &SkillTree,
        hash: &str,
        beside: impl FnOnce(&Path) -> Result<(), String>,
    ) -> Result<Self, String> {
        let root = dir.path().join(&tree.folder);
        std::fs::create_dir_all(&root)
            .map_err(|e| format!("cannot make {}: {e}", root.display()))?;
        for file in &tree.files {
            write_read_only(&root, &file.path, &file.bytes, file.executable)
                .map_err(|e| format!("cannot write {} into the snapshot: {e}", file.path))?;
        }
        beside(dir.path())?;
        // Folders last, so that nothing more can be made in them.
        for entry in walkdir::WalkDir::new(dir.path()).contents_first(true) {
            let entry = entry.map_err(|e| e.to_string())?;
            if entry.file_type().is_dir() {
                set_mode(entry.path(), 0o555)?;
            }
        }
        let snapshot = Self {
            dir,
            folder: tree.folder.clone(),
            proposal: tree.proposal.clone(),
            hash: hash.to_owned(),
        };
        snapshot.check()?;
        Ok(snapshot)
    }

    /// Hashes the snapshot again: the error says it no longer holds the trusted bytes.
    pub fn check(&self) -> Result<(), String> {
        let files = read_folder(&self.folder_path(), &globset::GlobSet::empty())
            .map_err(|e| format!("the snapshot cannot be read: {e}"))?;
        let now = SkillTree {
            proposal_path: String::new(),
            proposal: self.proposal.clone(),
            folder: self.folder.clone(),
            files,
        }
        .hash();
        if now != self.hash {
            return Err(format!(
                "its snapshot hashes to {now}, not to the trusted {}",
                self.hash
            ));
        }
        Ok(())
    }

    /// The snapshot's root: the skill's folder lies at the same relative path under it as
    /// under the workspace.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The skill's folder, relative to the workspace and to [`Snapshot::path`].
    pub fn folder(&self) -> &str {
        &self.folder
    }

    fn folder_path(&self) -> PathBuf {
        self.dir.path().join(&self.folder)
    }
}

impl Drop for Snapshot {
    /// Folders are made writable again so that the snapshot can be removed by a user that
    /// permissions bind (root removes it regardless).
    fn drop(&mut self) {
        for entry in walkdir::WalkDir::new(self.dir.path())
            .into_iter()
            .flatten()
            .filter(|e| e.file_type().is_dir())
        {
            let _ = set_mode(entry.path(), 0o700);
        }
    }
}

/// A new file (never one already there) at `relative` under `root`, mode 0444 or 0555.
fn write_read_only(
    root: &Path,
    relative: &str,
    bytes: &[u8],
    executable: bool,
) -> std::io::Result<()> {
    if let Some(reason) = crate::sandbox::unsafe_path_reason(relative) {
        return Err(std::io::Error::other(reason));
    }
    let path = root.join(relative);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let mut file = std::fs::File::create_new(&path)?;
    file.write_all(bytes)?;
    let mode = if executable { 0o555 } else { 0o444 };
    file.set_permissions(std::fs::Permissions::from_mode(mode))
}

fn set_mode(path: &Path, mode: u32) -> Result<(), String> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| format!("cannot set the mode of {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::super::trust::TreeFile;
    use super::*;

    fn tree() -> SkillTree {
        SkillTree {
            proposal_path: "proposals/demo.toml".into(),
            proposal: b"name = \"demo\"\n".to_vec(),
            folder: "skills/demo".into(),
            files: vec![
                TreeFile {
                    path: "lib/helper.py".into(),
                    bytes: b"X = 1\n".to_vec(),
                    executable: false,
                    meta: None,
                },
                TreeFile {
                    path: "run.sh".into(),
                    bytes: b"#!/bin/sh\n".to_vec(),
                    executable: true,
                    meta: None,
                },
            ],
        }
    }

    #[test]
    fn a_snapshot_holds_exactly_the_trusted_files_read_only_and_notices_a_change() {
        let tree = tree();
        let snapshot = Snapshot::make(&tree, &tree.hash(), |_| Ok(())).unwrap();
        let folder = snapshot.path().join("skills/demo");
        let mut found: Vec<String> = walkdir::WalkDir::new(snapshot.path())
            .into_iter()
            .map(|e| e.unwrap())
            .filter(|e| !e.file_type().is_dir())
            .map(|e| {
                e.path()
                    .strip_prefix(snapshot.path())
                    .unwrap()
                    .display()
                    .to_string()
            })
            .collect();
        found.sort();
        assert_eq!(found, ["skills/demo/lib/helper.py", "skills/demo/run.sh"]);
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&folder.join("lib/helper.py")), 0o444);
        assert_eq!(mode(&folder.join("run.sh")), 0o555);
        assert_eq!(mode(&folder.join("lib")), 0o555);
        assert_eq!(mode(&folder), 0o555);

        // Whoever can still write there (root can) is caught by the check before a run.
        set_mode(&folder, 0o755).unwrap();
        std::fs::write(folder.join("json.py"), "raise SystemExit(7)\n").unwrap();
        let error = snapshot.check().unwrap_err();
        assert!(error.contains("not to the trusted"), "{error}");

        let path = snapshot.path().to_owned();
        drop(snapshot);
        assert!(!path.exists(), "the snapshot outlived its runs");
    }

    #[test]
    fn a_tree_that_does_not_hash_to_the_trusted_hash_makes_no_snapshot() {
        let error = Snapshot::make(&tree(), "sha256:other", |_| Ok(())).unwrap_err();
        assert!(error.contains("not to the trusted sha256:other"), "{error}");
    }
}
