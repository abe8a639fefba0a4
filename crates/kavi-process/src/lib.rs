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

use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use tokio::io::AsyncWriteExt;
use tokio_util::sync::CancellationToken;

use crate::confinement::Confinement;

mod child;
pub mod confinement;
mod environment;
pub mod git;
mod output;
pub mod roster;
mod spawn;
mod watch;

use child::{Child, GroupGuard, QuietStart, high, memfd, resolve_program};
pub use environment::{
    base_env, is_variable_name, jobs_within_open_files, open_file_limit, raise_open_file_limit,
};
use output::capture;
pub use output::{Captured, LiveOutput, OutputChunks, Stream};
pub use roster::Roster;
pub use watch::Violation;
use watch::{AbortOnDrop, Watched, watch};

/// How long a cancelled process group gets between SIGTERM and SIGKILL.
const TERMINATE_GRACE: Duration = Duration::from_secs(2);

/// How long output is still read after the node's group is gone. Only a process that left the
/// group (setsid) can still hold the pipes open; kavi does not wait for it forever.
const DRAIN_GRACE: Duration = Duration::from_secs(1);

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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Code(i32),
    Signal(i32),
    /// Stopped because the cancel token fired.
    Cancelled,
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
    /// What the run leaves to remove: its private folders and cgroups, removed when this is
    /// dropped. Its process tree is gone already.
    pub leftovers: Leftovers,
}

/// Private folders, decoys and cgroups of a finished run, removed when dropped. Removing them
/// takes dozens of calls into the file system; a caller that someone waits on (an executor's
/// client) answers first and drops this after.
#[derive(Default)]
pub struct Leftovers(Vec<Box<dyn Send>>);

impl Leftovers {
    /// `self` holding `more` too, removed when `self` is.
    #[must_use]
    pub fn and(mut self, more: impl Send + 'static) -> Self {
        self.0.push(Box::new(more));
        self
    }
}

impl std::fmt::Debug for Leftovers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Leftovers({})", self.0.len())
    }
}

/// Runs a command to completion, capturing its output.
pub async fn run(
    spec: &CommandSpec,
    options: &CaptureOptions,
    cancel: &CancellationToken,
) -> io::Result<Finished> {
    run_with(spec, spec.stdin.clone().map(Input::Now), options, cancel).await
}

/// [`run`] with the child's input sent later: the child starts now, its stdin a pipe that
/// stays open until `input` brings the bytes (a sandbox started before its work is known); a
/// dropped sender closes it. `spec.stdin` is not used.
pub async fn run_fed(
    spec: &CommandSpec,
    input: tokio::sync::oneshot::Receiver<Vec<u8>>,
    options: &CaptureOptions,
    cancel: &CancellationToken,
) -> io::Result<Finished> {
    run_with(spec, Some(Input::Later(input)), options, cancel).await
}

/// What a child reads on its stdin.
enum Input {
    Now(Vec<u8>),
    Later(tokio::sync::oneshot::Receiver<Vec<u8>>),
}

async fn run_with(
    spec: &CommandSpec,
    input: Option<Input>,
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
        Some(confinement) => {
            let listed = confinement.list_workspace().await?;
            confinement.launch(&program, &spec.args, &spec.cwd, listed)?
        }
        None => None,
    };
    // The launch's private folders are written down as soon as they exist, so that a kavi
    // killed from here on leaves nothing a later one does not remove.
    if let (Some(roster), Some(launch)) = (&options.roster, &launch) {
        let folders = launch.tripwires.as_ref().map(|t| t.folder());
        for folder in folders
            .into_iter()
            .chain(launch.accounts.as_ref().map(|a| a.folder()))
            .chain(launch.proxy.as_ref().map(|p| p.folder()))
            .chain(launch.listed.as_ref().map(|l| l.folder()))
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
    // Every death in a confined tree is seen from its first fork, whoever reaps it. Where the
    // role may start programs, seccomp kills only for calls an attack makes; where it may not,
    // a child's death may be a library trying a program (`platform`, `ctypes.util`), which the
    // class refuses but no attack needs to try, so only the program's own death counts there.
    let mut deaths = match (&spec.confinement, &launch) {
        (Some(confinement), Some(_)) if confinement.profile.programs => {
            crate::confinement::deaths::watch()
        }
        _ => None,
    };
    // Where no cgroup bounds the tree's processes, bubblewrap's init waits for its bound.
    let hold = match launch.as_ref().and_then(|launch| launch.processes) {
        Some(_) => Some(crate::confinement::bounds::InitHold::new()?),
        None => None,
    };
    let window = roster::StartWindow::open();
    let spawned = match &launch {
        None => spawn::spawn(
            &program,
            &spec.args,
            env,
            &spec.cwd,
            input.is_some(),
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
            // The hold's two ends after the scopes' (see `Launch::processes`).
            let held = match &hold {
                Some((_, ends)) => ends
                    .iter()
                    .map(|fd| high(fd.as_fd()))
                    .collect::<io::Result<Vec<_>>>()?,
                None => Vec::new(),
            };
            let pass: Vec<_> = filters
                .iter()
                .chain(&scopes)
                .chain(&held)
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
                input.is_some(),
                &spawn::Extras {
                    pass: &pass,
                    cgroups: &cgroups,
                    rlimits: &launch.rlimits,
                    landlock: launch.landlock.as_ref().map(|fd| fd.as_raw_fd()),
                },
            )?
        }
    };
    if let Some(deaths) = &mut deaths {
        deaths.track(spawned.pid.as_raw() as u32);
    }
    let deaths = deaths.map(Arc::new);
    let mut child = Child::new(spawned.pid)?;
    tracing::debug!(program = %program.display(), args = ?spec.args, cwd = %spec.cwd.display(), "spawned");
    let group = GroupGuard::new(spawned.pid);
    if let (Some((hold, ends)), Some(processes)) =
        (hold, launch.as_ref().and_then(|launch| launch.processes))
    {
        // bubblewrap holds its ends now: with kavi's closed, a bubblewrap that ends early
        // ends the wait.
        drop(ends);
        hold.release(processes)?;
    }
    if let Some(roster) = &options.roster {
        roster.enlist(spawned.pid.as_raw(), window)?;
    }

    if let (Some(input), Some(fd)) = (input, spawned.stdin) {
        let mut pipe = tokio::net::unix::pipe::Sender::from_owned_fd(fd)?;
        // A child that does not read its stdin closes the pipe; that is not an error.
        tokio::spawn(async move {
            let bytes = match input {
                Input::Now(bytes) => bytes,
                Input::Later(later) => match later.await {
                    Ok(bytes) => bytes,
                    // Never sent: the pipe closes, the child reads the end of its input.
                    Err(_) => return,
                },
            };
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
                deaths: deaths.clone(),
            },
            stop.clone(),
            Arc::clone(&stopped_for),
        )))),
        _ => None,
    };
    let exited = CancellationToken::new();
    // Output someone watches live is read as it comes, from the start.
    let quick_exit = match &options.live {
        Some(live) if live.watched => None,
        _ => {
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
    // A child that exited in its quiet start is done before anyone could follow its output: it
    // goes to its capture only, not through a live log (on a chain of short nodes, a file made
    // and removed per node).
    let not_followed;
    let options = match &options.live {
        Some(live) if quick_exit.is_some() && !live.watched => {
            not_followed = CaptureOptions {
                live: None,
                ..options.clone()
            };
            &not_followed
        }
        _ => options,
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
        // Whatever the child left running in its group goes with it, and in its cgroup
        // whatever left the group; that closes the pipes.
        group.kill();
        if let Some((cgroup, _)) = launch.as_ref().and_then(|launch| launch.cgroup.as_ref()) {
            cgroup.kill_all();
        }
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
        // Everything the run is stopped or failed for, in the order found; the gravest names it.
        let mut found: Vec<Violation> = Vec::new();
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
        let sprung = tripwires.as_ref().and_then(|t| {
            let sprung = t.sprung();
            t.disarm();
            sprung
        });
        found.extend(watched);
        found.extend(sprung.map(Violation::Tripwire));
        // A process of the tree killed by seccomp, the program or one it started. Once the root
        // is reaped, every process of the tree has ended; this waits for their ends to be read.
        let descendant = match deaths.clone() {
            Some(deaths) => {
                use crate::confinement::deaths::Seen;
                match tokio::task::spawn_blocking(move || deaths.seen())
                    .await
                    .unwrap_or(Seen::Unfinished)
                {
                    Seen::Killed(_) => Some(Violation::ForbiddenCall),
                    Seen::Lost => Some(Violation::Unwatched),
                    Seen::Clean => None,
                    // Not every end of its processes was read in time: one killed by seccomp
                    // may be among them, and kavi says it sees every death.
                    Seen::Unfinished => {
                        tracing::warn!("the ends of the run's processes were not all read in time");
                        Some(Violation::Unwatched)
                    }
                }
            }
            None => None,
        };
        found.extend(descendant);
        found.extend(match exit {
            Exit::Signal(signal) if signal == nix::libc::SIGSYS => Some(Violation::ForbiddenCall),
            Exit::Signal(signal) => {
                crate::confinement::bounds::exceeded_by_signal(signal, limits).map(Violation::Bound)
            }
            _ => None,
        });
        if let Some((cgroup, _)) = launch.cgroup.as_ref() {
            found.extend(cgroup.exceeded().map(Violation::Bound));
        }
        // What it wrote in its last moments, or in less than the watch's first measure, stays:
        // its write folders are measured once more now that it has ended.
        if found.is_empty()
            && let Some(mib) = limits.disk_mib
        {
            let paths = spec
                .confinement
                .as_ref()
                .expect("launched confined")
                .profile
                .write
                .clone();
            let used =
                tokio::task::spawn_blocking(move || crate::confinement::bounds::disk_used(&paths))
                    .await
                    .ok()
                    .flatten();
            if used.is_none_or(|used| used > mib << 20) {
                found.push(Violation::disk(mib));
            }
        }
        // What it nested too deep for a path to name, no later look at the workspace could
        // read (each would refuse to run anything): removed, and the run fails for it. The
        // scopes are walked off the runtime's threads, as the disk is measured.
        let scopes: Vec<PathBuf> = launch
            .vcs_before
            .iter()
            .map(|(scope, _)| scope.clone())
            .collect();
        let unnameable = tokio::task::spawn_blocking(move || {
            let mut removed = Vec::new();
            for scope in scopes {
                let found = kavi_foundation::removal::remove_unnameable(&scope)
                    .map_err(|e| format!("{}: {e}", scope.display()))?;
                removed.extend(found.into_iter().map(|path| scope.join(path)));
            }
            Ok::<_, String>(removed)
        })
        .await
        .unwrap_or_else(|e| Err(format!("the look stopped: {e}")));
        match unnameable {
            Ok(removed) if removed.is_empty() => {}
            Ok(removed) => {
                found.push(Violation::Bound(format!(
                    "nested paths in its write scope too long to name (over {} bytes), \
                     removed: {} entries, the first {}",
                    kavi_foundation::removal::NAMEABLE,
                    removed.len(),
                    shortened(&removed[0])
                )));
            }
            Err(unseen) => {
                found.push(Violation::Bound(format!(
                    "cannot look for paths too long to name in its write scope: {}",
                    unseen.chars().take(300).collect::<String>()
                )));
            }
        }
        // A repository it made in a write scope in the workspace would run its configuration
        // as the person who next runs git there: made inert, and the run fails for it.
        let vcs_before = launch.vcs_before.clone();
        let made =
            tokio::task::spawn_blocking(move || crate::confinement::repositories_made(&vcs_before))
                .await
                .unwrap_or_else(|e| Err(format!("the look stopped: {e}")));
        match made {
            Ok(made) if made.is_empty() => {}
            Ok(made) => {
                let made: Vec<String> = made.iter().map(|p| p.display().to_string()).collect();
                found.push(Violation::Repository(made.join(", ")));
            }
            Err(unseen) => {
                found.push(Violation::Repository(format!("cannot look: {unseen}")));
            }
        }
        violation = Violation::gravest(found);
    }
    Ok(Finished {
        exit,
        stdout: stdout?,
        stderr: stderr?,
        violation,
        network: proxy.map(crate::confinement::proxy::Running::finish),
        leftovers: Leftovers::default().and(launch).and(tripwires),
    })
}

/// A path too long to print whole: its start and its end.
fn shortened(path: &Path) -> String {
    let text = path.display().to_string();
    if text.chars().count() <= 160 {
        return text;
    }
    let start: String = text.chars().take(80).collect();
    let end: String = text.chars().skip(text.chars().count() - 60).collect();
    format!("{start}...{end}")
}

#[cfg(test)]
mod tests;
