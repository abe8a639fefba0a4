//! The workspace as a confined process sees it: a folder kavi builds from git's list of the
//! workspace's files ([`crate::git::listed`]), mounted read-only where the workspace is. Reads
//! are an allowlist: a file git ignores (a `.my.cnf`, a `terraform.tfstate`, whatever a person
//! keeps there untracked and ignored) is not in the list, so it is not in the folder, whatever
//! its name; `hide_matching` stays as a second layer. The folder is built from the list, never
//! from the workspace as it is when the process starts, so a file made after the list was taken
//! is not in it either.
//!
//! Each listed file is a hard link to the workspace's (a copy where the file system refuses the
//! link), reached one folder at a time without following a link, so a folder swapped for a
//! symlink after the listing leads nowhere. A symlink is linked as the link it is: the process
//! resolves it inside its own view, where an ignored target or a host file is not there.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat};
use nix::sys::stat::{Mode, SFlag, fstatat};

/// A workspace's view, built in a private folder removed when this is dropped.
#[derive(Debug)]
pub struct Listed {
    /// The workspace the view stands for.
    pub root: PathBuf,
    folder: tempfile::TempDir,
    /// How many listed files the view holds.
    pub files: usize,
}

impl Listed {
    /// The folder mounted in the workspace's place.
    pub fn folder(&self) -> &Path {
        self.folder.path()
    }

    /// Builds the view of `root` holding exactly `files` (relative paths, as git listed them)
    /// that are still regular files or symlinks there, and an empty folder or file at each of
    /// `mount_points` (absolute, under `root`) that the workspace has, for a write scope to be
    /// mounted on.
    pub fn build(root: &Path, files: &[PathBuf], mount_points: &[PathBuf]) -> io::Result<Self> {
        let folder = tempfile::Builder::new()
            .prefix("kavi-view-")
            .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .tempdir()?;
        let mut builder = Builder {
            source: Folders::new(root, false)?,
            dest: Folders::new(folder.path(), true)?,
        };
        let mut count = 0;
        for file in files {
            if builder.place(file)? {
                count += 1;
            }
        }
        for point in mount_points {
            let Ok(relative) = point.strip_prefix(root) else {
                continue;
            };
            let target = folder.path().join(relative);
            if relative.as_os_str().is_empty() || target.symlink_metadata().is_ok() {
                continue;
            }
            match point.symlink_metadata() {
                Ok(m) if m.is_dir() => std::fs::create_dir_all(&target)?,
                Ok(m) if m.is_file() => {
                    std::fs::create_dir_all(target.parent().unwrap_or(folder.path()))?;
                    std::fs::File::create(&target)?;
                }
                _ => {}
            }
        }
        Ok(Self {
            root: root.to_owned(),
            folder,
            files: count,
        })
    }
}

/// Folders below a root, each opened once, one component at a time.
struct Folders {
    root: OwnedFd,
    open: HashMap<PathBuf, OwnedFd>,
    /// Make a missing folder (the view) rather than refuse it (the workspace).
    make: bool,
}

impl Folders {
    fn new(root: &Path, make: bool) -> io::Result<Self> {
        let root = openat(
            nix::fcntl::AT_FDCWD,
            root,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Self {
            root,
            open: HashMap::new(),
            make,
        })
    }

    /// The folder `relative` (`""`: the root), or `None` where a component is missing or is
    /// not a folder (a link among them).
    fn get(&mut self, relative: &Path) -> io::Result<Option<&OwnedFd>> {
        if relative.as_os_str().is_empty() {
            return Ok(Some(&self.root));
        }
        if !self.open.contains_key(relative) {
            let parent = relative.parent().unwrap_or(Path::new(""));
            let name = relative.file_name().unwrap_or_default().to_owned();
            let make = self.make;
            let Some(above) = self.get(parent)? else {
                return Ok(None);
            };
            if make {
                match nix::sys::stat::mkdirat(above.as_fd(), name.as_os_str(), Mode::S_IRWXU) {
                    Ok(()) | Err(Errno::EEXIST) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
            match openat(above.as_fd(), name.as_os_str(), flags, Mode::empty()) {
                Ok(fd) => {
                    self.open.insert(relative.to_owned(), fd);
                }
                Err(Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP) if !make => return Ok(None),
                Err(e) => return Err(e.into()),
            }
        }
        Ok(self.open.get(relative))
    }
}

impl Folders {
    /// The listed file `relative` as it is now: its folder, its name and what it is, if it is
    /// still a file or symlink there (not a submodule's folder, a socket, or gone).
    fn listed<'r>(
        &mut self,
        relative: &'r Path,
    ) -> io::Result<Option<(OwnedFd, &'r OsStr, nix::sys::stat::FileStat)>> {
        let (Some(parent), Some(name)) = (relative.parent(), relative.file_name()) else {
            return Ok(None);
        };
        let Some(from) = self.get(parent)? else {
            return Ok(None);
        };
        let from = from.try_clone()?;
        let stat = match fstatat(from.as_fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(stat) => stat,
            Err(Errno::ENOENT | Errno::ENOTDIR) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let kind = SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT;
        Ok((kind == SFlag::S_IFREG || kind == SFlag::S_IFLNK).then_some((from, name, stat)))
    }
}

/// What a view of `root` built from `files` (git's list) would hold now, as a digest: each
/// listed path that is a file or symlink there, with its inode (and, for a file the view would
/// copy, its size and mtime). A view built earlier holds the same only while this is
/// unchanged: a file git no longer lists (ignored, removed from the index), one deleted, one
/// saved anew (a new inode, where the view's link still shows the old bytes) or a copied one
/// changed moves it. A linked file changed in place is shown as it is now.
pub fn stamp(root: &Path, files: &[PathBuf]) -> io::Result<String> {
    use std::os::unix::fs::MetadataExt as _;
    let mut source = Folders::new(root, false)?;
    // Where the view is built ([`Listed::build`]), and whether the kernel links another
    // account's file for this one (root may; `fs.protected_hardlinks` stops the others).
    let view_device = std::fs::metadata(std::env::temp_dir())?.dev();
    let uid = nix::unistd::getuid();
    let mut seen = Vec::new();
    for file in files {
        if let Some((_, _, stat)) = source.listed(file)? {
            seen.extend_from_slice(file.as_os_str().as_encoded_bytes());
            let mut entry = format!("\0{}:{}:{:o}", stat.st_dev, stat.st_ino, stat.st_mode);
            // A file the view holds as a copy (another file system, another account's file)
            // does not show a change in place, nor a file made anew on a reused inode: its
            // size and mtime count too. A linked one shows what the file holds now.
            let copied =
                stat.st_dev != view_device || (!uid.is_root() && stat.st_uid != uid.as_raw());
            if copied {
                entry.push_str(&format!(
                    ":{}:{}.{}",
                    stat.st_size, stat.st_mtime, stat.st_mtime_nsec
                ));
            }
            entry.push('\n');
            seen.extend_from_slice(entry.as_bytes());
        }
    }
    Ok(kavi_foundation::hash::sha256_hex(&seen))
}

struct Builder {
    source: Folders,
    dest: Folders,
}

impl Builder {
    /// Puts the listed file `relative` in the view; false when it is no longer there, or is
    /// no file or symlink (a submodule's folder, a socket).
    fn place(&mut self, relative: &Path) -> io::Result<bool> {
        let Some((from, name, stat)) = self.source.listed(relative)? else {
            return Ok(false);
        };
        let kind = SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT;
        let parent = relative.parent().unwrap_or(Path::new(""));
        let to = self
            .dest
            .get(parent)?
            .expect("the view's folders are made")
            .try_clone()?;
        // No AT_SYMLINK_FOLLOW: a symlink is linked as itself.
        match nix::unistd::linkat(from.as_fd(), name, to.as_fd(), name, AtFlags::empty()) {
            Ok(()) => Ok(true),
            // Another file system, or a file of another account the kernel will not link.
            Err(Errno::EXDEV | Errno::EPERM | Errno::EMLINK) => copy(&from, &to, name, kind),
            Err(Errno::ENOENT) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }
}

/// Copies `name` from the folder `from` into `to`, never following a link.
fn copy(from: &OwnedFd, to: &OwnedFd, name: &OsStr, kind: SFlag) -> io::Result<bool> {
    if kind == SFlag::S_IFLNK {
        let target = nix::fcntl::readlinkat(from.as_fd(), name)?;
        nix::unistd::symlinkat(target.as_os_str(), to.as_fd(), name)?;
        return Ok(true);
    }
    let source = match openat(
        from.as_fd(),
        name,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => std::fs::File::from(fd),
        // Swapped for a link or removed since it was looked at.
        Err(Errno::ELOOP | Errno::ENOENT) => return Ok(false),
        Err(e) => return Err(e.into()),
    };
    let metadata = source.metadata()?;
    if !metadata.is_file() {
        return Ok(false);
    }
    let mode = Mode::from_bits_truncate(
        std::os::unix::fs::PermissionsExt::mode(&metadata.permissions()) & 0o777,
    );
    let dest = openat(
        to.as_fd(),
        name,
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        mode,
    )?;
    io::copy(&mut &source, &mut std::fs::File::from(dest))?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The stamp stays while the view holds what the workspace does, building the view
    /// included (a link moves ctime only), and moves when a listed file is saved anew or no
    /// longer listed, or, where the view would hold a copy (another file system), changed in
    /// place.
    #[test]
    fn the_stamp_moves_with_what_a_view_would_hold() {
        use std::os::unix::fs::MetadataExt as _;
        let stamps_of = |root: &Path| {
            std::fs::create_dir_all(root).unwrap();
            std::fs::write(root.join("a.txt"), "DB_PASSWORD=secret\n").unwrap();
            std::fs::write(root.join("b.txt"), "b").unwrap();
            let files = [PathBuf::from("a.txt"), PathBuf::from("b.txt")];
            let first = stamp(root, &files).unwrap();
            let view = Listed::build(root, &files, &[]).unwrap();
            assert_eq!(
                stamp(root, &files).unwrap(),
                first,
                "building the view moved it"
            );
            std::fs::write(root.join("a.txt"), "DB_PASSWORD=\n").unwrap();
            let changed = stamp(root, &files).unwrap();
            std::fs::write(root.join("a.new"), "DB_PASSWORD=\n").unwrap();
            std::fs::rename(root.join("a.new"), root.join("a.txt")).unwrap();
            let saved = stamp(root, &files).unwrap();
            assert_ne!(saved, changed, "saved anew");
            assert_ne!(stamp(root, &files[..1]).unwrap(), saved, "no longer listed");
            drop(view);
            (first, changed)
        };
        // Linked: a change in place is what the view shows.
        let dir = tempfile::tempdir().unwrap();
        let (first, changed) = stamps_of(&dir.path().join("ws"));
        assert_eq!(first, changed, "a linked file changed in place");
        // Copied: it is not.
        let temp_device = std::fs::metadata(std::env::temp_dir()).unwrap().dev();
        let Some(other) = ["/dev/shm", "/run"]
            .into_iter()
            .map(Path::new)
            .find(|p| p.metadata().is_ok_and(|m| m.dev() != temp_device))
        else {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI has a tmpfs apart from the temporary folder"
            );
            eprintln!("skipping the copied view: no file system apart from the temporary one");
            return;
        };
        let dir = tempfile::tempdir_in(other).unwrap();
        let (first, changed) = stamps_of(&dir.path().join("ws"));
        assert_ne!(first, changed, "a copied file changed in place");
    }

    /// Only what the list names is in the view; a link is linked as itself, a folder on the
    /// way swapped for a link is not followed, and a mount point is made empty.
    #[test]
    fn the_view_holds_only_the_listed_files() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("ws");
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        std::fs::create_dir_all(root.join("notes")).unwrap();
        std::fs::create_dir_all(dir.path().join("outside")).unwrap();
        std::fs::write(root.join("a/b/kept.txt"), "kept").unwrap();
        std::fs::write(root.join(".my.cnf"), "secret").unwrap();
        std::fs::write(dir.path().join("outside/secret"), "secret").unwrap();
        std::os::unix::fs::symlink("../.my.cnf", root.join("a/link")).unwrap();
        // A listed path whose folder is a link out of the workspace.
        std::os::unix::fs::symlink(dir.path().join("outside"), root.join("swapped")).unwrap();
        let listed: Vec<PathBuf> = ["a/b/kept.txt", "a/link", "gone.txt", "swapped/secret"]
            .map(PathBuf::from)
            .into();
        let view =
            Listed::build(&root, &listed, &[root.join("notes"), root.join("nothing")]).unwrap();
        let folder = view.folder();
        assert_eq!(view.files, 2);
        assert_eq!(
            std::fs::read_to_string(folder.join("a/b/kept.txt")).unwrap(),
            "kept"
        );
        let link = folder.join("a/link");
        assert!(link.symlink_metadata().unwrap().is_symlink());
        assert_eq!(std::fs::read_link(&link).unwrap(), Path::new("../.my.cnf"));
        // The link leads to a file the view does not hold.
        assert!(std::fs::read(&link).is_err());
        for absent in [".my.cnf", "gone.txt", "swapped", "nothing"] {
            assert!(
                folder.join(absent).symlink_metadata().is_err(),
                "{absent} is in the view"
            );
        }
        assert!(folder.join("notes").is_dir());
        let made = view.folder().to_owned();
        drop(view);
        assert!(!made.exists(), "the view is removed with it");
    }

    #[test]
    fn a_file_that_cannot_be_linked_is_copied() {
        let dir = tempfile::tempdir().unwrap();
        let (from, to) = (dir.path().join("from"), dir.path().join("to"));
        std::fs::create_dir_all(&from).unwrap();
        std::fs::create_dir_all(&to).unwrap();
        std::fs::write(from.join("f"), "bytes").unwrap();
        std::os::unix::fs::symlink("f", from.join("l")).unwrap();
        let open = |p: &Path| Folders::new(p, false).unwrap().root;
        let (source, dest) = (open(&from), open(&to));
        assert!(copy(&source, &dest, OsStr::new("f"), SFlag::S_IFREG).unwrap());
        assert!(copy(&source, &dest, OsStr::new("l"), SFlag::S_IFLNK).unwrap());
        assert_eq!(std::fs::read_to_string(to.join("f")).unwrap(), "bytes");
        assert_eq!(std::fs::read_link(to.join("l")).unwrap(), Path::new("f"));
    }
}
