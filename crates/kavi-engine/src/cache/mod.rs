//! Up-to-date nodes: a node that declares its `inputs` gets a key, and when a node run with the
//! same key succeeded before, the node is `cached`: its recorded outputs are taken and its
//! declared output files restored from the artifact store, with no process started.
//!
//! The key is the SHA-256 over named parts, each itself a hash: the node's definition, the
//! parameters and upstream outputs its templates read, the contents of its input files, the
//! environment its process would get, the files that govern it (its policies, templates, chains
//! and the scripts it declares or executes; of the pipeline file, its definition is what
//! matters), the settings of the configuration its result depends on (its kind's, and those its
//! templates read: never `jobs` or a timeout), and kavi's version. The parts are recorded with the
//! node run, so `kavi explain` can say which of them changed when a node ran again.
//!
//! Nothing is guessed: a node without declared inputs always runs, and `cache = false` or
//! `--no-cache` runs it whatever its key (the key is still recorded for later runs).

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::files::open_regular;
use crate::hash::{hash_reader, sha256_hex};
use crate::ledger::{Artifact, ArtifactStore};
use crate::spec::{InputPattern, output_path};

mod digests;
pub use digests::DigestMemo;

/// A node's key: named parts, each a hash (or a short fact such as `missing`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Key {
    pub parts: BTreeMap<String, String>,
}

impl Key {
    pub fn add(&mut self, name: impl Into<String>, value: impl AsRef<[u8]>) {
        self.parts.insert(name.into(), sha256_hex(value.as_ref()));
    }

    /// The key itself: the SHA-256 (hex) of one `name=value` LF line per part, sorted by name.
    pub fn digest(&self) -> String {
        let mut hasher = Sha256::new();
        for (name, value) in &self.parts {
            hasher.update(format!("{name}={value}\n"));
        }
        format!("{:x}", hasher.finalize())
    }

    pub fn parts_json(&self) -> Value {
        Value::Object(
            self.parts
                .iter()
                .map(|(name, value)| (name.clone(), Value::String(value.clone())))
                .collect(),
        )
    }

    /// Adds an `input:<path>` part for every file the node's inputs name: its content's hash,
    /// `symlink:<hash of the target>` for a link (not followed), `missing` for a plain path that
    /// does not exist. Paths under `skip` (kavi's own state) are never inputs. A large file
    /// unchanged since `memo` last read it is not read again (see [`DigestMemo`]).
    ///
    /// `stopped` is asked before each entry walked and each buffer read: once it says yes (the
    /// run was cancelled), hashing ends with an error at once, however much is left to read.
    pub fn add_inputs(
        &mut self,
        workspace: &Path,
        inputs: &[InputPattern],
        skip: &[PathBuf],
        memo: &DigestMemo,
        stopped: &dyn Fn() -> bool,
    ) -> io::Result<()> {
        let check = until(stopped);
        for input in inputs {
            let base = workspace.join(input.base());
            if input.glob().is_none() && base.symlink_metadata().is_err() {
                self.parts
                    .insert(format!("input:{}", input.text), "missing".into());
                continue;
            }
            let walker = walkdir::WalkDir::new(&base)
                .follow_links(false)
                .sort_by_file_name()
                .into_iter()
                .filter_entry(|entry| !skip.iter().any(|s| entry.path().starts_with(s)));
            for entry in walker {
                let entry = match entry {
                    Ok(entry) => entry,
                    // A glob's folder that does not exist matches nothing.
                    Err(e) if input.glob().is_some() && e.depth() == 0 => break,
                    Err(e) => return Err(io::Error::other(e)),
                };
                // Asked for every entry walked, matched or not: a glob over a large tree that
                // matches little is as much work as one that matches much.
                check()?;
                let relative = entry
                    .path()
                    .strip_prefix(workspace)
                    .expect("inputs are walked inside the workspace");
                if input.glob().is_some_and(|g| !g.is_match(relative)) {
                    continue;
                }
                let name = format!("input:{}", relative.display());
                let file_type = entry.file_type();
                if file_type.is_file() {
                    let digest = memo.hash(entry.path(), &relative.to_string_lossy(), &check)?;
                    self.parts.insert(name, digest);
                } else if file_type.is_symlink() {
                    let target = std::fs::read_link(entry.path())?;
                    let target = sha256_hex(target.as_os_str().as_encoded_bytes());
                    self.parts.insert(name, format!("symlink:{target}"));
                }
            }
        }
        Ok(())
    }
}

/// A check that fails once `stopped` says the run stopped (it was cancelled): asked between
/// buffers, it ends a read or copy of any size at once.
fn until(stopped: &dyn Fn() -> bool) -> impl Fn() -> io::Result<()> + '_ {
    move || {
        if stopped() {
            return Err(io::Error::other("the run stopped meanwhile"));
        }
        Ok(())
    }
}

/// The SHA-256 (hex) of what `reader` yields, read while `check` allows.
fn hash_checked(
    reader: &mut impl io::Read,
    check: &impl Fn() -> io::Result<()>,
) -> io::Result<String> {
    let mut reading = Checked {
        inner: reader,
        check,
    };
    Ok(hash_reader(&mut reading)?.0)
}

/// A file read, or written, while `check` allows: each read or write asks it first.
struct Checked<T, C> {
    inner: T,
    check: C,
}

impl<R: io::Read, C: Fn() -> io::Result<()>> io::Read for Checked<R, C> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        (self.check)()?;
        self.inner.read(buf)
    }
}

impl<W: io::Write, C: Fn() -> io::Result<()>> io::Write for Checked<W, C> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        (self.check)()?;
        self.inner.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Stores the declared output files of a node that succeeded, as (path, artifact). A declared
/// output that was not written, or is not a regular file, fails the node: what is restored later
/// must be what it made.
///
/// Each is copied through `scratch` (see [`ArtifactStore::put_read`]); `stopped` is asked
/// between buffers, as by [`Key::add_inputs`].
pub fn store_outputs(
    workspace: &Path,
    outputs: &[String],
    store: &ArtifactStore,
    scratch: &Path,
    stopped: &dyn Fn() -> bool,
) -> Result<Vec<(String, Artifact)>, String> {
    let check = until(stopped);
    let mut stored = Vec::with_capacity(outputs.len());
    for output in outputs {
        let path = output_path(workspace, output).map_err(|e| format!("declared output {e}"))?;
        match path.symlink_metadata() {
            Ok(meta) if meta.is_file() => {}
            Ok(_) => {
                return Err(format!(
                    "declared output `{output}` is not a regular file (outputs are files, not \
                     links or folders)"
                ));
            }
            Err(_) => return Err(format!("declared output `{output}` was not written")),
        }
        // Opened as what was just checked, or refused: a FIFO or a link swapped in meanwhile is
        // neither waited on nor followed.
        let artifact = open_regular(&path)
            .and_then(|file| {
                let mut reading = Checked {
                    inner: file,
                    check: &check,
                };
                store.put_read("OUTPUT", &mut reading, scratch)
            })
            .map_err(|e| format!("failed to store declared output `{output}`: {e}"))?;
        stored.push((output.clone(), artifact));
    }
    Ok(stored)
}

/// Puts recorded output files back where they were written, each copied through `copy` (which
/// re-hashes what it writes, and fails when that is not what was recorded). A file that already
/// holds the recorded content is left alone; another is replaced by a rename, so a link in its
/// place is replaced, never followed. Every copy is made and checked in `staging` (the run's
/// spill folder, on the store's file system) before any output is touched, one buffer at a
/// time: an output of any size is never held in memory.
///
/// `stopped` is asked between buffers, as by [`Key::add_inputs`]: a stop leaves every output
/// as it was.
pub fn restore_outputs(
    workspace: &Path,
    files: &BTreeMap<String, String>,
    staging: &Path,
    copy: impl Fn(&str, &mut dyn io::Write) -> Result<(), String>,
    stopped: &dyn Fn() -> bool,
) -> Result<usize, String> {
    let check = until(stopped);
    let mut wanted = Vec::new();
    for (output, sha256) in files {
        let path = output_path(workspace, output).map_err(|e| format!("recorded output {e}"))?;
        // Anything but a regular file (missing, a link, a FIFO) is refused by the open: replaced.
        let current = open_regular(&path)
            .and_then(|mut file| hash_checked(&mut file, &check))
            .ok();
        if current.is_some_and(|hash| &hash == sha256) {
            continue;
        }
        let unusable = |e: String| format!("the stored copy of output `{output}` is unusable: {e}");
        let mut staged = new_output_file(staging).map_err(|e| unusable(e.to_string()))?;
        let mut writing = Checked {
            inner: staged.as_file_mut(),
            check: &check,
        };
        copy(sha256, &mut writing).map_err(unusable)?;
        wanted.push((path, staged));
    }
    let restored = wanted.len();
    for (path, staged) in wanted {
        put_in_place(staged, &path)
            .map_err(|e| format!("failed to restore {}: {e}", path.display()))?;
    }
    Ok(restored)
}

/// A temporary file in `folder` (made if need be) made as a program would make its output:
/// readable as the umask allows, not only by its owner as temporary files are.
fn new_output_file(folder: &Path) -> io::Result<tempfile::NamedTempFile> {
    use std::os::unix::fs::PermissionsExt;
    let mut builder = tempfile::Builder::new();
    builder.permissions(std::fs::Permissions::from_mode(0o666));
    crate::files::temp_file_in(folder, &builder)
}

/// Renames `staged` to `path`, making its folder first; where the two are on different file
/// systems, copies it into a temporary file beside `path` and renames that.
fn put_in_place(staged: tempfile::NamedTempFile, path: &Path) -> io::Result<()> {
    let parent = path.parent().expect("an output path has a parent");
    std::fs::create_dir_all(parent)?;
    let staged = match staged.persist(path) {
        Ok(_) => return Ok(()),
        Err(e) if e.error.raw_os_error() == Some(nix::libc::EXDEV) => e.file,
        Err(e) => return Err(e.error),
    };
    let mut local = new_output_file(parent)?;
    io::copy(&mut staged.reopen()?, local.as_file_mut())?;
    local.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// How the parts of two keys differ, in words, for `kavi explain`: `changed`, `new` or `gone`,
/// each naming the part (`input `a.txt``, `parameter `n``, `policy `policies/x.toml``, ...).
pub fn differences(
    before: &BTreeMap<String, String>,
    now: &BTreeMap<String, String>,
) -> Vec<String> {
    let mut differences = Vec::new();
    for (name, value) in now {
        match before.get(name) {
            Some(old) if old == value => {}
            Some(_) => differences.push(format!("{} changed", describe_part(name))),
            None => differences.push(format!("{} is new", describe_part(name))),
        }
    }
    for name in before.keys().filter(|name| !now.contains_key(*name)) {
        differences.push(format!("{} is gone", describe_part(name)));
    }
    differences
}

/// A part's name as a reader would say it.
fn describe_part(name: &str) -> String {
    let Some((kind, what)) = name.split_once(':') else {
        return match name {
            "definition" => "the node's definition".to_owned(),
            "kavi" => "kavi's version".to_owned(),
            other => format!("`{other}`"),
        };
    };
    let kind = match kind {
        "input" => "input",
        "param" => "parameter",
        "node" => "the outputs of node",
        "run" => "the run's",
        "env" => "environment variable",
        "config" => "setting",
        other => other,
    };
    format!("{kind} `{what}`")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_of(root: &Path, patterns: &[&str]) -> Key {
        let inputs: Vec<InputPattern> = patterns
            .iter()
            .map(|p| InputPattern::parse(p).unwrap())
            .collect();
        let mut key = Key::default();
        let memo = DigestMemo::of_store(&ArtifactStore::open(&root.join(".kavi")).unwrap());
        key.add_inputs(root, &inputs, &[root.join(".kavi")], &memo, &|| false)
            .unwrap();
        key
    }

    #[test]
    fn globs_match_within_folders_and_double_stars_cross_them() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("src/deep")).unwrap();
        std::fs::create_dir_all(root.join(".kavi")).unwrap();
        for file in [
            "src/a.py",
            "src/b.txt",
            "src/deep/c.py",
            ".kavi/d.py",
            "e.py",
        ] {
            std::fs::write(root.join(file), file).unwrap();
        }
        let names = |key: Key| key.parts.into_keys().collect::<Vec<_>>();
        assert_eq!(names(key_of(root, &["src/*.py"])), ["input:src/a.py"]);
        assert_eq!(
            names(key_of(root, &["src/**/*.py"])),
            ["input:src/a.py", "input:src/deep/c.py"]
        );
        // A plain folder is every file under it; kavi's own state never is an input.
        assert_eq!(
            names(key_of(root, &["src"])),
            ["input:src/a.py", "input:src/b.txt", "input:src/deep/c.py"]
        );
        assert_eq!(
            names(key_of(root, &["**/*.py"])),
            ["input:e.py", "input:src/a.py", "input:src/deep/c.py"]
        );
        assert!(names(key_of(root, &["nowhere/*.py"])).is_empty());
        assert_eq!(
            key_of(root, &["absent.txt"]).parts["input:absent.txt"],
            "missing"
        );
    }

    #[test]
    fn the_key_changes_with_any_part_and_differences_name_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.txt"), "one").unwrap();
        let before = key_of(dir.path(), &["a.txt"]);
        assert_eq!(before.digest(), key_of(dir.path(), &["a.txt"]).digest());
        std::fs::write(dir.path().join("a.txt"), "two").unwrap();
        let mut now = key_of(dir.path(), &["a.txt"]);
        now.add("param:n", "3");
        assert_ne!(before.digest(), now.digest());
        assert_eq!(
            differences(&before.parts, &now.parts),
            ["input `a.txt` changed", "parameter `n` is new"]
        );
    }

    #[test]
    fn outputs_are_stored_and_restored_without_following_links() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("ws");
        std::fs::create_dir_all(root.join("out")).unwrap();
        let store = ArtifactStore::open(&dir.path().join("store")).unwrap();
        std::fs::write(root.join("out/result.txt"), "made").unwrap();
        let store_one = |output: &str| {
            store_outputs(&root, &[output.into()], &store, &store.temp_dir(), &|| {
                false
            })
        };
        let stored = store_one("out/result.txt").unwrap();
        let files: BTreeMap<String, String> = stored
            .iter()
            .map(|(path, artifact)| (path.clone(), artifact.sha256.clone()))
            .collect();
        let staging = store.temp_dir();
        let read = |sha: &str, to: &mut dyn io::Write| -> Result<(), String> {
            assert_eq!(sha, sha256_hex(b"made"));
            to.write_all(b"made").map_err(|e| e.to_string())
        };
        // Unchanged: nothing written.
        assert_eq!(
            restore_outputs(&root, &files, &staging, read, &|| false).unwrap(),
            0
        );
        // A link put in its place is replaced, and what it pointed at is untouched.
        let victim = dir.path().join("victim.txt");
        std::fs::write(&victim, "keep").unwrap();
        std::fs::remove_file(root.join("out/result.txt")).unwrap();
        std::os::unix::fs::symlink(&victim, root.join("out/result.txt")).unwrap();
        assert_eq!(
            restore_outputs(&root, &files, &staging, read, &|| false).unwrap(),
            1
        );
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
        assert_eq!(
            std::fs::read_to_string(root.join("out/result.txt")).unwrap(),
            "made"
        );
        // A folder that leads out of the workspace is refused, and nothing is written there.
        let outside = dir.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("escape")).unwrap();
        let escaping = BTreeMap::from([("escape/x.txt".to_owned(), sha256_hex(b"made"))]);
        let error = restore_outputs(&root, &escaping, &staging, read, &|| false).unwrap_err();
        assert_eq!(
            error,
            "recorded output `escape/x.txt` resolves outside the workspace"
        );
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);
        // An output that is missing, or a link, is refused when storing.
        let missing = store_one("out/none.txt").unwrap_err();
        assert_eq!(missing, "declared output `out/none.txt` was not written");
        std::os::unix::fs::symlink(&victim, root.join("out/link.txt")).unwrap();
        let link = store_one("out/link.txt").unwrap_err();
        assert!(link.contains("is not a regular file"), "{link}");
    }

    #[test]
    fn an_output_is_put_back_across_file_systems_by_a_copy() {
        use std::os::unix::fs::MetadataExt;
        let workspace = tempfile::tempdir().unwrap();
        // The staging folder on another file system, where a rename cannot reach the workspace.
        let Some(staging) = ["/dev/shm", "/run"]
            .iter()
            .filter_map(|base| tempfile::tempdir_in(base).ok())
            .find(|dir| {
                let device = |path: &Path| std::fs::metadata(path).unwrap().dev();
                device(dir.path()) != device(workspace.path())
            })
        else {
            let missing = "no writable folder on a file system other than the workspace's";
            // CI's machine has a tmpfs at /dev/shm: there, this test must run.
            assert!(std::env::var_os("CI").is_none(), "CI must: {missing}");
            eprintln!("skipping: {missing}");
            return;
        };
        let files = BTreeMap::from([("out/a.txt".to_owned(), sha256_hex(b"made"))]);
        let copy =
            |_: &str, to: &mut dyn io::Write| to.write_all(b"made").map_err(|e| e.to_string());
        let restored =
            restore_outputs(workspace.path(), &files, staging.path(), copy, &|| false).unwrap();
        assert_eq!(restored, 1);
        assert_eq!(
            std::fs::read(workspace.path().join("out/a.txt")).unwrap(),
            b"made"
        );
        assert_eq!(std::fs::read_dir(staging.path()).unwrap().count(), 0);
        // Only the output is left in its folder, no temporary copy beside it.
        assert_eq!(
            std::fs::read_dir(workspace.path().join("out"))
                .unwrap()
                .count(),
            1
        );
    }

    #[test]
    fn a_stop_ends_storing_and_putting_back_and_leaves_every_file_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("ws");
        std::fs::create_dir_all(root.join("out")).unwrap();
        let store = ArtifactStore::open(&dir.path().join("store")).unwrap();
        // Past the 16 KiB the ledger keeps: a file copied into the store, buffer by buffer.
        let made = vec![b'x'; 64 * 1024];
        std::fs::write(root.join("out/big.bin"), &made).unwrap();
        let outputs = ["out/big.bin".to_owned()];
        let error =
            store_outputs(&root, &outputs, &store, &store.temp_dir(), &|| true).unwrap_err();
        assert!(error.ends_with("the run stopped meanwhile"), "{error}");
        assert_eq!(std::fs::read_dir(store.temp_dir()).unwrap().count(), 0);
        let stored = store_outputs(&root, &outputs, &store, &store.temp_dir(), &|| false).unwrap();
        let files = BTreeMap::from([(outputs[0].clone(), stored[0].1.sha256.clone())]);
        std::fs::write(root.join("out/big.bin"), "changed").unwrap();
        let copy = |sha256: &str, to: &mut dyn io::Write| store.copy_out(sha256, to);
        let staging = store.temp_dir();
        let error = restore_outputs(&root, &files, &staging, copy, &|| true).unwrap_err();
        assert!(error.ends_with("the run stopped meanwhile"), "{error}");
        assert_eq!(std::fs::read(root.join("out/big.bin")).unwrap(), b"changed");
        assert_eq!(std::fs::read_dir(&staging).unwrap().count(), 0);
        assert_eq!(
            restore_outputs(&root, &files, &staging, copy, &|| false),
            Ok(1)
        );
        assert_eq!(std::fs::read(root.join("out/big.bin")).unwrap(), made);
    }
}
