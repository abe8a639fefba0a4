//! Digests of large input files, remembered by each file's identity and times, so that an
//! unchanged input of gigabytes is not read again on every run to make its node's key.
//!
//! A remembered digest is used only while the file's device, inode, size, modification time and
//! change time are all as they were when it was read. The change time (ctime) is the one no
//! process can choose: writing, truncating, replacing the file, `touch -d` and `utimensat` all
//! set it to the kernel's clock. Two writes within one tick of the file system's clock can
//! leave the times as the first one set them (git calls such entries "racily clean"), so a
//! digest is remembered only for a file whose change time was already [`SETTLED`] in the past
//! when its reading began, and still the same when it ended. A file changed more recently than
//! that is read on every run until it settles.
//!
//! Files below [`MEMO_MIN`] are simply read. The memo lives in the artifact store, kavi's
//! state, which no sandbox copy holds and no confined process may write; it is one small file
//! per input path, written by rename and never synced: a memo lost or torn by a crash is
//! ignored, and the input read again.

use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::hash_checked;
use crate::files::{open_regular, temp_file_in};
use crate::hash::sha256_hex;
use crate::ledger::ArtifactStore;

/// The size from which a file's digest is remembered. Reading a memo costs tens of
/// microseconds and each one is a file; hashing 1 MiB costs under a millisecond (SHA-256 runs
/// at about 1.5 GB/s here). Below this, a workspace of many small inputs would gain little
/// for as many memo files.
const MEMO_MIN: u64 = 1 << 20;

/// How long ago a file must have last changed for its digest to be remembered: far more than
/// a tick of any file system's clock, and short enough that an input written by one run is
/// remembered by the next.
const SETTLED: Duration = Duration::from_secs(2);

/// The first line of every memo; another first line (a later format) is not read.
const FORMAT: &str = "kavi-digest-v1";

/// Where the digests of large input files are remembered (see the module's comment).
#[derive(Debug, Clone)]
pub struct DigestMemo {
    dir: PathBuf,
    /// Where a memo is written before it is renamed into `dir`: the store's temporary folder,
    /// which `kavi gc` clears of what a crash left there.
    temp: PathBuf,
    settled: Duration,
}

/// What identifies a file's content without reading it: device, inode, size, modification
/// time and change time (seconds and nanoseconds each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp([i64; 7]);

impl Stamp {
    fn of(metadata: &fs::Metadata) -> Self {
        // Device, inode and size are unsigned in the kernel; as i64 they still compare equal
        // exactly when they are, which is all a stamp is for.
        Self([
            metadata.dev() as i64,
            metadata.ino() as i64,
            metadata.size() as i64,
            metadata.mtime(),
            metadata.mtime_nsec(),
            metadata.ctime(),
            metadata.ctime_nsec(),
        ])
    }

    /// Whether the file last changed at least `settled` before `now`.
    fn settled_before(&self, now: SystemTime, settled: Duration) -> bool {
        let changed = i128::from(self.0[5]) * 1_000_000_000 + i128::from(self.0[6]);
        let now = now
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_nanos() as i128);
        changed + settled.as_nanos() as i128 <= now
    }

    fn line(&self) -> String {
        self.0.map(|n| n.to_string()).join(" ")
    }
}

impl DigestMemo {
    /// The memo of `store`, whose folder is made when the first digest is remembered.
    pub fn of_store(store: &ArtifactStore) -> Self {
        Self {
            dir: store.digests_dir(),
            temp: store.temp_dir(),
            settled: SETTLED,
        }
    }

    /// The SHA-256 (hex) of the regular file at `path` (see [`open_regular`]), which the
    /// node's inputs name `name`: remembered when the file is large and unchanged since it was
    /// last read, else read while `check` allows, and remembered for next time when it is
    /// large and settled.
    pub fn hash(
        &self,
        path: &Path,
        name: &str,
        check: &impl Fn() -> io::Result<()>,
    ) -> io::Result<String> {
        let mut file = open_regular(path)?;
        // The length at open bounds the read: no second `fstat` for the many small inputs.
        if file.limit() < MEMO_MIN {
            return hash_checked(&mut file, check);
        }
        let stamp = Stamp::of(&file.get_ref().metadata()?);
        let memo = self.dir.join(sha256_hex(name.as_bytes()));
        if let Some(digest) = recalled(&memo, name, &stamp) {
            return Ok(digest);
        }
        let began = SystemTime::now();
        // What is read is as long as the file was at open; a file that grew since is not the
        // one the stamp describes.
        let whole = u64::try_from(stamp.0[2]).is_ok_and(|size| size == file.limit());
        let digest = hash_checked(&mut file, check)?;
        let unchanged = Stamp::of(&file.get_ref().metadata()?) == stamp;
        if whole && unchanged && stamp.settled_before(began, self.settled) {
            // Only a memo lost: the next run reads the file again.
            if let Err(e) = self.remember(&memo, name, &stamp, &digest) {
                tracing::debug!(error = %e, input = name, "failed to remember an input's digest");
            }
        }
        Ok(digest)
    }

    /// Removes (unless `dry_run`) the memos of inputs no longer in `workspace`, and anything
    /// in the memo's folder that is no memo: returns how many, and their bytes. Each memo names
    /// its input, so a workspace that deleted or renamed large inputs keeps no memo of them.
    pub fn forget_gone(&self, workspace: &Path, dry_run: bool) -> (usize, u64) {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return (0, 0);
        };
        let mut gone = (0, 0);
        for entry in entries.flatten() {
            let path = entry.path();
            let named = memo_lines(&path).and_then(|lines| Some(workspace.join(lines.get(1)?)));
            if named.is_some_and(|input| input.symlink_metadata().is_ok()) {
                continue;
            }
            gone.0 += 1;
            gone.1 += entry.metadata().map_or(0, |m| m.len());
            if !dry_run {
                let _ = fs::remove_file(&path);
            }
        }
        gone
    }

    fn remember(&self, memo: &Path, name: &str, stamp: &Stamp, digest: &str) -> io::Result<()> {
        let mut temp = temp_file_in(&self.temp, tempfile::Builder::new().prefix("digest"))?;
        write!(temp, "{FORMAT}\n{name}\n{}\n{digest}\n", stamp.line())?;
        std::fs::create_dir_all(&self.dir)?;
        temp.persist(memo).map_err(|e| e.error)?;
        Ok(())
    }
}

/// The lines of the memo file at `path`: none for a file that is not one of kavi's memos (of
/// this format, and a few hundred bytes; a larger file is no memo).
fn memo_lines(path: &Path) -> Option<Vec<String>> {
    let mut text = String::new();
    open_regular(path)
        .ok()?
        .take(4096)
        .read_to_string(&mut text)
        .ok()?;
    let lines: Vec<String> = text
        .strip_suffix('\n')?
        .split('\n')
        .map(str::to_owned)
        .collect();
    (lines.first().map(String::as_str) == Some(FORMAT)).then_some(lines)
}

/// The digest `memo` holds for the file `name` as `stamp` describes it, if it holds one: a
/// memo of another format, another file or another stamp, or not whole, holds none.
fn recalled(memo: &Path, name: &str, stamp: &Stamp) -> Option<String> {
    let lines = memo_lines(memo)?;
    let [_, remembered_name, remembered_stamp, digest] = &lines[..] else {
        return None;
    };
    let well_formed = digest.len() == 64
        && digest
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    (well_formed && remembered_name == name && *remembered_stamp == stamp.line())
        .then(|| digest.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A memo in a temporary folder that remembers whatever it reads, settled or not (a test
    /// cannot make a file's change time older).
    fn eager_memo(dir: &Path) -> DigestMemo {
        DigestMemo {
            settled: Duration::ZERO,
            ..DigestMemo::of_store(&ArtifactStore::open(dir).unwrap())
        }
    }

    fn large(byte: u8) -> Vec<u8> {
        vec![byte; MEMO_MIN as usize + 1]
    }

    fn hash(memo: &DigestMemo, path: &Path) -> String {
        memo.hash(path, "data/big.bin", &|| Ok(())).unwrap()
    }

    fn memos(memo: &DigestMemo) -> usize {
        fs::read_dir(&memo.dir).map_or(0, |entries| entries.count())
    }

    #[test]
    fn a_large_unchanged_file_is_recognised_without_being_read() {
        let dir = tempfile::tempdir().unwrap();
        let memo = eager_memo(dir.path());
        let path = dir.path().join("big.bin");
        fs::write(&path, large(b'a')).unwrap();
        assert_eq!(hash(&memo, &path), sha256_hex(&large(b'a')));
        assert_eq!(memos(&memo), 1);
        // What the memo says for this very file is taken without reading it: a planted digest
        // comes back.
        let stamp = Stamp::of(&fs::metadata(&path).unwrap());
        let planted = "0".repeat(64);
        let memo_file = memo.dir.join(sha256_hex(b"data/big.bin"));
        memo.remember(&memo_file, "data/big.bin", &stamp, &planted)
            .unwrap();
        assert_eq!(hash(&memo, &path), planted);
        // Under another name, the same file's memo is not this one.
        assert_eq!(
            memo.hash(&path, "data/other.bin", &|| Ok(())).unwrap(),
            sha256_hex(&large(b'a'))
        );
    }

    #[test]
    fn a_change_that_keeps_size_and_modification_time_is_still_seen() {
        let dir = tempfile::tempdir().unwrap();
        let memo = eager_memo(dir.path());
        let path = dir.path().join("big.bin");
        fs::write(&path, large(b'a')).unwrap();
        hash(&memo, &path);
        // The bypass: rewrite the content in place, same size, and put the modification time
        // back as it was. The change time moves, so the memo no longer holds.
        let before = fs::metadata(&path).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        let mut file = fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.write_all(&large(b'b')).unwrap();
        file.set_modified(before.modified().unwrap()).unwrap();
        drop(file);
        let after = fs::metadata(&path).unwrap();
        assert_eq!(
            (after.len(), after.mtime(), after.mtime_nsec()),
            (before.len(), before.mtime(), before.mtime_nsec())
        );
        assert_eq!(hash(&memo, &path), sha256_hex(&large(b'b')));
        // Replaced by another file of the same size and times: another inode.
        let other = dir.path().join("other.bin");
        fs::write(&other, large(b'c')).unwrap();
        fs::File::options()
            .write(true)
            .open(&other)
            .unwrap()
            .set_modified(after.modified().unwrap())
            .unwrap();
        fs::rename(&other, &path).unwrap();
        assert_eq!(hash(&memo, &path), sha256_hex(&large(b'c')));
    }

    #[test]
    fn small_recent_or_unreadable_memos_are_not_trusted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big.bin");
        // A small file is read every time, and nothing is remembered of it.
        let memo = eager_memo(dir.path());
        fs::write(&path, b"small").unwrap();
        assert_eq!(hash(&memo, &path), sha256_hex(b"small"));
        assert_eq!(memos(&memo), 0);
        // A file that changed within the settling time is not remembered either.
        let settling = DigestMemo::of_store(&ArtifactStore::open(dir.path()).unwrap());
        fs::write(&path, large(b'a')).unwrap();
        assert_eq!(hash(&settling, &path), sha256_hex(&large(b'a')));
        assert_eq!(memos(&settling), 0);
        // A torn or foreign memo is ignored, and the file read.
        hash(&memo, &path);
        let memo_file = memo.dir.join(sha256_hex(b"data/big.bin"));
        let whole = fs::read_to_string(&memo_file).unwrap();
        let stamp = Stamp::of(&fs::metadata(&path).unwrap());
        for bad in [
            String::new(),
            whole[..whole.len() - 10].to_owned(),
            whole.replace(FORMAT, "kavi-digest-v0"),
            format!("{whole}extra\n"),
            format!("{FORMAT}\ndata/big.bin\n{}\nnot-a-digest\n", stamp.line()),
        ] {
            fs::write(&memo_file, &bad).unwrap();
            let recalled_digest = recalled(&memo_file, "data/big.bin", &stamp);
            assert_eq!(recalled_digest, None, "{bad:?}");
        }
        assert_eq!(hash(&memo, &path), sha256_hex(&large(b'a')));
    }

    #[test]
    fn the_memos_of_inputs_no_longer_there_are_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        let memo = eager_memo(dir.path());
        for name in ["kept.bin", "gone.bin"] {
            let path = dir.path().join(name);
            fs::write(&path, large(b'a')).unwrap();
            memo.hash(&path, name, &|| Ok(())).unwrap();
        }
        fs::write(memo.dir.join("stray"), "not a memo").unwrap();
        fs::remove_file(dir.path().join("gone.bin")).unwrap();
        assert_eq!(memos(&memo), 3);
        let (count, bytes) = memo.forget_gone(dir.path(), true);
        assert_eq!((count, memos(&memo)), (2, 3), "a dry run removes nothing");
        assert!(bytes > 0);
        assert_eq!(memo.forget_gone(dir.path(), false), (count, bytes));
        assert_eq!(memos(&memo), 1);
        assert!(memo.dir.join(sha256_hex(b"kept.bin")).is_file());
    }

    #[test]
    fn a_stop_ends_the_reading_and_nothing_is_remembered() {
        let dir = tempfile::tempdir().unwrap();
        let memo = eager_memo(dir.path());
        let path = dir.path().join("big.bin");
        fs::write(&path, large(b'a')).unwrap();
        let stopped = || Err(io::Error::other("stopped"));
        assert!(memo.hash(&path, "data/big.bin", &stopped).is_err());
        assert_eq!(memos(&memo), 0);
    }
}
