//! An import's files on their way in. `kavi skill import` writes a bundle's files into the
//! workspace before its import pipeline decides on them; the files it wrote go back out when the
//! pipeline does not promote the skill. A kavi killed in between would leave them for the next
//! forge to take as the workspace's own, so the list of what is about to be written is kept
//! first, in kavi's state folder (no builder, gate or skill writes there), and held locked while
//! the import runs. A list nobody holds belongs to an import that died: the next import or run
//! takes its files back out, unless the skill was promoted after all.

use std::fs::File;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::config::Workspace;
use crate::hash::sha256_hex;
use crate::ledger::{Ledger, LedgerError};
use crate::skill::TRUSTED;
use crate::{GovernanceError, Result};

/// Where the lists are: beside the ledger and artifacts, in the workspace's state folder.
fn lists_folder(workspace: &Workspace) -> PathBuf {
    workspace.root.join(".kavi").join("imports")
}

/// One file an import writes: where, and what it holds (so a file changed since is not taken).
#[derive(Debug, Serialize, Deserialize)]
struct Written {
    path: PathBuf,
    sha256: String,
}

#[derive(Debug, Serialize, Deserialize)]
struct List {
    skill: String,
    files: Vec<Written>,
}

/// The files of an import in progress, listed and held until [`PendingImport::settle`].
#[derive(Debug)]
pub struct PendingImport {
    list: PathBuf,
    files: Vec<PathBuf>,
    // Held for the import's life: the lock says the import is alive.
    _held: File,
}

impl PendingImport {
    /// Lists `files` (absolute paths with the bytes about to be written there) for `skill`,
    /// and holds the list, before anything is written.
    pub fn begin(workspace: &Workspace, skill: &str, files: &[(PathBuf, &[u8])]) -> Result<Self> {
        let io = |context: String| move |source| GovernanceError::Io { context, source };
        let folder = lists_folder(workspace);
        // Closed to the accounts that may not write kavi's state: one that could open a list
        // could hold its lock and refuse every import of that skill.
        kavi_foundation::sandbox::lock_folder(&folder)
            .map_err(io(format!("failed to make {}", folder.display())))?;
        let list = folder.join(format!("{skill}.json"));
        let body = List {
            skill: skill.to_owned(),
            files: files
                .iter()
                .map(|(path, bytes)| Written {
                    path: path.clone(),
                    sha256: sha256_hex(bytes),
                })
                .collect(),
        };
        let held = hold(&list)?;
        serde_json::to_writer(&held, &body)
            .map_err(std::io::Error::from)
            .and_then(|()| held.sync_all())
            .map_err(io(format!("failed to write {}", list.display())))?;
        Ok(Self {
            list,
            files: files.iter().map(|(path, _)| path.clone()).collect(),
            _held: held,
        })
    }

    /// The files the import writes.
    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }

    /// The import is over (promoted, or its files taken back out): the list goes.
    pub fn settle(self) {
        let _ = std::fs::remove_file(&self.list);
    }
}

/// Opens the list at `list` and holds it, emptied, for one import. Never emptied before it is
/// held (a running import's list would be lost with it), and refused while another import of
/// the same skill holds it. A list its import removed between the open and the lock is not the
/// one at `list` any more: opened again.
fn hold(list: &Path) -> Result<File> {
    use std::os::unix::fs::MetadataExt as _;
    let io = |context: &str| {
        let context = format!("failed to {context} {}", list.display());
        move |source| GovernanceError::Io { context, source }
    };
    loop {
        let held = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(list)
            .map_err(io("write"))?;
        match held.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(GovernanceError::Io {
                    context: format!(
                        "another import of this skill is running (it holds {})",
                        list.display()
                    ),
                    source: std::io::Error::from(std::io::ErrorKind::ResourceBusy),
                });
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(io("lock")(e)),
        }
        let ours = held.metadata().map_err(io("read"))?;
        let there = std::fs::symlink_metadata(list).ok();
        if there.is_some_and(|there| (there.dev(), there.ino()) == (ours.dev(), ours.ino())) {
            held.set_len(0).map_err(io("write"))?;
            return Ok(held);
        }
    }
}

/// Takes back out the files of imports that died before they settled: every list nobody holds
/// whose skill is not TRUSTED. A file is removed only while it holds what the import wrote.
/// Returns the files removed.
pub fn settle_abandoned(workspace: &Workspace, ledger: &Ledger) -> Result<Vec<PathBuf>> {
    let folder = lists_folder(workspace);
    let entries = match std::fs::read_dir(&folder) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(GovernanceError::Io {
                context: format!("failed to read {}", folder.display()),
                source,
            });
        }
    };
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(file) = File::open(&path) else {
            continue;
        };
        // Held: its import is running.
        if file.try_lock().is_err() {
            continue;
        }
        let Ok(list) = serde_json::from_reader::<_, List>(&file) else {
            // Cut short before its first byte was synced: nothing was written after it.
            let _ = std::fs::remove_file(&path);
            continue;
        };
        let promoted = match ledger.skill(&list.skill) {
            Ok(skill) => skill.state == TRUSTED,
            Err(LedgerError::SkillNotFound(_)) => false,
            Err(e) => return Err(e.into()),
        };
        if !promoted {
            for written in &list.files {
                if is_import_file(workspace, &written.path)
                    && is_unchanged(&written.path, &written.sha256)
                {
                    let _ = std::fs::remove_file(&written.path);
                    removed.push(written.path.clone());
                }
            }
        }
        let _ = std::fs::remove_file(&path);
    }
    Ok(removed)
}

/// Whether `path` is where an import writes: beneath the workspace, outside kavi's state and
/// git's, reached through no link. A list is kavi's own, but what it names is checked again
/// before anything is removed.
fn is_import_file(workspace: &Workspace, path: &Path) -> bool {
    let Ok(relative) = path.strip_prefix(&workspace.root) else {
        return false;
    };
    let mut parts = relative.components();
    let plain = relative
        .components()
        .all(|part| matches!(part, std::path::Component::Normal(_)));
    let outside_state = parts.next().is_some_and(|first| {
        ![".kavi", ".git"].contains(&first.as_os_str().to_str().unwrap_or(""))
    });
    let unlinked = match (workspace.root.canonicalize(), relative.parent()) {
        (Ok(real_root), Some(folder)) => path
            .parent()
            .and_then(|parent| parent.canonicalize().ok())
            .is_some_and(|real| real == real_root.join(folder)),
        _ => false,
    };
    plain && outside_state && unlinked
}

/// Whether `path` is still the regular file the import wrote (no link, same bytes).
fn is_unchanged(path: &Path, sha256: &str) -> bool {
    path.symlink_metadata().is_ok_and(|meta| meta.is_file())
        && std::fs::read(path).is_ok_and(|bytes| sha256_hex(&bytes) == sha256)
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use super::hold;

    /// A second import of a skill whose list is held is refused, and the list it found is left
    /// as the running import wrote it; once that import is gone, the list is held again.
    #[test]
    fn a_held_list_is_neither_emptied_nor_shared() {
        let folder = tempfile::tempdir().unwrap();
        let list = folder.path().join("demo.json");
        let mut first = hold(&list).unwrap();
        first.write_all(b"{\"skill\": \"demo\"}").unwrap();
        let second = hold(&list).unwrap_err().to_string();
        assert!(
            second.contains("another import of this skill is running"),
            "{second}"
        );
        assert_eq!(std::fs::read(&list).unwrap(), b"{\"skill\": \"demo\"}");
        // The first import settles: its list goes, and the next one holds a new one.
        std::fs::remove_file(&list).unwrap();
        drop(first);
        let third = hold(&list).unwrap();
        assert_eq!(third.metadata().unwrap().len(), 0);
        assert!(list.exists());
    }
}
