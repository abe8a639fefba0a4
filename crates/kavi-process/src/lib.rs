//! The one place kavi starts processes ([`run`]), the one place it isolates them
//! ([`confinement`]), and the one place it builds git commands ([`git`]).
//!
//! Each child leads a new process group, so a timeout or a cancel can signal everything it
//! started (a shell's children, a test runner's workers) and not only the child itself. When the
//! child exits, whatever it left behind in its group is killed too: a node's processes never
//! outlive the node.
//!
//! A child that runs for a confined role is started through bubblewrap, in namespaces of its own,
//! with its seccomp programs, cgroup and rlimits set between clone and exec (see
//! [`crate::confinement`]).
//!
//! Children must not outlive kavi unnoticed: each is set to get SIGKILL when kavi dies, and each
//! group is written down in kavi's [`roster::Roster`] so that the next kavi process can stop what
//! a killed one left running.
//!
//! Output is read from pipes. The first `limit` bytes stay in memory; past that, everything goes
//! to a temporary file. Most nodes print little, so most runs create no files at all.

use std::collections::HashMap;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tempfile::NamedTempFile;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use crate::confinement::Confinement;

pub mod confinement;
pub mod git;
pub mod roster;
mod spawn;
pub use roster::Roster;

/// How long a cancelled process group gets between SIGTERM and SIGKILL.
const TERMINATE_GRACE: Duration = Duration::from_secs(2);

/// How long output is still read after the node's group is gone. Only a process that left the
/// group (setsid) can still hold the pipes open; kavi does not wait for it forever.
const DRAIN_GRACE: Duration = Duration::from_secs(1);

/// Variables passed through from kavi's own environment to a command that does not inherit it:
/// what ordinary tools need to find programs and behave, and nothing that tends to hold secrets.
const BASE_ENV: &[&str] = &[
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TERM", "TMPDIR", "TZ",
];

/// The minimal environment: the `BASE_ENV` variables that are set. Read from kavi's own
/// environment once, which kavi never changes: each node's start asked for all ten anew, each
/// ask a scan of the environment under its lock, between one node's end and the next's start.
pub fn base_env() -> Vec<(String, String)> {
    static BASE: std::sync::OnceLock<Vec<(String, String)>> = std::sync::OnceLock::new();
    BASE.get_or_init(|| {
        BASE_ENV
            .iter()
            .filter_map(|key| std::env::var(key).ok().map(|v| ((*key).to_owned(), v)))
            .collect()
    })
    .clone()
}

/// The open files kavi keeps for itself (the ledger and its journal, locks, the runtime,
/// stdio), and what each node running at once adds (its pipes, its process descriptor, its
/// output files): measured with `prlimit --nofile`, with room to spare.
const RESERVED_FILES: u64 = 32;
const FILES_PER_NODE: u64 = 4;

/// The open-file limits kavi was started with, where it raised its own: its children get
/// them back, since a program may walk every descriptor up to its limit.
static STARTED_WITH_OPEN_FILES: OnceLock<(u64, u64)> = OnceLock::new();

/// Raises this process's open-file soft limit to its hard limit, as build tools that run many
/// commands at once do (a shell's default soft limit is often 1,024 or less).
pub fn raise_open_file_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE)
        && soft < hard
        && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok()
    {
        let _ = STARTED_WITH_OPEN_FILES.set((soft, hard));
    }
}

/// This process's open-file soft limit (unlimited where it cannot be read).
pub fn open_file_limit() -> u64 {
    nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map_or(u64::MAX, |(soft, _)| soft)
}

/// How many nodes may run at once within the open-file limit `limit`, at most `jobs`; an
/// error when not even one may.
pub fn jobs_within_open_files(limit: u64, jobs: usize) -> Result<usize, String> {
    let room = limit.saturating_sub(RESERVED_FILES) / FILES_PER_NODE;
    if room == 0 {
        return Err(format!(
            "the open-file limit is {limit}; kavi needs at least {} to run a node (raise it with \
             `ulimit -n`)",
            RESERVED_FILES + FILES_PER_NODE
        ));
    }
    Ok(jobs.min(usize::try_from(room).unwrap_or(usize::MAX)))
}

/// Whether `name` can name an environment variable: letters, digits and `_`, not starting
/// with a digit. Anything else (empty, `=`, spaces, shell syntax) is refused where it is declared.
pub fn is_variable_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A fully resolved command: nothing here is a template any more.
#[derive(Debug, Clone)]
pub struct CommandSpec {
    pub program: String,
    pub args: Vec<String>,
    /// The complete environment; the child inherits nothing else.
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
    pub stdin: Option<Vec<u8>>,
    /// The kernel's limits for the child, applied between fork and exec; `None`: unconfined.
    pub confinement: Option<Confinement>,
}

/// Where captured output goes.
#[derive(Debug, Clone)]
pub struct CaptureOptions {
    /// Bytes kept in memory; the rest spills to a file.
    pub limit: usize,
    /// Where spill files are created (the artifact store's temp folder).
    pub spill_dir: PathBuf,
    /// Where the child's process group is written down; `None` for short helpers (git, probes)
    /// that die with kavi and start nothing of their own.
    pub roster: Option<Arc<Roster>>,
    /// Who also sees the output as it arrives (`kavi pipeline run --stream`).
    pub live: Option<LiveOutput>,
}

/// One of a child's two output streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// A function given each chunk of a child's output as it arrives.
pub type OutputChunks = dyn Fn(Stream, &[u8]) + Send + Sync;

/// Receives a child's output in the chunks it arrives in, besides its capture.
#[derive(Clone)]
pub struct LiveOutput(pub Arc<OutputChunks>);

impl std::fmt::Debug for LiveOutput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LiveOutput")
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Code(i32),
    Signal(i32),
    /// Stopped because the cancel token fired.
    Cancelled,
}

/// One output stream of a finished process.
#[derive(Debug, Default)]
pub struct Captured {
    /// The first `limit` bytes.
    pub head: Vec<u8>,
    /// Everything, once the stream grew past `limit`.
    pub spill: Option<NamedTempFile>,
    pub total: u64,
    /// The pipe was still open when kavi stopped reading (held by a process outside the group).
    pub abandoned: bool,
    /// Keep only the head: what a confined process prints past it is counted and dropped,
    /// never spilled, so that a builder, gate or skill cannot fill kavi's disk by printing
    /// (their callers read only the head).
    head_only: bool,
}

impl Captured {
    /// Keeps a chunk of `stream` as it arrived, and shows it to whoever watches live.
    fn keep(&mut self, stream: Stream, chunk: &[u8], options: &CaptureOptions) -> io::Result<()> {
        if chunk.is_empty() {
            return Ok(());
        }
        self.push(chunk, options)?;
        if let Some(LiveOutput(live)) = &options.live {
            live(stream, chunk);
        }
        Ok(())
    }

    fn push(&mut self, chunk: &[u8], options: &CaptureOptions) -> io::Result<()> {
        self.total += chunk.len() as u64;
        if self.head_only {
            let room = options.limit.saturating_sub(self.head.len());
            self.head.extend_from_slice(&chunk[..room.min(chunk.len())]);
            return Ok(());
        }
        if self.spill.is_none() && self.head.len() + chunk.len() <= options.limit {
            self.head.extend_from_slice(chunk);
            return Ok(());
        }
        if self.spill.is_none() {
            let mut file = spill_file(&options.spill_dir)?;
            file.write_all(&self.head)?;
            self.spill = Some(file);
        }
        let room = options.limit.saturating_sub(self.head.len());
        self.head.extend_from_slice(&chunk[..room.min(chunk.len())]);
        self.spill
            .as_mut()
            .expect("spill file was just created")
            .write_all(chunk)
    }

    pub fn truncated(&self) -> bool {
        self.total > self.head.len() as u64
    }

    /// The whole stream, from its first byte.
    pub fn reader(&mut self) -> io::Result<Box<dyn Read + '_>> {
        match &mut self.spill {
            Some(file) => {
                let file = file.as_file_mut();
                file.seek(SeekFrom::Start(0))?;
                Ok(Box::new(file))
            }
            None => Ok(Box::new(self.head.as_slice())),
        }
    }

    /// The stream passed through `filter` (which copies what it reads to what it writes), as a
    /// new capture under `options`.
    pub fn filtered(
        mut self,
        options: &CaptureOptions,
        filter: impl FnOnce(&mut dyn Read, &mut dyn Write) -> io::Result<()>,
    ) -> io::Result<Self> {
        struct Recapture<'a> {
            captured: Captured,
            options: &'a CaptureOptions,
        }
        impl Write for Recapture<'_> {
            fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
                self.captured.push(bytes, self.options)?;
                Ok(bytes.len())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let mut out = Recapture {
            captured: Captured {
                abandoned: self.abandoned,
                ..Captured::default()
            },
            options,
        };
        filter(&mut self.reader()?, &mut out)?;
        Ok(out.captured)
    }
}

#[derive(Debug)]
pub struct Finished {
    pub exit: Exit,
    pub stdout: Captured,
    pub stderr: Captured,
    /// What a confined process did that its confinement stopped it for, if anything.
    pub violation: Option<Violation>,
    /// For a confined process with the network: every connection its proxy allowed or
    /// refused.
    pub network: Option<crate::confinement::proxy::ProxyLog>,
}

/// Why a confined process was stopped by its confinement rather than ending on its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    /// seccomp killed it for a system call only an attack makes (ptrace, mount, TIOCSTI, ...).
    ForbiddenCall,
    /// It opened a decoy laid where a secret usually lives: which, as its view showed it.
    Tripwire(PathBuf),
    /// It left a process behind to outlive it (a child orphaned to the namespace's init, as a
    /// daemon's double fork does).
    Daemon,
    /// It hit a resource bound: which, in words.
    Bound(String),
}

impl Violation {
    /// Whether only an attack does this (as opposed to outgrowing a bound).
    pub fn is_security(&self) -> bool {
        !matches!(self, Violation::Bound(_))
    }

    /// The failure kind the process fails as, whatever role it ran as.
    pub fn failure_kind(&self) -> &'static str {
        use crate::confinement::{RESOURCE_KIND, SECURITY_KIND};
        if self.is_security() {
            SECURITY_KIND
        } else {
            RESOURCE_KIND
        }
    }
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Violation::ForbiddenCall => f.write_str(
                "killed by its confinement for a forbidden system call (seccomp: tracing, \
                 mounting, kernel code, terminal injection, or a socket its profile does not \
                 allow)",
            ),
            Violation::Tripwire(path) => write!(
                f,
                "stopped by its confinement for opening {}, a decoy where a secret usually \
                 lives",
                path.display()
            ),
            Violation::Daemon => f.write_str(
                "stopped by its confinement for leaving a process to outlive it (a daemon)",
            ),
            Violation::Bound(bound) => write!(f, "stopped for exceeding {bound}"),
        }
    }
}

/// How often a confined process is looked at for a sprung tripwire or a daemon.
const WATCH: Duration = Duration::from_millis(100);

/// Every how many looks its write folders and CPU time are measured against its bounds
/// (walking the write folders costs more).
const BOUNDS_EVERY: u32 = 5;

/// A task that ends when its handle is dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A memfd holding `bytes`, at a high descriptor, closed on exec (the child dups it).
fn memfd(bytes: &[u8]) -> io::Result<OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: a plain system call with a static name; a non-negative result is ours.
    let fd = unsafe { nix::libc::memfd_create(c"kavi-seccomp".as_ptr(), nix::libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: just made.
    let file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    (&file).write_all(bytes)?;
    (&file).seek(SeekFrom::Start(0))?;
    high(file.as_fd())
}

/// The lowest descriptor a child's passed descriptors are taken from: above every target.
const PASSED_FROM: i32 = 64;

/// A copy of `fd` at [`PASSED_FROM`] or above, closed on exec (the child dups it down).
fn high(fd: std::os::fd::BorrowedFd<'_>) -> io::Result<OwnedFd> {
    use std::os::fd::FromRawFd;
    let high = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(PASSED_FROM))?;
    // SAFETY: fcntl just made this descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(high) })
}

/// Kills the whole group when dropped, whatever path the caller took out, unless it was killed
/// already.
struct GroupGuard(Pid, std::sync::atomic::AtomicBool);

impl GroupGuard {
    fn new(leader: Pid) -> Self {
        Self(leader, std::sync::atomic::AtomicBool::new(false))
    }

    fn kill(&self) {
        let _ = killpg(self.0, Signal::SIGKILL);
        self.1.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if !self.1.load(std::sync::atomic::Ordering::Relaxed) {
            self.kill();
        }
    }
}

/// A program name, the PATH it is searched on, and the folder relative entries resolve against.
type ProgramKey = (String, String, PathBuf);

/// Finds the program the way a shell would, but on the child's PATH and in the parent.
///
/// Resolving here (rather than letting the child search) gives a clear "not found" error, and
/// lets std start the child with `posix_spawn` instead of a full `fork`, which it must fall back
/// to whenever the child's environment sets its own PATH. Found paths are cached.
fn resolve_program(program: &str, env: &[(String, String)], cwd: &Path) -> io::Result<PathBuf> {
    if program.contains('/') {
        return Ok(cwd.join(program));
    }
    let path = env
        .iter()
        .rev()
        .find(|(key, _)| key == "PATH")
        .map_or("/usr/local/bin:/usr/bin:/bin", |(_, value)| value.as_str());
    static FOUND: OnceLock<Mutex<HashMap<ProgramKey, PathBuf>>> = OnceLock::new();
    let key = (program.to_owned(), path.to_owned(), cwd.to_owned());
    let cache = FOUND.get_or_init(Default::default);
    if let Some(found) = cache.lock().expect("cache lock").get(&key) {
        return Ok(found.clone());
    }
    let found = std::env::split_paths(path)
        .map(|dir| cwd.join(dir).join(program))
        .find(|candidate| is_executable(candidate))
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("`{program}` was not found on PATH ({path})"),
            )
        })?;
    cache.lock().expect("cache lock").insert(key, found.clone());
    Ok(found)
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// A new spill file in `dir`, which is made with the first one (see
/// [`kavi_foundation::files::temp_file_in`]).
fn spill_file(dir: &Path) -> io::Result<NamedTempFile> {
    kavi_foundation::files::temp_file_in(dir, &tempfile::Builder::new())
}

/// A child kavi started, waited on through its pidfd, and never left behind: dropped before it
/// was reaped (its node cancelled by dropping), it is killed and reaped.
///
/// The child is set to get SIGKILL when kavi dies (see [`spawn`]). That signal follows the
/// thread that started the child; kavi runs its processes from one thread (a current-thread
/// runtime), which lives as long as kavi does.
struct Child {
    pid: Pid,
    exited: tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>,
    reaped: bool,
}

impl Child {
    fn new(pid: Pid) -> io::Result<Self> {
        let pidfd = spawn::pidfd(pid).inspect_err(|_| {
            let _ = nix::sys::signal::kill(pid, Signal::SIGKILL);
            let _ = nix::sys::wait::waitpid(pid, None);
        })?;
        // SAFETY: an OwnedFd is open and keeps its descriptor for as long as it is owned.
        let exited = unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(pidfd, tokio::io::Interest::READABLE)
        }
        .map_err(io::Error::from)?;
        Ok(Self {
            pid,
            exited,
            reaped: false,
        })
    }

    /// Waits for the child to exit, and reaps it.
    async fn wait(&mut self) -> io::Result<Exit> {
        use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
        loop {
            let mut ready = self.exited.readable().await?;
            match waitpid(self.pid, Some(WaitPidFlag::WNOHANG))? {
                WaitStatus::Exited(_, code) => {
                    self.reaped = true;
                    return Ok(Exit::Code(code));
                }
                WaitStatus::Signaled(_, signal, _) => {
                    self.reaped = true;
                    return Ok(Exit::Signal(signal as i32));
                }
                _ => ready.clear_ready(),
            }
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
        if self.reaped {
            return;
        }
        let _ = nix::sys::signal::kill(self.pid, Signal::SIGKILL);
        if !matches!(
            waitpid(self.pid, Some(WaitPidFlag::WNOHANG)),
            Ok(WaitStatus::Exited(..) | WaitStatus::Signaled(..))
        ) {
            // Killed but not gone yet: reap it off this thread rather than block here.
            let pid = self.pid;
            std::thread::spawn(move || waitpid(pid, None));
        }
    }
}

/// Reads a pipe to its end, or until `DRAIN_GRACE` after `exited` fires.
///
/// What the pipe holds already is read first, without the reactor: after a child's exit that is
/// all of it, and the pipe never wakes kavi.
async fn capture(
    pipe: OwnedFd,
    stream: Stream,
    options: &CaptureOptions,
    exited: &CancellationToken,
    head_only: bool,
) -> io::Result<Captured> {
    let mut captured = Captured {
        head_only,
        ..Captured::default()
    };
    let pipe = std::fs::File::from(pipe);
    if read_held(&pipe, stream, &mut captured, options)? {
        return Ok(captured);
    }
    // Known pipes, their ends made non-blocking by `spawn`: no checking them again.
    let mut pipe = tokio::net::unix::pipe::Receiver::from_owned_fd_unchecked(OwnedFd::from(pipe))?;
    let deadline = async {
        exited.cancelled().await;
        tokio::time::sleep(DRAIN_GRACE).await;
    };
    tokio::pin!(deadline);
    // Read into spare capacity: a zeroed 64 KiB buffer per stream was a memset of 128 KiB on
    // every node, most of which print nothing.
    let mut buffer = Vec::with_capacity(PIPE_CHUNK);
    loop {
        buffer.clear();
        let n = tokio::select! {
            n = pipe.read_buf(&mut buffer) => n?,
            () = &mut deadline => {
                captured.abandoned = true;
                break;
            }
        };
        if n == 0 {
            break;
        }
        captured.keep(stream, &buffer[..n], options)?;
    }
    Ok(captured)
}

/// How much is read from a pipe at a time: its default capacity.
const PIPE_CHUNK: usize = 64 * 1024;

/// Reads what the non-blocking `pipe` holds now, without waiting; `true` once it is at its end
/// (every writer gone).
fn read_held(
    pipe: &std::fs::File,
    stream: Stream,
    captured: &mut Captured,
    options: &CaptureOptions,
) -> io::Result<bool> {
    let mut chunk = Vec::new();
    loop {
        chunk.clear();
        // Bounded: a writer outside the group may keep the pipe full for as long as it likes.
        let read = pipe.take(PIPE_CHUNK as u64).read_to_end(&mut chunk);
        captured.keep(stream, &chunk, options)?;
        match read {
            Ok(_) if chunk.len() < PIPE_CHUNK => return Ok(true),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// How long a child is waited for alone, its pipes left unwatched, before kavi reads them as it
/// runs. Most commands a pipeline runs are done sooner: kavi reads their output once they exit,
/// and is woken once per child rather than also for the end of each pipe. A child that fills a
/// pipe meanwhile waits at most this long for kavi to read it.
const QUIET_START: Duration = Duration::from_millis(10);

thread_local! {
    /// Quiet-start timers of children that have ended, each with the runtime it belongs to, for
    /// the next children started on this thread (see [`QuietStart`]).
    static QUIET_TIMERS: std::cell::RefCell<Vec<(tokio::runtime::Id, Pin<Box<tokio::time::Sleep>>)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// A child's [`QUIET_START`] timer, handed on to the next child once this one has exited.
///
/// tokio wakes its own driver (an eventfd write, then a poll that finds only that) whenever a
/// timer is set earlier than every timer the driver saw at its last poll. A new timer for each
/// child always was: on a chain, the previous child's timer was dropped with it, and the driver
/// polled in between. Reset, the previous timer is still registered at an earlier deadline
/// when the next child's is set, and no wake is needed; a kept timer no child takes fires once,
/// with no one waiting.
struct QuietStart {
    runtime: tokio::runtime::Id,
    timer: Pin<Box<tokio::time::Sleep>>,
}

impl QuietStart {
    fn begin() -> Self {
        let runtime = tokio::runtime::Handle::current().id();
        let deadline = tokio::time::Instant::now() + QUIET_START;
        let kept = QUIET_TIMERS.with_borrow_mut(|kept| {
            // A timer of another runtime (one that has ended, on this thread) cannot be reset
            // into this one.
            kept.retain(|(id, _)| *id == runtime);
            kept.pop().map(|(_, timer)| timer)
        });
        let timer = match kept {
            Some(mut timer) => {
                timer.as_mut().reset(deadline);
                timer
            }
            None => Box::pin(tokio::time::sleep_until(deadline)),
        };
        Self { runtime, timer }
    }

    /// Keeps the timer for the next child. One whose wait was cut short (its node cancelled by
    /// dropping) is dropped instead.
    fn hand_on(self) {
        // At the thread's end the list may be gone already; the timer is then dropped.
        let _ = QUIET_TIMERS.try_with(|kept| kept.borrow_mut().push((self.runtime, self.timer)));
    }
}

/// What the watch of a confined process looks at.
struct Watched {
    /// bubblewrap, kavi's child: its one child is the namespace's init.
    outer: Pid,
    tripwires: Option<Arc<crate::confinement::tripwire::Tripwires>>,
    /// The disk bound in MiB and the folders it bounds.
    disk: Option<(u64, Vec<PathBuf>)>,
    /// The CPU bound in seconds and the cgroup folders that count it.
    cpu: Option<(u64, Vec<PathBuf>)>,
}

/// Watches a confined process until it is stopped (the task is aborted when the run ends);
/// the first violation seen is written to `found` and stops it.
async fn watch(watched: Watched, stop: CancellationToken, found: Arc<Mutex<Option<Violation>>>) {
    let watched = Arc::new(watched);
    for look in 1u32.. {
        tokio::time::sleep(WATCH).await;
        let watched = Arc::clone(&watched);
        let seen = tokio::task::spawn_blocking(move || {
            use crate::confinement::bounds;
            if let Some(path) = watched.tripwires.as_ref().and_then(|t| t.sprung()) {
                return Some(Violation::Tripwire(path));
            }
            if orphaned(watched.outer) {
                return Some(Violation::Daemon);
            }
            if look % BOUNDS_EVERY != 0 {
                return None;
            }
            if let Some((mib, paths)) = &watched.disk
                && bounds::disk_used(paths).is_none_or(|used| used > mib << 20)
            {
                return Some(Violation::Bound(format!("its disk bound ({mib} MiB)")));
            }
            let (seconds, folders) = watched.cpu.as_ref()?;
            (bounds::cpu_seconds(folders)? > *seconds as f64)
                .then(|| Violation::Bound(format!("its CPU bound ({seconds} s)")))
        })
        .await
        .ok()
        .flatten();
        if let Some(violation) = seen {
            if let Ok(mut found) = found.lock() {
                *found = Some(violation);
            }
            stop.cancel();
            return;
        }
    }
}

/// Whether a process in bubblewrap's namespace was orphaned to the namespace's init, as a
/// daemon's double fork leaves it: the init (bubblewrap's one child, `outer`'s) starts one
/// process, the program, and any other child it has was reparented to it.
fn orphaned(outer: Pid) -> bool {
    let children = |pid: i32| {
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|child| child.parse::<i32>().ok())
            .collect::<Vec<_>>()
    };
    children(outer.as_raw())
        .into_iter()
        .any(|init| children(init).len() > 1)
}

/// Runs a command to completion, capturing its output.
pub async fn run(
    spec: &CommandSpec,
    options: &CaptureOptions,
    cancel: &CancellationToken,
) -> io::Result<Finished> {
    // A confined program is found on its profile's search path, inside its view.
    let confined_env;
    let env = match &spec.confinement {
        Some(confinement) if confinement.isolated() => {
            confined_env = spec
                .env
                .iter()
                .filter(|(key, _)| key != "PATH")
                .cloned()
                .chain([("PATH".to_owned(), confinement.profile.path.clone())])
                .collect::<Vec<_>>();
            &confined_env
        }
        _ => &spec.env,
    };
    let program = resolve_program(&spec.program, env, &spec.cwd)?;
    let mut launch = match &spec.confinement {
        Some(confinement) => confinement.launch(&program, &spec.args, &spec.cwd)?,
        None => None,
    };
    // The launch's private folders are written down as soon as they exist, so that a kavi
    // killed from here on leaves nothing a later one does not remove.
    if let (Some(roster), Some(launch)) = (&options.roster, &launch) {
        let folders = launch.tripwires.as_ref().map(|t| t.folder());
        for folder in folders
            .into_iter()
            .chain(launch.proxy.as_ref().map(|p| p.folder()))
        {
            roster.track(folder)?;
        }
    }
    // A process with the network gets a proxy for as long as it runs, and only the proxy
    // variables that name it.
    let proxy = match launch.as_mut().and_then(|launch| launch.proxy.take()) {
        Some(listening) => Some(listening.serve()?),
        None => None,
    };
    let proxied_env;
    let env = match &launch {
        Some(launch) if !launch.env.is_empty() => {
            proxied_env = env
                .iter()
                .filter(|(key, _)| !crate::confinement::proxy::is_proxy_variable(key))
                .chain(&launch.env)
                .cloned()
                .collect::<Vec<_>>();
            &proxied_env
        }
        _ => env,
    };
    let window = roster::StartWindow::open();
    let spawned = match &launch {
        None => spawn::spawn(
            &program,
            &spec.args,
            env,
            &spec.cwd,
            spec.stdin.is_some(),
            &spawn::Extras::default(),
        )?,
        Some(launch) => {
            let filters = launch
                .filters
                .iter()
                .map(|program| memfd(program))
                .collect::<io::Result<Vec<_>>>()?;
            // Above the child's targets (3, 4, ...), so that no dup lands on one not yet moved.
            let scopes = launch
                .scopes
                .iter()
                .map(|fd| high(fd.as_fd()))
                .collect::<io::Result<Vec<_>>>()?;
            let pass: Vec<_> = filters
                .iter()
                .chain(&scopes)
                .map(|fd| fd.as_raw_fd())
                .collect();
            let cgroups: Vec<_> = launch
                .cgroup
                .iter()
                .flat_map(|(_, procs)| procs.iter().map(|fd| fd.as_raw_fd()))
                .collect();
            spawn::spawn(
                &launch.program,
                &launch.args,
                env,
                &spec.cwd,
                spec.stdin.is_some(),
                &spawn::Extras {
                    pass: &pass,
                    cgroups: &cgroups,
                    rlimits: &launch.rlimits,
                    landlock: launch.landlock.as_ref().map(|fd| fd.as_raw_fd()),
                },
            )?
        }
    };
    let mut child = Child::new(spawned.pid)?;
    tracing::debug!(program = %program.display(), args = ?spec.args, cwd = %spec.cwd.display(), "spawned");
    let group = GroupGuard::new(spawned.pid);
    if let Some(roster) = &options.roster {
        roster.enlist(spawned.pid.as_raw(), window)?;
    }

    if let (Some(bytes), Some(fd)) = (spec.stdin.clone(), spawned.stdin) {
        let mut pipe = tokio::net::unix::pipe::Sender::from_owned_fd(fd)?;
        // A child that does not read its stdin closes the pipe; that is not an error.
        tokio::spawn(async move {
            let _ = pipe.write_all(&bytes).await;
        });
    }

    // A confined process is watched while it runs: a sprung tripwire or a daemon stops it at
    // once, and so does its write folders or its tree's CPU time past a bound. What stopped it
    // is its violation.
    let stop = cancel.child_token();
    let cancel = &stop;
    let stopped_for: Arc<Mutex<Option<Violation>>> = Arc::default();
    let tripwires = launch
        .as_mut()
        .and_then(|launch| launch.tripwires.take())
        .map(Arc::new);
    let _watch = match (&spec.confinement, launch.as_mut()) {
        (Some(confinement), Some(launch)) => Some(AbortOnDrop(tokio::spawn(watch(
            Watched {
                outer: spawned.pid,
                tripwires: tripwires.clone(),
                disk: confinement
                    .profile
                    .limits
                    .disk_mib
                    .map(|mib| (mib, confinement.profile.write.clone())),
                cpu: confinement.profile.limits.cpu_seconds.zip(
                    launch
                        .cgroup
                        .as_ref()
                        .map(|(cgroup, _)| cgroup.folders().to_vec()),
                ),
            },
            stop.clone(),
            Arc::clone(&stopped_for),
        )))),
        _ => None,
    };
    let exited = CancellationToken::new();
    // Output someone watches live is read as it comes, from the start.
    let quick_exit = match options.live {
        Some(_) => None,
        None => {
            let mut quiet = QuietStart::begin();
            let exit = tokio::select! {
                exit = child.wait() => Some(exit),
                () = quiet.timer.as_mut() => None,
                () = cancel.cancelled() => None,
            };
            quiet.hand_on();
            exit
        }
    };
    let wait = async {
        let exit = match quick_exit {
            Some(exit) => exit,
            None => tokio::select! {
                exit = child.wait() => exit,
                () = cancel.cancelled() => {
                    let _ = killpg(group.0, Signal::SIGTERM);
                    if tokio::time::timeout(TERMINATE_GRACE, child.wait()).await.is_err() {
                        let _ = killpg(group.0, Signal::SIGKILL);
                        let _ = child.wait().await;
                    }
                    Ok(Exit::Cancelled)
                }
            },
        };
        // Whatever the child left running in its group goes with it; that closes the pipes.
        group.kill();
        exited.cancel();
        exit
    };
    let confined = launch.is_some();
    let stdout = capture(spawned.stdout, Stream::Stdout, options, &exited, confined);
    let stderr = capture(spawned.stderr, Stream::Stderr, options, &exited, confined);
    let (exit, stdout, stderr) = tokio::join!(wait, stdout, stderr);
    let mut exit = exit?;
    let mut violation = None;
    if let Some(launch) = &launch {
        // bubblewrap exits with 128 + the signal that killed the program.
        if let Exit::Code(code @ 129..=192) = exit {
            exit = Exit::Signal(code - 128);
        }
        let limits = &spec
            .confinement
            .as_ref()
            .expect("launched confined")
            .profile
            .limits;
        let watched = stopped_for.lock().ok().and_then(|mut found| found.take());
        // A decoy opened by a process that died with the namespace before the watch looked.
        let sprung = tripwires
            .as_ref()
            .and_then(|t| t.sprung())
            .map(Violation::Tripwire);
        // What only an attack does names the violation before a bound it also hit.
        let watched = match watched {
            Some(bound @ Violation::Bound(_)) => sprung.or(Some(bound)),
            other => other.or(sprung),
        };
        violation = watched
            .or(match exit {
                Exit::Signal(signal) if signal == nix::libc::SIGSYS => {
                    Some(Violation::ForbiddenCall)
                }
                Exit::Signal(signal) => {
                    crate::confinement::bounds::exceeded_by_signal(signal, limits)
                        .map(Violation::Bound)
                }
                _ => None,
            })
            .or_else(|| {
                let (cgroup, _) = launch.cgroup.as_ref()?;
                cgroup.exceeded().map(Violation::Bound)
            });
    }
    Ok(Finished {
        exit,
        stdout: stdout?,
        stderr: stderr?,
        violation,
        network: proxy.map(crate::confinement::proxy::Running::finish),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(limit: usize, dir: &Path) -> CaptureOptions {
        CaptureOptions {
            live: None,
            limit,
            spill_dir: dir.to_owned(),
            roster: None,
        }
    }

    #[test]
    fn output_past_the_limit_spills_to_a_file_and_keeps_the_head() {
        let dir = tempfile::tempdir().unwrap();
        let mut captured = Captured::default();
        captured.push(b"abc", &options(4, dir.path())).unwrap();
        assert!(captured.spill.is_none());
        captured.push(b"defg", &options(4, dir.path())).unwrap();
        assert_eq!(captured.head, b"abcd");
        assert_eq!(captured.total, 7);
        assert!(captured.truncated());
        let spilled = std::fs::read(captured.spill.unwrap().path()).unwrap();
        assert_eq!(spilled, b"abcdefg");
    }

    #[test]
    fn the_spill_folder_is_made_with_the_first_spill() {
        let dir = tempfile::tempdir().unwrap();
        let spill = dir.path().join("tmp/owner");
        let mut captured = Captured::default();
        captured.push(b"abc", &options(4, &spill)).unwrap();
        assert!(!spill.exists(), "made before anything spilled");
        captured.push(b"defg", &options(4, &spill)).unwrap();
        let file = captured.spill.unwrap();
        assert_eq!(file.path().parent(), Some(spill.as_path()));
        assert_eq!(std::fs::read(file.path()).unwrap(), b"abcdefg");
    }

    #[test]
    fn programs_resolve_on_the_childs_path_with_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let env = vec![("PATH".to_owned(), "/usr/bin:/bin".to_owned())];
        let found = resolve_program("sh", &env, dir.path()).unwrap();
        assert!(found.is_absolute() && found.ends_with("sh"), "{found:?}");
        let err = resolve_program("no-such-program-kavi", &env, dir.path()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        assert!(err.to_string().contains("no-such-program-kavi"));
    }

    fn sh(script: &str, dir: &Path) -> CommandSpec {
        CommandSpec {
            program: "sh".into(),
            args: vec!["-c".into(), script.into()],
            env: base_env(),
            cwd: dir.to_owned(),
            stdin: Some(b"on stdin\n".to_vec()),
            confinement: None,
        }
    }

    /// The vfork-style start leaves the child's signals as std's spawn does (nothing blocked,
    /// though kavi blocks every signal around the clone; SIGPIPE, which Rust ignores, back to
    /// its default), and gives it its own process group,
    /// kavi as its parent, its stdin, cwd and exit code where they belong.
    #[tokio::test]
    async fn a_child_starts_with_default_signals_in_its_own_group() {
        let dir = tempfile::tempdir().unwrap();
        let script = "grep -E '^Sig(Blk|Ign)' /proc/self/status; \
                      echo \"pgid=$(ps -o pgid= -p $$ | tr -d ' ') pid=$$ ppid=$PPID\"; \
                      cat; pwd; exit 7";
        let finished = run(
            &sh(script, dir.path()),
            &options(4096, dir.path()),
            &Default::default(),
        )
        .await
        .unwrap();
        assert_eq!(finished.exit, Exit::Code(7));
        let out = String::from_utf8(finished.stdout.head).unwrap();
        let lines: Vec<&str> = out.lines().collect();
        // What std's own spawn leaves a child with, in this same process.
        let by_std = std::process::Command::new("sh")
            .args(["-c", "grep -E '^Sig(Blk|Ign)' /proc/self/status"])
            .output()
            .unwrap();
        let by_std = String::from_utf8(by_std.stdout).unwrap();
        assert_eq!(lines[..2].join("\n") + "\n", by_std, "{out}");
        assert_eq!(lines[0], "SigBlk:\t0000000000000000", "{out}");
        let ids: HashMap<&str, &str> = lines[2]
            .split(' ')
            .filter_map(|pair| pair.split_once('='))
            .collect();
        assert_eq!(ids["pgid"], ids["pid"], "{out}");
        assert_eq!(ids["ppid"], std::process::id().to_string(), "{out}");
        assert_eq!(lines[3], "on stdin");
        assert_eq!(
            Path::new(lines[4]).canonicalize().unwrap(),
            dir.path().canonicalize().unwrap()
        );
    }

    /// A descriptor kavi holds without close-on-exec (one it inherited from whoever started
    /// it, say) does not reach a child: only the child's three standard streams do.
    #[tokio::test]
    async fn a_child_gets_its_standard_streams_and_nothing_else() {
        use std::os::fd::AsRawFd;
        let dir = tempfile::tempdir().unwrap();
        let file = std::fs::File::open("/dev/null").unwrap();
        // SAFETY: a copy of a descriptor this test holds, closed below; `dup` does not set
        // close-on-exec on it.
        let held = unsafe { nix::libc::dup(file.as_raw_fd()) };
        assert!(held > 2);
        let finished = run(
            &sh("ls /proc/$$/fd", dir.path()),
            &options(4096, dir.path()),
            &Default::default(),
        )
        .await;
        // SAFETY: closes the copy made above, once.
        unsafe { nix::libc::close(held) };
        let out = String::from_utf8(finished.unwrap().stdout.head).unwrap();
        assert_eq!(out.lines().collect::<Vec<_>>(), ["0", "1", "2"], "{out}");
    }

    /// A step that fails between clone and exec is reported, and leaves no child behind.
    #[tokio::test]
    async fn a_child_that_cannot_start_says_which_step_failed() {
        let dir = tempfile::tempdir().unwrap();
        let mut spec = sh("true", dir.path());
        spec.cwd = dir.path().join("gone");
        let error = run(&spec, &options(4096, dir.path()), &Default::default())
            .await
            .unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("the child failed to change to its working directory"),
            "{error}"
        );
        let not_executable = dir.path().join("data.txt");
        std::fs::write(&not_executable, "not a program").unwrap();
        let mut spec = sh("true", dir.path());
        spec.program = not_executable.display().to_string();
        let error = run(&spec, &options(4096, dir.path()), &Default::default())
            .await
            .unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::PermissionDenied, "{error}");
        // Both children were reaped: none is left as a zombie of this process.
        let children = std::fs::read_to_string(format!(
            "/proc/self/task/{}/children",
            nix::unistd::gettid()
        ))
        .unwrap_or_default();
        assert!(children.trim().is_empty(), "{children}");
    }

    /// Output is whole whichever way it was read: a quick child's after its exit, a child that
    /// filled its pipe before kavi watched it, and a child that outlived the quiet start.
    #[tokio::test]
    async fn output_is_whole_however_long_the_child_runs() {
        let dir = tempfile::tempdir().unwrap();
        let options = options(1 << 20, dir.path());
        let cancel = CancellationToken::new();
        let quick = run(&sh("echo out; echo err >&2", dir.path()), &options, &cancel)
            .await
            .unwrap();
        assert_eq!(
            (quick.stdout.head.as_slice(), quick.stderr.head.as_slice()),
            (&b"out\n"[..], &b"err\n"[..])
        );
        // The quick child's quiet-start timer is kept, and the next child's is that one, reset:
        // the filling child below is read only once it fires.
        let runtime = tokio::runtime::Handle::current().id();
        let kept = || {
            QUIET_TIMERS.with_borrow(|kept| kept.iter().filter(|(id, _)| *id == runtime).count())
        };
        assert_eq!(kept(), 1);
        // Three pipes' worth: the child blocks on the full pipe until kavi starts reading.
        let filling = run(
            &sh("head -c 200000 /dev/zero", dir.path()),
            &options,
            &cancel,
        )
        .await
        .unwrap();
        assert_eq!(filling.stdout.total, 200_000);
        assert_eq!(filling.stdout.head.len(), 200_000);
        let slow = run(
            &sh("echo before; sleep 0.1; echo after", dir.path()),
            &options,
            &cancel,
        )
        .await
        .unwrap();
        assert_eq!(slow.stdout.head, b"before\nafter\n");
        assert_eq!(kept(), 1);
        assert!(!(quick.stdout.abandoned || filling.stdout.abandoned || slow.stdout.abandoned));
    }

    /// A process that left the child's group (setsid) and keeps its stdout open does not keep
    /// the child's capture waiting: what came before the child's exit is kept, and the pipe is
    /// given up after the drain grace.
    #[tokio::test]
    async fn a_pipe_held_past_the_exit_is_given_up_after_the_grace() {
        let dir = tempfile::tempdir().unwrap();
        let finished = run(
            // The child waits until the holder is in a session of its own, out of reach of
            // the group's kill at the child's exit.
            &sh(
                "setsid sh -c 'echo $$ > holder; exec sleep 30' & \
                 while [ ! -s holder ]; do sleep 0.01; done; cat holder",
                dir.path(),
            ),
            &options(4096, dir.path()),
            &CancellationToken::new(),
        )
        .await
        .unwrap();
        let out = String::from_utf8(finished.stdout.head).unwrap();
        let holder: i32 = out.trim().parse().expect("the holder's pid");
        let _ = nix::sys::signal::kill(Pid::from_raw(holder), Signal::SIGKILL);
        assert_eq!(finished.exit, Exit::Code(0));
        assert!(finished.stdout.abandoned, "{out}");
        assert!(!finished.stderr.abandoned || finished.stderr.head.is_empty());
    }
}
