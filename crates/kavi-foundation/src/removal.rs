//! Removing a tree an untrusted process made, or can still write: through descriptors, never
//! by path. Each folder is opened from the one above it refusing a link, so a folder swapped for
//! a link while the removal runs is refused, never followed out of the tree; and a tree of any
//! depth is removed with at most [`DEPTH`] descriptors and stack frames (a folder deeper than
//! that is moved up to the top first), where `std::fs::remove_dir_all` holds one descriptor per
//! level and fails at the open-file limit, or overflows its stack, on a deep enough tree.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Component, Path};

use nix::fcntl::{AtFlags, OFlag, RenameFlags, openat, renameat2};
use nix::sys::stat::{Mode, SFlag, fchmod, fstatat};
use nix::unistd::{UnlinkatFlags, unlinkat};

/// How many folders deep a removal descends before it moves what lies below to the top.
const DEPTH: usize = 48;

/// The prefix of the names a deep folder is moved up to the top under.
const MOVED: &str = ".kavi-removing-";

fn io_error(errno: nix::errno::Errno) -> io::Error {
    io::Error::from_raw_os_error(errno as i32)
}

/// Opens the folder `name` in `parent`, refusing a link; one its maker left without read or
/// search permission is given them first (through an `O_PATH` descriptor, so that the change
/// lands on the folder that was opened, never on what a link would name).
fn open_folder(parent: BorrowedFd<'_>, name: &OsStr) -> io::Result<OwnedFd> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    match openat(parent, name, flags, Mode::empty()) {
        Err(nix::errno::Errno::EACCES) => {
            let path = openat(
                parent,
                name,
                OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
            .map_err(io_error)?;
            let proc = format!("/proc/self/fd/{}", path.as_raw_fd());
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&proc, std::fs::Permissions::from_mode(0o700))?;
            openat(path.as_fd(), ".", flags, Mode::empty()).map_err(io_error)
        }
        opened => opened.map_err(io_error),
    }
}

/// The names `dir` holds, read whole before anything is removed or moved into it (listed through
/// the descriptor's own entry in `/proc`, which leads to the folder opened, not to a path).
fn names(dir: &OwnedFd) -> io::Result<Vec<OsString>> {
    std::fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd()))?
        .map(|entry| entry.map(|entry| entry.file_name()))
        .collect()
}

/// Empties the folder `dir`, `depth` below `top`; a folder it holds at [`DEPTH`] is moved into
/// `top` under a fresh name, added to `moved` for the caller to empty in turn.
fn empty(
    dir: &OwnedFd,
    depth: usize,
    top: BorrowedFd<'_>,
    moved: &mut Vec<OsString>,
) -> io::Result<()> {
    // A folder its maker left without write permission cannot lose its entries.
    let _ = fchmod(dir.as_fd(), Mode::from_bits_truncate(0o700));
    for name in names(dir)? {
        let stat = match fstatat(dir.as_fd(), name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
            Err(nix::errno::Errno::ENOENT) => continue,
            stat => stat.map_err(io_error)?,
        };
        let is_folder = SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR;
        if !is_folder {
            match unlinkat(dir.as_fd(), name.as_os_str(), UnlinkatFlags::NoRemoveDir) {
                Err(nix::errno::Errno::ENOENT) | Ok(()) => {}
                Err(e) => return Err(io_error(e)),
            }
        } else if depth + 1 >= DEPTH {
            moved.push(move_up(dir.as_fd(), &name, top)?);
        } else {
            let sub = open_folder(dir.as_fd(), &name)?;
            empty(&sub, depth + 1, top, moved)?;
            drop(sub);
            unlinkat(dir.as_fd(), name.as_os_str(), UnlinkatFlags::RemoveDir).map_err(io_error)?;
        }
    }
    Ok(())
}

/// Moves the folder `name` of `dir` into `top` under a name nothing there has (never replacing
/// an entry, whoever made it); returns that name.
fn move_up(dir: BorrowedFd<'_>, name: &OsStr, top: BorrowedFd<'_>) -> io::Result<OsString> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let fresh = OsString::from(format!("{MOVED}{}-{n}", std::process::id()));
        match renameat2(
            dir,
            name,
            top,
            fresh.as_os_str(),
            RenameFlags::RENAME_NOREPLACE,
        ) {
            Err(nix::errno::Errno::EEXIST) => continue,
            moved => return moved.map(|()| fresh).map_err(io_error),
        }
    }
}

/// Removes the entry `name` of the folder `parent` and, for a folder, everything beneath it,
/// without following a link anywhere. A link is removed as a link. Nothing there: done.
pub fn remove_at(parent: BorrowedFd<'_>, name: &OsStr) -> io::Result<()> {
    let top = match open_folder(parent, name) {
        Ok(top) => top,
        // Not a folder (a file, a link): it goes alone.
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(nix::libc::ENOTDIR | nix::libc::ELOOP)
            ) =>
        {
            return match unlinkat(parent, name, UnlinkatFlags::NoRemoveDir) {
                Err(nix::errno::Errno::ENOENT) | Ok(()) => Ok(()),
                Err(e) => Err(io_error(e)),
            };
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    let mut moved = Vec::new();
    empty(&top, 0, top.as_fd(), &mut moved)?;
    while let Some(name) = moved.pop() {
        let sub = open_folder(top.as_fd(), &name)?;
        empty(&sub, 1, top.as_fd(), &mut moved)?;
        drop(sub);
        unlinkat(top.as_fd(), name.as_os_str(), UnlinkatFlags::RemoveDir).map_err(io_error)?;
    }
    drop(top);
    match unlinkat(parent, name, UnlinkatFlags::RemoveDir) {
        Err(nix::errno::Errno::ENOENT) | Ok(()) => Ok(()),
        Err(e) => Err(io_error(e)),
    }
}

/// Removes `path` and everything beneath it ([`remove_at`] in its parent folder, which is opened
/// by path: kavi's own folders lead to it).
pub fn remove_tree(path: &Path) -> io::Result<()> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(io::Error::other(format!(
            "{} names no entry to remove",
            path.display()
        )));
    };
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    let parent = match std::fs::File::open(parent) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        parent => parent?,
    };
    remove_at(parent.as_fd(), name)
}

/// Opens the folder `relative` beneath the open folder `root`, one component at a time, each
/// refusing a link: what a process that can write beneath `root` swaps in is never followed out
/// of it. `relative` holds plain names only.
pub fn open_beneath(root: BorrowedFd<'_>, relative: &Path) -> io::Result<OwnedFd> {
    let mut dir = open_folder(root, OsStr::new("."))?;
    for component in relative.components() {
        let Component::Normal(name) = component else {
            return Err(io::Error::other(format!(
                "{} is not a plain path beneath its folder",
                relative.display()
            )));
        };
        dir = open_folder(dir.as_fd(), name)?;
    }
    Ok(dir)
}

/// How long a path from `/` to anything in a folder a process was given to write may be: half
/// of `PATH_MAX`, so that the same file still has a name once its folder is copied or mounted
/// under a longer one (a sandbox, a view).
pub const NAMEABLE: usize = 2048;

/// Removes from the folder `top` whatever lies too deep to be named by a path of at most
/// [`NAMEABLE`] bytes, and returns what was removed, each relative to `top` (a folder goes
/// whole). A process that may write a folder can nest one as deep as it likes, and what no path
/// can name, nothing that walks or copies by path can read: every later look at the workspace
/// would fail. Each folder is opened from `top` down, refusing links, one at a time.
pub fn remove_unnameable(top: &Path) -> io::Result<Vec<std::path::PathBuf>> {
    let root = std::fs::File::open(top)?;
    let base = top.as_os_str().len();
    let mut removed = Vec::new();
    let mut folders = vec![std::path::PathBuf::new()];
    while let Some(relative) = folders.pop() {
        let dir = match open_beneath(root.as_fd(), &relative) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            dir => dir?,
        };
        for name in names(&dir)? {
            let path = relative.join(&name);
            if base + 1 + path.as_os_str().len() > NAMEABLE {
                remove_at(dir.as_fd(), &name)?;
                removed.push(path);
                continue;
            }
            match fstatat(dir.as_fd(), name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
                Err(nix::errno::Errno::ENOENT) => {}
                Err(e) => return Err(io_error(e)),
                Ok(stat)
                    if SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT
                        == SFlag::S_IFDIR =>
                {
                    folders.push(path);
                }
                Ok(_) => {}
            }
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_deeper_than_the_open_file_limit_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let top = dir.path().join("deep");
        std::fs::create_dir(&top).unwrap();
        // Made through descriptors: the path of the bottom is far past PATH_MAX.
        let mut here = std::fs::File::open(&top).unwrap();
        for _ in 0..3000 {
            nix::sys::stat::mkdirat(here.as_fd(), "d", Mode::from_bits_truncate(0o700)).unwrap();
            std::fs::write(format!("/proc/self/fd/{}/f", here.as_raw_fd()), b"x").unwrap();
            here = std::fs::File::from(open_folder(here.as_fd(), OsStr::new("d")).unwrap());
        }
        drop(here);
        // Below the depth, with fewer descriptors than levels: std's removal would fail.
        let (soft, hard) =
            nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).unwrap();
        nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, 1024, hard)
            .unwrap();
        let removed = remove_tree(&top);
        nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, soft, hard)
            .unwrap();
        removed.unwrap();
        assert!(!top.exists());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    /// What lies past the nameable length goes, whole, and nothing else: a long-named folder
    /// and what is under it, but not its shallower siblings, and a link is never followed.
    #[test]
    fn what_no_path_can_name_is_removed_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let top = dir.path().join("scope");
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("kept"), b"x").unwrap();
        let long = "n".repeat(200);
        let mut here = top.clone();
        std::fs::create_dir_all(&here).unwrap();
        std::fs::write(here.join("shallow"), b"x").unwrap();
        let mut first_too_deep = None;
        let mut made = std::path::PathBuf::new();
        for _ in 0..12 {
            here = here.join(&long);
            made = made.join(&long);
            std::fs::create_dir(&here).unwrap();
            std::os::unix::fs::symlink(&outside, here.join("link")).unwrap();
            if first_too_deep.is_none() && here.as_os_str().len() > NAMEABLE {
                first_too_deep = Some(made.clone());
            }
        }
        let removed = remove_unnameable(&top).unwrap();
        let first_too_deep = first_too_deep.unwrap();
        assert!(removed.contains(&first_too_deep), "{removed:?}");
        assert!(
            removed
                .iter()
                .all(|path| top.join(path).as_os_str().len() > NAMEABLE)
        );
        assert!(!top.join(&first_too_deep).exists());
        assert!(top.join(first_too_deep.parent().unwrap()).is_dir());
        assert!(top.join("shallow").exists());
        assert!(outside.join("kept").exists());
        assert!(remove_unnameable(&top).unwrap().is_empty());
    }

    #[test]
    fn a_link_is_removed_as_a_link_and_never_followed() {
        let dir = tempfile::tempdir().unwrap();
        let outside = dir.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("HEAD"), "keep").unwrap();
        let tree = dir.path().join("tree");
        std::fs::create_dir_all(tree.join("a")).unwrap();
        std::os::unix::fs::symlink(&outside, tree.join("a/link")).unwrap();
        remove_tree(&tree).unwrap();
        assert!(!tree.exists());
        assert_eq!(
            std::fs::read_to_string(outside.join("HEAD")).unwrap(),
            "keep"
        );
        // A link where a folder was expected beneath a root is refused, not followed.
        std::fs::create_dir(&tree).unwrap();
        std::os::unix::fs::symlink(&outside, tree.join("swapped")).unwrap();
        let root = std::fs::File::open(&tree).unwrap();
        let refused = open_beneath(root.as_fd(), Path::new("swapped")).unwrap_err();
        assert!(
            matches!(
                refused.raw_os_error(),
                Some(nix::libc::ENOTDIR | nix::libc::ELOOP)
            ),
            "{refused}"
        );
    }

    #[test]
    fn folders_left_without_permissions_are_removed() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let tree = dir.path().join("tree");
        std::fs::create_dir_all(tree.join("locked/inner")).unwrap();
        std::fs::write(tree.join("locked/inner/f"), "x").unwrap();
        for folder in ["locked/inner", "locked"] {
            std::fs::set_permissions(tree.join(folder), std::fs::Permissions::from_mode(0o000))
                .unwrap();
        }
        remove_tree(&tree).unwrap();
        assert!(!tree.exists());
    }
}
