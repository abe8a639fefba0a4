//! Resource bounds: memory, processes, CPU seconds, open files and file size.
//!
//! Memory and processes are bounded for the whole process tree by a cgroup of its own where the
//! machine lets kavi make one (cgroup v2, or v1's `memory` and `pids` controllers); the child
//! moves itself into it before it execs. CPU seconds, open files and the size of one file are
//! rlimits, set in the child before it execs. Without a cgroup, memory falls back to an address
//! space rlimit of each process, and processes to an `RLIMIT_NPROC` set on the sandbox's init
//! before its program starts ([`processes_by_rlimit`]), which the kernel counts in the
//! sandbox's own user namespace; the record and `kavi doctor` say which applies.
//!
//! After the process exits, the cgroup's counters say whether a bound was hit (an OOM kill, a
//! refused fork), which kavi reports as its own failure, never as a plain crash.

use std::fs;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use nix::libc;
use serde::{Deserialize, Serialize};

/// The bounds a profile sets; `None`: unbounded.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Memory of the whole process tree, in MiB.
    pub memory_mib: Option<u64>,
    /// Processes (and threads) alive at once in the tree.
    pub processes: Option<u64>,
    /// CPU time of the whole tree (where the cgroup counts it) and of each process, in seconds.
    pub cpu_seconds: Option<u64>,
    /// Open files of each process.
    pub open_files: Option<u64>,
    /// The largest file a process may write, in MiB.
    pub file_size_mib: Option<u64>,
    /// What the profile's write folders may hold together, in MiB, measured while it runs.
    pub disk_mib: Option<u64>,
}

impl Limits {
    /// Whether a cgroup bounds any of these: memory, processes or the tree's CPU time.
    pub fn need_cgroup(&self) -> bool {
        self.memory_mib.is_some() || self.processes.is_some() || self.cpu_seconds.is_some()
    }

    /// Each bound the smaller of the two; unbounded only where both are.
    pub fn tightest(&self, other: &Limits) -> Limits {
        let min = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        Limits {
            memory_mib: min(self.memory_mib, other.memory_mib),
            processes: min(self.processes, other.processes),
            cpu_seconds: min(self.cpu_seconds, other.cpu_seconds),
            open_files: min(self.open_files, other.open_files),
            file_size_mib: min(self.file_size_mib, other.file_size_mib),
            disk_mib: min(self.disk_mib, other.disk_mib),
        }
    }
}

/// How the machine bounds memory and processes.
#[derive(Debug, Clone)]
pub enum CgroupSupport {
    /// A cgroup v2 folder kavi may make children in.
    V2(PathBuf),
    /// cgroup v1: the `memory` and `pids` hierarchies' folders kavi may make children in, and
    /// `cpuacct`'s where the machine has it.
    V1 {
        memory: PathBuf,
        pids: PathBuf,
        cpuacct: Option<PathBuf>,
    },
    /// Neither: why not.
    None(String),
}

impl CgroupSupport {
    /// The folders kavi makes its cgroups in, one a hierarchy.
    pub fn parents(&self) -> Vec<&Path> {
        match self {
            CgroupSupport::V2(folder) => vec![folder],
            CgroupSupport::V1 {
                memory,
                pids,
                cpuacct,
            } => [memory, pids]
                .into_iter()
                .chain(cpuacct)
                .map(PathBuf::as_path)
                .collect(),
            CgroupSupport::None(_) => Vec::new(),
        }
    }

    pub fn describe(&self) -> String {
        match self {
            CgroupSupport::V2(path) => format!("cgroup v2 ({})", path.display()),
            CgroupSupport::V1 { cpuacct: None, .. } => "cgroup v1 (memory, pids)".to_owned(),
            CgroupSupport::V1 { .. } => "cgroup v1 (memory, pids, cpuacct)".to_owned(),
            CgroupSupport::None(why) if nproc_applies() => format!(
                "rlimits only ({why}): processes by RLIMIT_NPROC in the sandbox's own user \
                 namespace, memory by each process's address space"
            ),
            CgroupSupport::None(why) => format!(
                "rlimits only ({why}): memory by each process's address space; processes not \
                 bounded, as the kernel holds no task of the host's root to RLIMIT_NPROC"
            ),
        }
    }
}

/// Where no cgroup bounds a tree's processes (`by_cgroup` false), the profile's bound, for kavi
/// to set as `RLIMIT_NPROC` on the sandbox's init before its program starts. The kernel counts
/// that limit per user namespace: in the sandbox's own, where only the tree's tasks are, and
/// not against the account's other processes (bubblewrap made the namespace with kavi's own
/// limit, which the levels above are held to). `None` where a cgroup bounds them, the profile
/// sets no bound, or kavi runs as the host's root, whose tasks the kernel never holds to it.
pub fn processes_by_rlimit(limits: &Limits, by_cgroup: bool) -> Option<u64> {
    limits.processes.filter(|_| !by_cgroup && nproc_applies())
}

/// How kavi holds a sandbox's init until its processes bound is set (see
/// [`processes_by_rlimit`]): bubblewrap writes the init's pid on one pipe (`--info-fd`) and
/// closes it; the init then waits for a byte on the other (`--block-fd`) before it starts the
/// program, so that the program and all it starts inherit the bound.
pub struct InitHold {
    info: OwnedFd,
    go: OwnedFd,
}

/// How long bubblewrap has to say its init's pid: it does so right after making the
/// namespaces, in a few milliseconds.
const INIT_PID_WAIT_MS: u16 = 10_000;

impl InitHold {
    /// The hold, and the two ends bubblewrap gets, in its order: the info end it writes, then
    /// the block end it reads. Every end is close-on-exec in kavi.
    pub fn new() -> std::io::Result<(Self, [OwnedFd; 2])> {
        let (info, info_end) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        let (go_end, go) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        Ok((Self { info, go }, [info_end, go_end]))
    }

    /// Reads the init's pid, sets `processes` as its `RLIMIT_NPROC`, and lets it start the
    /// program. On an error (bubblewrap ended, said no pid, or the limit was refused) the init
    /// is still waiting, or gone: the caller kills the tree, and nothing ran unbounded.
    pub fn release(self, processes: u64) -> std::io::Result<()> {
        use std::io::Read;
        let unheld = |why: String| {
            std::io::Error::other(format!(
                "cannot set the sandbox's process bound ({processes} processes): {why}"
            ))
        };
        let mut said = Vec::new();
        let mut info = fs::File::from(self.info);
        loop {
            let mut ready = [nix::poll::PollFd::new(
                std::os::fd::AsFd::as_fd(&info),
                nix::poll::PollFlags::POLLIN,
            )];
            match nix::poll::poll(&mut ready, nix::poll::PollTimeout::from(INIT_PID_WAIT_MS)) {
                Ok(0) => return Err(unheld("bubblewrap did not say its init's pid".into())),
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(unheld(e.to_string())),
            }
            let mut chunk = [0; 1024];
            match info.read(&mut chunk) {
                Ok(0) => break,
                Ok(read) => said.extend_from_slice(&chunk[..read]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(unheld(e.to_string())),
            }
        }
        let pid = serde_json::from_slice::<serde_json::Value>(&said)
            .ok()
            .and_then(|said| said.get("child-pid")?.as_i64())
            .and_then(|pid| libc::pid_t::try_from(pid).ok())
            .filter(|pid| *pid > 0)
            .ok_or_else(|| unheld("bubblewrap ended before it said its init's pid".into()))?;
        let limit = libc::rlimit64 {
            rlim_cur: processes,
            rlim_max: processes,
        };
        // SAFETY: a plain system call on a pid and a limit of ours; the old limit is not asked.
        if unsafe {
            libc::prlimit64(
                pid,
                libc::RLIMIT_NPROC,
                &raw const limit,
                std::ptr::null_mut(),
            )
        } != 0
        {
            return Err(unheld(std::io::Error::last_os_error().to_string()));
        }
        fs::File::from(self.go)
            .write_all(b"1")
            .map_err(|e| unheld(e.to_string()))
    }
}

/// Whether the kernel holds this account's tasks to `RLIMIT_NPROC`: every account but the
/// host's root (uid 0 of the first user namespace, which `/proc/self/uid_map` shows mapping
/// every id to itself).
fn nproc_applies() -> bool {
    static APPLIES: OnceLock<bool> = OnceLock::new();
    *APPLIES.get_or_init(|| {
        let host_root = nix::unistd::getuid().is_root()
            && fs::read_to_string("/proc/self/uid_map").is_ok_and(|map| {
                map.lines().any(|line| {
                    line.split_whitespace().collect::<Vec<_>>() == ["0", "0", "4294967295"]
                })
            });
        !host_root
    })
}

/// This process's cgroup path in the hierarchy whose line in /proc/self/cgroup matches.
fn own_cgroup(controller: &str) -> Option<String> {
    let text = fs::read_to_string("/proc/self/cgroup").ok()?;
    text.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let matches = if controller.is_empty() {
            controllers.is_empty()
        } else {
            controllers.split(',').any(|c| c == controller)
        };
        matches.then(|| path.trim_start_matches('/').to_owned())
    })
}

/// Whether a child cgroup can be made (and removed) in `folder`, with `file` in it written.
fn can_make_child(folder: &Path, file: &str, value: &str) -> bool {
    let probe = folder.join(format!("kavi-probe-{}", std::process::id()));
    let ok = fs::create_dir(&probe).is_ok() && fs::write(probe.join(file), value).is_ok();
    let _ = fs::remove_dir(&probe);
    ok
}

/// What this machine offers, asked once.
pub fn cgroup_support() -> &'static CgroupSupport {
    static SUPPORT: OnceLock<CgroupSupport> = OnceLock::new();
    SUPPORT.get_or_init(|| {
        let root = Path::new("/sys/fs/cgroup");
        if let Some(own) = own_cgroup("") {
            let folder = root.join(&own);
            let controllers = fs::read_to_string(folder.join("cgroup.subtree_control"))
                .or_else(|_| fs::read_to_string(folder.join("cgroup.controllers")))
                .unwrap_or_default();
            let has = |c| controllers.split_whitespace().any(|x| x == c);
            if has("memory") && has("pids") && can_make_child(&folder, "pids.max", "max") {
                return CgroupSupport::V2(folder);
            }
        }
        let v1 = |controller: &str| {
            let own = own_cgroup(controller)?;
            let folder = root.join(controller).join(own);
            folder.is_dir().then_some(folder)
        };
        match (v1("memory"), v1("pids")) {
            (Some(memory), Some(pids))
                if can_make_child(&memory, "memory.limit_in_bytes", "-1")
                    && can_make_child(&pids, "pids.max", "max") =>
            {
                let cpuacct = v1("cpuacct").filter(|c| can_make_child(c, "notify_on_release", "0"));
                CgroupSupport::V1 {
                    memory,
                    pids,
                    cpuacct,
                }
            }
            _ => CgroupSupport::None(
                "no cgroup with the memory and pids controllers that kavi may make children in"
                    .to_owned(),
            ),
        }
    })
}

/// How long [`move_soon`] keeps cgroup moves fast after its last call.
const MOVE_SOON_WINDOW: std::time::Duration = std::time::Duration::from_millis(300);

/// Says that a confined child will move into its cgroup soon, so that its move does not wait.
///
/// The first move into a cgroup after a quiet spell waits for an RCU grace period (the kernel's
/// `cgroup_threadgroup_rwsem` leaves its per-CPU fast path only after one; the `favordynmods`
/// mount option keeps it left, and few machines set it): 6 to 23 ms on this project's machines,
/// paid by the child before it execs, on every run. A move within a grace period of another
/// does not wait. So kavi pays the wait ahead, on a thread of its own, while it checks and
/// snapshots what it will run: the thread moves kavi into the cgroup it is already in, which
/// changes nothing, and again every two milliseconds until [`MOVE_SOON_WINDOW`] after the last
/// call. Where kavi cannot make cgroups, or cannot write its own, this does nothing.
pub fn move_soon() {
    use std::sync::Mutex;
    use std::time::{Duration, Instant};
    // When the keeping thread stops; `None` while no thread runs.
    static UNTIL: Mutex<Option<Instant>> = Mutex::new(None);
    let own = match cgroup_support() {
        CgroupSupport::V2(folder) | CgroupSupport::V1 { memory: folder, .. } => {
            folder.join("cgroup.procs")
        }
        CgroupSupport::None(_) => return,
    };
    let mut until = UNTIL.lock().unwrap_or_else(|e| e.into_inner());
    let running = until.is_some();
    *until = Some(Instant::now() + MOVE_SOON_WINDOW);
    if running {
        return;
    }
    drop(until);
    let spawned = std::thread::Builder::new()
        .name("kavi-cgroup-move".into())
        .spawn(move || {
            let Ok(mut procs) = fs::OpenOptions::new().write(true).open(&own) else {
                *UNTIL.lock().unwrap_or_else(|e| e.into_inner()) = None;
                return;
            };
            loop {
                // "0": the writer's own process, into the cgroup it is in.
                let moved = procs.write_all(b"0").is_ok();
                let mut until = UNTIL.lock().unwrap_or_else(|e| e.into_inner());
                if !moved || until.is_none_or(|until| Instant::now() >= until) {
                    *until = None;
                    return;
                }
                drop(until);
                std::thread::sleep(Duration::from_millis(2));
            }
        });
    if spawned.is_err() {
        *UNTIL.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

/// One process tree's cgroup folders, removed when dropped.
#[derive(Debug)]
pub struct Cgroup {
    folders: Vec<PathBuf>,
    limits: Limits,
}

/// A distinct name for each cgroup this kavi makes: `kavi-<pid>-<seq>-<random>-<pid namespace>`.
fn next_name() -> String {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    // Random too: a kavi killed before it removed its cgroups leaves their names taken, and a
    // later kavi may get the same pid. The PID namespace says where that pid means this kavi
    // (see `sweep_orphans`).
    format!(
        "kavi-{}-{}-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed),
        &uuid::Uuid::new_v4().simple().to_string()[..8],
        pid_namespace()
    )
}

/// This process's PID namespace, as `ns<inode>` (`ns0` where it cannot be read).
pub(crate) fn pid_namespace() -> &'static str {
    static NAMESPACE: OnceLock<String> = OnceLock::new();
    NAMESPACE.get_or_init(|| {
        let inode = fs::metadata("/proc/self/ns/pid").map_or(0, |m| {
            use std::os::unix::fs::MetadataExt;
            m.ino()
        });
        format!("ns{inode}")
    })
}

/// The kavi process a cgroup's name says made it, where that pid means a process of this
/// PID namespace: `kavi-<pid>-<seq>-<random>-<namespace>` of [`next_name`].
fn maker(name: &str) -> Option<i32> {
    let mut parts = name.strip_prefix("kavi-")?.split('-');
    let pid = parts.next()?.parse().ok().filter(|pid| *pid > 0)?;
    let (_seq, _random) = (parts.next()?, parts.next()?);
    // A name without the namespace (made before names carried it) is left alone: a kavi of
    // another namespace may have made it.
    // `ns0` is a namespace kavi could not read: any kavi may have it.
    let namespace = parts.next()?;
    (namespace != "ns0" && namespace == pid_namespace() && parts.next().is_none()).then_some(pid)
}

/// Removes the cgroups whose kavi is gone, killing first whatever is still in them.
///
/// A kavi removes its cgroups when a launch ends; one killed outright (SIGKILL) cannot, and
/// what its sandbox ran should have died with it. So each kavi, at its first bounded launch,
/// sweeps the folders it makes cgroups in: a cgroup named for a process of this PID namespace
/// that no longer exists has its processes killed and is removed. A name whose process exists
/// (even one that reused the pid), or that a kavi in another PID namespace made (or that does
/// not say which namespace), is left alone.
/// Returns how many cgroups were removed.
pub fn sweep_orphans() -> usize {
    let swept = sweep_orphans_here();
    if swept > 0 {
        tracing::debug!("removed {swept} cgroups of kavi processes that are gone");
    }
    swept
}

fn sweep_orphans_here() -> usize {
    let own = std::process::id() as i32;
    let mut orphans: std::collections::BTreeMap<String, Vec<PathBuf>> = Default::default();
    for parent in cgroup_support().parents() {
        let Ok(entries) = fs::read_dir(parent) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(pid) = maker(&name) else { continue };
            let gone = pid != own
                && nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None)
                    == Err(nix::errno::Errno::ESRCH);
            if gone && entry.file_type().is_ok_and(|t| t.is_dir()) {
                orphans.entry(name).or_default().push(entry.path());
            }
        }
    }
    orphans
        .into_values()
        .filter(|folders| {
            let cgroup = Cgroup {
                folders: folders.clone(),
                limits: Limits::default(),
            };
            cgroup.kill_all();
            drop(cgroup);
            folders.iter().all(|folder| !folder.exists())
        })
        .count()
}

impl Cgroup {
    /// Makes the cgroup for `limits` (or none, when nothing it bounds is asked for or the
    /// machine has none) and opens the `cgroup.procs` files the child writes itself into.
    pub fn make(limits: &Limits) -> std::io::Result<Option<(Cgroup, Vec<OwnedFd>)>> {
        if !limits.need_cgroup() {
            return Ok(None);
        }
        // Off the launch's path: the sweep may wait for a leftover tree to die.
        static SWEPT: std::sync::Once = std::sync::Once::new();
        SWEPT.call_once(|| {
            let _ = std::thread::Builder::new()
                .name("kavi-cgroup-sweep".into())
                .spawn(sweep_orphans);
        });
        let name = next_name();
        let memory = limits
            .memory_mib
            .map_or("max".to_owned(), |m| (m << 20).to_string());
        let pids = limits.processes.map_or("max".to_owned(), |p| p.to_string());
        let (folders, settings): (Vec<PathBuf>, Vec<(usize, &str, String)>) = match cgroup_support()
        {
            CgroupSupport::V2(root) => (
                vec![root.join(&name)],
                vec![
                    (0, "memory.max", memory),
                    (0, "memory.swap.max", "0".to_owned()),
                    (0, "pids.max", pids),
                ],
            ),
            CgroupSupport::V1 {
                memory: m,
                pids: p,
                cpuacct,
            } => (
                [m.join(&name), p.join(&name)]
                    .into_iter()
                    .chain(cpuacct.as_ref().map(|c| c.join(&name)))
                    .collect(),
                vec![
                    (
                        0,
                        "memory.limit_in_bytes",
                        if memory == "max" { "-1".into() } else { memory },
                    ),
                    (1, "pids.max", pids),
                ],
            ),
            CgroupSupport::None(_) => return Ok(None),
        };
        let cgroup = Cgroup {
            folders: Vec::new(),
            limits: *limits,
        };
        let mut cgroup = cgroup;
        for folder in &folders {
            fs::create_dir(folder)?;
            cgroup.folders.push(folder.clone());
        }
        for (index, file, value) in settings {
            let path = folders[index].join(file);
            // memory.swap.max is absent where swap accounting is off: nothing to bound then.
            if file == "memory.swap.max" && !path.exists() {
                continue;
            }
            fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .and_then(|mut f| f.write_all(value.as_bytes()))
                .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        }
        let procs = folders
            .iter()
            .map(|folder| {
                fs::OpenOptions::new()
                    .write(true)
                    .custom_flags(libc::O_CLOEXEC)
                    .open(folder.join("cgroup.procs"))
                    .map(OwnedFd::from)
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(Some((cgroup, procs)))
    }

    /// The cgroup's folders, one a hierarchy.
    pub fn folders(&self) -> &[PathBuf] {
        &self.folders
    }

    /// Kills every process still in the cgroup, whatever session or process group it moved
    /// to, and waits (a second at most) until none is listed. The namespace's end kills them
    /// too; this does not rely on its init, which runs as the program's user.
    pub fn kill_all(&self) {
        for _ in 0..500 {
            let listed: Vec<i32> = self
                .folders
                .iter()
                .filter_map(|folder| fs::read_to_string(folder.join("cgroup.procs")).ok())
                .flat_map(|procs| {
                    procs
                        .lines()
                        .filter_map(|line| line.trim().parse().ok())
                        .collect::<Vec<i32>>()
                })
                .collect();
            if listed.is_empty() {
                return;
            }
            for pid in listed {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }

    /// The bound the tree hit, if it hit one, read from the cgroup's event counters.
    pub fn exceeded(&self) -> Option<String> {
        let count = |file: &Path, key: &str| -> u64 {
            fs::read_to_string(file)
                .unwrap_or_default()
                .lines()
                .find_map(|line| {
                    let (k, v) = line.split_once(' ')?;
                    (k == key).then(|| v.trim().parse().ok())?
                })
                .unwrap_or(0)
        };
        for folder in &self.folders {
            let oom = count(&folder.join("memory.events"), "oom_kill")
                + count(&folder.join("memory.oom_control"), "oom_kill");
            if oom > 0
                && let Some(mib) = self.limits.memory_mib
            {
                return Some(format!("its memory bound ({mib} MiB)"));
            }
            if count(&folder.join("pids.events"), "max") > 0
                && let Some(processes) = self.limits.processes
            {
                return Some(format!("its process bound ({processes} processes)"));
            }
        }
        None
    }
}

use std::os::unix::fs::OpenOptionsExt;

impl Drop for Cgroup {
    fn drop(&mut self) {
        // The tree dies with its namespace's init; the kernel may take a moment to empty it.
        for folder in &self.folders {
            for _ in 0..200 {
                if fs::remove_dir(folder).is_ok() || !folder.exists() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        }
    }
}

/// The rlimits the child sets before it execs: `(resource, value)`.
pub fn rlimits(limits: &Limits, memory_by_cgroup: bool) -> Vec<(libc::__rlimit_resource_t, u64)> {
    let mut set = vec![(libc::RLIMIT_CORE, 0)];
    if let Some(seconds) = limits.cpu_seconds {
        set.push((libc::RLIMIT_CPU, seconds));
    }
    if let Some(files) = limits.open_files {
        set.push((libc::RLIMIT_NOFILE, files));
    }
    if let Some(mib) = limits.file_size_mib {
        set.push((libc::RLIMIT_FSIZE, mib << 20));
    }
    if !memory_by_cgroup && let Some(mib) = limits.memory_mib {
        set.push((libc::RLIMIT_AS, mib << 20));
    }
    set
}

/// The bound a process killed by `signal` hit, for the ones the kernel signals.
pub fn exceeded_by_signal(signal: i32, limits: &Limits) -> Option<String> {
    match signal {
        libc::SIGXCPU => limits.cpu_seconds.map(|s| format!("its CPU bound ({s} s)")),
        libc::SIGXFSZ => limits
            .file_size_mib
            .map(|m| format!("its file size bound ({m} MiB)")),
        _ => None,
    }
}

/// What one file costs the filesystem at least, whatever it holds: its inode and its entry.
/// Counted so, 300,000 empty files (no blocks at all) are over a disk bound, not a way around it
/// to the host's inodes.
const LEAST_PER_ENTRY: u64 = 4096;

/// The disk the files under `paths` take (allocated blocks, so a sparse file counts for what it
/// holds, and at least [`LEAST_PER_ENTRY`] each), not following links; `None` when part of them
/// cannot be measured (a folder nested
/// past the longest path, say), which the caller takes as past any bound: what cannot be
/// counted cannot be shown to be within it.
pub fn disk_used(paths: &[std::path::PathBuf]) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    let mut used = 0;
    for entry in paths
        .iter()
        .flat_map(|path| walkdir::WalkDir::new(path).follow_links(false))
    {
        let gone = |e: &walkdir::Error| {
            e.io_error()
                .is_some_and(|e| e.kind() == std::io::ErrorKind::NotFound)
        };
        match entry.and_then(|entry| entry.metadata()) {
            Ok(metadata) => used += (metadata.blocks() * 512).max(LEAST_PER_ENTRY),
            // Gone between listing and reading (a test's temporary file): nothing to count.
            Err(e) if gone(&e) => {}
            Err(_) => return None,
        }
    }
    Some(used)
}

/// The disk that files no folder names any more (removed, or made nameless with `O_TMPFILE`)
/// take while the processes `pids` keep them open or mapped, where they were in one of `paths`.
/// The walk of [`disk_used`] cannot see them, yet their blocks stay on the disk until the last
/// holder ends: a process could hold many times its bound that way. Each file is counted once.
/// `None` when one cannot be measured (a process's descriptors or mappings that cannot be read,
/// a mapped file whose size cannot be read), which the caller takes as past any bound. Not
/// seen: a descriptor in flight on a socket (sent, and closed by its sender); what it holds is
/// bounded by `open_files` times `file_size_mib`.
pub fn unlinked_held(pids: &[i32], paths: &[PathBuf]) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    // The process may have ended meanwhile: what it held is gone with it.
    let ended = |e: &std::io::Error| {
        e.kind() == std::io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH)
    };
    // Where the file was, as the kernel names it: `/scope/file (deleted)`.
    let removed_in_scope = |named: &str| {
        named
            .strip_suffix(" (deleted)")
            .is_some_and(|was| paths.iter().any(|path| Path::new(was).starts_with(path)))
    };
    let mut held: std::collections::HashMap<(u64, u64), u64> = std::collections::HashMap::new();
    let mut count = |file: &fs::Metadata| {
        let entry = held.entry((file.dev(), file.ino())).or_default();
        *entry = (*entry).max(file.blocks() * 512);
    };
    for pid in pids {
        // Every thread of it, each by its own `/proc/TID`: a leader that ended with `exit(2)`
        // leaves its threads running with everything the process holds while its own `fd` and
        // `maps` show nothing, and a thread made without `CLONE_FILES` has a table of its own.
        let threads = match fs::read_dir(format!("/proc/{pid}/task")) {
            Ok(threads) => threads,
            Err(e) if ended(&e) => continue,
            Err(_) => return None,
        };
        let mut mapped = false;
        for thread in threads {
            let tid = match thread {
                Ok(thread) => thread.file_name(),
                Err(e) if ended(&e) => continue,
                Err(_) => return None,
            };
            let base = Path::new("/proc").join(tid);
            let fds = match fs::read_dir(base.join("fd")) {
                Ok(fds) => fds,
                Err(e) if ended(&e) => continue,
                Err(_) => return None,
            };
            for fd in fds {
                let link = match fd {
                    Ok(fd) => fd.path(),
                    Err(e) if ended(&e) => continue,
                    Err(_) => return None,
                };
                match fs::read_link(&link) {
                    Ok(target) if removed_in_scope(&target.to_string_lossy()) => {
                        match fs::metadata(&link) {
                            Ok(file) => count(&file),
                            Err(e) if ended(&e) => {}
                            Err(_) => return None,
                        }
                    }
                    Ok(_) => {}
                    Err(e) if ended(&e) => {}
                    Err(_) => return None,
                }
            }
            // The threads share one memory: the first that shows it will do.
            if mapped {
                continue;
            }
            let maps = match fs::read_to_string(base.join("maps")) {
                Ok(maps) => maps,
                Err(e) if ended(&e) => continue,
                Err(_) => return None,
            };
            mapped = !maps.is_empty();
            for line in maps.lines() {
                // `start-end perms offset major:minor inode path`: the path is the sixth field on.
                let fields: Vec<&str> = line.splitn(6, ' ').collect();
                let (Some(range), Some(named)) = (fields.first(), fields.get(5)) else {
                    continue;
                };
                if !removed_in_scope(named.trim_start()) {
                    continue;
                }
                // `map_files` names the range without `maps`' zero padding.
                let bounds: Option<Vec<u64>> = range
                    .split('-')
                    .map(|bound| u64::from_str_radix(bound, 16).ok())
                    .collect();
                let Some([start, end]) = bounds.as_deref() else {
                    return None;
                };
                match fs::metadata(base.join(format!("map_files/{start:x}-{end:x}"))) {
                    Ok(file) => count(&file),
                    Err(e) if ended(&e) => {}
                    // Its size is unknown (looking needs privileges kavi may not have), and a
                    // page mapped of a file of any size holds all of it.
                    Err(_) => return None,
                }
            }
        }
    }
    Some(held.values().sum())
}

/// The CPU seconds a cgroup's whole tree has used, where one of its `folders` counts them
/// (v1's `cpuacct`, v2's `cpu.stat`).
pub fn cpu_seconds(folders: &[PathBuf]) -> Option<f64> {
    folders.iter().find_map(|folder| {
        if let Ok(ns) = fs::read_to_string(folder.join("cpuacct.usage")) {
            return ns.trim().parse::<f64>().ok().map(|ns| ns / 1e9);
        }
        let stat = fs::read_to_string(folder.join("cpu.stat")).ok()?;
        stat.lines().find_map(|line| {
            let usec = line.strip_prefix("usage_usec ")?;
            usec.trim().parse::<f64>().ok().map(|us| us / 1e6)
        })
    })
}
