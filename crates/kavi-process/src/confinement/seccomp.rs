//! The seccomp filters a confined process runs under, compiled with `seccompiler` (rust-vmm's
//! compiler, as Firecracker uses) and handed to bubblewrap as BPF programs.
//!
//! Two programs, because a program has one action for everything it matches and the kernel
//! takes the strictest action of all the programs a process runs under:
//! - **kill**: calls no program under review has a reason to make, which only an attack would:
//!   tracing another process, changing mounts, loading BPF or kernel code, rebooting, and the
//!   terminal ioctls that push input into a terminal (TIOCSTI) or drive its console
//!   (TIOCLINUX), and a signal to every process it may signal (`kill -1`). The process dies
//!   with SIGSYS, which kavi reports as a security violation.
//!   Raw and packet sockets and MPTCP are in it, and, for a profile without the network, every
//!   IPv4 and IPv6 socket.
//! - **deny** (EPERM): calls an ordinary program may probe and cope without: the kernel keyring,
//!   performance counters, new namespaces, io_uring (which makes sockets without `socket`), and
//!   every socket family but unix, IPv4 and IPv6. Unix sockets too, but for socket pairs: the
//!   view is read-only, yet `connect` to a host socket file it shows (an agent's, a database's)
//!   needs no write. A profile with the network keeps them for the bridge to kavi's proxy, and
//!   the bridge refuses them to the program it runs (see [`unix_sockets_refused`]).
//!
//! On x86-64 a third, written by hand, kills any call made through the x32 ABI: its numbers are
//! the native ones with bit 30 set, which a filter keyed on the native numbers would let by.

use std::collections::BTreeMap;

use nix::libc;
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

/// The terminal ioctls that inject input or drive the console.
const TIOCSTI: u64 = 0x5412;
const TIOCLINUX: u64 = 0x541C;

/// `IPPROTO_MPTCP`: a TCP-like protocol that Landlock's TCP rules never covered.
const IPPROTO_MPTCP: u64 = 262;

fn arch() -> Result<TargetArch, String> {
    std::env::consts::ARCH.try_into().map_err(|_| {
        format!(
            "seccomp filters are not built for {}",
            std::env::consts::ARCH
        )
    })
}

/// One condition on a system call's argument.
fn arg(index: u8, op: SeccompCmpOp, value: u64) -> Result<SeccompCondition, String> {
    SeccompCondition::new(index, SeccompCmpArgLen::Dword, op, value).map_err(|e| e.to_string())
}

fn rule(conditions: Vec<SeccompCondition>) -> Result<SeccompRule, String> {
    SeccompRule::new(conditions).map_err(|e| e.to_string())
}

fn compile(
    rules: BTreeMap<i64, Vec<SeccompRule>>,
    action: SeccompAction,
) -> Result<Vec<u8>, String> {
    let filter = SeccompFilter::new(rules, SeccompAction::Allow, action, arch()?)
        .map_err(|e| e.to_string())?;
    let program: BpfProgram = filter
        .try_into()
        .map_err(|e: seccompiler::BackendError| e.to_string())?;
    Ok(bytes(&program))
}

/// The program as the kernel reads it: each instruction's 8 bytes in native order.
fn bytes(program: &[seccompiler::sock_filter]) -> Vec<u8> {
    program
        .iter()
        .flat_map(|insn| {
            let mut bytes = Vec::with_capacity(8);
            bytes.extend_from_slice(&insn.code.to_ne_bytes());
            bytes.push(insn.jt);
            bytes.push(insn.jf);
            bytes.extend_from_slice(&insn.k.to_ne_bytes());
            bytes
        })
        .collect()
}

/// The calls that kill the process: made only by an attack. Without the network, that includes
/// opening any IPv4 or IPv6 socket: a process that may not talk to anyone and tries to is
/// trying to get something out.
fn kill_rules(network: bool) -> Result<BTreeMap<i64, Vec<SeccompRule>>, String> {
    let always = [
        libc::SYS_ptrace,
        libc::SYS_process_vm_readv,
        libc::SYS_process_vm_writev,
        libc::SYS_process_madvise,
        libc::SYS_pidfd_getfd,
        libc::SYS_mount,
        libc::SYS_umount2,
        libc::SYS_pivot_root,
        libc::SYS_move_mount,
        libc::SYS_open_tree,
        libc::SYS_fsopen,
        libc::SYS_fsmount,
        libc::SYS_fsconfig,
        libc::SYS_mount_setattr,
        libc::SYS_bpf,
        libc::SYS_kexec_load,
        libc::SYS_kexec_file_load,
        libc::SYS_init_module,
        libc::SYS_finit_module,
        libc::SYS_delete_module,
        libc::SYS_reboot,
        libc::SYS_swapon,
        libc::SYS_swapoff,
    ];
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        always.into_iter().map(|call| (call, Vec::new())).collect();
    rules.insert(
        libc::SYS_ioctl,
        vec![
            rule(vec![arg(1, SeccompCmpOp::Eq, TIOCSTI)?])?,
            rule(vec![arg(1, SeccompCmpOp::Eq, TIOCLINUX)?])?,
        ],
    );
    // A signal to every process it may signal (`kill -9 -1`): inside its PID namespace that is
    // only its own tree, but nothing but an attempt on kavi does it.
    rules.insert(
        libc::SYS_kill,
        vec![rule(vec![arg(0, SeccompCmpOp::Eq, u64::from(u32::MAX))?])?],
    );
    let (inet, inet6) = (libc::AF_INET as u64, libc::AF_INET6 as u64);
    let mut socket = vec![rule(vec![arg(2, SeccompCmpOp::Eq, IPPROTO_MPTCP)?])?];
    for family in [inet, inet6] {
        if network {
            // Raw sockets and SOCK_PACKET (10, the obsolete packet socket): the type's low bits.
            for kind in [libc::SOCK_RAW as u64, 10] {
                socket.push(rule(vec![
                    arg(0, SeccompCmpOp::Eq, family)?,
                    arg(1, SeccompCmpOp::MaskedEq(0xf), kind)?,
                ])?);
            }
        } else {
            socket.push(rule(vec![arg(0, SeccompCmpOp::Eq, family)?])?);
        }
    }
    rules.insert(libc::SYS_socket, socket);
    Ok(rules)
}

/// The calls refused with EPERM: what an ordinary program may probe and do without, every
/// socket family but unix ones and IPv4 and IPv6 (which [`kill_rules`] decides), without the
/// network, unix sockets but for socket pairs, and without `locks`, file locks and leases.
fn deny_rules(network: bool, locks: bool) -> Result<BTreeMap<i64, Vec<SeccompRule>>, String> {
    let always = [
        libc::SYS_keyctl,
        libc::SYS_add_key,
        libc::SYS_request_key,
        libc::SYS_perf_event_open,
        libc::SYS_userfaultfd,
        libc::SYS_unshare,
        libc::SYS_setns,
        libc::SYS_acct,
        libc::SYS_quotactl,
        libc::SYS_syslog,
        libc::SYS_lookup_dcookie,
        // io_uring makes sockets and connections without the calls filtered here
        // (IORING_OP_SOCKET, IORING_OP_CONNECT); libraries that probe it fall back.
        libc::SYS_io_uring_setup,
        libc::SYS_io_uring_enter,
        libc::SYS_io_uring_register,
        // Opening a file by handle walks past the mount view (it also needs a capability).
        libc::SYS_open_by_handle_at,
        // Inotify instances and fanotify groups are counted per account, across every user
        // namespace: a process that takes them all leaves kavi none for the tripwires of its
        // next launch, and the account's other programs none. A POSIX message queue's bytes
        // are counted per account too.
        libc::SYS_inotify_init1,
        libc::SYS_fanotify_init,
        libc::SYS_mq_open,
    ];
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        always.into_iter().map(|call| (call, Vec::new())).collect();
    #[cfg(target_arch = "x86_64")]
    rules.insert(libc::SYS_inotify_init, Vec::new());
    // A process's (or thread's) name is shown to every account on the machine: renaming
    // itself would carry bits out. Programs that name their threads carry on without.
    rules.insert(
        libc::SYS_prctl,
        vec![rule(vec![arg(
            0,
            SeccompCmpOp::Eq,
            libc::PR_SET_NAME as u64,
        )?])?],
    );
    page_cache_rules(&mut rules)?;
    let (unix, inet, inet6) = (
        libc::AF_UNIX as u64,
        libc::AF_INET as u64,
        libc::AF_INET6 as u64,
    );
    // Netlink, packet, vsock, bluetooth, ...: any family but the three.
    let mut socket = vec![rule(vec![
        arg(0, SeccompCmpOp::Ne, unix)?,
        arg(0, SeccompCmpOp::Ne, inet)?,
        arg(0, SeccompCmpOp::Ne, inet6)?,
    ])?];
    if !network {
        socket.push(rule(vec![arg(0, SeccompCmpOp::Eq, unix)?])?);
    }
    rules.insert(libc::SYS_socket, socket);
    // A socket pair is local whatever its family says; only unix ones exist.
    rules.insert(
        libc::SYS_socketpair,
        vec![rule(vec![arg(0, SeccompCmpOp::Ne, unix)?])?],
    );
    if !locks {
        // A lock on a file every sandbox shows (the interpreter, read-only) is seen from
        // another sandbox running at the same time (`F_GETLK`): one bit an offset, a channel
        // out for a process that holds secrets. Record and open-file-description locks,
        // leases and `flock`.
        rules.insert(libc::SYS_flock, Vec::new());
        let commands = [
            libc::F_GETLK,
            libc::F_SETLK,
            libc::F_SETLKW,
            libc::F_OFD_GETLK,
            libc::F_OFD_SETLK,
            libc::F_OFD_SETLKW,
            libc::F_SETLEASE,
            libc::F_GETLEASE,
        ];
        rules.insert(
            libc::SYS_fcntl,
            commands
                .into_iter()
                .map(|command| rule(vec![arg(1, SeccompCmpOp::Eq, command as u64)?]))
                .collect::<Result<_, _>>()?,
        );
    }
    Ok(rules)
}

/// `cachestat(2)` (Linux 6.5), the same number on every architecture; libc does not name it
/// for all of them.
const SYS_CACHESTAT: i64 = 451;
/// `madvise` advice that drops a mapping's pages from memory, a file's from its page cache.
const MADV_COLD: u64 = 20;
const MADV_PAGEOUT: u64 = 21;

/// The page cache of the files every sandbox shows (the interpreter, the libraries) is one
/// state all of them share, and the machine's other accounts too. A process that evicts pages
/// of such a file and reads some back sets bits that another asks for without reading them
/// (`mincore`, `cachestat`, `preadv2` with `RWF_NOWAIT`): a channel out, past the network
/// namespace, of whatever it holds. Neither half is what a builder's, a gate's or a skill's
/// tools need: eviction (`posix_fadvise` `DONTNEED`, `madvise` `COLD` and `PAGEOUT`) and the
/// questions are refused. What stays is slower and noisier (see the threat model).
fn page_cache_rules(rules: &mut BTreeMap<i64, Vec<SeccompRule>>) -> Result<(), String> {
    rules.insert(libc::SYS_mincore, Vec::new());
    rules.insert(SYS_CACHESTAT, Vec::new());
    // posix_fadvise(fd, offset, len, advice)
    rules.insert(
        libc::SYS_fadvise64,
        vec![rule(vec![arg(
            3,
            SeccompCmpOp::Eq,
            libc::POSIX_FADV_DONTNEED as u64,
        )?])?],
    );
    rules.insert(
        libc::SYS_madvise,
        vec![
            rule(vec![arg(2, SeccompCmpOp::Eq, MADV_COLD)?])?,
            rule(vec![arg(2, SeccompCmpOp::Eq, MADV_PAGEOUT)?])?,
        ],
    );
    // preadv2(fd, iov, count, offset_low, offset_high, flags): a read that fails rather than
    // wait for the disk says whether the pages were cached.
    let nowait = libc::RWF_NOWAIT as u64;
    for call in [libc::SYS_preadv2, libc::SYS_pwritev2] {
        rules.insert(
            call,
            vec![rule(vec![arg(5, SeccompCmpOp::MaskedEq(nowait), nowait)?])?],
        );
    }
    Ok(())
}

/// On x86-64: kill every call made through the x32 ABI (a number with bit 30 set).
#[cfg(target_arch = "x86_64")]
fn no_x32() -> Vec<u8> {
    use seccompiler::sock_filter;
    const LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
    const JGE_K: u16 = 0x35; // BPF_JMP | BPF_JGE | BPF_K
    const RET_K: u16 = 0x06; // BPF_RET | BPF_K
    let insn = |code, jt, jf, k| sock_filter { code, jt, jf, k };
    // seccomp_data: nr at offset 0. Another architecture is killed by the other programs.
    bytes(&[
        insn(LD_W_ABS, 0, 0, 0),
        insn(JGE_K, 0, 1, 0x4000_0000),
        insn(RET_K, 0, 0, libc::SECCOMP_RET_KILL_PROCESS),
        insn(RET_K, 0, 0, libc::SECCOMP_RET_ALLOW),
    ])
}

/// The BPF programs for a profile, each as the bytes bubblewrap reads from a descriptor.
pub fn filters(network: bool, locks: bool) -> Result<Vec<Vec<u8>>, String> {
    #[allow(unused_mut)]
    let mut programs = vec![
        compile(kill_rules(network)?, SeccompAction::KillProcess)?,
        compile(
            deny_rules(network, locks)?,
            SeccompAction::Errno(libc::EPERM as u32),
        )?,
    ];
    #[cfg(target_arch = "x86_64")]
    programs.push(no_x32());
    Ok(programs)
}

/// The programs a process that may start no other program puts itself under once its
/// interpreter has started (see [`super::programs`]): `execve` and `execveat` kill it, and on
/// x86-64 so does any x32 call (its own program, for a process run without the others).
pub fn no_programs() -> Result<Vec<Vec<u8>>, String> {
    let rules = BTreeMap::from([
        (libc::SYS_execve, Vec::new()),
        (libc::SYS_execveat, Vec::new()),
    ]);
    #[allow(unused_mut)]
    let mut programs = vec![compile(rules, SeccompAction::KillProcess)?];
    #[cfg(target_arch = "x86_64")]
    programs.push(no_x32());
    Ok(programs)
}

/// The program the network bridge puts its child under: unix sockets refused (EPERM), socket
/// pairs aside, as a profile without the network has them (see the module's notes).
pub fn unix_sockets_refused() -> Result<BpfProgram, String> {
    let rules = BTreeMap::from([(
        libc::SYS_socket,
        vec![rule(vec![arg(0, SeccompCmpOp::Eq, libc::AF_UNIX as u64)?])?],
    )]);
    SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch()?,
    )
    .map_err(|e| e.to_string())?
    .try_into()
    .map_err(|e: seccompiler::BackendError| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_profile_compiles_to_whole_instructions() {
        for network in [false, true] {
            for locks in [false, true] {
                let programs = filters(network, locks).unwrap();
                assert!(programs.len() >= 2);
                for program in programs {
                    assert!(!program.is_empty() && program.len() % 8 == 0);
                }
            }
        }
    }
}
