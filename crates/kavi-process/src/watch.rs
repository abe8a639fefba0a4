//! Watching a confined process while it runs: a sprung tripwire, a daemon left behind, a bound
//! outgrown; and the violation it is stopped for.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::unistd::Pid;
use tokio_util::sync::CancellationToken;

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
    /// It made version control's state in a write scope in the workspace (removed since), or
    /// the scope could not be looked at: what, in words.
    Repository(String),
    /// Not every process of it could be watched: kavi's reader of the kernel's process events
    /// fell behind, as a flood of them makes it, so a forbidden call could have gone unseen.
    Unwatched,
}

impl Violation {
    /// Whether only an attack does this (as opposed to outgrowing a bound).
    pub fn is_security(&self) -> bool {
        !matches!(self, Violation::Bound(_))
    }

    /// Of the violations one run was found with, in the order found, the one it fails for: the
    /// first that only an attack does, else the first. A bound the run also hit (as an attack
    /// can do on purpose, to be stopped for it first) never hides what the attack did.
    pub fn gravest(mut found: Vec<Violation>) -> Option<Violation> {
        let index = found.iter().position(Violation::is_security).unwrap_or(0);
        (index < found.len()).then(|| found.swap_remove(index))
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
            Violation::Unwatched => f.write_str(
                "stopped by its confinement when not every process of it could be watched \
                 (kavi's reader of the kernel's process events fell behind, as a flood of \
                 process events makes it)",
            ),
            Violation::Repository(what) => write!(
                f,
                "failed by its confinement for leaving version control's state in its write \
                 scope, which a person's `git status` there would run the configuration of \
                 ({what}; removed)"
            ),
        }
    }
}

impl Violation {
    /// Past the disk bound of `mib` MiB.
    pub(crate) fn disk(mib: u64) -> Self {
        Violation::Bound(format!("its disk bound ({mib} MiB)"))
    }
}

/// How often a confined process is looked at for a sprung tripwire or a daemon.
const WATCH: Duration = Duration::from_millis(100);

/// Every how many looks its write folders and CPU time are measured against its bounds
/// (walking the write folders costs more).
const BOUNDS_EVERY: u32 = 5;

/// A task that ends when its handle is dropped.
pub(crate) struct AbortOnDrop(pub(crate) tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What the watch of a confined process looks at.
pub(crate) struct Watched {
    /// bubblewrap, kavi's child: its one child is the namespace's init.
    pub(crate) outer: Pid,
    pub(crate) tripwires: Option<Arc<crate::confinement::tripwire::Tripwires>>,
    /// The disk bound in MiB and the folders it bounds.
    pub(crate) disk: Option<(u64, Vec<PathBuf>)>,
    /// The CPU bound in seconds and the cgroup folders that count it.
    pub(crate) cpu: Option<(u64, Vec<PathBuf>)>,
    /// The kernel's process events of the tree, where kavi has them.
    pub(crate) deaths: Option<Arc<crate::confinement::deaths::Watch>>,
}

use crate::confinement::deaths::Seen;

/// Watches a confined process until it is stopped (the task is aborted when the run ends);
/// the first violation seen is written to `found` and stops it.
pub(crate) async fn watch(
    watched: Watched,
    stop: CancellationToken,
    found: Arc<Mutex<Option<Violation>>>,
) {
    let watched = Arc::new(watched);
    for look in 1u32.. {
        tokio::time::sleep(WATCH).await;
        let watched = Arc::clone(&watched);
        let seen = tokio::task::spawn_blocking(move || {
            use crate::confinement::bounds;
            if let Some(path) = watched.tripwires.as_ref().and_then(|t| t.sprung()) {
                return Some(Violation::Tripwire(path));
            }
            // A process the program started, killed by seccomp: the program may carry on.
            match watched.deaths.as_ref().map(|d| d.so_far()) {
                Some(Seen::Killed(_)) => return Some(Violation::ForbiddenCall),
                Some(Seen::Lost) => return Some(Violation::Unwatched),
                _ => {}
            }
            if orphaned(watched.outer) {
                return Some(Violation::Daemon);
            }
            if look % BOUNDS_EVERY != 0 {
                return None;
            }
            if let Some((mib, paths)) = &watched.disk
                && bounds::disk_used(paths)
                    .zip(bounds::unlinked_held(&programs(watched.outer), paths))
                    .is_none_or(|(listed, held)| listed + held > mib << 20)
            {
                return Some(Violation::disk(*mib));
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
    children(outer.as_raw())
        .into_iter()
        .any(|init| children(init).len() > 1)
}

/// The children of process `pid`, of any of its threads.
fn children(pid: i32) -> Vec<i32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .flat_map(|task| {
            std::fs::read_to_string(task.path().join("children"))
                .unwrap_or_default()
                .split_whitespace()
                .filter_map(|child| child.parse::<i32>().ok())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Every process below the namespace's init (bubblewrap's child, `outer`'s): the program and
/// whatever it started, as an orphan is the init's child. bubblewrap's own two processes hold
/// nothing the program made, and a setuid bubblewrap's cannot be looked at.
fn programs(outer: Pid) -> Vec<i32> {
    let inits = children(outer.as_raw());
    let mut found = inits.clone();
    let mut seen: std::collections::HashSet<i32> = inits.iter().copied().collect();
    seen.insert(outer.as_raw());
    let mut next = 0;
    while next < found.len() {
        for pid in children(found[next]) {
            if seen.insert(pid) {
                found.push(pid);
            }
        }
        next += 1;
    }
    found.drain(..inits.len());
    found
}

#[cfg(test)]
mod tests {
    use super::Violation;

    #[test]
    fn the_first_violation_only_an_attack_commits_names_the_run_before_any_bound() {
        let bound = |what: &str| Violation::Bound(what.to_owned());
        assert_eq!(Violation::gravest(vec![]), None);
        assert_eq!(
            Violation::gravest(vec![bound("disk"), Violation::ForbiddenCall]),
            Some(Violation::ForbiddenCall)
        );
        assert_eq!(
            Violation::gravest(vec![
                bound("disk"),
                Violation::Repository("a".into()),
                Violation::Unwatched
            ]),
            Some(Violation::Repository("a".into()))
        );
        assert_eq!(
            Violation::gravest(vec![bound("disk"), bound("cpu")]),
            Some(bound("disk"))
        );
    }
}
