//! Sandboxes: an isolated copy of a target tree, kavi's record of it, and the safe way back.
//!
//! A sandbox is a fresh 0700 folder outside the workspace (by default in the system's temporary
//! folder), so nothing the builder reaches by a relative path belongs to the workspace or to
//! kavi's state. The copy leaves out what policy says (VCS data, virtualenvs, secrets, databases,
//! caches), every special file (sockets, FIFOs, devices) and every symlink that points out of the
//! tree. kavi then records a [`manifest`] of the copy in the ledger: that record, not the
//! sandbox's git repository, is what the diff gate compares against.

pub mod manifest;

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Component, Path, PathBuf};

use globset::GlobSet;
use nix::fcntl::{OFlag, openat};
use nix::sys::stat::Mode;

/// What a tree copy did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CopyStats {
    pub files: usize,
    pub skipped: usize,
    /// Symlinks that point out of the tree, as `path -> target`: never followed, never copied.
    pub links_left_out: Vec<String>,
}

/// `path` with every link resolved, as far as it exists; the rest is appended as written.
fn resolved(path: &Path) -> PathBuf {
    let mut existing = path;
    let mut rest = Vec::new();
    loop {
        if let Ok(real) = existing.canonicalize() {
            return rest.iter().rev().fold(real, |acc, part| acc.join(part));
        }
        match (existing.parent(), existing.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_owned());
                existing = parent;
            }
            _ => return path.to_owned(),
        }
    }
}

/// Makes a new, empty sandbox folder in `root`, readable by this user only.
///
/// `root` must lie apart from each of `apart` (the workspace, kavi's state): neither inside the
/// other, or the builder could reach them by a relative path such as `../name`. It is created
/// if missing; an existing one must be a real folder, not a link. The sandbox's own name is
/// random and made with `mkdir`, so nobody can have prepared it.
pub fn create(root: &Path, prefix: &str, apart: &[&Path]) -> io::Result<PathBuf> {
    ensure_root(root, apart)?;
    Ok(private_folder(root, prefix)?.keep())
}

/// A private temporary folder (0700) in the sandbox folder `root`, removed when dropped: a
/// confined process's TMPDIR. `root` is made if missing, with the checks of [`create`].
pub fn private_temp(root: &Path, prefix: &str) -> io::Result<PrivateFolder> {
    ensure_root(root, &[])?;
    private_folder(root, prefix)
}

/// A private temporary folder (0700) in `folder`, removed when dropped: what kavi stages for a
/// confined process there (its TMPDIR, its snapshot, its report) is nobody else's to read, nor,
/// in a folder someone else may write, to replace.
pub fn private_folder(root: &Path, prefix: &str) -> io::Result<PrivateFolder> {
    tempfile::Builder::new()
        .prefix(prefix)
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .tempdir_in(root)
        .map(|made| PrivateFolder(made.keep()))
}

/// A private folder kavi made, removed when dropped however deep, whatever links and modes the
/// process that used it left there ([`crate::removal::remove_tree`]: `tempfile`'s removal holds
/// a descriptor per level, and leaves a deep enough tree behind without a word).
#[derive(Debug)]
pub struct PrivateFolder(PathBuf);

impl PrivateFolder {
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// The folder, no longer removed when this is dropped.
    pub fn keep(mut self) -> PathBuf {
        let path = std::mem::take(&mut self.0);
        std::mem::forget(self);
        path
    }
}

impl Drop for PrivateFolder {
    fn drop(&mut self) {
        if let Err(e) = crate::removal::remove_tree(&self.0) {
            tracing::warn!("could not remove {}: {e}", self.0.display());
        }
    }
}

/// Where kavi makes the few small files a launch needs only while it runs (its tripwires'
/// decoys, an empty repository to list a workspace with): `/dev/shm` when it is the usual
/// shared memory folder (root's, sticky, in memory), else the temporary folder. Each file made
/// on a disk costs an inode's allocation: on an ext4 disk with many files, about 0.3 ms each
/// (benches/isolation.md), a few milliseconds a launch.
pub fn memory_temp_dir() -> PathBuf {
    static CHOSEN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    CHOSEN
        .get_or_init(|| {
            let shm = Path::new("/dev/shm");
            let usual = shm.symlink_metadata().is_ok_and(|folder| {
                folder.is_dir() && folder.uid() == 0 && folder.mode() & 0o1000 != 0
            }) && nix::sys::statfs::statfs(shm)
                .is_ok_and(|fs| fs.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC);
            if usual {
                shm.to_owned()
            } else {
                std::env::temp_dir()
            }
        })
        .clone()
}

/// This account's folder for kavi's machine-local state (provisioned toolchains, sandboxes, a
/// server ledger's locks): `$XDG_CACHE_HOME/kavi`, else `~/.cache/kavi`. Never a fixed name in a
/// folder every account may write, such as `/tmp`: another account could make it first, own it,
/// and move what kavi makes there (the sticky bit does not bind a folder's owner). Only without
/// a home (neither `HOME` nor one the system records) is it `kavi-<uid>` in the temporary
/// folder, refused if another account made it.
pub fn cache_home() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|path| path.is_absolute())
        .or_else(|| {
            std::env::var_os("HOME")
                .map(PathBuf::from)
                // Without HOME, the account's home as the system records it.
                .or_else(|| {
                    nix::unistd::User::from_uid(nix::unistd::getuid())
                        .ok()
                        .flatten()
                        .map(|user| user.dir)
                })
                .filter(|home| home.is_absolute() && home != Path::new("/"))
                .map(|home| home.join(".cache"))
        })
        .map(|cache| cache.join("kavi"))
        .unwrap_or_else(|| std::env::temp_dir().join(format!("kavi-{}", nix::unistd::getuid())))
}

/// Makes the sandbox folder `root` if missing and checks it: apart from each of `apart`, a real
/// folder, and this user's (or a sticky shared one of root's, such as `/tmp`).
fn ensure_root(root: &Path, apart: &[&Path]) -> io::Result<()> {
    let real_root = resolved(root);
    for other in apart {
        let real_other = resolved(other);
        if real_other.starts_with(&real_root) || real_root.starts_with(&real_other) {
            return Err(io::Error::other(format!(
                "refusing to make sandboxes in {}: it overlaps {}, which a builder could then \
                 reach by a relative path; set `sandboxes` in kavi.toml (or KAVI_SANDBOXES) to \
                 a folder apart from the workspace",
                root.display(),
                other.display()
            )));
        }
    }
    if root.symlink_metadata().is_err() {
        std::fs::create_dir_all(root.parent().unwrap_or(root))?;
        // Private from the start; an existing folder is checked below instead.
        match std::fs::DirBuilder::new().mode(0o700).create(root) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
            _ => {}
        }
    }
    let metadata = root.symlink_metadata()?;
    if !metadata.is_dir() {
        return Err(io::Error::other(format!(
            "the sandbox folder {} is not a folder (a link is refused)",
            root.display()
        )));
    }
    // In a shared folder such as /tmp, someone else could have made the folder first and so
    // control what sandboxes are made in: only this user's folder will do, or a sticky shared
    // one root owns (`/tmp` itself). A sticky folder another account owns is refused: the
    // sticky bit does not bind the folder's owner, who could move kavi's folders away and put
    // their own under the same names.
    let sticky = metadata.mode() & 0o1000 != 0;
    if !(sticky && metadata.uid() == 0)
        && let Some(problem) = not_ours(&metadata)
    {
        return Err(io::Error::other(format!(
            "the sandbox folder {} {problem}; refusing to use it",
            root.display()
        )));
    }
    // Without the sticky bit, any account that may write the folder may move what is in it.
    if !sticky && metadata.mode() & 0o002 != 0 {
        return Err(io::Error::other(format!(
            "the sandbox folder {} is writable by every account (mode {:o}) without the sticky \
             bit: any of them could move kavi's folders away and put their own in their place; \
             refusing to use it (`chmod o-w` it)",
            root.display(),
            metadata.mode() & 0o7777
        )));
    }
    Ok(())
}

/// Why a folder is not this user's alone: another account owns it.
fn not_ours(metadata: &std::fs::Metadata) -> Option<String> {
    let uid = metadata.uid();
    (uid != nix::unistd::getuid().as_raw()).then(|| format!("belongs to another user (uid {uid})"))
}

/// Makes one of kavi's state folders (`.kavi/`, the ledger's locks, the artifact store) if
/// missing, and checks it: a real folder (not a link), this user's or root's, and not writable
/// by every account. In a shared workspace another account could otherwise make it first, or
/// add to it, and plant what kavi trusts there (a ledger, an executor's socket, lock files,
/// artifacts). A folder root owns is accepted open to a group: that is how a team shares a
/// workspace. World write is refused even with the sticky bit: that bit stops others removing
/// kavi's files, not adding their own under names kavi then reads.
pub fn state_folder(path: &Path) -> io::Result<()> {
    match path.symlink_metadata() {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            // Never group- or world-writable, whatever the umask allows.
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(path)?;
        }
        Err(e) => return Err(e),
        Ok(_) => {}
    }
    let metadata = path.symlink_metadata()?;
    let problem = if !metadata.is_dir() {
        Some((
            "is not a folder (a link is refused)".to_owned(),
            "remove it",
        ))
    } else if metadata.mode() & 0o002 != 0 {
        Some((
            format!(
                "is writable by every account (mode {:o}): any of them could plant files kavi \
                 reads there",
                metadata.mode() & 0o7777
            ),
            "`chmod o-w` it",
        ))
    } else if let Some(writers) = acl_writers(path)? {
        Some((
            format!(
                "lets {writers} write there through an ACL, which its mode ({:o}) does not \
                 show: they could plant files kavi reads there",
                metadata.mode() & 0o7777
            ),
            "`setfacl -b` it; a team shares a workspace through a group",
        ))
    } else if metadata.uid() == 0 {
        None
    } else {
        not_ours(&metadata).map(|problem| (problem, "remove it, or make it yours"))
    };
    match problem {
        Some((problem, remedy)) => Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "kavi's state folder {} {problem}; refusing to use it ({remedy})",
                path.display()
            ),
        )),
        None => Ok(()),
    }
}

/// Makes and checks a folder of kavi's lock files as [`state_folder`] does, then closes it (see
/// [`close_to_readers`]): flock(2) needs only a descriptor opened for reading, so an account that
/// could open a lock file there could hold it and stall every kavi (or keep a dead owner looking
/// alive).
pub fn lock_folder(path: &Path) -> io::Result<()> {
    state_folder(path)?;
    close_to_readers(path)
}

/// Takes every access away from the accounts that may not write the folder `path` is in, when
/// `path` is this account's: a reader of kavi's record or locks can hold the locks SQLite and
/// kavi take (a read lock on the ledger's `-shm` stops every writer), and the record holds
/// inputs and outputs. Its group keeps access only when that group shares the folder (see
/// [`closed_bits`]). What another account made is left as it is (its owner's next kavi closes
/// it): refusing would lock a team member out. A file system that keeps no modes (vfat, some
/// network mounts) refuses the change: kavi says so and goes on, as it cannot do better there.
pub fn close_to_readers(path: &Path) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::PermissionsExt;
    // The mode is read and changed through one descriptor of the very file, never a link: a
    // name swapped between a look and a chmod would otherwise be given this file's bits.
    let handle = match nix::fcntl::open(
        path,
        OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    ) {
        Err(nix::errno::Errno::ENOENT) => return Ok(()),
        other => other?,
    };
    let metadata = nix::sys::stat::fstat(&handle)?;
    let kind = metadata.st_mode & nix::libc::S_IFMT;
    if kind != nix::libc::S_IFREG && kind != nix::libc::S_IFDIR {
        return Ok(());
    }
    let mode = metadata.st_mode & 0o7777;
    let closed = closed_bits(path);
    if mode & closed == 0 || metadata.st_uid != nix::unistd::getuid().as_raw() {
        return Ok(());
    }
    if mode & closed & 0o070 != 0
        && let Ok(folder) = folder_of(path).metadata()
        && shared_with_group(&folder)
    {
        // A team folder an older kavi wrote into: its files were left readable by their maker's
        // group, which is not the folder's unless the folder is setgid.
        tracing::warn!(
            "closing {} to its group: {} is writable by its group but not setgid, so the files \
             made there are of their maker's group; to share them with the folder's group, \
             `chmod g+s` the folder and `chgrp` its files to the folder's group",
            path.display(),
            folder_of(path).display()
        );
    }
    let this_file = PathBuf::from(format!("/proc/self/fd/{}", handle.as_raw_fd()));
    match std::fs::set_permissions(this_file, std::fs::Permissions::from_mode(mode & !closed)) {
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::PermissionDenied | io::ErrorKind::Unsupported
            ) =>
        {
            tracing::warn!(
                "could not close {} to other accounts ({e}): its file system keeps no modes",
                path.display()
            );
            Ok(())
        }
        other => other,
    }
}

/// The mode bits [`close_to_readers`] takes away from `path` (or from what is made there):
/// the group's as well as everyone's, unless the group shares the folder, as a team sharing a
/// workspace does: the folder's group may write it, nobody else may (a world-writable folder,
/// sticky or not, such as `/tmp`, is shared with everyone, so with nobody), and the file is
/// (or will be) of the folder's group. A file of the creator's own group in a team folder
/// would otherwise open the record to everyone in that group.
pub fn closed_bits(path: &Path) -> u32 {
    let Ok(folder) = folder_of(path).metadata() else {
        return 0o077;
    };
    let group_shared = shared_with_group(&folder);
    let group = match path.symlink_metadata() {
        Ok(file) => file.gid(),
        // A setgid folder gives its group to what is made there; otherwise it is the maker's.
        Err(_) if folder.mode() & 0o2000 != 0 => folder.gid(),
        Err(_) => nix::unistd::getegid().as_raw(),
    };
    if group_shared && group == folder.gid() {
        0o007
    } else {
        0o077
    }
}

/// Whether a folder is shared with its group: its group may write it, and nobody else may.
fn shared_with_group(folder: &std::fs::Metadata) -> bool {
    folder.mode() & 0o020 != 0 && folder.mode() & 0o002 == 0
}

/// The folder `path` names something in: `.` for a bare relative name.
pub fn folder_of(path: &Path) -> &Path {
    path.parent()
        .filter(|parent| !parent.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// Checks a file kavi keeps its record in (the ledger, its write-ahead log), if it exists: a
/// file, not a link, that only those who may write its folder could have put there (this
/// account, root, the folder's owner, or, when its group may write it, a member of that group
/// or a file of that group: a setgid folder gives its group to what its members make there),
/// and that neither its mode nor an ACL opens to anyone else. Another account's copy moved over
/// the ledger, or written into it, would otherwise be read as kavi's own record (an earlier
/// one, with a revoked skill still trusted).
pub fn state_file(path: &Path) -> io::Result<()> {
    let metadata = match path.symlink_metadata() {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        other => other?,
    };
    let folder = folder_of(path).metadata()?;
    let uid = metadata.uid();
    let problem = if !metadata.is_file() {
        Some("is not a file (a link is refused)".to_owned())
    } else if let Some(writers) = acl_writers(path)? {
        Some(format!("lets {writers} write it through an ACL"))
    } else if metadata.mode() & 0o002 != 0 {
        Some(format!(
            "is writable by every account (mode {:o}): `chmod o-w` it",
            metadata.mode() & 0o7777
        ))
    } else if metadata.mode() & 0o020 != 0
        && (folder.mode() & 0o020 == 0 || metadata.gid() != folder.gid())
    {
        Some(format!(
            "is writable by group {}, which may not write its folder: `chmod g-w` it",
            metadata.gid()
        ))
    } else if uid == nix::unistd::getuid().as_raw()
        || uid == 0
        || uid == folder.uid()
        || (folder.mode() & 0o020 != 0
            && (metadata.gid() == folder.gid() || in_group(uid, folder.gid())))
    {
        None
    } else {
        Some(format!(
            "belongs to uid {uid}, who may not write its folder: another account put it there"
        ))
    };
    match problem {
        Some(problem) => Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "kavi's record {} {problem}; refusing to use it",
                path.display()
            ),
        )),
        None => Ok(()),
    }
}

/// Whether the account `uid` is a member of group `gid` (its primary group or another).
fn in_group(uid: u32, gid: u32) -> bool {
    let Ok(Some(user)) = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)) else {
        return false;
    };
    let Ok(name) = std::ffi::CString::new(user.name) else {
        return false;
    };
    nix::unistd::getgrouplist(&name, user.gid)
        .is_ok_and(|groups| groups.contains(&nix::unistd::Gid::from_raw(gid)))
}

/// The named users and groups a POSIX ACL on `path` lets write (`setfacl -m u:NAME:rwx`), on the
/// path itself or as the default what is made in it inherits, in words; `None` when there are
/// none. The mode bits show only the ACL's mask, as the group's.
fn acl_writers(path: &Path) -> io::Result<Option<String>> {
    // Tags of the entries that name an account (linux/posix_acl_xattr.h); the write bit.
    const ACL_USER: u16 = 0x02;
    const ACL_GROUP: u16 = 0x08;
    const WRITE: u16 = 0o2;
    let mut writers = Vec::new();
    for (attribute, prefix) in [
        ("system.posix_acl_access", ""),
        ("system.posix_acl_default", "by default "),
    ] {
        let Some(value) = xattr(path, attribute)? else {
            continue;
        };
        // A 4-byte version, then entries of a 2-byte tag, 2-byte permissions and 4-byte id.
        for entry in value.get(4..).unwrap_or_default().chunks_exact(8) {
            let tag = u16::from_le_bytes([entry[0], entry[1]]);
            let perm = u16::from_le_bytes([entry[2], entry[3]]);
            let id = u32::from_le_bytes([entry[4], entry[5], entry[6], entry[7]]);
            let kind = match tag {
                ACL_USER => "uid",
                ACL_GROUP => "gid",
                _ => continue,
            };
            if perm & WRITE != 0 {
                writers.push(format!("{prefix}{kind} {id}"));
            }
        }
    }
    Ok((!writers.is_empty()).then(|| writers.join(", ")))
}

/// The value of extended attribute `name` of `path` (not following a link); `None` when it has
/// none, or its file system keeps none.
fn xattr(path: &Path, name: &str) -> io::Result<Option<Vec<u8>>> {
    use nix::libc;
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let name = std::ffi::CString::new(name).expect("no NUL in an attribute's name");
    loop {
        // SAFETY: both strings are NUL-terminated; a null buffer of size 0 asks for the size.
        let size =
            unsafe { libc::lgetxattr(path.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0) };
        if size < 0 {
            let error = io::Error::last_os_error();
            return match error.raw_os_error() {
                Some(libc::ENODATA | libc::EOPNOTSUPP) => Ok(None),
                _ => Err(error),
            };
        }
        let mut value = vec![0u8; size as usize];
        // SAFETY: `value` has room for `value.len()` bytes.
        let read = unsafe {
            libc::lgetxattr(
                path.as_ptr(),
                name.as_ptr(),
                value.as_mut_ptr().cast(),
                value.len(),
            )
        };
        match read {
            // Grown since its size was asked: ask again.
            -1 if io::Error::last_os_error().raw_os_error() == Some(libc::ERANGE) => continue,
            -1 => return Err(io::Error::last_os_error()),
            read => {
                value.truncate(read as usize);
                return Ok(Some(value));
            }
        }
    }
}

/// Removes a sandbox and everything in it, even folders the builder made unreadable, however
/// deep, never following a link ([`crate::removal::remove_tree`]).
pub fn remove(dir: &Path) -> io::Result<()> {
    crate::removal::remove_tree(dir)
}

/// Where a symlink at `link` (relative to the tree's root) leads, if it stays inside the tree
/// when read as written: relative, and never climbing above the root.
fn link_stays_inside(link: &Path, target: &Path) -> bool {
    if target.is_absolute() {
        return false;
    }
    let mut depth = link.components().count().saturating_sub(1);
    for component in target.components() {
        match component {
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
            Component::ParentDir => match depth.checked_sub(1) {
                Some(up) => depth = up,
                None => return false,
            },
            Component::RootDir | Component::Prefix(_) => return false,
        }
    }
    true
}

/// Copies the files of `source` that `listed` names (paths relative to `source`: what git lists
/// of it) into the empty folder `dest`, leaving out paths matching `skip` and the absolute paths
/// in `exclude` (kavi's own state, which may live inside the source). A file the list does not
/// name is never copied, so one made after the list was taken is not either. Empty folders are
/// not copied. A symlink is copied as a link only when it points inside the tree; one that
/// points out is neither followed nor copied, and is listed in `links_left_out`.
pub fn copy_tree(
    source: &Path,
    dest: &Path,
    listed: &std::collections::HashSet<PathBuf>,
    skip: &GlobSet,
    exclude: &[PathBuf],
) -> io::Result<CopyStats> {
    let mut stats = CopyStats::default();
    let root: OwnedFd = File::open(source)?.into();
    // The folder the last file was read from, opened beneath the root: the walk is sorted, so
    // a folder's files come one after another.
    let mut folder: Option<(PathBuf, OwnedFd)> = None;
    let mut walker = walkdir::WalkDir::new(source)
        .follow_links(false)
        .sort_by_file_name()
        .into_iter();
    while let Some(entry) = walker.next() {
        let entry = entry.map_err(io::Error::other)?;
        let relative = entry
            .path()
            .strip_prefix(source)
            .expect("walkdir yields paths under its root");
        if relative.as_os_str().is_empty() {
            continue;
        }
        let file_type = entry.file_type();
        let excluded = exclude.iter().any(|e| entry.path().starts_with(e));
        let unlisted = !file_type.is_dir() && !listed.contains(relative);
        if excluded || unlisted || skip.is_match(relative) {
            stats.skipped += 1;
            if file_type.is_dir() {
                walker.skip_current_dir();
            }
            continue;
        }
        let target = dest.join(relative);
        if file_type.is_dir() {
            // Folders are made when a file goes into them: a folder whose contents were all
            // left out should not appear at all.
            continue;
        }
        if file_type.is_file() {
            copy_beneath(root.as_fd(), &mut folder, relative, &target)?;
            stats.files += 1;
        } else if file_type.is_symlink() {
            let link = std::fs::read_link(entry.path())?;
            if link_stays_inside(relative, &link) {
                std::fs::create_dir_all(target.parent().expect("a copied path has a parent"))?;
                std::os::unix::fs::symlink(&link, &target)?;
                stats.files += 1;
            } else {
                stats.skipped += 1;
                stats
                    .links_left_out
                    .push(format!("{} -> {}", relative.display(), link.display()));
            }
        } else {
            // Sockets, FIFOs and devices: reading one could block or leak, so none are copied.
            stats.skipped += 1;
        }
    }
    Ok(stats)
}

/// Copies the file `relative` beneath `root` to `target`, reading it through descriptors, each
/// folder on the way and the file itself refusing a link: a process that can write the
/// workspace (a FILE_WRITE skill running now) may swap what the walk saw for a link to a
/// secret before its turn comes. `folder` keeps the last folder opened, for the next file.
fn copy_beneath(
    root: BorrowedFd<'_>,
    folder: &mut Option<(PathBuf, OwnedFd)>,
    relative: &Path,
    target: &Path,
) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let parent = relative.parent().unwrap_or(Path::new(""));
    if folder.as_ref().is_none_or(|(path, _)| path != parent) {
        let opened = crate::removal::open_beneath(root, parent)
            .map_err(|e| changed_while_copied(relative, &e))?;
        *folder = Some((parent.to_owned(), opened));
    }
    let (_, dir) = folder.as_ref().expect("opened above");
    let name = relative.file_name().expect("a copied path has a name");
    let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
    let mut file = openat(dir.as_fd(), name, flags, Mode::empty())
        .map(File::from)
        .map_err(|errno| changed_while_copied(relative, &io::Error::from(errno)))?;
    let metadata = file.metadata()?;
    if !metadata.is_file() {
        return Err(changed_while_copied(
            relative,
            &io::Error::other("it is no longer a regular file"),
        ));
    }
    std::fs::create_dir_all(target.parent().expect("a copied path has a parent"))?;
    let mut copy = File::create_new(target)?;
    io::copy(&mut file, &mut copy)?;
    copy.set_permissions(std::fs::Permissions::from_mode(
        metadata.permissions().mode() & 0o777,
    ))
}

fn changed_while_copied(relative: &Path, error: &io::Error) -> io::Error {
    io::Error::other(format!(
        "`{}` changed while the workspace was copied ({error}): nothing is copied through a link",
        relative.display()
    ))
}

/// Resolves a user-given relative path under `root`, refusing anything that could leave it:
/// absolute paths, `..`, and (for existing paths) symlinks that resolve outside.
pub fn contained_path(root: &Path, relative: &str) -> Result<PathBuf, String> {
    let path = Path::new(relative);
    if relative.is_empty() {
        return Err("the path is empty".into());
    }
    for component in path.components() {
        match component {
            Component::Normal(_) | Component::CurDir => {}
            Component::ParentDir => return Err(format!("`{relative}` contains `..`")),
            Component::RootDir | Component::Prefix(_) => {
                return Err(format!(
                    "`{relative}` is absolute; give a path inside the workspace"
                ));
            }
        }
    }
    let joined = root.join(path);
    if !links_below(root, path) {
        // No link on the way: nothing below the root can lead out of it.
        return Ok(joined);
    }
    // The deepest existing ancestor must still be inside the root once symlinks are resolved.
    let root_real = root
        .canonicalize()
        .map_err(|e| format!("cannot resolve {}: {e}", root.display()))?;
    let mut existing = joined.as_path();
    while !existing.exists() {
        existing = existing.parent().unwrap_or(root);
    }
    let existing_real = existing
        .canonicalize()
        .map_err(|e| format!("cannot resolve {}: {e}", existing.display()))?;
    if !existing_real.starts_with(&root_real) {
        return Err(format!("`{relative}` resolves outside the workspace"));
    }
    Ok(joined)
}

/// Whether a link is among the existing ancestors of `root/relative` below `root`, or is that
/// path itself, looked at one component at a time without following any. Most paths have none:
/// then they are plainly inside the root, and the two full resolutions (of the root and of the
/// path) cost a pipeline of 1,000 nodes with inputs and outputs some 16,000 `readlink` calls.
pub fn links_below(root: &Path, relative: &Path) -> bool {
    let mut current = root.to_path_buf();
    for component in relative.components() {
        if component == Component::CurDir {
            continue;
        }
        current.push(component);
        match current.symlink_metadata() {
            Ok(metadata) if metadata.file_type().is_symlink() => return true,
            Ok(_) => {}
            // Nothing further down exists, so nothing further down is a link yet.
            Err(_) => return false,
        }
    }
    false
}

/// How many entries of a folder a value names are looked at for a link that leads out.
const LINKS_SEARCHED: usize = 10_000;

/// The first path that `value` (a skill's input or output) names in the workspace at `root`,
/// and that leads out of it through a symlink, said as a refusal. A string names a path when
/// one exists there (relative to `root`, or absolute below it); with `folders`, every entry of
/// a folder named is looked at too, the first [`LINKS_SEARCHED`] of them. A skill's view shows
/// the workspace and the system's files at their own paths, so such a link would hand back a
/// file of the machine as if it were the workspace's.
pub fn link_out_named(root: &Path, value: &serde_json::Value, folders: bool) -> Option<String> {
    let mut strings = Vec::new();
    json_strings(value, &mut strings);
    for text in strings {
        if text.is_empty() || text.len() > 4096 || text.contains('\0') {
            continue;
        }
        let path = Path::new(text);
        let Ok(relative) = (if path.is_absolute() {
            path.strip_prefix(root)
        } else {
            Ok(path)
        }) else {
            continue;
        };
        let named = root.join(relative);
        let Ok(metadata) = named.symlink_metadata() else {
            continue;
        };
        if let Some(refused) = leads_out(root, relative) {
            return Some(refused);
        }
        if folders && metadata.is_dir() {
            let entries = walkdir::WalkDir::new(&named)
                .follow_links(false)
                .min_depth(1);
            for entry in entries.into_iter().flatten().take(LINKS_SEARCHED) {
                if entry.path_is_symlink()
                    && let Ok(inner) = entry.path().strip_prefix(root)
                    && let Some(refused) = leads_out(root, inner)
                {
                    return Some(refused);
                }
            }
        }
    }
    None
}

/// Every string in a JSON value, at any depth.
pub fn json_strings<'v>(value: &'v serde_json::Value, found: &mut Vec<&'v str>) {
    match value {
        serde_json::Value::String(s) => found.push(s),
        serde_json::Value::Array(items) => items.iter().for_each(|v| json_strings(v, found)),
        serde_json::Value::Object(map) => {
            map.values().for_each(|v| json_strings(v, found));
        }
        _ => {}
    }
}

/// Why `root/relative` is refused when a link on its way leads out of `root` (or nowhere).
fn leads_out(root: &Path, relative: &Path) -> Option<String> {
    if !links_below(root, relative) {
        return None;
    }
    let shown = relative.display();
    let real_root = root.canonicalize().ok()?;
    match root.join(relative).canonicalize() {
        Ok(real) if real.starts_with(&real_root) => None,
        Ok(real) => Some(format!(
            "`{shown}` is a link that leads outside the workspace (to {}); kavi does not follow \
             it for a skill",
            real.display()
        )),
        Err(_) => Some(format!(
            "`{shown}` is a link that leads nowhere in the workspace; kavi does not follow it \
             for a skill"
        )),
    }
}

/// Where a file goes in a target it is written into: inside it once links are resolved, and not
/// itself a link.
pub fn destination(target: &Path, path: &str) -> Result<PathBuf, String> {
    let destination = contained_path(target, path)?;
    if destination
        .symlink_metadata()
        .is_ok_and(|m| m.file_type().is_symlink())
    {
        return Err(format!("the destination of `{path}` is a symlink"));
    }
    Ok(destination)
}

/// Writes `bytes` to `destination` whole: to a temporary file beside it, synced, then renamed
/// into place, so a reader never sees half a file. `executable` sets the execute bits.
pub fn write_file(bytes: &[u8], destination: &Path, executable: bool) -> io::Result<()> {
    let parent = destination
        .parent()
        .expect("a destination inside the target has a parent");
    std::fs::create_dir_all(parent)?;
    let mut temp = tempfile::NamedTempFile::new_in(parent)?;
    temp.write_all(bytes)?;
    if executable {
        use std::os::unix::fs::PermissionsExt;
        temp.as_file()
            .set_permissions(std::fs::Permissions::from_mode(0o755))?;
    }
    temp.as_file().sync_all()?;
    temp.persist(destination).map_err(|e| e.error)?;
    Ok(())
}

/// Writes `bytes` to `relative` beneath `root` whole, as [`write_file`] does, but resolving the
/// path itself: each folder on the way is opened (or made) with `O_NOFOLLOW`, and the temporary
/// file is made, synced and renamed relative to the last one, so a folder swapped for a link
/// after any check cannot send the write elsewhere. `relative` must pass [`unsafe_path_reason`].
pub fn write_beneath(
    root: &Path,
    relative: &str,
    bytes: &[u8],
    executable: bool,
) -> io::Result<()> {
    use nix::errno::Errno;
    use nix::sys::stat::{fchmod, mkdirat};
    use nix::unistd::{UnlinkatFlags, unlinkat};
    use std::sync::atomic::{AtomicU64, Ordering};
    static TEMPORARIES: AtomicU64 = AtomicU64::new(0);

    if let Some(reason) = unsafe_path_reason(relative) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("`{relative}`: {reason}"),
        ));
    }
    let (folders, name) = relative.rsplit_once('/').unwrap_or(("", relative));
    let mut dir: OwnedFd = File::open(root)?.into();
    for part in folders.split('/').filter(|part| !part.is_empty()) {
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let opened = match openat(dir.as_fd(), part, flags, Mode::empty()) {
            Err(Errno::ENOENT) => match mkdirat(dir.as_fd(), part, Mode::from_bits_truncate(0o777))
            {
                Ok(()) | Err(Errno::EEXIST) => openat(dir.as_fd(), part, flags, Mode::empty()),
                Err(errno) => Err(errno),
            },
            opened => opened,
        };
        dir = opened.map_err(|errno| {
            let reason = match errno {
                // O_NOFOLLOW refuses a link as ELOOP, O_DIRECTORY a non-folder as ENOTDIR.
                Errno::ELOOP | Errno::ENOTDIR => "is a symlink or not a folder",
                errno => errno.desc(),
            };
            io::Error::new(
                io::Error::from(errno).kind(),
                format!("`{relative}`: `{part}` {reason}"),
            )
        })?;
    }
    let (temporary, file) = loop {
        let temporary = format!(
            ".{name}.{}-{}.kavi-tmp",
            std::process::id(),
            TEMPORARIES.fetch_add(1, Ordering::Relaxed)
        );
        let flags =
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        match openat(
            dir.as_fd(),
            temporary.as_str(),
            flags,
            Mode::from_bits_truncate(0o600),
        ) {
            // Left by a writer of the same pid that died: take the next name.
            Err(Errno::EEXIST) => continue,
            opened => break (temporary, File::from(opened?)),
        }
    };
    let written = (|| {
        let mut file = file;
        file.write_all(bytes)?;
        if executable {
            fchmod(file.as_fd(), Mode::from_bits_truncate(0o755))?;
        }
        file.sync_all()?;
        nix::fcntl::renameat(dir.as_fd(), temporary.as_str(), dir.as_fd(), name)?;
        Ok(())
    })();
    if written.is_err() {
        let _ = unlinkat(dir.as_fd(), temporary.as_str(), UnlinkatFlags::NoRemoveDir);
    }
    written
}

/// Opens the regular file at `relative` beneath `root` without following any link on the way
/// (each folder is opened with `O_NOFOLLOW`), so a folder swapped for a link after the check
/// cannot redirect the read. `relative` must pass [`unsafe_path_reason`].
pub fn open_beneath(root: &Path, relative: &str) -> io::Result<File> {
    let mut dir: OwnedFd = File::open(root)?.into();
    let mut parts = relative.split('/').peekable();
    let mut walked = PathBuf::new();
    while let Some(part) = parts.next() {
        walked.push(part);
        let last = parts.peek().is_none();
        let flags = OFlag::O_RDONLY
            | OFlag::O_NOFOLLOW
            | OFlag::O_CLOEXEC
            | if last {
                OFlag::O_NONBLOCK
            } else {
                OFlag::O_DIRECTORY
            };
        dir = openat(dir.as_fd(), part, flags, Mode::empty()).map_err(|errno| {
            // A link refused by O_NOFOLLOW shows as ELOOP, or ENOTDIR where a folder was asked.
            let is_link = root
                .join(&walked)
                .symlink_metadata()
                .is_ok_and(|m| m.file_type().is_symlink());
            let reason = if is_link {
                "is a symlink"
            } else {
                errno.desc()
            };
            // Its kind kept, so that a caller can tell a missing file; the path said once.
            let kind = io::Error::from(errno).kind();
            if last {
                io::Error::new(kind, format!("`{relative}` {reason}"))
            } else {
                io::Error::new(
                    kind,
                    format!("`{relative}`: `{}` {reason}", walked.display()),
                )
            }
        })?;
    }
    Ok(File::from(dir))
}

/// Reads at most `limit` bytes of `file`; more than that is an error naming the limit.
pub fn read_bounded(file: File, limit: u64) -> io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    file.take(limit.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(io::Error::other(format!(
            "it holds more than {limit} bytes"
        )));
    }
    Ok(bytes)
}

/// Why a relative path may not be used to write into a target, if it may not: it must be
/// relative, normalised (no `.`, `..`, empty or trailing parts) and plain.
pub fn unsafe_path_reason(path: &str) -> Option<&'static str> {
    if path.is_empty() {
        return Some("the path is empty");
    }
    if path.starts_with('/') {
        return Some("the path is absolute");
    }
    if path.contains('\0') || path.contains('\\') {
        return Some("the path holds a NUL or a backslash");
    }
    for part in path.split('/') {
        match part {
            "" => return Some("the path is not normalised (empty part)"),
            "." => return Some("the path is not normalised (`.` part)"),
            ".." => return Some("the path contains `..`"),
            _ => {}
        }
    }
    let normal = Path::new(path)
        .components()
        .all(|c| matches!(c, Component::Normal(_)));
    if !normal {
        return Some("the path is not normalised");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A state folder any account may add to is refused whoever owns it, sticky or not; one
    /// open to a group only is kept, and so is a missing one kavi makes itself.
    #[test]
    fn a_world_writable_state_folder_is_refused() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let made = dir.path().join("made");
        state_folder(&made).unwrap();
        assert_eq!(made.metadata().unwrap().mode() & 0o022, 0, "made closed");
        for (mode, refused) in [
            (0o777, true),
            (0o1777, true),
            (0o775, false),
            (0o755, false),
        ] {
            let state = dir.path().join(format!("state-{mode:o}"));
            std::fs::create_dir(&state).unwrap();
            std::fs::set_permissions(&state, std::fs::Permissions::from_mode(mode)).unwrap();
            match state_folder(&state) {
                Err(e) => {
                    assert!(refused, "mode {mode:o} refused: {e}");
                    let message = e.to_string();
                    assert!(
                        message.contains("is writable by every account")
                            && message.contains(&format!("(mode {mode:o})"))
                            && message.contains("`chmod o-w` it"),
                        "{message}"
                    );
                    assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
                }
                Ok(()) => assert!(!refused, "mode {mode:o} was accepted"),
            }
        }
    }

    /// Sets a POSIX ACL on `path`, as `setfacl` does: `entries` of (tag, permissions, id).
    fn set_acl(path: &Path, attribute: &str, entries: &[(u16, u16, u32)]) {
        use nix::libc;
        use std::os::unix::ffi::OsStrExt;
        let mut value = 2u32.to_le_bytes().to_vec();
        for (tag, perm, id) in entries {
            value.extend(tag.to_le_bytes());
            value.extend(perm.to_le_bytes());
            value.extend(id.to_le_bytes());
        }
        let path = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
        let name = std::ffi::CString::new(attribute).unwrap();
        // SAFETY: NUL-terminated strings and a buffer of `value.len()` bytes.
        let set = unsafe {
            libc::lsetxattr(
                path.as_ptr(),
                name.as_ptr(),
                value.as_ptr().cast(),
                value.len(),
                0,
            )
        };
        assert_eq!(set, 0, "{}", io::Error::last_os_error());
    }

    /// Base entries (owner rwx, group r-x, mask, others r-x) and one named account's.
    fn acl_naming(tag: u16, perm: u16) -> Vec<(u16, u16, u32)> {
        let any = u32::MAX;
        let mut entries = vec![
            (0x01, 7, any),
            (tag, perm, 4201),
            (0x04, 5, any),
            (0x10, 7, any),
            (0x20, 5, any),
        ];
        // The kernel takes them in the order of their tags.
        entries.sort_unstable();
        entries
    }

    /// A named user or group an ACL lets write a state folder (its mode shows only the mask, as
    /// the group's) is refused, and so is one its default ACL lets write what is made in it; a
    /// named entry that may only read is kept.
    #[test]
    fn a_state_folder_an_acl_opens_to_another_account_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        for (name, attribute, tag, perm, refused) in [
            ("user", "system.posix_acl_access", 0x02, 7, true),
            ("group", "system.posix_acl_access", 0x08, 6, true),
            ("default", "system.posix_acl_default", 0x02, 7, true),
            ("reader", "system.posix_acl_access", 0x02, 5, false),
        ] {
            let state = dir.path().join(name);
            std::fs::create_dir(&state).unwrap();
            set_acl(&state, attribute, &acl_naming(tag, perm));
            match state_folder(&state) {
                Err(e) => {
                    assert!(refused, "{name} refused: {e}");
                    let message = e.to_string();
                    assert!(
                        message.contains("4201 write there through an ACL")
                            && message.contains("`setfacl -b` it"),
                        "{message}"
                    );
                }
                Ok(()) => assert!(!refused, "{name} was accepted"),
            }
        }
    }

    /// A ledger file another account put in kavi's folder (moved there, keeping its owner) is
    /// refused; this account's, and one an ACL opens, are told apart.
    #[test]
    fn a_record_file_another_account_put_there_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = dir.path().join("ledger.db");
        assert!(
            state_file(&ledger).is_ok(),
            "a missing file is made by kavi"
        );
        std::fs::write(&ledger, "").unwrap();
        state_file(&ledger).unwrap();
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = |mode| {
                std::fs::set_permissions(&ledger, std::fs::Permissions::from_mode(mode)).unwrap();
                state_file(&ledger).map_err(|e| e.to_string())
            };
            let open = mode(0o666).unwrap_err();
            assert!(
                open.contains("is writable by every account (mode 666)"),
                "{open}"
            );
            // The folder (a private temporary one) is not its group's to write.
            let grouped = mode(0o664).unwrap_err();
            assert!(
                grouped.contains("which may not write its folder"),
                "{grouped}"
            );
            mode(0o644).unwrap();
        }
        set_acl(&ledger, "system.posix_acl_access", &acl_naming(0x02, 6));
        let message = state_file(&ledger).unwrap_err().to_string();
        assert!(
            message.contains("lets uid 4201 write it through an ACL"),
            "{message}"
        );
        std::fs::remove_file(&ledger).unwrap();
        std::os::unix::fs::symlink("elsewhere", &ledger).unwrap();
        let message = state_file(&ledger).unwrap_err().to_string();
        assert!(
            message.contains("is not a file (a link is refused)"),
            "{message}"
        );
        std::fs::remove_file(&ledger).unwrap();
        if !nix::unistd::getuid().is_root() {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI runs as root: a file of another account's must be made"
            );
            eprintln!("skipping the other account's file: making one needs root");
            return;
        }
        std::fs::write(&ledger, "").unwrap();
        nix::unistd::chown(&ledger, Some(nix::unistd::Uid::from_raw(4201)), None).unwrap();
        let message = state_file(&ledger).unwrap_err().to_string();
        assert!(
            message.contains("belongs to uid 4201, who may not write its folder"),
            "{message}"
        );
    }

    /// A sandbox folder another account made first is refused, even sticky (its owner is not
    /// bound by the sticky bit, and could move what kavi makes there); `/tmp`, sticky and
    /// root's, and this account's own folder are used. What kavi stages is made private.
    #[test]
    fn a_sandbox_folder_another_account_owns_is_refused_even_sticky() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let ours = dir.path().join("ours");
        let made = private_temp(&ours, "kavi-tmp-").unwrap();
        assert_eq!(made.path().metadata().unwrap().mode() & 0o777, 0o700);
        let staged = private_folder(&std::env::temp_dir(), "kavi-test-").unwrap();
        assert_eq!(staged.path().metadata().unwrap().mode() & 0o777, 0o700);
        if !nix::unistd::getuid().is_root() {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI runs as root: a folder of another account's must be made"
            );
            eprintln!("skipping the squatted sandbox folder: making one needs root");
            return;
        }
        let squatted = dir.path().join("kavi-0");
        std::fs::create_dir(&squatted).unwrap();
        std::fs::set_permissions(&squatted, std::fs::Permissions::from_mode(0o1777)).unwrap();
        nix::unistd::chown(&squatted, Some(nix::unistd::Uid::from_raw(4201)), None).unwrap();
        let message = private_temp(&squatted, "kavi-tmp-")
            .unwrap_err()
            .to_string();
        assert!(
            message.contains("belongs to another user (uid 4201)"),
            "{message}"
        );
        // Root's sticky folder, as /tmp is; without the sticky bit, refused.
        nix::unistd::chown(&squatted, Some(nix::unistd::Uid::from_raw(0)), None).unwrap();
        private_temp(&squatted, "kavi-tmp-").unwrap();
        std::fs::set_permissions(&squatted, std::fs::Permissions::from_mode(0o777)).unwrap();
        let message = private_temp(&squatted, "kavi-tmp-")
            .unwrap_err()
            .to_string();
        assert!(message.contains("without the sticky bit"), "{message}");
    }

    /// The group keeps its way into kavi's record only when it shares the folder: writable by
    /// the group, by nobody else, and the file of the folder's group. A world-writable folder
    /// (`/tmp`) shares with nobody; a link is never followed.
    #[test]
    fn only_a_group_sharing_the_folder_keeps_read_access() {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = |path: &Path| path.symlink_metadata().unwrap().mode() & 0o7777;
        let dir = tempfile::tempdir().unwrap();
        let made = |folder_mode: u32| {
            let folder = dir.path().join(format!("folder-{folder_mode:o}"));
            std::fs::create_dir(&folder).unwrap();
            std::fs::set_permissions(&folder, std::fs::Permissions::from_mode(folder_mode))
                .unwrap();
            let file = folder.join("ledger.db");
            std::fs::write(&file, "").unwrap();
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o664)).unwrap();
            (folder, file)
        };
        for (folder_mode, closed, left) in [
            (0o755, 0o077, 0o600),
            (0o2775, 0o007, 0o660),
            (0o1777, 0o077, 0o600),
            (0o777, 0o077, 0o600),
        ] {
            let (folder, file) = made(folder_mode);
            assert_eq!(closed_bits(&file), closed, "folder {folder_mode:o}");
            assert_eq!(
                closed_bits(&folder.join("new")),
                closed,
                "folder {folder_mode:o}"
            );
            close_to_readers(&file).unwrap();
            assert_eq!(mode(&file), left, "folder {folder_mode:o}");
        }
        // A link is left alone, and so is what it names.
        let (folder, target) = made(0o700);
        let link = folder.join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        close_to_readers(&link).unwrap();
        assert_eq!(mode(&target), 0o664, "a link was followed");
        // A bare relative name is in the working folder.
        assert_eq!(folder_of(Path::new("ledger.db")), Path::new("."));
        // A team folder that is not setgid: what is made there is of its maker's group, which
        // is not the team's; that group is closed out.
        let Some(other) = nix::unistd::getgroups()
            .unwrap_or_default()
            .into_iter()
            .chain(
                nix::unistd::getuid()
                    .is_root()
                    .then(|| nix::unistd::Gid::from_raw(4000)),
            )
            .find(|gid| *gid != nix::unistd::getegid())
        else {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI runs as root: a folder of another group must be made"
            );
            eprintln!("skipping the team folder of another group: this account has one group");
            return;
        };
        let (folder, file) = made(0o775);
        nix::unistd::chown(&folder, None, Some(other)).unwrap();
        assert_eq!(
            closed_bits(&folder.join("new")),
            0o077,
            "made of the maker's group"
        );
        close_to_readers(&file).unwrap();
        assert_eq!(
            mode(&file),
            0o600,
            "a file of the maker's group is closed to it"
        );
        std::fs::set_permissions(&folder, std::fs::Permissions::from_mode(0o2775)).unwrap();
        assert_eq!(
            closed_bits(&folder.join("new")),
            0o007,
            "setgid: of the team's group"
        );
    }

    #[test]
    fn a_named_path_or_folder_entry_that_links_out_of_the_root_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        std::fs::create_dir_all(root.join("notes/deep")).unwrap();
        std::fs::write(root.join("notes/a.md"), "a").unwrap();
        std::os::unix::fs::symlink("a.md", root.join("notes/inside.md")).unwrap();
        let value = serde_json::json!({"folder": "notes", "results": [{"path": "notes/a.md"}]});
        assert_eq!(
            link_out_named(&root, &value, true),
            None,
            "a link inside is fine"
        );
        std::os::unix::fs::symlink("/etc/passwd", root.join("notes/deep/link.md")).unwrap();
        let refused = link_out_named(&root, &value, true).unwrap();
        assert!(
            refused.contains("`notes/deep/link.md` is a link that leads outside the workspace"),
            "{refused}"
        );
        // Without folders, only the paths named themselves are looked at.
        assert_eq!(link_out_named(&root, &value, false), None);
        for named in [
            "notes/deep/link.md",
            &root.join("notes/deep/link.md").display().to_string(),
        ] {
            let value = serde_json::json!({"results": [{"path": named, "line": 1}]});
            assert!(link_out_named(&root, &value, false).is_some(), "{named}");
        }
        // A link in a folder on the way counts as much as one at the end.
        std::os::unix::fs::symlink("/etc", root.join("etc")).unwrap();
        let value = serde_json::json!(["etc/hostname", "/etc/passwd", "no such file"]);
        assert!(
            link_out_named(&root, &value, false)
                .unwrap()
                .contains("`etc/hostname`")
        );
        std::os::unix::fs::symlink("/nonexistent/x", root.join("gone")).unwrap();
        let value = serde_json::json!({"path": "gone"});
        assert!(
            link_out_named(&root, &value, false)
                .unwrap()
                .contains("leads nowhere")
        );
    }

    #[test]
    fn contained_path_refuses_escapes_with_a_reason() {
        let dir = tempfile::tempdir().unwrap();
        assert!(contained_path(dir.path(), "out/report.md").is_ok());
        assert!(
            contained_path(dir.path(), "../x")
                .unwrap_err()
                .contains("..")
        );
        assert!(
            contained_path(dir.path(), "/etc/passwd")
                .unwrap_err()
                .contains("absolute")
        );
        std::os::unix::fs::symlink("/tmp", dir.path().join("link")).unwrap();
        assert!(
            contained_path(dir.path(), "link/x")
                .unwrap_err()
                .contains("outside")
        );
        // A link deeper down, behind folders that are not links, is looked at all the same:
        // leading out, as the path itself, or in a `./` path.
        let deep = dir.path().join("a/b");
        std::fs::create_dir_all(&deep).unwrap();
        std::os::unix::fs::symlink("/tmp", deep.join("out")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", deep.join("file")).unwrap();
        for escape in ["a/b/out/x", "./a/b/out", "a/./b/file"] {
            assert!(
                contained_path(dir.path(), escape)
                    .unwrap_err()
                    .contains("outside"),
                "{escape}"
            );
        }
        // Links that stay inside are fine, as are paths through plain folders or not there yet.
        std::os::unix::fs::symlink(dir.path().join("a"), deep.join("up")).unwrap();
        for inside in ["a/b/up/b", "a/b/new/file", "a/b", "a/b/up/missing"] {
            assert_eq!(
                contained_path(dir.path(), inside).unwrap(),
                dir.path().join(inside),
                "{inside}"
            );
        }
    }
    use std::os::unix::fs::FileTypeExt;

    #[test]
    fn unsafe_paths_are_named_with_a_reason() {
        assert_eq!(unsafe_path_reason("skills/a/skill.py"), None);
        assert_eq!(unsafe_path_reason("../x"), Some("the path contains `..`"));
        assert_eq!(unsafe_path_reason("a/../b"), Some("the path contains `..`"));
        assert_eq!(
            unsafe_path_reason("/etc/passwd"),
            Some("the path is absolute")
        );
        assert!(unsafe_path_reason("a//b").unwrap().contains("normalised"));
        assert!(unsafe_path_reason("./a").unwrap().contains("normalised"));
        assert!(unsafe_path_reason("a/").unwrap().contains("normalised"));
    }

    #[test]
    fn copy_tree_skips_policy_matches_excluded_state_and_special_files() {
        let source = tempfile::tempdir().unwrap();
        let dest = tempfile::tempdir().unwrap();
        let root = source.path();
        std::fs::create_dir_all(root.join("src")).unwrap();
        std::fs::create_dir_all(root.join(".git/objects")).unwrap();
        std::fs::create_dir_all(root.join(".kavi")).unwrap();
        std::fs::write(root.join("src/lib.py"), "x = 1\n").unwrap();
        std::fs::write(root.join(".env"), "TOKEN=secret\n").unwrap();
        std::fs::write(root.join("src/server.pem"), "key").unwrap();
        std::fs::write(root.join(".git/objects/o"), "o").unwrap();
        std::fs::write(root.join(".kavi/ledger.db"), "db").unwrap();
        nix::unistd::mkfifo(&root.join("pipe"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        std::os::unix::fs::symlink("src/lib.py", root.join("link")).unwrap();
        // Links that leave the tree: absolute, or climbing above the root.
        std::os::unix::fs::symlink("/etc", root.join("etc")).unwrap();
        std::os::unix::fs::symlink("../../outside", root.join("src/up")).unwrap();
        std::os::unix::fs::symlink("../lib.py", root.join("src/sibling")).unwrap();

        let mut builder = globset::GlobSetBuilder::new();
        for pattern in [".git", "**/.env", "**/*.pem"] {
            builder.add(globset::Glob::new(pattern).unwrap());
        }
        let skip = builder.build().unwrap();
        let listed: std::collections::HashSet<PathBuf> = [
            "src/lib.py",
            ".env",
            "src/server.pem",
            ".git/objects/o",
            ".kavi/ledger.db",
            "pipe",
            "link",
            "etc",
            "src/up",
            "src/sibling",
        ]
        .map(PathBuf::from)
        .into();
        // Not listed (git ignores it): never copied, whatever its name.
        std::fs::write(root.join("src/.my.cnf"), "password=x\n").unwrap();
        let stats = copy_tree(root, dest.path(), &listed, &skip, &[root.join(".kavi")]).unwrap();

        let d = dest.path();
        assert_eq!(
            std::fs::read_to_string(d.join("src/lib.py")).unwrap(),
            "x = 1\n"
        );
        for gone in [
            ".env",
            "src/server.pem",
            ".git",
            ".kavi",
            "pipe",
            "src/.my.cnf",
        ] {
            assert!(!d.join(gone).exists(), "{gone} was copied");
        }
        assert!(
            d.join("link")
                .symlink_metadata()
                .unwrap()
                .file_type()
                .is_symlink()
        );
        for gone in ["etc", "src/up"] {
            assert!(
                d.join(gone).symlink_metadata().is_err(),
                "{gone} was copied"
            );
        }
        // `src/sibling` climbs to the root but not above it: kept as the link it is.
        assert!(d.join("src/sibling").symlink_metadata().is_ok());
        assert_eq!(
            stats,
            CopyStats {
                files: 3,
                skipped: 8,
                links_left_out: vec!["etc -> /etc".into(), "src/up -> ../../outside".into()],
            }
        );
    }

    #[test]
    fn sandboxes_are_made_apart_from_the_workspace_and_private() {
        let dir = tempfile::tempdir().unwrap();
        let workspace = dir.path().join("ws");
        std::fs::create_dir(&workspace).unwrap();
        for root in [workspace.join(".kavi/sandboxes"), dir.path().to_owned()] {
            let err = create(&root, "s-", &[&workspace]).unwrap_err();
            assert!(err.to_string().contains("overlaps"), "{err}");
        }
        let root = dir.path().join("sandboxes");
        let made = create(&root, "s-", &[&workspace]).unwrap();
        assert!(made.starts_with(&root));
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(made.metadata().unwrap().permissions().mode() & 0o777, 0o700);
        // A root that is a link is refused.
        std::os::unix::fs::symlink(&root, dir.path().join("linked")).unwrap();
        assert!(create(&dir.path().join("linked"), "s-", &[&workspace]).is_err());
        // A folder made unreadable inside is removed all the same.
        std::fs::create_dir_all(made.join("a/b")).unwrap();
        std::fs::set_permissions(made.join("a"), std::fs::Permissions::from_mode(0o000)).unwrap();
        remove(&made).unwrap();
        assert!(!made.exists());
    }

    #[test]
    fn links_are_judged_by_where_they_lead_from_their_folder() {
        assert!(link_stays_inside(Path::new("a/b/l"), Path::new("../c")));
        assert!(link_stays_inside(Path::new("a/l"), Path::new("../c")));
        assert!(!link_stays_inside(Path::new("l"), Path::new("../c")));
        assert!(!link_stays_inside(
            Path::new("a/l"),
            Path::new("x/../../../c")
        ));
        assert!(!link_stays_inside(Path::new("a/l"), Path::new("/a/c")));
    }

    /// What the copy's walk saw as a file, swapped for a link (or its folder for a link) before
    /// its turn came: the read is refused, never carried through the link.
    #[test]
    fn a_listed_file_swapped_for_a_link_is_not_copied_through_it() {
        let dir = tempfile::tempdir().unwrap();
        let (source, dest, secret) = (
            dir.path().join("src"),
            dir.path().join("dest"),
            dir.path().join("secret"),
        );
        for folder in [&source.join("notes"), &dest, &secret] {
            std::fs::create_dir_all(folder).unwrap();
        }
        std::fs::write(secret.join("credentials"), "key").unwrap();
        std::fs::write(source.join("notes/plain.md"), "mine").unwrap();
        std::os::unix::fs::symlink(secret.join("credentials"), source.join("notes/zz.md")).unwrap();
        std::os::unix::fs::symlink(&secret, source.join("swapped")).unwrap();
        let root = File::open(&source).unwrap();
        let mut folder = None;
        copy_beneath(
            root.as_fd(),
            &mut folder,
            Path::new("notes/plain.md"),
            &dest.join("notes/plain.md"),
        )
        .unwrap();
        assert_eq!(
            std::fs::read_to_string(dest.join("notes/plain.md")).unwrap(),
            "mine"
        );
        for swapped in ["notes/zz.md", "swapped/credentials"] {
            let refused = copy_beneath(
                root.as_fd(),
                &mut folder,
                Path::new(swapped),
                &dest.join(swapped),
            )
            .unwrap_err();
            assert!(refused.to_string().contains("changed while"), "{refused}");
            assert!(!dest.join(swapped).exists());
        }
    }

    #[test]
    fn write_beneath_makes_folders_keeps_modes_and_follows_no_link() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let (root, outside) = (dir.path().join("root"), dir.path().join("outside"));
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;

        write_beneath(&root, "skills/demo/skill.py", b"one", false).unwrap();
        write_beneath(&root, "skills/demo/run.sh", b"#!/bin/sh\n", true).unwrap();
        write_beneath(&root, "skills/demo/skill.py", b"two", false).unwrap();
        let demo = root.join("skills/demo");
        assert_eq!(std::fs::read(demo.join("skill.py")).unwrap(), b"two");
        assert_eq!(mode(&demo.join("skill.py")), 0o600);
        assert_eq!(mode(&demo.join("run.sh")), 0o755);
        // No temporary file is left beside them.
        assert_eq!(std::fs::read_dir(&demo).unwrap().count(), 2);

        // A folder on the way swapped for a link: refused, nothing written where it leads.
        std::fs::remove_dir_all(&demo).unwrap();
        std::os::unix::fs::symlink(&outside, &demo).unwrap();
        let refused = write_beneath(&root, "skills/demo/skill.py", b"three", false).unwrap_err();
        assert!(
            refused.to_string().contains("`demo` is a symlink"),
            "{refused}"
        );
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);
        // The file itself a link: replaced by the rename, its target untouched.
        std::fs::remove_file(&demo).unwrap();
        std::fs::create_dir(&demo).unwrap();
        let target = outside.join("target");
        std::fs::write(&target, "kept").unwrap();
        std::os::unix::fs::symlink(&target, demo.join("skill.py")).unwrap();
        write_beneath(&root, "skills/demo/skill.py", b"four", false).unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "kept");
        assert!(
            !demo
                .join("skill.py")
                .symlink_metadata()
                .unwrap()
                .is_symlink()
        );
        // Paths that leave the root are refused before anything is opened.
        assert!(write_beneath(&root, "../outside/x", b"", false).is_err());
        assert!(write_beneath(&root, "/etc/x", b"", false).is_err());
    }

    #[test]
    fn open_beneath_refuses_every_link_on_the_way_and_bounds_the_read() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("skills/a")).unwrap();
        std::fs::write(root.join("skills/a/skill.py"), "print(1)\n").unwrap();
        std::os::unix::fs::symlink("skills", root.join("linked")).unwrap();
        std::os::unix::fs::symlink("skill.py", root.join("skills/a/link.py")).unwrap();
        nix::unistd::mkfifo(&root.join("skills/a/fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();

        let file = open_beneath(root, "skills/a/skill.py").unwrap();
        assert_eq!(read_bounded(file, 100).unwrap(), b"print(1)\n");
        let file = open_beneath(root, "skills/a/skill.py").unwrap();
        assert!(
            read_bounded(file, 3)
                .unwrap_err()
                .to_string()
                .contains("more than 3")
        );
        let err = open_beneath(root, "linked/a/skill.py").unwrap_err();
        assert!(err.to_string().contains("`linked` is a symlink"), "{err}");
        let err = open_beneath(root, "skills/a/link.py").unwrap_err();
        assert!(err.to_string().contains("is a symlink"), "{err}");
        // A FIFO opens without blocking (O_NONBLOCK); the caller's fstat then refuses it.
        let fifo = open_beneath(root, "skills/a/fifo").unwrap();
        assert!(fifo.metadata().unwrap().file_type().is_fifo());
    }
}
