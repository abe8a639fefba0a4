//! A running node's live log, read from another process (`kavi runs logs`, the review page):
//! what the node has printed so far, then more as it prints, until it ends. The node's kavi
//! writes the file with the node's secrets already hidden (`kavi_spec`'s `LiveLog`), so what is
//! read here is what may be shown.

use std::fs::File;
use std::io::{self, Read as _, Seek as _, SeekFrom};
use std::os::unix::fs::MetadataExt as _;
use std::path::PathBuf;
use std::time::Duration;

use super::Ledger;

/// How often a follower looks for more output, and for the node's end.
const FOLLOW_EVERY: Duration = Duration::from_millis(100);
/// How many looks apart a follower checks that the run's kavi is still alive (recovery marks a
/// killed one's nodes interrupted, which ends the follow).
const RECOVER_EVERY: u32 = 20;

/// Where a reader of a live log stopped: the file (by inode: each process of a node makes its
/// own) and how much of it was read. Written `INODE-OFFSET`, for a page to hand back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LivePosition {
    pub inode: u64,
    pub offset: u64,
}

impl std::fmt::Display for LivePosition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.inode, self.offset)
    }
}

impl std::str::FromStr for LivePosition {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let parsed = text
            .split_once('-')
            .and_then(|(inode, offset)| Some((inode.parse().ok()?, offset.parse().ok()?)));
        match parsed {
            Some((inode, offset)) => Ok(Self { inode, offset }),
            None => Err(format!(
                "`{text}` is not a position in a live log (INODE-OFFSET)"
            )),
        }
    }
}

/// Reads one stream's live log as it grows. The file is removed when the process that writes it
/// ends (what it printed is the ledger's then), and the node's next process (a gate after
/// another, a retry) makes a new one: the reader reads the removed file to its end, then opens
/// whatever is at the path next.
#[derive(Debug)]
pub struct LiveTail {
    /// `None` for a log this machine cannot see (see [`super::live_log`]).
    path: Option<PathBuf>,
    file: Option<File>,
    opened: bool,
}

impl LiveTail {
    /// A reader of the live log at `path`, from its start.
    pub fn new(path: Option<PathBuf>) -> Self {
        Self {
            path,
            file: None,
            opened: false,
        }
    }

    /// A reader of the live log at `path` that goes on from `at`, where an earlier reader
    /// stopped: after what it read, in the same file; a file made since is read from its start.
    pub fn resume(path: Option<PathBuf>, at: LivePosition) -> Self {
        let mut tail = Self::new(path);
        tail.open();
        if let Some(file) = &mut tail.file
            && file.metadata().is_ok_and(|meta| meta.ino() == at.inode)
        {
            // Past the end reads nothing; never more than the file has.
            let _ = file.seek(SeekFrom::Start(at.offset));
        }
        tail
    }

    fn open(&mut self) {
        if self.file.is_none() {
            self.file = self.path.as_ref().and_then(|path| File::open(path).ok());
            self.opened |= self.file.is_some();
        }
    }

    /// What was written since the last read (often nothing).
    pub fn read(&mut self) -> io::Result<Vec<u8>> {
        self.open();
        let Some(file) = &mut self.file else {
            return Ok(Vec::new());
        };
        // Removed before this read: its process has ended, and this read takes all it holds.
        let removed = file.metadata().map_or(true, |meta| meta.nlink() == 0);
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        if removed {
            self.file = None;
        }
        Ok(bytes)
    }

    /// Whether it has found a live log to read at all.
    pub fn opened(&self) -> bool {
        self.opened
    }

    /// Where it stands in the file it reads; `None` when it reads none (not made yet, or read
    /// to its end after its process ended).
    pub fn position(&self) -> Option<LivePosition> {
        let mut file = self.file.as_ref()?;
        Some(LivePosition {
            inode: file.metadata().ok()?.ino(),
            offset: file.stream_position().ok()?,
        })
    }
}

impl Ledger {
    /// Follows a running node through its live logs, `tails` (one per stream), until `ended`
    /// finds its last attempt over. At every look `shown` gets each tail's index and what it
    /// added (often nothing), and says whether to go on; once the node has ended, what its logs
    /// held at its end is shown, and `ended`'s answer returned. `Ok(None)` once `shown` said to
    /// stop (its reader went away). Runs whose kavi was killed are recovered on the way, which
    /// ends their nodes.
    pub fn follow_live<T, E>(
        &mut self,
        tails: &mut [LiveTail],
        mut shown: impl FnMut(usize, io::Result<Vec<u8>>) -> Result<bool, E>,
        mut ended: impl FnMut(&Ledger) -> Result<Option<T>, E>,
    ) -> Result<Option<T>, E> {
        let mut show = |tails: &mut [LiveTail]| -> Result<bool, E> {
            for (index, tail) in tails.iter_mut().enumerate() {
                if !shown(index, tail.read())? {
                    return Ok(false);
                }
            }
            Ok(true)
        };
        let mut look: u32 = 0;
        loop {
            look = look.wrapping_add(1);
            if !show(tails)? {
                return Ok(None);
            }
            if look.is_multiple_of(RECOVER_EVERY) {
                // A read-only ledger cannot be recovered; the follower then only waits.
                let _ = self.recover_interrupted();
            }
            if let Some(end) = ended(self)? {
                // Written before the node's end was recorded: all of it is there now.
                return Ok(show(tails)?.then_some(end));
            }
            std::thread::sleep(FOLLOW_EVERY);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader reads what was added since it last read; it reads a removed file (its process
    /// ended) to its end, then the file made next at the path from its start; one resumed from
    /// a position goes on in the same file, and reads a different one from its start.
    #[test]
    fn a_tail_reads_what_was_added_across_files_and_resumes_where_a_reader_stopped() {
        use std::io::Write as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("1.a.stdout");
        let mut tail = LiveTail::new(Some(path.clone()));
        assert_eq!(tail.read().unwrap(), b"");
        assert!(!tail.opened() && tail.position().is_none());
        let mut file = File::create(&path).unwrap();
        file.write_all(b"one\n").unwrap();
        assert_eq!(tail.read().unwrap(), b"one\n");
        let at = tail.position().unwrap();
        assert_eq!(at.offset, 4);
        assert_eq!(at.to_string().parse::<LivePosition>(), Ok(at));
        file.write_all(b"two\n").unwrap();
        let mut resumed = LiveTail::resume(Some(path.clone()), at);
        assert_eq!(resumed.read().unwrap(), b"two\n");
        // Its process ends: the file goes, with a last line written before.
        file.write_all(b"three\n").unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(tail.read().unwrap(), b"two\nthree\n");
        assert!(tail.position().is_none());
        // The node's next process writes a new file at the path.
        std::fs::write(&path, "again\n").unwrap();
        assert_eq!(tail.read().unwrap(), b"again\n");
        assert_eq!(LiveTail::resume(Some(path), at).read().unwrap(), b"again\n");
        assert!("12".parse::<LivePosition>().is_err());
    }
}
