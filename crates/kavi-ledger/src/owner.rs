//! The owner: one kavi process, as the ledger and later kavi processes see it.
//!
//! An owner holds a lock file next to the ledger for as long as it lives, and keeps beside it the
//! roster of the process groups it started (see [`kavi_process::roster`]) and a folder for its
//! spill files. Runs and executions record their owner's name. When a later kavi process finds an
//! owner's lock free while its files remain, that owner died without cleaning up (SIGKILL, power
//! loss): recovery stops what it left running, marks what it left unfinished `interrupted`, and
//! removes its files (see [`super::Ledger::recover_interrupted`]).

use std::fs::File;
use std::io::{self, Write as _};
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use kavi_process::{CaptureOptions, Roster};

/// The owner of a run whose nodes another scheduler drives (`kavi pipeline start`): no kavi
/// process lives as long as such a run, so none holds a lock for it, and recovery leaves it
/// alone; `kavi pipeline end` closes it.
pub const EXTERNAL: &str = "external";

/// An owner's lock file, by extension: `claiming` while it is being claimed, then `lock`.
pub(super) const LOCKS: [&str; 2] = ["lock", "claiming"];
/// An owner's roster, by extension.
pub(super) const ROSTER: &str = "procs";
/// The room an owner's lock file holds for why the owner stopped with its runs unfinished (see
/// [`Owner::note_stop`]): written when the lock is claimed, so that the reason still fits once
/// the disk is full, which is most often the reason.
const NOTE_ROOM: usize = 512;
/// The folder, in an owner's spill folder, holding what its running nodes have printed so far.
const LIVE: &str = "live";

/// The file claims and recovery take turns on, in the locks folder: a claim holds it shared
/// while it makes its files, recovery holds it exclusively while it decides which owners are
/// dead. So recovery never looks at an owner half-way through its claim: a `.claiming` file
/// not locked yet, or renamed to `.lock` between two looks, which made a starting kavi look
/// dead (its claim then failed, or its files were removed under it).
const TURNS: &str = "claims.turns";

/// Takes a turn: shared for a claim, exclusive for recovery; held until the file is dropped.
/// A turn is held for milliseconds, so a wait that goes on says so after [`TURN_NOTICE`] and
/// gives up after [`TURN_LIMIT`]: what holds it then is not a kavi taking its turn.
pub(super) fn take_turn(locks: &Path, exclusive: bool) -> io::Result<File> {
    take_turn_within(locks, exclusive, TURN_LIMIT)
}

pub(super) fn take_turn_within(
    locks: &Path,
    exclusive: bool,
    limit: std::time::Duration,
) -> io::Result<File> {
    let path = locks.join(TURNS);
    let turns = lock_file(&path, false)?;
    // One an older kavi made readable by all is closed (the folder is, too: see `lock_folder`).
    kavi_foundation::sandbox::close_to_readers(&path)?;
    let started = std::time::Instant::now();
    let mut pause = std::time::Duration::from_millis(1);
    let mut told = false;
    loop {
        let taken = if exclusive {
            turns.try_lock()
        } else {
            turns.try_lock_shared()
        };
        match taken {
            Ok(()) => return Ok(turns),
            Err(std::fs::TryLockError::Error(e)) => return Err(e),
            Err(std::fs::TryLockError::WouldBlock) => {}
        }
        let waited = started.elapsed();
        if waited >= limit {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "gave up after {}s waiting for {}: another process has held it all that \
                     time, and a kavi holds it for milliseconds (`fuser -v {}` names the \
                     holder)",
                    waited.as_secs(),
                    path.display(),
                    path.display()
                ),
            ));
        }
        if !told && waited >= TURN_NOTICE {
            tracing::warn!(
                "waiting for {}: another process holds it (a kavi holds it for milliseconds)",
                path.display()
            );
            told = true;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(std::time::Duration::from_millis(50));
    }
}

/// Opens (or, when `new`, creates afresh) a lock file in the locks folder, closed to the accounts
/// that may not write the folder (see [`kavi_foundation::sandbox::closed_bits`]).
fn lock_file(path: &Path, new: bool) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(new)
        .write(true)
        .mode(0o666 & !kavi_foundation::sandbox::closed_bits(path))
        .open(path)
}

/// How long a wait for a turn goes on before it says so.
const TURN_NOTICE: std::time::Duration = std::time::Duration::from_secs(5);

/// How long a wait for a turn goes on before it gives up: far above a turn's milliseconds, even
/// on a loaded machine.
const TURN_LIMIT: std::time::Duration = std::time::Duration::from_secs(60);

/// The owner a file in the locks folder belongs to. Names have one form, `<pid>-<nanos>@<host>`
/// (older kavis wrote `<pid>-<nanos>`); a file of another form is not an owner's (and its
/// contents are never acted on).
pub(super) fn name_of(path: &Path) -> Option<&str> {
    let extension = path.extension()?.to_str()?;
    let name = path.file_stem()?.to_str()?;
    ((LOCKS.contains(&extension) || extension == ROSTER) && well_formed(name)).then_some(name)
}

pub(super) fn well_formed(name: &str) -> bool {
    let (process, host) = name.split_once('@').unwrap_or((name, "localhost"));
    let host_ok = !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
    host_ok
        && process.split_once('-').is_some_and(|(pid, nanos)| {
            [pid, nanos]
                .iter()
                .all(|part| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()))
        })
}

/// A name for this process, unique on the team: `<pid>-<nanos>@<host>`.
pub fn new_name() -> String {
    format!(
        "{}-{}@{}",
        std::process::id(),
        jiff::Timestamp::now().as_nanosecond(),
        this_host()
    )
}

/// This machine's name, as owners name it.
pub fn this_host() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|name| name.into_string().ok())
        .filter(|name| well_formed(&format!("0-0@{name}")))
        .unwrap_or_else(|| "localhost".to_owned())
}

/// Whether the owner `name` ran on this machine, where its lock and processes can be checked:
/// a ledger on a server names owners on every machine that shares it.
pub(super) fn runs_here(name: &str) -> bool {
    name.split_once('@')
        .is_none_or(|(_, host)| host == this_host())
}

/// Whether the process the owner `name` names (`<pid>-<nanos>@host`, made at `nanos`) still
/// runs on this machine: a live process with that pid that started no later than the name was
/// made (within a second: the name's clock is the wall clock, the start's the boot clock). A
/// pid reused since started after its owner died, so later than that.
pub(super) fn still_running(name: &str) -> bool {
    let process = name.split_once('@').map_or(name, |(process, _)| process);
    let Some((pid, nanos)) = process.split_once('-') else {
        return false;
    };
    let (Ok(pid), Ok(named_at)) = (pid.parse::<i32>(), nanos.parse::<i128>()) else {
        return false;
    };
    let Some(ago) = kavi_process::roster::started_ago(pid) else {
        return false;
    };
    let started = jiff::Timestamp::now().as_nanosecond() - ago.as_nanos() as i128;
    started <= named_at.saturating_add(1_000_000_000)
}

/// Where what `stream` (`stdout` or `stderr`) of node `node` in run `run_id` has printed so far
/// is written while it runs, in the spill folder `spill`: its owner's, removed with it.
fn live_log_in(spill: &Path, run_id: i64, node: &str, stream: &str) -> PathBuf {
    spill.join(LIVE).join(format!("{run_id}.{node}.{stream}"))
}

/// Where the owner `owner`, spilling under `spill_root`, writes what a running node has printed
/// so far (see [`Owner::live_log`]), for another kavi to read; `None` for an owner this machine
/// cannot see into (another machine's, [`EXTERNAL`]) or a node id no pipeline can declare.
pub fn live_log(
    spill_root: &Path,
    owner: &str,
    run_id: i64,
    node: &str,
    stream: &str,
) -> Option<PathBuf> {
    let node_ok = !node.is_empty()
        && node
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-'));
    (well_formed(owner) && runs_here(owner) && node_ok)
        .then(|| live_log_in(&spill_root.join(owner), run_id, node, stream))
}

/// Why the dead owner whose lock file is at `lock` stopped, when it could say (see
/// [`Owner::note_stop`]).
pub(super) fn stop_note(lock: &Path) -> Option<String> {
    let bytes = std::fs::read(lock).ok()?;
    let note = String::from_utf8_lossy(&bytes[..bytes.len().min(NOTE_ROOM)])
        .trim()
        .to_owned();
    (!note.is_empty()).then_some(note)
}

/// Removes a dead owner's spill folder. The path comes from a file, so it is trusted only when
/// it is a real folder named after the owner, as [`Owner::claim`] makes it.
pub(super) fn remove_spill(name: &str, spill: &Path) {
    let named_for_owner = well_formed(name) && spill.file_name() == Some(name.as_ref());
    let real_folder = spill.symlink_metadata().is_ok_and(|m| m.is_dir());
    if named_for_owner && real_folder {
        let _ = std::fs::remove_dir_all(spill);
    }
}

/// Removes a private folder a dead owner's roster lists. The path comes from a file, so it is
/// trusted only when it is a real folder (not a link) named as kavi names its folders.
pub(super) fn remove_private_folder(folder: &Path) {
    let named_by_kavi = folder
        .file_name()
        .and_then(|name| name.to_str())
        .is_some_and(|name| name.starts_with("kavi-"));
    let real_folder = folder.symlink_metadata().is_ok_and(|m| m.is_dir());
    if named_by_kavi && real_folder {
        let _ = kavi_foundation::sandbox::remove(folder);
    }
}

/// A live kavi process that runs things. Dropping it removes its files.
#[derive(Debug)]
pub struct Owner {
    name: String,
    lock_path: PathBuf,
    roster_path: PathBuf,
    roster: Arc<Roster>,
    /// Held (and locked) for the owner's life.
    lock: File,
    /// Why it stopped is written in its lock file, which then stays for a later kavi to read.
    noted: AtomicBool,
}

impl Owner {
    /// Claims a new owner for the ledger at `ledger`, spilling into a folder of its own under
    /// `spill_root` (the artifact store's temp folder).
    pub fn claim(ledger: &Path, spill_root: &Path) -> io::Result<Self> {
        let locks = super::locks_dir(ledger);
        kavi_foundation::sandbox::lock_folder(&locks)?;
        let name = new_name();
        let [lock, claiming, roster] =
            [LOCKS[0], LOCKS[1], ROSTER].map(|extension| locks.join(format!("{name}.{extension}")));
        let _turn = take_turn(&locks, false)?;
        // The lock is taken under another name and renamed into place once the owner's other
        // files exist, so that recovery never finds them without a held lock beside them.
        let mut held = lock_file(&claiming, true)?;
        held.lock()?;
        held.write_all(&[b' '; NOTE_ROOM])?;
        // The spill folder is made with the first spill (see `process::spill_file`).
        let spill = spill_root.join(&name);
        let roster_file = Arc::new(Roster::create(&roster, &spill)?);
        std::fs::rename(&claiming, &lock)?;
        Ok(Self {
            name,
            lock_path: lock,
            roster_path: roster,
            roster: roster_file,
            lock: held,
            noted: AtomicBool::new(false),
        })
    }

    /// The name runs and executions record.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// This owner's own folder for temporary files, removed with it (or by the recovery of a
    /// later kavi, when it was killed); made only when first used.
    pub fn spill_dir(&self) -> &Path {
        self.roster.spill_dir()
    }

    /// Where this owner writes what `stream` of node `node` in run `run_id` has printed so far,
    /// while the node runs: `kavi runs logs` reads it from another process.
    pub fn live_log(&self, run_id: i64, node: &str, stream: &str) -> PathBuf {
        live_log_in(self.spill_dir(), run_id, node, stream)
    }

    /// Writes down why this owner stops with its runs unfinished, in the room its lock file
    /// keeps for it (no disk space needed), and keeps the lock file when it goes: the kavi that
    /// recovers its runs records it as their end, where a killed owner's say only that it stopped.
    /// Used where the end itself cannot be recorded, such as a full disk.
    pub fn note_stop(&self, cause: &str) {
        let mut note = cause.replace(['\n', '\r'], " ");
        let mut end = note.len().min(NOTE_ROOM);
        while !note.is_char_boundary(end) {
            end -= 1;
        }
        note.truncate(end);
        if self.lock.write_all_at(note.as_bytes(), 0).is_ok() {
            self.noted.store(true, Ordering::Release);
        }
    }

    /// Writes down a private folder made for what this owner runs, so that a later kavi removes
    /// it if this one is killed before it does.
    pub fn track(&self, folder: &Path) -> io::Result<()> {
        self.roster.track(folder)
    }

    /// How this owner's children capture output: spilling into its folder, listed in its roster.
    pub fn capture(&self, limit: usize) -> CaptureOptions {
        CaptureOptions {
            limit,
            spill_dir: self.spill_dir().to_owned(),
            roster: Some(Arc::clone(&self.roster)),
            live: None,
        }
    }
}

impl Drop for Owner {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(self.roster.spill_dir());
        let _ = std::fs::remove_file(&self.roster_path);
        if !self.noted.load(Ordering::Acquire) {
            let _ = std::fs::remove_file(&self.lock_path);
        }
    }
}
