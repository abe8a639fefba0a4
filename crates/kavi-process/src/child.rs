//! A started child and its group: finding its program, the descriptors it is passed, waiting
//! on it through its pidfd, and killing its group whatever way the caller leaves.

use std::collections::HashMap;
use std::io::{self, Seek, SeekFrom, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use crate::{Exit, spawn};

/// A memfd holding `bytes`, at a high descriptor, closed on exec (the child dups it).
pub(crate) fn memfd(bytes: &[u8]) -> io::Result<OwnedFd> {
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
pub(crate) fn high(fd: std::os::fd::BorrowedFd<'_>) -> io::Result<OwnedFd> {
    use std::os::fd::FromRawFd;
    let high = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(PASSED_FROM))?;
    // SAFETY: fcntl just made this descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(high) })
}

/// Kills the whole group when dropped, whatever path the caller took out, unless it was killed
/// already.
pub(crate) struct GroupGuard(pub(crate) Pid, std::sync::atomic::AtomicBool);

impl GroupGuard {
    pub(crate) fn new(leader: Pid) -> Self {
        Self(leader, std::sync::atomic::AtomicBool::new(false))
    }

    pub(crate) fn kill(&self) {
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
pub(crate) fn resolve_program(
    program: &str,
    env: &[(String, String)],
    cwd: &Path,
) -> io::Result<PathBuf> {
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

/// A child kavi started, waited on through its pidfd, and never left behind: dropped before it
/// was reaped (its node cancelled by dropping), it is killed and reaped.
///
/// The child is set to get SIGKILL when kavi dies (see [`spawn`]). That signal follows the
/// thread that started the child; kavi runs its processes from one thread (a current-thread
/// runtime), which lives as long as kavi does.
pub(crate) struct Child {
    pid: Pid,
    exited: tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>,
    reaped: bool,
}

impl Child {
    pub(crate) fn new(pid: Pid) -> io::Result<Self> {
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
    pub(crate) async fn wait(&mut self) -> io::Result<Exit> {
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

/// How long a child is waited for alone, its pipes left unwatched, before kavi reads them as it
/// runs. Most commands a pipeline runs are done sooner: kavi reads their output once they exit,
/// and is woken once per child rather than also for the end of each pipe. A child that fills a
/// pipe meanwhile waits at most this long for kavi to read it.
const QUIET_START: Duration = Duration::from_millis(10);

thread_local! {
    /// Quiet-start timers of children that have ended, each with the runtime it belongs to, for
    /// the next children started on this thread (see [`QuietStart`]).
    pub(crate) static QUIET_TIMERS: std::cell::RefCell<Vec<(tokio::runtime::Id, Pin<Box<tokio::time::Sleep>>)>> =
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
pub(crate) struct QuietStart {
    runtime: tokio::runtime::Id,
    pub(crate) timer: Pin<Box<tokio::time::Sleep>>,
}

impl QuietStart {
    pub(crate) fn begin() -> Self {
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
    pub(crate) fn hand_on(self) {
        // At the thread's end the list may be gone already; the timer is then dropped.
        let _ = QUIET_TIMERS.try_with(|kept| kept.borrow_mut().push((self.runtime, self.timer)));
    }
}
