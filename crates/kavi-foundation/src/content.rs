//! A folder's content as text, one line per entry: what kavi adopts of a program environment it
//! does not make itself (a toolchain `kavi.toml` names), so that the bytes its tools run are the
//! bytes someone adopted, whatever files inside it claim about themselves (pip's `RECORD` is
//! one of those files).
//!
//! Every entry is listed, bytecode and metadata included: Python runs a planted
//! `__pycache__/*.pyc` whose header matches its source, and a rewritten `RECORD` is exactly the
//! attack this closes. A link is listed by its target; the environment's interpreter, which its
//! `bin/python` links to outside the folder, is listed by its bytes too.
//!
//! Hashing a large environment (a Python toolchain is over 100 MB) on every check would be slow,
//! so a file's hash is kept in this process with the metadata it was taken at (device, inode,
//! size, modification and change times): a file written, replaced or touched has another, and
//! is hashed again. The change time cannot be set back by a user, so a rewrite that restores
//! the modification time is still seen.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::hash::hash_file;

/// The metadata a cached hash was taken at.
type Stamp = (u64, u64, u64, i64, i64, i64, i64);

static HASHES: Mutex<Option<HashMap<PathBuf, (Stamp, String)>>> = Mutex::new(None);

fn stamp(meta: &std::fs::Metadata) -> Stamp {
    (
        meta.dev(),
        meta.ino(),
        meta.size(),
        meta.mtime(),
        meta.mtime_nsec(),
        meta.ctime(),
        meta.ctime_nsec(),
    )
}

/// The SHA-256 (hex) of the regular file at `path` (never through a link), from this process's
/// cache while its metadata is unchanged.
fn file_hash(path: &Path, meta: &std::fs::Metadata) -> std::io::Result<String> {
    let stamp = stamp(meta);
    let cached = HASHES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .as_ref()
        .and_then(|hashes| hashes.get(path))
        .filter(|(at, _)| *at == stamp)
        .map(|(_, hash)| hash.clone());
    if let Some(hash) = cached {
        return Ok(hash);
    }
    let (hash, _) = hash_file(path)?;
    // Metadata taken after the read: a file written while it was read is hashed again next time.
    let after = std::fs::symlink_metadata(path)?;
    if self::stamp(&after) == stamp {
        HASHES
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get_or_insert_with(HashMap::new)
            .insert(path.to_owned(), (stamp, hash.clone()));
    }
    Ok(hash)
}

/// The manifest of `folder`, in path order: `file <mode> <sha256> <path>`, `link <path> ->
/// <target>` and `dir <mode> <path>` lines (paths relative to the folder), then `interpreter
/// <sha256> <path>` for the file `bin/python` resolves to, when it has one. An entry that is
/// neither (a socket, a device) or cannot be read is an error naming it.
pub fn manifest(folder: &Path) -> Result<String, String> {
    let mut lines = Vec::new();
    for entry in walkdir::WalkDir::new(folder)
        .follow_links(false)
        .sort_by_file_name()
    {
        let entry = entry.map_err(|e| format!("cannot read {}: {e}", folder.display()))?;
        let path = entry.path();
        let Ok(relative) = path.strip_prefix(folder) else {
            continue;
        };
        if relative.as_os_str().is_empty() {
            continue;
        }
        let name = relative.to_string_lossy();
        let meta = entry
            .metadata()
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let mode = meta.mode() & 0o7777;
        let kind = entry.file_type();
        if kind.is_symlink() {
            let target = std::fs::read_link(path)
                .map_err(|e| format!("cannot read the link {}: {e}", path.display()))?;
            lines.push(format!("link {name} -> {}", target.to_string_lossy()));
        } else if kind.is_dir() {
            lines.push(format!("dir {mode:o} {name}"));
        } else if kind.is_file() {
            let hash = file_hash(path, &meta)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            lines.push(format!("file {mode:o} {hash} {name}"));
        } else {
            return Err(format!(
                "{} is neither a file, a folder nor a link",
                path.display()
            ));
        }
    }
    let python = folder.join("bin/python");
    if python.is_symlink() {
        let real = python
            .canonicalize()
            .map_err(|e| format!("cannot resolve {}: {e}", python.display()))?;
        let meta = std::fs::symlink_metadata(&real)
            .map_err(|e| format!("cannot read {}: {e}", real.display()))?;
        let hash =
            file_hash(&real, &meta).map_err(|e| format!("cannot read {}: {e}", real.display()))?;
        lines.push(format!("interpreter {hash} {}", real.display()));
    }
    lines.push(String::new());
    Ok(lines.join("\n"))
}

/// A digest of the metadata of every entry of `folder` and of its interpreter (see
/// [`manifest`]), nothing read: equal before and after a run only if no file was written,
/// replaced, moved or touched in between, even one put back as it was.
pub fn stamps(folder: &Path) -> Result<String, String> {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    let mut add = |path: &Path, meta: &std::fs::Metadata| {
        hasher.update(format!(
            "{:?} {} {:?}\n",
            stamp(meta),
            meta.mode(),
            path.as_os_str()
        ));
    };
    for entry in walkdir::WalkDir::new(folder)
        .follow_links(false)
        .sort_by_file_name()
    {
        let entry = entry.map_err(|e| format!("cannot read {}: {e}", folder.display()))?;
        let meta = entry
            .metadata()
            .map_err(|e| format!("cannot read {}: {e}", entry.path().display()))?;
        add(entry.path(), &meta);
    }
    if let Ok(real) = folder.join("bin/python").canonicalize()
        && let Ok(meta) = std::fs::symlink_metadata(&real)
    {
        add(&real, &meta);
    }
    Ok(format!("{:x}", hasher.finalize()))
}

/// What differs between two manifests, by entry: `` `bin/ruff` changed ``, `added`, `removed`,
/// the interpreter's own line as `the interpreter changed`; the first `at_most`, then how many
/// more.
pub fn differences(before: &str, after: &str, at_most: usize) -> Vec<String> {
    fn entries(text: &str) -> std::collections::BTreeMap<String, &str> {
        text.lines()
            .filter(|line| !line.is_empty())
            .map(|line| (entry_name(line), line))
            .collect()
    }
    let (old, new) = (entries(before), entries(after));
    let mut names: Vec<&String> = old.keys().chain(new.keys()).collect();
    names.sort();
    names.dedup();
    let mut found: Vec<String> = names
        .into_iter()
        .filter_map(|name| {
            let what = match (old.get(name), new.get(name)) {
                (Some(a), Some(b)) if a == b => return None,
                (Some(_), Some(_)) => "changed",
                (Some(_), None) => "removed",
                (None, _) => "added",
            };
            Some(if name.is_empty() {
                format!("the interpreter {what}")
            } else {
                format!("`{name}` {what}")
            })
        })
        .collect();
    if found.len() > at_most {
        let more = found.len() - at_most;
        found.truncate(at_most);
        found.push(format!("{more} more"));
    }
    found
}

/// The path a manifest line is about (empty for the interpreter's line, of which there is one).
fn entry_name(line: &str) -> String {
    let mut words = line.splitn(4, ' ');
    match words.next() {
        Some("link") => line[5..]
            .split(" -> ")
            .next()
            .unwrap_or_default()
            .to_owned(),
        Some("dir") => line.splitn(3, ' ').nth(2).unwrap_or_default().to_owned(),
        Some("file") => words.nth(2).unwrap_or_default().to_owned(),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_mode_and_link_is_in_the_manifest_and_a_change_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("bin")).unwrap();
        std::fs::create_dir_all(root.join("lib/__pycache__")).unwrap();
        std::fs::write(root.join("bin/tool"), "#!/bin/python\nimport tool\n").unwrap();
        std::fs::write(root.join("lib/__pycache__/tool.pyc"), "bytecode").unwrap();
        std::fs::write(root.join("lib/RECORD"), "tool,sha256=x,1\n").unwrap();
        // The interpreter lives outside the environment, as a venv's does.
        let system = tempfile::tempdir().unwrap();
        let interpreter = system.path().join("python3.11");
        std::fs::write(&interpreter, "ELF").unwrap();
        std::os::unix::fs::symlink(&interpreter, root.join("bin/python")).unwrap();
        let before = manifest(root).unwrap();
        assert_eq!(
            manifest(root).unwrap(),
            before,
            "the same folder, the same text"
        );
        assert!(before.contains("link bin/python -> "), "{before}");
        assert!(before.contains("interpreter "), "{before}");

        // A rewritten script is seen, as the cache keys on its metadata.
        std::fs::write(root.join("bin/tool"), "#!/bin/sh\nexit 0 # padding..\n").unwrap();
        let after = manifest(root).unwrap();
        assert_eq!(differences(&before, &after, 5), ["`bin/tool` changed"]);

        std::fs::write(root.join("lib/__pycache__/tool.pyc"), "planted!").unwrap();
        std::fs::write(root.join("lib/sitecustomize.py"), "").unwrap();
        std::fs::write(&interpreter, "ELF2").unwrap();
        let later = manifest(root).unwrap();
        assert_eq!(
            differences(&after, &later, 5),
            [
                "the interpreter changed",
                "`lib/__pycache__/tool.pyc` changed",
                "`lib/sitecustomize.py` added"
            ]
        );
        assert_eq!(
            differences(&after, &later, 1),
            ["the interpreter changed", "2 more"]
        );

        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(
            root.join("lib/RECORD"),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        assert_eq!(
            differences(&later, &manifest(root).unwrap(), 5),
            ["`lib/RECORD` changed"]
        );

        // A file replaced and put back as it was is the same content, but not the same stamps.
        let stamped = stamps(root).unwrap();
        assert_eq!(stamps(root).unwrap(), stamped);
        let content = manifest(root).unwrap();
        std::fs::rename(root.join("bin/tool"), root.join("bin/kept")).unwrap();
        std::fs::write(root.join("bin/tool"), "#!/bin/sh\nexit 0\n").unwrap();
        std::fs::remove_file(root.join("bin/tool")).unwrap();
        std::fs::rename(root.join("bin/kept"), root.join("bin/tool")).unwrap();
        assert_eq!(manifest(root).unwrap(), content);
        assert_ne!(stamps(root).unwrap(), stamped);
    }
}
