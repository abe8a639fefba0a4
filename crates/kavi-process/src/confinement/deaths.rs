//! Every process of a confined tree that seccomp killed, whoever reaps it.
//!
//! seccomp kills the process that makes a forbidden call, and its exit status goes to its
//! parent. When that process is the program, kavi is the parent and sees it. When it is a
//! process the program started, only the program sees it, and may say nothing
//! (`sh -c 'forbidden; true'` exits 0): an attacker could try call after call in children and
//! never be reported. The kernel's process events (the proc connector, a netlink socket told of
//! every fork and exit on the machine, with the exit's status, as `forkstat` reads them) show
//! kavi each exit in the tree instead. Only a process in the first user and PID namespaces may
//! listen (on older kernels, only one with CAP_NET_ADMIN); elsewhere only the program's
//! own death is seen, and the ledger's record of the confinement says which applies.
//!
//! One socket and one thread serve the whole kavi process. kavi listens only while a confined
//! tree runs, so the machine's forks are not reported to it otherwise.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use nix::libc;

// From linux/connector.h and linux/cn_proc.h.
const CN_IDX_PROC: u32 = 1;
const CN_VAL_PROC: u32 = 1;
const PROC_CN_MCAST_LISTEN: u32 = 1;
const PROC_CN_MCAST_IGNORE: u32 = 2;
const PROC_EVENT_NONE: u32 = 0;
const PROC_EVENT_FORK: u32 = 1;
const PROC_EVENT_EXIT: u32 = 0x8000_0000;
/// `struct nlmsghdr`, `struct cn_msg` and the head of `struct proc_event`, in bytes.
const NLMSG_HEADER: usize = 16;
const CN_MSG_HEADER: usize = 20;
const EVENT_HEADER: usize = 16;
/// The inode numbers of the first PID and user namespaces (linux/proc_ns.h): the kernel reports
/// process events only to a listener in both, and to any other says nothing at all.
const INIT_PID_NAMESPACE: u64 = 0xEFFF_FFFC;
const INIT_USER_NAMESPACE: u64 = 0xEFFF_FFFD;
/// How long the first listen waits for the kernel's answer, and a tree's end for its last
/// events (read at once, unless the machine is so loaded that the reader is seconds behind).
const ANSWER: Duration = Duration::from_millis(500);
const LAST_EVENT: Duration = Duration::from_secs(2);
/// How many of kavi's own ended children are remembered (a root is tracked microseconds after
/// its spawn; these are only for a root that ended even sooner).
const ENDED_CHILDREN_KEPT: usize = 4096;
/// How long a fork outside every tree is kept for a root to adopt: a root adopts only what
/// was forked after its watch began, so older ones only take room.
const ADOPTABLE_NANOS: u64 = 10_000_000_000;

/// The machine's process events, as this kavi listens to them.
pub struct Deaths {
    socket: OwnedFd,
    state: Mutex<State>,
    ended: Condvar,
}

#[derive(Default)]
struct State {
    /// Trees being watched (each a launch's outer process), with what was seen of each.
    trees: HashMap<u32, Tree>,
    /// How many launches listen now: the kernel is told to stop when none does.
    listening: usize,
    /// The reader stopped on an error: no event comes any more.
    stopped: bool,
    /// The kernel was told to report (and not told to stop since).
    kernel_listening: bool,
    /// How many times the reader found events dropped: a watch begun before a drop and
    /// tracked after it missed what was dropped.
    overflows: u64,
    /// Processes forked into a tree: process → its tree's root, and how many of its threads
    /// have not ended. A process is a member until its last thread's end is read: its first
    /// thread may end before the others, which may still fork or make a forbidden call.
    members: HashMap<u32, Member>,
    /// Processes forked outside every tree while kavi listened, still alive: process → its
    /// parent and when it was forked. A root is watched once it is spawned; whatever it
    /// forked before that is found here.
    others: HashMap<u32, Other>,
    /// kavi's own children that ended while it listened, and when: a root that ended before
    /// it was watched is found here.
    ended_children: HashMap<u32, u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Other {
    parent: u32,
    /// The kernel's monotonic clock at the fork, in nanoseconds.
    at: u64,
}

/// The monotonic clock the kernel stamps its events with (`ktime_get_ns`), in nanoseconds.
fn monotonic_nanos() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).map_or(0, |t| {
        (t.tv_sec() as u64)
            .saturating_mul(1_000_000_000)
            .saturating_add(t.tv_nsec() as u64)
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Member {
    root: u32,
    threads: u32,
}

impl Member {
    fn of(root: u32) -> Self {
        Member { root, threads: 1 }
    }
}

#[derive(Default, Debug, Clone, Copy, PartialEq, Eq)]
struct Tree {
    /// A process of the tree seccomp killed (the first seen).
    killed: Option<u32>,
    /// The root's exit was read. Its processes' own ends may still be on their way: the
    /// kernel reports a process's end after its parent may already have reaped it.
    ended: bool,
    /// Events were lost while it ran (the socket's buffer overflowed).
    lost: bool,
}

/// What was seen of one tree once it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// No process of it was killed by seccomp.
    Clean,
    /// This process of it was (a global pid).
    Killed(u32),
    /// Events were lost while it ran: the reader fell behind the machine's process events (as
    /// a flood of them makes it), so a kill may have been missed.
    Lost,
    /// The root's exit was not read in time: what came before it may not have been either.
    Unfinished,
}

/// Whether kavi can see every death in a confined tree here, and why not where it cannot.
pub fn availability() -> Result<(), &'static str> {
    deaths().map(|_| ())
}

/// The process events, listened to from the first time they are asked for.
fn deaths() -> Result<&'static Arc<Deaths>, &'static str> {
    static DEATHS: OnceLock<Result<Arc<Deaths>, String>> = OnceLock::new();
    DEATHS
        .get_or_init(|| Deaths::start().map_err(|why| why.to_string()))
        .as_ref()
        .map_err(String::as_str)
}

/// Starts watching for a tree about to be spawned; `None` where the events cannot be had.
/// The kernel reports from the moment this returns, so the root's first fork is seen.
/// The kinds of events kavi listens to, where the kernel lets a listener choose (Linux 6.6 and
/// later; an older one ignores a listen that names kinds, so none is named there): forks and
/// exits only. Every other kind (a process renaming itself, `prctl(PR_SET_NAME)`, costs a
/// process a microsecond and no fork) would be a cheap way to flood the socket, by the tree
/// or by any process of the machine, and lost events stop a tree.
fn filter() -> Option<u32> {
    static NAMES_KINDS: OnceLock<bool> = OnceLock::new();
    let names_kinds = *NAMES_KINDS.get_or_init(|| {
        // SAFETY: uname fills the struct it is given.
        let mut name: libc::utsname = unsafe { std::mem::zeroed() };
        if unsafe { libc::uname(&mut name) } != 0 {
            return false;
        }
        // SAFETY: the kernel's release is a NUL-terminated string.
        let release = unsafe { std::ffi::CStr::from_ptr(name.release.as_ptr()) };
        kernel_at_least(&release.to_string_lossy(), (6, 6))
    });
    names_kinds.then_some(PROC_EVENT_FORK | PROC_EVENT_EXIT)
}

/// Whether a kernel release (`6.18.44-fc`) is `at_least` (major, minor).
fn kernel_at_least(release: &str, at_least: (u32, u32)) -> bool {
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|part| part.parse::<u32>().unwrap_or(0));
    let major = parts.next().unwrap_or(0);
    let minor = parts.next().unwrap_or(0);
    (major, minor) >= at_least
}

/// Where the events can be had but this watch cannot get them (the kernel refused to listen
/// again, or the reader stopped), the tree is taken as one whose events were lost: kavi
/// says it sees every death, so a tree it cannot see is stopped, not run unseen.
pub fn watch() -> Option<Watch> {
    let deaths = deaths().ok()?;
    let mut state = deaths.lock();
    let mut blind = state.stopped;
    if !state.kernel_listening && !blind {
        // The last launch stopped listening (or the first try failed): the kernel is told again.
        match deaths.send(PROC_CN_MCAST_LISTEN, filter(), 0) {
            Ok(()) => state.kernel_listening = true,
            Err(e) => {
                tracing::warn!("the kernel's process events could not be listened to: {e}");
                blind = true;
            }
        }
    }
    state.listening += 1;
    Some(Watch {
        deaths: Arc::clone(deaths),
        root: None,
        blind,
        since: monotonic_nanos(),
        overflows: state.overflows,
    })
}

/// One launch's watch: from before its spawn until it is dropped.
pub struct Watch {
    deaths: Arc<Deaths>,
    root: Option<u32>,
    /// Its events cannot be had: its tree counts as one whose events were lost.
    blind: bool,
    /// When it began (before the spawn), on the kernel's monotonic clock.
    since: u64,
    /// The reader's count of drops when it began.
    overflows: u64,
}

impl Watch {
    /// The spawned process whose tree this watch is of.
    pub fn track(&mut self, root: u32) {
        self.root = Some(root);
        let since = self.since;
        let mut state = self.deaths.lock();
        let tree = Tree {
            lost: self.blind || state.overflows != self.overflows,
            // Ended before now, after this watch began: this root, not an earlier child of
            // kavi's that had its pid.
            ended: state
                .ended_children
                .get(&root)
                .is_some_and(|at| *at >= since),
            killed: None,
        };
        state.trees.insert(root, tree);
        state.others.remove(&root);
        state
            .others
            .retain(|_, other| other.at.saturating_add(ADOPTABLE_NANOS) >= since);
        // What the root forked before now, and what those forked: members since.
        loop {
            let State {
                others, members, ..
            } = &mut *state;
            let joined: Vec<u32> = others
                .iter()
                .filter(|(_, other)| {
                    other.at >= since
                        && (other.parent == root
                            || members.get(&other.parent).is_some_and(|m| m.root == root))
                })
                .map(|(process, _)| *process)
                .collect();
            if joined.is_empty() {
                break;
            }
            for process in joined {
                others.remove(&process);
                members.insert(process, Member::of(root));
            }
        }
    }

    /// What is already known of the tree while it runs: a process of it that seccomp killed
    /// (`Killed`), events lost (`Lost`), or neither (`Clean`).
    pub fn so_far(&self) -> Seen {
        let Some(tree) = self
            .root
            .and_then(|root| self.deaths.lock().trees.get(&root).copied())
        else {
            return Seen::Clean;
        };
        match (tree.killed, tree.lost) {
            (Some(process), _) => Seen::Killed(process),
            (None, true) => Seen::Lost,
            (None, false) => Seen::Clean,
        }
    }

    /// What was seen of the tree, once its root has exited (and been reaped): waits until the
    /// root's end and the last end of each of its processes are read. (The kernel reports a
    /// process's end just after its parent may reap it, so the root's may come before some.)
    pub fn seen(&self) -> Seen {
        let Some(root) = self.root else {
            return Seen::Unfinished;
        };
        let deadline = Instant::now() + LAST_EVENT;
        let mut state = self.deaths.lock();
        loop {
            let Some(tree) = state.trees.get(&root).copied() else {
                return Seen::Unfinished;
            };
            if let Some(process) = tree.killed {
                return Seen::Killed(process);
            }
            if tree.lost {
                return Seen::Lost;
            }
            // The root's end read, and the end of every process of the tree.
            if tree.ended && !state.members.values().any(|m| m.root == root) {
                return Seen::Clean;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Seen::Unfinished;
            }
            state = self
                .deaths
                .ended
                .wait_timeout(state, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let mut state = self.deaths.lock();
        if let Some(root) = self.root {
            state.trees.remove(&root);
            state.members.retain(|_, member| member.root != root);
        }
        state.listening = state.listening.saturating_sub(1);
        if state.listening == 0 {
            if state.kernel_listening {
                let _ = self.deaths.send(PROC_CN_MCAST_IGNORE, None, 0);
                state.kernel_listening = false;
            }
            state.members.clear();
            state.others.clear();
            state.ended_children.clear();
        }
    }
}

impl Deaths {
    /// Opens the socket, listens once to learn whether the kernel lets kavi, and starts the
    /// thread that reads the events.
    fn start() -> Result<Arc<Deaths>, String> {
        let namespace = |name: &str| {
            std::fs::metadata(format!("/proc/self/ns/{name}")).map_or(0, |m| {
                use std::os::unix::fs::MetadataExt;
                m.ino()
            })
        };
        if namespace("pid") != INIT_PID_NAMESPACE || namespace("user") != INIT_USER_NAMESPACE {
            return Err(
                "kavi runs in a PID or user namespace of its own, where the kernel \
                        reports no process events"
                    .to_owned(),
            );
        }
        let socket = open().map_err(|e| format!("the kernel's process events: {e}"))?;
        let deaths = Deaths {
            socket,
            state: Mutex::default(),
            ended: Condvar::new(),
        };
        // Unfiltered: the kernel's answer is an event of no kind, which a filter would drop. It
        // carries the listen's own number back (+1), so another listener's answer is not taken
        // for it.
        let nonce = std::process::id() | 1 << 31;
        let listened = deaths
            .send(PROC_CN_MCAST_LISTEN, None, nonce)
            .and_then(|()| deaths.answer(nonce));
        let stopped = deaths.send(PROC_CN_MCAST_IGNORE, None, 0);
        listened
            .and(stopped)
            .map_err(|e| format!("the kernel's process events: {e}"))?;
        let deaths = Arc::new(deaths);
        let reader = Arc::clone(&deaths);
        std::thread::Builder::new()
            .name("kavi-process-events".into())
            .spawn(move || reader.read())
            .map_err(|e| format!("the kernel's process events: {e}"))?;
        Ok(deaths)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Tells the kernel to report (`PROC_CN_MCAST_LISTEN`) or to stop (`..._IGNORE`), of
    /// every kind of event, or only of `only` (a mask of `PROC_EVENT_*`); `nonce` is the
    /// message's number, which the kernel's answer carries back plus one.
    fn send(&self, op: u32, only: Option<u32>, nonce: u32) -> io::Result<()> {
        let data = if only.is_some() { 8 } else { 4 };
        let mut message = Vec::with_capacity(NLMSG_HEADER + CN_MSG_HEADER + data);
        let length = (NLMSG_HEADER + CN_MSG_HEADER + data) as u32;
        message.extend(length.to_ne_bytes());
        message.extend((libc::NLMSG_DONE as u16).to_ne_bytes());
        message.extend(0u16.to_ne_bytes()); // flags
        message.extend(0u32.to_ne_bytes()); // sequence
        message.extend(std::process::id().to_ne_bytes());
        message.extend(CN_IDX_PROC.to_ne_bytes());
        message.extend(CN_VAL_PROC.to_ne_bytes());
        message.extend(nonce.to_ne_bytes()); // sequence
        message.extend(nonce.to_ne_bytes()); // acknowledgement
        message.extend((data as u16).to_ne_bytes()); // length of what follows
        message.extend(0u16.to_ne_bytes()); // flags
        message.extend(op.to_ne_bytes());
        if let Some(kinds) = only {
            message.extend(kinds.to_ne_bytes());
        }
        // SAFETY: the socket is open; the buffer is valid for its length.
        let sent = unsafe {
            libc::send(
                self.socket.as_raw_fd(),
                message.as_ptr().cast(),
                message.len(),
                0,
            )
        };
        if sent < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Waits for the kernel's answer to the first listen (the one whose acknowledgement is
    /// `nonce + 1`): an error where kavi may not.
    fn answer(&self, nonce: u32) -> io::Result<()> {
        let deadline = Instant::now() + ANSWER;
        let mut buffer = vec![0u8; 8192];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the kernel did not answer",
                ));
            }
            let mut poll = libc::pollfd {
                fd: self.socket.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            if unsafe { libc::poll(&mut poll, 1, left.as_millis().max(1) as i32) } <= 0 {
                continue;
            }
            let got = match self.receive(&mut buffer) {
                Ok(got) => got,
                // Other events filled the buffer: the answer comes after them.
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => continue,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            for event in events(&buffer[..got]) {
                if let Event::Answer { error, ack } = event
                    && ack == nonce.wrapping_add(1)
                {
                    return match error {
                        0 => Ok(()),
                        errno => Err(io::Error::from_raw_os_error(errno as i32)),
                    };
                }
            }
        }
    }

    fn receive(&self, buffer: &mut [u8]) -> io::Result<usize> {
        // SAFETY: the socket is open; the buffer is valid for its length.
        let got = unsafe {
            libc::recv(
                self.socket.as_raw_fd(),
                buffer.as_mut_ptr().cast(),
                buffer.len(),
                0,
            )
        };
        if got < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(got as usize)
    }

    /// The reading thread: every event, for as long as kavi runs.
    fn read(&self) {
        let mut buffer = vec![0u8; 64 * 1024];
        loop {
            match self.receive(&mut buffer) {
                Ok(got) => {
                    let mut state = self.lock();
                    let mut ended = false;
                    for event in events(&buffer[..got]) {
                        ended |= state.apply(event);
                    }
                    drop(state);
                    if ended {
                        self.ended.notify_all();
                    }
                }
                // The buffer overflowed: what the trees running now did is not all known.
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                    let mut state = self.lock();
                    state.overflows += 1;
                    for tree in state.trees.values_mut() {
                        tree.lost = true;
                    }
                    drop(state);
                    self.ended.notify_all();
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    tracing::warn!("the kernel's process events stopped: {e}");
                    let mut state = self.lock();
                    state.stopped = true;
                    for tree in state.trees.values_mut() {
                        tree.lost = true;
                    }
                    drop(state);
                    self.ended.notify_all();
                    return;
                }
            }
        }
    }
}

/// A netlink connector socket bound to the process events' group, with room for bursts.
fn open() -> io::Result<OwnedFd> {
    // SAFETY: plain socket calls on a descriptor owned from its creation.
    unsafe {
        let fd = libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            libc::NETLINK_CONNECTOR,
        );
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let socket = OwnedFd::from_raw_fd(fd);
        let mut address: libc::sockaddr_nl = std::mem::zeroed();
        address.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        address.nl_groups = CN_IDX_PROC;
        if libc::bind(
            fd,
            (&raw const address).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        ) < 0
        {
            return Err(io::Error::last_os_error());
        }
        // A machine forking fast fills the default buffer between two reads; root may go past
        // the system's maximum.
        let size: libc::c_int = 8 << 20;
        for option in [libc::SO_RCVBUFFORCE, libc::SO_RCVBUF] {
            if libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                option,
                (&raw const size).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            ) == 0
            {
                break;
            }
        }
        Ok(socket)
    }
}

/// One process event, as far as kavi reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Event {
    /// The kernel's answer to a listen: 0, or the errno it refused with; `ack` is the
    /// listen's number plus one.
    Answer { error: u32, ack: u32 },
    /// A process (`thread`: a thread of `child`, an existing process) was made by `parent`.
    Fork {
        parent: u32,
        child: u32,
        thread: bool,
        /// The kernel's monotonic clock at the event, in nanoseconds.
        at: u64,
    },
    /// A thread of `process` ended (`leader`: its first thread, whose id the process has),
    /// with its wait status, while `parent` was the process's parent (0 where the kernel does
    /// not say). A process seccomp kills ends every thread with SIGSYS, whichever made the
    /// call, also when its first thread had ended before.
    Exit {
        process: u32,
        leader: bool,
        status: u32,
        parent: u32,
        at: u64,
    },
}

impl State {
    /// Takes one event in; true when it may have completed a watched tree (its root's end, or
    /// the last end of one of its processes).
    fn apply(&mut self, event: Event) -> bool {
        if self.listening == 0 {
            return false;
        }
        match event {
            Event::Answer { .. } => false,
            Event::Fork {
                child,
                thread: true,
                ..
            } => {
                if let Some(member) = self.members.get_mut(&child) {
                    member.threads += 1;
                }
                false
            }
            // A root's own fork, read after it was tracked.
            Event::Fork { child, .. } if self.trees.contains_key(&child) => false,
            Event::Fork {
                parent, child, at, ..
            } => {
                let root = if self.trees.contains_key(&parent) {
                    Some(parent)
                } else {
                    self.members.get(&parent).map(|m| m.root)
                };
                match root {
                    Some(root) => {
                        self.members.insert(child, Member::of(root));
                    }
                    None => {
                        self.others.insert(child, Other { parent, at });
                    }
                }
                false
            }
            Event::Exit {
                process,
                leader,
                status,
                parent,
                at,
            } => {
                if leader && let Some(tree) = self.trees.get_mut(&process) {
                    tree.ended = true;
                    self.others.remove(&process);
                    return true;
                }
                if status & 0x7f == libc::SIGSYS as u32 {
                    // The process, or else its parent (a process of the tree, or the
                    // namespace's init an orphan is reparented to), says which tree.
                    let root = self
                        .members
                        .get(&process)
                        .or_else(|| self.members.get(&parent))
                        .map(|m| m.root)
                        .or_else(|| self.trees.contains_key(&parent).then_some(parent));
                    if let Some(tree) = root.and_then(|root| self.trees.get_mut(&root)) {
                        tree.killed.get_or_insert(process);
                    }
                }
                if leader
                    && let Some(other) = self.others.remove(&process)
                    && other.parent == std::process::id()
                {
                    // One of kavi's own children, perhaps a root not tracked yet.
                    if self.ended_children.len() >= ENDED_CHILDREN_KEPT {
                        self.ended_children.clear();
                    }
                    self.ended_children.insert(process, at);
                }
                // Its last thread gone, a process can fork and call no more. (A thread that
                // execs takes the first thread's place without an end of its own.)
                if let Some(member) = self.members.get_mut(&process) {
                    member.threads = member.threads.saturating_sub(1);
                    if member.threads == 0 {
                        self.members.remove(&process);
                        return true;
                    }
                }
                false
            }
        }
    }
}

/// The events in one datagram of the connector.
fn events(mut bytes: &[u8]) -> Vec<Event> {
    let u32_at = |bytes: &[u8], at: usize| -> Option<u32> {
        Some(u32::from_ne_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
    };
    let mut found = Vec::new();
    while let Some(length) = u32_at(bytes, 0).map(|l| l as usize) {
        if length < NLMSG_HEADER || length > bytes.len() {
            break;
        }
        let message = &bytes[..length];
        let event = NLMSG_HEADER + CN_MSG_HEADER;
        let is_proc = u32_at(message, NLMSG_HEADER) == Some(CN_IDX_PROC)
            && u32_at(message, NLMSG_HEADER + 4) == Some(CN_VAL_PROC);
        let data = event + EVENT_HEADER;
        let field = |index: usize| u32_at(message, data + 4 * index);
        let at = message
            .get(event + 8..event + 16)
            .and_then(|bytes| bytes.try_into().ok())
            .map_or(0, u64::from_ne_bytes);
        if is_proc {
            let parsed = match u32_at(message, event) {
                // The acknowledgement is `struct cn_msg`'s fourth field.
                Some(PROC_EVENT_NONE) => field(0).map(|error| Event::Answer {
                    error,
                    ack: u32_at(message, NLMSG_HEADER + 12).unwrap_or(0),
                }),
                // parent_pid, parent_tgid, child_pid, child_tgid: a new thread has an id of
                // its own in an existing process.
                Some(PROC_EVENT_FORK) => match (field(1), field(2), field(3)) {
                    (Some(parent), Some(pid), Some(child)) => Some(Event::Fork {
                        parent,
                        child,
                        thread: pid != child,
                        at,
                    }),
                    _ => None,
                },
                // process_pid, process_tgid, exit_code, exit_signal, parent_pid, parent_tgid
                // (the parent only on newer kernels).
                Some(PROC_EVENT_EXIT) => match (field(0), field(1), field(2)) {
                    (Some(pid), Some(process), Some(status)) => Some(Event::Exit {
                        process,
                        leader: pid == process,
                        status,
                        parent: field(5).unwrap_or(0),
                        at,
                    }),
                    _ => None,
                },
                _ => None,
            };
            found.extend(parsed);
        }
        // Messages are aligned to 4 bytes.
        let next = (length + 3) & !3;
        bytes = bytes.get(next..).unwrap_or_default();
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tracked(root: u32) -> State {
        let mut state = State {
            listening: 1,
            ..State::default()
        };
        state.trees.insert(root, Tree::default());
        state
    }

    /// A new process.
    fn fork(parent: u32, child: u32) -> Event {
        Event::Fork {
            parent,
            child,
            thread: false,
            at: 1,
        }
    }

    /// A process's first thread ending, with its wait status.
    fn exit(process: u32, status: u32) -> Event {
        Event::Exit {
            process,
            leader: true,
            status,
            parent: 0,
            at: 1,
        }
    }

    const SIGSYS: u32 = libc::SIGSYS as u32;

    /// A kill by seccomp two forks below the root counts for the root's tree, one outside it
    /// does not, and a plain exit is no kill.
    #[test]
    fn a_kill_anywhere_below_the_root_is_the_trees() {
        let mut state = tracked(10);
        for (parent, child) in [(10, 11), (11, 12), (1, 50)] {
            state.apply(fork(parent, child));
        }
        state.apply(exit(50, SIGSYS));
        state.apply(exit(11, 0));
        assert_eq!(state.trees[&10].killed, None);
        // The core-dump flag (0x80) may be set with the signal.
        state.apply(exit(12, 0x80 | SIGSYS));
        assert!(state.apply(exit(10, 0)));
        assert_eq!(
            state.trees[&10],
            Tree {
                killed: Some(12),
                ended: true,
                lost: false
            }
        );
        assert!(state.others.is_empty());
    }

    /// A second thread of `process`.
    fn thread(process: u32) -> Event {
        Event::Fork {
            parent: process,
            child: process,
            thread: true,
            at: 1,
        }
    }

    /// A process whose first thread ended (`pthread_exit` in `main`) and whose other thread
    /// then makes the forbidden call is still the tree's, and so is what it forks after; a
    /// process kavi never saw forked is placed by its parent.
    #[test]
    fn a_kill_after_the_first_thread_ended_is_still_seen() {
        let mut state = tracked(10);
        state.apply(fork(10, 11));
        state.apply(thread(11));
        state.apply(exit(11, 0));
        state.apply(Event::Exit {
            process: 11,
            leader: false,
            status: SIGSYS,
            parent: 10,
            at: 1,
        });
        assert_eq!(state.trees[&10].killed, Some(11));

        let mut state = tracked(10);
        state.apply(fork(10, 11));
        state.apply(thread(11));
        state.apply(exit(11, 0));
        state.apply(fork(11, 12));
        state.apply(exit(12, SIGSYS));
        assert_eq!(state.trees[&10].killed, Some(12));

        let mut state = tracked(10);
        state.apply(Event::Exit {
            process: 99,
            leader: true,
            status: SIGSYS,
            parent: 10,
            at: 1,
        });
        assert_eq!(state.trees[&10].killed, Some(99));
    }

    /// A process stays a member until its last thread's end is read, however many processes
    /// the tree has made and however late the reader is: membership follows the events, not
    /// what `/proc` shows when they are read.
    #[test]
    fn a_process_is_a_member_until_its_last_thread_ends() {
        let mut state = tracked(10);
        state.apply(fork(10, 11));
        state.apply(fork(11, 12));
        for child in 1000..6000 {
            state.apply(fork(11, child));
            state.apply(exit(child, 0));
        }
        assert_eq!(state.members.len(), 2);
        state.apply(exit(12, SIGSYS));
        assert_eq!(state.trees[&10].killed, Some(12));
        state.apply(thread(11));
        state.apply(exit(11, 0));
        assert!(state.members.contains_key(&11));
        state.apply(Event::Exit {
            process: 11,
            leader: false,
            status: 0,
            parent: 10,
            at: 1,
        });
        assert!(state.members.is_empty());
    }

    #[test]
    fn kernel_releases_are_compared_by_major_and_minor() {
        assert!(kernel_at_least("6.18.44-fc-v669", (6, 6)));
        assert!(kernel_at_least("6.6.0", (6, 6)));
        assert!(!kernel_at_least("6.1.0-28-amd64", (6, 6)));
        assert!(!kernel_at_least("5.15.0", (6, 6)));
        assert!(kernel_at_least("10.0", (6, 6)));
        assert!(!kernel_at_least("", (6, 6)));
    }

    /// The datagram the kernel sends for a fork and an exit is read field by field.
    #[test]
    fn the_kernels_events_are_read_as_laid_out() {
        let message = |what: u32, fields: &[u32]| {
            let mut body = Vec::new();
            body.extend(CN_IDX_PROC.to_ne_bytes());
            body.extend(CN_VAL_PROC.to_ne_bytes());
            body.extend([0u8; 8]);
            body.extend(((EVENT_HEADER + 4 * fields.len()) as u16).to_ne_bytes());
            body.extend([0u8; 2]);
            body.extend(what.to_ne_bytes());
            body.extend([0u8; 12]);
            for field in fields {
                body.extend(field.to_ne_bytes());
            }
            let mut message = ((NLMSG_HEADER + body.len()) as u32).to_ne_bytes().to_vec();
            message.extend([0u8; 12]);
            message.extend(body);
            message
        };
        let mut datagram = message(PROC_EVENT_FORK, &[7, 7, 9, 9]);
        datagram.extend(message(PROC_EVENT_FORK, &[7, 7, 10, 9])); // a thread
        datagram.extend(message(PROC_EVENT_EXIT, &[9, 9, 31, 17, 7, 7]));
        datagram.extend(message(PROC_EVENT_NONE, &[1]));
        assert_eq!(
            events(&datagram),
            [
                Event::Fork {
                    parent: 7,
                    child: 9,
                    thread: false,
                    at: 0
                },
                Event::Fork {
                    parent: 7,
                    child: 9,
                    thread: true,
                    at: 0
                },
                Event::Exit {
                    process: 9,
                    leader: true,
                    status: 31,
                    parent: 7,
                    at: 0
                },
                Event::Answer { error: 1, ack: 0 }
            ]
        );
        assert_eq!(events(&datagram[..10]), []);
    }

    /// Events lost while a tree runs are what is known of it, then what is seen of it: never
    /// a clean end.
    #[test]
    fn a_tree_whose_events_were_lost_never_ends_clean() {
        let mut state = tracked(10);
        state.listening = 2;
        state.trees.get_mut(&10).unwrap().lost = true;
        state.apply(exit(10, 0));
        let deaths = Arc::new(Deaths {
            socket: OwnedFd::from(std::fs::File::open("/dev/null").unwrap()),
            state: Mutex::new(state),
            ended: Condvar::new(),
        });
        let watch = Watch {
            deaths,
            root: Some(10),
            blind: false,
            since: 0,
            overflows: 0,
        };
        assert_eq!(watch.so_far(), Seen::Lost);
        assert_eq!(watch.seen(), Seen::Lost);
    }

    /// A watch that could not listen takes its tree for one whose events were lost.
    #[test]
    fn a_tree_kavi_could_not_listen_for_is_taken_as_unseen() {
        let deaths = Arc::new(Deaths {
            socket: OwnedFd::from(std::fs::File::open("/dev/null").unwrap()),
            state: Mutex::new(State {
                listening: 2,
                ..State::default()
            }),
            ended: Condvar::new(),
        });
        let mut watch = Watch {
            deaths,
            root: None,
            blind: true,
            since: 0,
            overflows: 0,
        };
        watch.track(10);
        assert_eq!(watch.so_far(), Seen::Lost);
    }

    fn deaths_with(state: State) -> Arc<Deaths> {
        Arc::new(Deaths {
            socket: OwnedFd::from(std::fs::File::open("/dev/null").unwrap()),
            state: Mutex::new(state),
            ended: Condvar::new(),
        })
    }

    /// The kernel reports a process's end after its parent may have reaped it, so the root's
    /// end can be read before a process of its tree: the tree ends when both are read, and a
    /// kill read last still counts.
    #[test]
    fn a_tree_ends_when_its_last_process_end_is_read_not_its_roots() {
        let mut state = tracked(10);
        state.listening = 2;
        state.apply(fork(10, 11));
        state.apply(exit(10, 0));
        let deaths = deaths_with(state);
        let watch = Watch {
            deaths: Arc::clone(&deaths),
            root: Some(10),
            blind: false,
            since: 0,
            overflows: 0,
        };
        let late = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            let ended = deaths.lock().apply(exit(11, SIGSYS));
            assert!(ended);
            deaths.ended.notify_all();
        });
        assert_eq!(watch.seen(), Seen::Killed(11));
        late.join().unwrap();
    }

    /// A root that ended before it was tracked (kavi's thread held up after the spawn) is seen
    /// ended; an earlier child of kavi's with the same pid, ended before the watch began, is not
    /// taken for it, nor are forks from before the watch adopted.
    #[test]
    fn what_happened_before_the_watch_began_is_not_the_trees() {
        let kavi = std::process::id();
        // More than the watches made here hold: dropping them tells the kernel nothing.
        let mut state = State {
            listening: 9,
            ..State::default()
        };
        let at = |at| Event::Fork {
            parent: kavi,
            child: 10,
            thread: false,
            at,
        };
        state.apply(at(5));
        state.apply(Event::Exit {
            process: 10,
            leader: true,
            status: 0,
            parent: kavi,
            at: 6,
        });
        state.apply(Event::Fork {
            parent: 20,
            child: 21,
            thread: false,
            at: 6,
        });
        let deaths = deaths_with(state);
        let watch_from = |since| Watch {
            deaths: Arc::clone(&deaths),
            root: None,
            blind: false,
            since,
            overflows: 0,
        };
        let mut stale = watch_from(7);
        stale.track(10);
        assert!(!deaths.lock().trees[&10].ended);
        drop(stale);
        let mut early = watch_from(4);
        early.track(10);
        assert!(deaths.lock().trees[&10].ended);
        let mut reused = watch_from(7);
        reused.track(20);
        assert!(!deaths.lock().members.contains_key(&21));
    }

    /// What the root forked before it was tracked joins its tree when it is.
    #[test]
    fn forks_read_before_the_root_was_tracked_join_its_tree() {
        // Two: the test holds one, so that dropping the watch tells the kernel nothing.
        let mut state = State {
            listening: 2,
            ..State::default()
        };
        state.apply(fork(1, 10));
        state.apply(fork(10, 11));
        state.apply(fork(11, 12));
        let deaths = Arc::new(Deaths {
            socket: open().unwrap_or_else(|_| {
                // Any descriptor will do: nothing is sent on it here.
                OwnedFd::from(std::fs::File::open("/dev/null").unwrap())
            }),
            state: Mutex::new(state),
            ended: Condvar::new(),
        });
        let mut watch = Watch {
            deaths: Arc::clone(&deaths),
            root: None,
            blind: false,
            since: 0,
            overflows: 0,
        };
        watch.track(10);
        let mut state = deaths.lock();
        assert_eq!(state.members.get(&12), Some(&Member::of(10)));
        assert_eq!(state.members.get(&11), Some(&Member::of(10)));
        assert!(state.others.is_empty());
        state.apply(exit(12, SIGSYS));
        drop(state);
        assert_eq!(watch.so_far(), Seen::Killed(12));
    }
}
