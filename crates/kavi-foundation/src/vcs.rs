//! Version control's state in a folder a person may look at with their own tools: its
//! configuration and hooks run as that person (`core.fsmonitor` on `git status`, Mercurial's
//! `pre-status` hook), so a folder an untrusted process could write must hold none it made.

use std::io;
use std::path::{Path, PathBuf};

/// What version control reads configuration and hooks from, which runs commands when a person
/// runs its `status` there: git (`core.fsmonitor`, hooks, a `gitdir:` file) and Mercurial
/// (`[hooks] pre-status`, `[extensions]`), and the others of their kind.
pub const VCS_STATE: &[&str] = &[".git", ".hg", ".jj", ".svn", ".bzr"];

/// Whether git could take `dir` for a repository by what it holds, whatever its name (a bare
/// one, or one whose `config` names a work tree): it holds a `HEAD` that is not a folder. Git
/// needs one, and takes a link as well as a file (`HEAD -> refs/heads/main`); it follows links
/// to `objects` and `refs` too, and a `commondir` file can name them elsewhere, so nothing but
/// the `HEAD` is asked for.
pub fn holds_a_repository(dir: &Path) -> bool {
    dir.join("HEAD")
        .symlink_metadata()
        .is_ok_and(|m| !m.is_dir())
}

/// Every version-control state under `dir` (links not followed, `dir` itself not counted as a
/// [`VCS_STATE`] entry): each [`VCS_STATE`] folder or file, and each folder git could take for a
/// repository by what it holds ([`holds_a_repository`]), in the order a walk finds them.
pub fn states(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    let mut walk = walkdir::WalkDir::new(dir).follow_links(false).into_iter();
    while let Some(entry) = walk.next() {
        let entry = entry.map_err(io::Error::other)?;
        if entry.depth() > 0 && VCS_STATE.iter().any(|name| entry.file_name() == *name) {
            if entry.file_type().is_dir() {
                walk.skip_current_dir();
            }
            found.push(entry.path().to_owned());
        } else if entry.file_type().is_dir() && holds_a_repository(entry.path()) {
            found.push(entry.path().to_owned());
        }
    }
    Ok(found)
}

/// Makes `state`, one of [`states`], inert: a [`VCS_STATE`] folder or file is removed, and a
/// folder git could take for a repository loses its `HEAD` and `config`.
pub fn remove(state: &Path) -> io::Result<()> {
    let vcs = state
        .file_name()
        .is_some_and(|name| VCS_STATE.iter().any(|state| name == *state));
    let metadata = match state.symlink_metadata() {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        metadata => metadata?,
    };
    if !vcs {
        for name in ["HEAD", "config"] {
            match std::fs::remove_file(state.join(name)) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        return Ok(());
    }
    if metadata.is_dir() {
        crate::sandbox::remove(state)
    } else {
        std::fs::remove_file(state)
    }
}

/// Removes every version-control state under `dir` ([`states`], then [`remove`] for each).
pub fn neutralise(dir: &Path) -> io::Result<()> {
    for state in states(dir)? {
        remove(&state)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_layout_git_takes_for_a_repository_is_found_and_made_inert() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for folder in [
            "plain/.git/objects",
            "bare/objects",
            "bare/refs",
            "linked/refs",
        ] {
            std::fs::create_dir_all(root.join(folder)).unwrap();
        }
        std::fs::write(root.join("plain/.git/HEAD"), "ref: refs/heads/main\n").unwrap();
        std::fs::write(root.join("bare/HEAD"), "ref: refs/heads/main\n").unwrap();
        std::fs::write(root.join("bare/config"), "[core]\n").unwrap();
        std::os::unix::fs::symlink("refs/heads/main", root.join("linked/HEAD")).unwrap();
        std::fs::write(root.join("file.git"), "").unwrap();
        std::fs::write(root.join(".hg"), "").unwrap();
        let mut found = states(root).unwrap();
        found.sort();
        let expected: Vec<PathBuf> = [".hg", "bare", "linked", "plain/.git"]
            .iter()
            .map(|p| root.join(p))
            .collect();
        assert_eq!(found, expected);
        neutralise(root).unwrap();
        assert!(states(root).unwrap().is_empty());
        // Only version control's state goes.
        assert!(root.join("bare/objects").is_dir() && root.join("file.git").is_file());
    }
}
