//! The runtime that builds the isolated process: bubblewrap (`bwrap`), the sandbox Flatpak,
//! Claude Code's and Codex CLI's Linux sandboxes use. kavi asks it for new user, PID, mount,
//! IPC, UTS, cgroup and network namespaces (a profile with the network reaches out only through
//! kavi's proxy, whose socket and bridge are mounted in: see [`super::proxy`]), a fresh
//! `/proc`, a mount view holding only what the profile lists, no capabilities, a new session
//! with no controlling terminal, and the seccomp programs; bubblewrap's own init reaps the tree,
//! and when the process it started exits, the namespace goes and every process in it dies.
//!
//! bubblewrap was chosen over making the namespaces from kavi itself: building a mount view
//! needs a fork after `unshare(CLONE_NEWPID)`, `pivot_root` and a reaper, which bubblewrap does
//! in a small, audited setuid-capable C program that every Linux desktop already trusts, and
//! which kavi's clone-and-exec spawner (no allocation between clone and exec) could not do.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Where bubblewrap is looked for: the distribution's path first, never the workspace's.
const BWRAP: &[&str] = &["/usr/bin/bwrap", "/usr/local/bin/bwrap", "/bin/bwrap"];

/// The namespaces kavi asks for, as `/proc/self/ns` names them.
const NAMESPACES: &[&str] = &["user", "pid", "mnt", "ipc", "uts", "net", "cgroup"];

/// bubblewrap's path, or why isolation cannot be had on this machine. Asked once.
pub fn bwrap() -> Result<&'static Path, &'static str> {
    static FOUND: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    FOUND
        .get_or_init(|| {
            let bwrap = BWRAP
                .iter()
                .map(PathBuf::from)
                .find(|p| p.is_file())
                .ok_or_else(|| {
                    "bubblewrap (`bwrap`) is not installed: install Debian's or your \
                     distribution's `bubblewrap` package"
                        .to_owned()
                })?;
            if let Some(missing) = NAMESPACES
                .iter()
                .find(|ns| !Path::new("/proc/self/ns").join(ns).exists())
            {
                return Err(format!("this kernel has no {missing} namespaces"));
            }
            let max = std::fs::read_to_string("/proc/sys/user/max_user_namespaces")
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok());
            if max == Some(0) {
                return Err(
                    "user namespaces are switched off (user.max_user_namespaces = 0)".to_owned(),
                );
            }
            Ok(bwrap)
        })
        .as_ref()
        .map(PathBuf::as_path)
        .map_err(String::as_str)
}

/// The paths of a view, each the same path inside as outside.
pub struct View<'a> {
    pub read: &'a [PathBuf],
    /// Each write scope, and the descriptor number it is mounted from.
    pub write: &'a [(PathBuf, usize)],
    pub hide: &'a [PathBuf],
    /// Tripwires: each decoy, or folder of decoys, kavi made, and where it appears (see
    /// [`super::tripwire`]).
    pub decoys: &'a [(PathBuf, PathBuf)],
    /// Files kavi wrote for the view, and the path each is shown at in place of the host's
    /// (see [`super::accounts`]).
    pub files: &'a [(PathBuf, PathBuf)],
    /// The workspace, and the folder of its listed files shown in its place (see
    /// [`super::listing`]).
    pub listed: Option<(&'a Path, &'a Path)>,
}

/// What a mount in the view does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Mount {
    Read,
    Write,
    Hide,
}

/// bubblewrap's arguments for `view` (each path the same inside as outside, so that every path
/// kavi hands the process stays true), without the program. `proxy` is, for a profile with the
/// network, the proxy's socket and the bridge's binary on the host, mounted read-only where the
/// bridge expects them; the network namespace is new either way. `handshake`, when given, is
/// the descriptor bubblewrap writes its namespace's init's pid to (`--info-fd`); the init then
/// waits, before it starts the program, for a byte on the next one (`--block-fd`).
///
/// Parents are mounted before their children, and for one path a write after a read, so that a
/// write scope inside a read-only folder stays writable and a hidden folder stays hidden.
pub fn arguments(
    view: &View<'_>,
    proxy: Option<(&Path, &Path)>,
    cwd: &Path,
    filters: usize,
    tmp_bytes: Option<u64>,
    handshake: Option<usize>,
) -> Vec<String> {
    let mut args: Vec<String> = [
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--hostname",
        "kavi",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
    ]
    .map(str::to_owned)
    .into();
    // The process is uid 0 of its user namespace, which is the host's uid 0 when kavi runs
    // as root, and /proc's kernel knobs check the uid, not a capability: the ones that reach
    // the host (core_pattern, sysrq, binfmt_misc, IRQs) are read-only, and the ones that show
    // the kernel's memory, keys or layout are empty, as Docker does for its containers.
    for knob in [
        "/proc/sys",
        "/proc/sysrq-trigger",
        "/proc/irq",
        "/proc/bus",
        "/proc/fs",
    ] {
        args.extend(["--ro-bind-try".into(), knob.into(), knob.into()]);
    }
    // Only where this kernel has them: bubblewrap cannot make a file to mount on in /proc.
    for shown in [
        "/proc/kcore",
        "/proc/keys",
        "/proc/timer_list",
        "/proc/sched_debug",
        "/proc/kpageflags",
        "/proc/kpagecount",
        "/proc/kpagecgroup",
        "/proc/slabinfo",
        "/proc/vmallocinfo",
        "/proc/pagetypeinfo",
        "/proc/zoneinfo",
        "/proc/iomem",
        "/proc/kallsyms",
        "/proc/config.gz",
    ] {
        if Path::new(shown).exists() {
            args.extend(["--ro-bind".into(), "/dev/null".into(), shown.into()]);
        }
    }
    // bubblewrap's init, pid 1 of the namespace, runs as the program's user, dumpable and
    // without the program's seccomp filters: through /proc/1/mem the program could write code
    // into it that outlives the run (it leaves the process group and the death signal) and
    // reports whatever exit status it likes through its descriptors (/proc/1/fd). Its /proc
    // folder is an empty read-only one; the mounts are made while pid 1 is the init itself.
    args.extend(["--tmpfs", "/proc/1", "--remount-ro", "/proc/1"].map(str::to_owned));
    // What a process writes of itself in /proc (its name, `/proc/self/comm`) every account on
    // the machine reads in the host's /proc: a way out for a process that holds secrets. Its
    // /proc is read-only (`prctl(PR_SET_NAME)` is refused by seccomp).
    args.extend(["--remount-ro", "/proc"].map(str::to_owned));
    // Each pseudo-terminal opened moves a count every account reads
    // (`/proc/sys/kernel/pty/nr`), whatever devpts it is in: no process here opens one, as
    // none has a terminal.
    args.extend(["--tmpfs", "/dev/pts", "--remount-ro", "/dev/pts"].map(str::to_owned));
    // The private /tmp lives in memory: it is bounded like memory.
    if let Some(bytes) = tmp_bytes {
        args.extend(["--size".into(), bytes.to_string()]);
    }
    args.extend(["--tmpfs".into(), "/tmp".into()]);
    // A write scope is mounted from the descriptor kavi opened it as (its number here).
    let mut mounts: Vec<(usize, Mount, &Path, usize)> = view
        .read
        .iter()
        .map(PathBuf::as_path)
        // The workspace is mounted from its listed files, never as it is.
        .filter(|p| view.listed.is_none_or(|(root, _)| *p != root))
        .map(|p| (Mount::Read, p, 0))
        .chain(view.listed.map(|(root, _)| (Mount::Read, root, 0)))
        .chain(
            view.write
                .iter()
                .map(|(p, fd)| (Mount::Write, p.as_path(), *fd)),
        )
        // A path under another hidden one is hidden with it; mounting on it again would
        // need a folder made in the read-only tmpfs that hides its parent.
        .chain(
            view.hide
                .iter()
                .filter(|p| !view.hide.iter().any(|h| h != *p && p.starts_with(h)))
                .map(|p| (Mount::Hide, p.as_path(), 0)),
        )
        .map(|(kind, path, fd)| (path.components().count(), kind, path, fd))
        .collect();
    mounts.sort();
    for (_, kind, path, fd) in mounts {
        let path = path.display().to_string();
        match kind {
            Mount::Read => match view.listed {
                Some((root, folder)) if Path::new(&path) == root => {
                    args.extend(["--ro-bind".into(), folder.display().to_string(), path]);
                }
                _ => args.extend(["--ro-bind-try".into(), path.clone(), path]),
            },
            Mount::Write => args.extend(["--bind-fd".into(), fd.to_string(), path]),
            Mount::Hide if Path::new(&path).is_dir() => {
                args.extend(["--tmpfs".into(), path.clone(), "--remount-ro".into(), path]);
            }
            Mount::Hide if Path::new(&path).exists() => {
                args.extend(["--ro-bind".into(), "/dev/null".into(), path]);
            }
            Mount::Hide => {}
        }
    }
    // Decoys go where nothing else is mounted, so after everything: bubblewrap makes the
    // folders they need in the view's own root. kavi's own files go over the host's they
    // replace, so after the folders that hold those.
    for (decoy, shown) in view.decoys.iter().chain(view.files) {
        args.extend([
            "--ro-bind".into(),
            decoy.display().to_string(),
            shown.display().to_string(),
        ]);
    }
    // After the profile's paths, so that none of them covers these. connect() on a unix
    // socket needs no writable mount.
    if let Some((socket, bridge)) = proxy {
        for (from, to) in [
            (socket, super::proxy::SOCKET_IN_VIEW),
            (bridge, super::bridge::PROGRAM_IN_VIEW),
        ] {
            args.extend(["--ro-bind".into(), from.display().to_string(), to.into()]);
        }
    }
    // The view's own root (the folders made to mount on) is read-only too: what the profile
    // does not list as writable is not, even where nothing is mounted.
    args.extend(["--remount-ro".into(), "/".into()]);
    args.extend(["--chdir".into(), cwd.display().to_string()]);
    // The programs' descriptors are 3, 4, ... in the child, the write scopes' after them (see
    // process::spawn).
    for fd in 0..filters {
        args.extend(["--add-seccomp-fd".into(), (3 + fd).to_string()]);
    }
    if let Some(info) = handshake {
        args.extend([
            "--info-fd".into(),
            info.to_string(),
            "--block-fd".into(),
            (info + 1).to_string(),
        ]);
    }
    args.push("--".into());
    args
}
