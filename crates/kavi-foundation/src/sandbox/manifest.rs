//! A manifest of a tree: every entry's path, type, mode, size, link count and content hash.
//!
//! kavi records a sandbox's manifest in the ledger when it makes the sandbox, before the builder
//! runs, and later compares the sandbox with that record. The sandbox's own git repository is
//! the builder's to edit (commits, `assume-unchanged`, ignore files), so it is never the
//! baseline. The scan sees every entry type, including links, FIFOs, sockets and devices, and
//! lists every entry however many there are.

use std::collections::BTreeMap;
use std::fs::Metadata;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use serde::Serialize;

/// What an entry is. A hard link is a regular file whose `links` count is above one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    File,
    Dir,
    Symlink,
    Fifo,
    Socket,
    BlockDevice,
    CharDevice,
}

impl EntryKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::File => "file",
            Self::Dir => "dir",
            Self::Symlink => "symlink",
            Self::Fifo => "fifo",
            Self::Socket => "socket",
            Self::BlockDevice => "block_device",
            Self::CharDevice => "char_device",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        [
            Self::File,
            Self::Dir,
            Self::Symlink,
            Self::Fifo,
            Self::Socket,
            Self::BlockDevice,
            Self::CharDevice,
        ]
        .into_iter()
        .find(|kind| kind.as_str() == text)
    }

    /// The kind with an article, for messages: "a FIFO".
    pub fn describe(self) -> &'static str {
        match self {
            Self::File => "a regular file",
            Self::Dir => "a folder",
            Self::Symlink => "a symlink",
            Self::Fifo => "a FIFO",
            Self::Socket => "a socket",
            Self::BlockDevice => "a block device",
            Self::CharDevice => "a character device",
        }
    }

    fn of(metadata: &Metadata) -> Self {
        let file_type = metadata.file_type();
        if file_type.is_symlink() {
            Self::Symlink
        } else if file_type.is_dir() {
            Self::Dir
        } else if file_type.is_fifo() {
            Self::Fifo
        } else if file_type.is_socket() {
            Self::Socket
        } else if file_type.is_block_device() {
            Self::BlockDevice
        } else if file_type.is_char_device() {
            Self::CharDevice
        } else {
            Self::File
        }
    }
}

/// One entry of a tree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Entry {
    /// Relative to the tree's root, `/`-separated; see [`path_text`] for names that are not UTF-8.
    pub path: String,
    pub kind: EntryKind,
    /// Permission bits (`0o7777`).
    pub mode: u32,
    pub size: u64,
    pub links: u64,
    /// A regular file's SHA-256 (hex), where it was hashed.
    pub sha256: Option<String>,
    /// A symlink's target, as stored in the link.
    pub target: Option<String>,
}

/// A path as text, one to one: valid UTF-8 stays as it is except `\`, which becomes `\\`;
/// every byte that is not UTF-8 becomes `\xNN`. Two different names never give the same text,
/// and no escaped name can equal an allowlisted path (those may not hold a backslash).
pub fn path_text(bytes: &[u8]) -> String {
    let mut text = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            if c == '\\' {
                text.push_str("\\\\");
            } else {
                text.push(c);
            }
        }
        for byte in chunk.invalid() {
            text.push_str(&format!("\\x{byte:02x}"));
        }
    }
    text
}

/// Lists every entry under `root` (not `root` itself), sorted by path. A regular file is hashed
/// when `hash(path, size)` says so. An entry that cannot be read is an error: a tree kavi cannot
/// see all of is never taken as unchanged.
pub fn scan(root: &Path, hash: &dyn Fn(&str, u64) -> bool) -> io::Result<Vec<Entry>> {
    let mut entries = Vec::new();
    for entry in walkdir::WalkDir::new(root)
        .follow_links(false)
        .sort_by_file_name()
        .min_depth(1)
    {
        let entry = entry.map_err(|e| {
            let path = e
                .path()
                .map(|p| p.display().to_string())
                .unwrap_or_default();
            io::Error::other(format!("cannot read {path}: {e}"))
        })?;
        let relative = entry
            .path()
            .strip_prefix(root)
            .expect("walkdir yields paths under its root");
        let path = path_text(relative.as_os_str().as_bytes());
        let metadata = entry.path().symlink_metadata()?;
        let kind = EntryKind::of(&metadata);
        let sha256 = if kind == EntryKind::File && hash(&path, metadata.len()) {
            let mut file = crate::files::open_regular(entry.path())?;
            Some(crate::hash::hash_reader(&mut file)?.0)
        } else {
            None
        };
        let target = if kind == EntryKind::Symlink {
            Some(path_text(
                std::fs::read_link(entry.path())?.as_os_str().as_bytes(),
            ))
        } else {
            None
        };
        entries.push(Entry {
            path,
            kind,
            mode: metadata.mode() & 0o7777,
            size: metadata.len(),
            links: metadata.nlink(),
            sha256,
            target,
        });
    }
    Ok(entries)
}

/// The manifest kavi records for a new sandbox: every regular file hashed.
pub fn record(root: &Path) -> io::Result<Vec<Entry>> {
    scan(root, &|_, _| true)
}

/// How an entry differs from the baseline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    Added,
    Removed,
    Modified,
}

/// One difference between a tree and its baseline manifest.
#[derive(Debug, Clone, Serialize)]
pub struct Change {
    pub path: String,
    pub change: ChangeKind,
    /// The entry as it is now (`None` when removed).
    pub now: Option<Entry>,
    /// The entry as the baseline recorded it (`None` when added).
    pub was: Option<Entry>,
}

/// Compares the tree under `root` with `baseline`. Files are hashed only where the size alone
/// cannot tell, so a huge new file costs no reading.
pub fn changes(root: &Path, baseline: &[Entry]) -> io::Result<Vec<Change>> {
    let before: BTreeMap<&str, &Entry> = baseline.iter().map(|e| (e.path.as_str(), e)).collect();
    let needs_hash = |path: &str, size: u64| {
        before
            .get(path)
            .is_some_and(|was| was.kind == EntryKind::File && was.size == size)
    };
    let now = scan(root, &needs_hash)?;
    let mut seen = std::collections::BTreeSet::new();
    let mut found = Vec::new();
    for entry in now {
        seen.insert(entry.path.clone());
        match before.get(entry.path.as_str()) {
            None => found.push(Change {
                path: entry.path.clone(),
                change: ChangeKind::Added,
                now: Some(entry),
                was: None,
            }),
            Some(was) if differs(was, &entry) => found.push(Change {
                path: entry.path.clone(),
                change: ChangeKind::Modified,
                now: Some(entry),
                was: Some((*was).clone()),
            }),
            Some(_) => {}
        }
    }
    for was in baseline {
        if !seen.contains(&was.path) {
            found.push(Change {
                path: was.path.clone(),
                change: ChangeKind::Removed,
                now: None,
                was: Some(was.clone()),
            });
        }
    }
    found.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(found)
}

fn differs(was: &Entry, now: &Entry) -> bool {
    if was.kind != now.kind || was.mode != now.mode {
        return true;
    }
    match now.kind {
        // A folder's size and link count follow its contents, which are entries of their own.
        EntryKind::Dir => false,
        EntryKind::Symlink => was.target != now.target,
        _ => was.size != now.size || was.links != now.links || was.sha256 != now.sha256,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(changes: &[Change]) -> Vec<(String, ChangeKind)> {
        changes.iter().map(|c| (c.path.clone(), c.change)).collect()
    }

    #[test]
    fn every_entry_type_and_every_kind_of_change_is_seen() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        std::fs::write(root.join("a/b/same.txt"), "same").unwrap();
        std::fs::write(root.join("a/edit.txt"), "1234").unwrap();
        std::fs::write(root.join("gone.txt"), "x").unwrap();
        std::fs::write(root.join("mode.txt"), "x").unwrap();
        let baseline = record(root).unwrap();
        assert!(
            baseline
                .iter()
                .all(|e| e.kind != EntryKind::File || e.sha256.is_some())
        );

        // Same size, other bytes: found by the hash.
        std::fs::write(root.join("a/edit.txt"), "abcd").unwrap();
        std::fs::remove_file(root.join("gone.txt")).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(
            root.join("mode.txt"),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        nix::unistd::mkfifo(&root.join("fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", root.join("link")).unwrap();
        std::fs::hard_link(root.join("a/b/same.txt"), root.join("hard")).unwrap();
        let _socket = std::os::unix::net::UnixListener::bind(root.join("sock")).unwrap();

        let found = changes(root, &baseline).unwrap();
        assert_eq!(
            kinds(&found),
            [
                ("a/b/same.txt".to_owned(), ChangeKind::Modified), // its link count is 2 now
                ("a/edit.txt".to_owned(), ChangeKind::Modified),
                ("fifo".to_owned(), ChangeKind::Added),
                ("gone.txt".to_owned(), ChangeKind::Removed),
                ("hard".to_owned(), ChangeKind::Added),
                ("link".to_owned(), ChangeKind::Added),
                ("mode.txt".to_owned(), ChangeKind::Modified),
                ("sock".to_owned(), ChangeKind::Added),
            ]
        );
        let now = |path: &str| found.iter().find(|c| c.path == path).unwrap().now.clone();
        assert_eq!(now("fifo").unwrap().kind, EntryKind::Fifo);
        assert_eq!(now("sock").unwrap().kind, EntryKind::Socket);
        assert_eq!(now("hard").unwrap().links, 2);
        assert_eq!(now("link").unwrap().target.as_deref(), Some("/etc/passwd"));
    }

    #[test]
    fn names_that_are_not_utf8_are_escaped_one_to_one() {
        assert_eq!(path_text(b"a/b.txt"), "a/b.txt");
        assert_eq!(path_text(b"a\\b"), "a\\\\b");
        assert_eq!(path_text(b"x\xffy"), "x\\xffy");
        assert_ne!(path_text(b"x\xffy"), path_text(b"x\\xffy"));
    }
}
