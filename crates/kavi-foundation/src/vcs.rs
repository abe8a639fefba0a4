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

/// Makes `state`, one of [`states`] of `root`, inert: a [`VCS_STATE`] folder or file is
/// removed, and a folder git could take for a repository loses its `HEAD` and `config`. Acted on
/// through descriptors opened from `root` down, each refusing a link
/// ([`crate::removal::open_beneath`]): a process that can still write beneath `root` and swaps
/// a folder on the way for a link to elsewhere gets a refusal, never a removal out there.
pub fn remove(root: &Path, state: &Path) -> io::Result<()> {
    use std::os::fd::AsFd;
    let relative = state.strip_prefix(root).map_err(|_| {
        io::Error::other(format!(
            "{} is not beneath {}",
            state.display(),
            root.display()
        ))
    })?;
    let root = std::fs::File::open(root)?;
    let within = |relative: &Path| match crate::removal::open_beneath(root.as_fd(), relative) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        opened => opened.map(Some),
    };
    if let (Some(name), Some(parent)) = (relative.file_name(), relative.parent())
        && VCS_STATE.iter().any(|state| name == *state)
    {
        return match within(parent)? {
            Some(parent) => crate::removal::remove_at(parent.as_fd(), name),
            None => Ok(()),
        };
    }
    let Some(folder) = within(relative)? else {
        return Ok(());
    };
    for name in ["HEAD", "config"] {
        crate::removal::remove_at(folder.as_fd(), name.as_ref())?;
    }
    Ok(())
}

/// Removes every version-control state under `dir` ([`states`], then [`remove`] for each).
pub fn neutralise(dir: &Path) -> io::Result<()> {
    for state in states(dir)? {
        remove(dir, &state)?;
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

    /// A state found, then its folder swapped for a link to elsewhere before it is removed (a
    /// process that can still write there races the check): the removal is refused, and what
    /// the link names is untouched.
    #[test]
    fn a_folder_swapped_for_a_link_after_the_look_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let (scope, victim) = (dir.path().join("scope"), dir.path().join("victim"));
        for folder in [
            scope.join("repo"),
            scope.join("deep/x/.git"),
            victim.join(".git"),
        ] {
            std::fs::create_dir_all(folder).unwrap();
        }
        for file in ["HEAD", "config"] {
            std::fs::write(scope.join("repo").join(file), "").unwrap();
            std::fs::write(victim.join(".git").join(file), "keep").unwrap();
        }
        let found = states(&scope).unwrap();
        assert_eq!(found.len(), 2, "{found:?}");
        std::fs::remove_dir_all(scope.join("repo")).unwrap();
        std::os::unix::fs::symlink(victim.join(".git"), scope.join("repo")).unwrap();
        std::fs::remove_dir_all(scope.join("deep/x")).unwrap();
        std::os::unix::fs::symlink(&victim, scope.join("deep/x")).unwrap();
        for state in &found {
            assert!(remove(&scope, state).is_err(), "{}", state.display());
        }
        for file in ["HEAD", "config"] {
            assert_eq!(
                std::fs::read_to_string(victim.join(".git").join(file)).unwrap(),
                "keep"
            );
        }
    }
}
