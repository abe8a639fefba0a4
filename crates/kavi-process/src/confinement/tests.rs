//! Tests of confinement: what a confined child sees, writes and reaches, and what it is
//! stopped for.

use super::*;
use crate::{CaptureOptions, CommandSpec, Exit, Violation};

/// A profile like the shipped skill ones, over `dir`.
fn profile(dir: &Path, write: Vec<PathBuf>, limits: Limits) -> Profile {
    Profile {
        role: "test".into(),
        read: ["/usr", "/bin", "/lib", "/lib64", "/etc/ld.so.cache"]
            .map(PathBuf::from)
            .into_iter()
            .chain([dir.to_owned()])
            .collect(),
        write,
        hide: vec![dir.join("hidden")],
        tripwires: vec![
            dir.join("hidden/id_rsa"),
            PathBuf::from("/root/.ssh/id_rsa"),
            PathBuf::from("/etc/shadow"),
        ],
        hide_matching: None,
        network: false,
        hosts: Arc::default(),
        programs: true,
        locks: true,
        require: true,
        limits,
        path: "/usr/bin:/bin".into(),
        workspace: None,
    }
}

/// Says why a test cannot run on this machine, which it then skips; under CI, whose
/// machine has what these tests need, that fails instead.
fn skipping(missing: &str) {
    assert!(
        std::env::var_os("CI").is_none(),
        "CI must be able to run this: {missing}"
    );
    eprintln!("skipping: {missing}");
}

/// Runs `script` with `sh` under `profile`, in `dir`. `None` when this machine cannot
/// isolate: the caller skips (and fails under CI, where it must).
async fn run_sh(dir: &Path, profile: Profile, script: &str) -> Option<crate::Finished> {
    if let Err(missing) = runtime::bwrap() {
        skipping(missing);
        return None;
    }
    let spec = CommandSpec {
        program: "sh".into(),
        args: vec!["-c".into(), script.to_owned()],
        env: vec![("SECRET_OF_KAVI".into(), "hunter2".into())],
        cwd: dir.to_owned(),
        stdin: None,
        confinement: Some(prepare(profile).unwrap()),
    };
    let options = CaptureOptions {
        limit: 1 << 20,
        spill_dir: dir.to_owned(),
        roster: None,
        live: None,
    };
    Some(
        crate::run(&spec, &options, &Default::default())
            .await
            .unwrap(),
    )
}

fn stdout(finished: &crate::Finished) -> String {
    String::from_utf8_lossy(&finished.stdout.head).into_owned()
}

#[tokio::test]
async fn a_confined_child_sees_and_writes_only_its_view() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    let inside = dir.join("inside");
    std::fs::create_dir_all(&inside).unwrap();
    std::fs::create_dir_all(dir.join("hidden")).unwrap();
    std::fs::write(dir.join("hidden/ledger"), "rows").unwrap();
    std::fs::write(dir.join("read-only"), "trusted").unwrap();
    std::fs::create_dir_all(dir.join("app")).unwrap();
    std::fs::write(dir.join("app/.env"), "API_KEY=sk-live").unwrap();
    // The decoys (/etc/shadow here, a hidden `.env`) are read last: the tripwire stops the
    // process as soon as it sees one opened, and what follows might not run.
    let script = format!(
        "echo ok > {inside}/a; echo no > {dir}/b; chmod 777 {dir}/read-only; \
             ls /root /home 2>&1; cat {dir}/hidden/ledger 2>&1; \
             cat /proc/1/environ /proc/$PPID/environ 2>/dev/null | tr '\\0' '\\n' | grep -c SECRET; \
             v=$(cat /proc/sys/kernel/printk_ratelimit_burst); \
             (echo $v > /proc/sys/kernel/printk_ratelimit_burst) 2>/dev/null || echo sysctl-refused; \
             (echo > /proc/sysrq-trigger) 2>/dev/null || echo sysrq-refused; \
             printf processes=; ls /proc | grep -c '^[0-9]'; \
             cat {dir}/app/.env /etc/shadow 2>&1",
        inside = inside.display(),
        dir = dir.display()
    );
    let mut profile = profile(&dir, vec![inside.clone()], Limits::default());
    let mut secrets = globset::GlobSetBuilder::new();
    secrets.add(globset::Glob::new("**/.env").unwrap());
    profile.hide_matching = Some((Arc::new(secrets.build().unwrap()), vec![dir.clone()]));
    let Some(finished) = run_sh(&dir, profile, &script).await else {
        return;
    };
    let out = stdout(&finished);
    assert_eq!(std::fs::read_to_string(inside.join("a")).unwrap(), "ok\n");
    assert!(!dir.join("b").exists(), "wrote outside its scope");
    assert_eq!(
        std::fs::metadata(dir.join("read-only"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o644,
        "changed a read-only file's mode"
    );
    assert!(out.contains("No such file"), "{out}");
    assert!(!out.contains("rows"), "read a hidden file: {out}");
    assert!(
        !out.contains("sk-live"),
        "read a secret the globs hide: {out}"
    );
    // uid 0 inside may be the host's: the kernel's knobs must not be writable through /proc.
    assert!(
        out.contains("sysctl-refused") && out.contains("sysrq-refused"),
        "{out}"
    );
    // /etc/shadow is not in the view (a decoy is); no process outside it (kavi's environment) is.
    assert!(!out.lines().any(|line| line.starts_with("root:")), "{out}");
    let processes: usize = out
        .lines()
        .find_map(|line| line.strip_prefix("processes="))
        .unwrap_or_else(|| panic!("no process count: {out}"))
        .parse()
        .unwrap();
    assert!(processes <= 4, "sees {processes} processes: {out}");
    use std::os::unix::fs::PermissionsExt;
}

#[tokio::test]
async fn nothing_a_confined_child_starts_outlives_it() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    let token = format!("kavi-daemon-{}", std::process::id());
    // A double-forked, setsid daemon that would sleep for a minute.
    let script = format!("setsid sh -c 'sleep 60; echo {token}' >/dev/null 2>&1 & echo started");
    let Some(finished) = run_sh(&dir, profile(&dir, vec![], Limits::default()), &script).await
    else {
        return;
    };
    assert_eq!(stdout(&finished).trim(), "started");
    // The namespace is gone with its init; the kernel kills the rest as it goes.
    let alive = || {
        std::fs::read_dir("/proc").unwrap().flatten().any(|entry| {
            std::fs::read(entry.path().join("cmdline"))
                .is_ok_and(|cmdline| String::from_utf8_lossy(&cmdline).contains(&token))
        })
    };
    for _ in 0..100 {
        if !alive() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    panic!("the daemon outlived its run");
}

#[tokio::test]
async fn reading_a_secret_where_it_usually_lives_springs_a_tripwire() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    let script = "cat /root/.ssh/id_rsa; echo read";
    let Some(finished) = run_sh(&dir, profile(&dir, vec![], Limits::default()), script).await
    else {
        return;
    };
    assert_eq!(
        finished.violation,
        Some(Violation::Tripwire("/root/.ssh/id_rsa".into()))
    );
    assert!(finished.violation.as_ref().unwrap().is_security());
    // Opened by a process that dies with the namespace at once (it holds the decoy open
    // when its parent exits), or without waiting and closed straight away: seen all the same.
    for script in [
        "(exec 3</etc/shadow; touch /tmp/opened; sleep 30) & \
             while [ ! -e /tmp/opened ]; do sleep 0.01; done; exit 0",
        "python3 -c 'import os; os.close(os.open(\"/etc/shadow\", os.O_RDONLY | os.O_NONBLOCK))'",
    ] {
        let finished = run_sh(&dir, profile(&dir, vec![], Limits::default()), script)
            .await
            .unwrap();
        assert_eq!(
            finished.violation,
            Some(Violation::Tripwire("/etc/shadow".into())),
            "{script}"
        );
    }
    // Inside a hidden folder the view shows nothing, and no decoy is laid there.
    let script = "ls -A /root/.ssh; cat hidden/id_rsa || echo absent";
    let finished = run_sh(&dir, profile(&dir, vec![], Limits::default()), script)
        .await
        .unwrap();
    assert_eq!(finished.violation, None);
    assert_eq!(stdout(&finished), "id_rsa\nabsent\n");
}

#[tokio::test]
async fn a_daemon_is_seen_and_stops_the_process_that_left_it() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    // The double fork of a daemon: the middle process exits, its child is orphaned.
    let script = "(setsid sleep 30 &) ; sleep 20; echo finished";
    let Some(finished) = run_sh(&dir, profile(&dir, vec![], Limits::default()), script).await
    else {
        return;
    };
    assert_eq!(finished.violation, Some(Violation::Daemon));
    assert_eq!(stdout(&finished), "");
    // A child the program waits for is no daemon.
    let script = "sleep 0.5 & wait; echo finished";
    let finished = run_sh(&dir, profile(&dir, vec![], Limits::default()), script)
        .await
        .unwrap();
    assert_eq!(finished.violation, None);
    assert_eq!(stdout(&finished), "finished\n");
}

#[tokio::test]
async fn terminal_injection_is_killed_as_a_security_violation() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    // TIOCSTI on stdin (whatever it is): seccomp kills before the kernel looks at the fd.
    let script = "python3 -c 'import fcntl, termios; fcntl.ioctl(0, termios.TIOCSTI, b\"x\")'";
    let Some(finished) = run_sh(&dir, profile(&dir, vec![], Limits::default()), script).await
    else {
        return;
    };
    assert_eq!(finished.exit, Exit::Signal(nix::libc::SIGSYS));
    assert_eq!(finished.violation, Some(Violation::ForbiddenCall));
}

/// A process the program started, killed by seccomp, fails the run as a security violation
/// although the program carries on and exits 0: its parent swallowing its status hides nothing.
#[tokio::test]
async fn a_forbidden_call_in_a_child_the_program_ignores_is_a_security_violation() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    if let Err(why) = deaths::availability() {
        skipping(why);
        return;
    }
    let script = "python3 -c 'import fcntl, termios; fcntl.ioctl(0, termios.TIOCSTI, b\"x\")'; \
                  echo carried on";
    let Some(finished) = run_sh(&dir, profile(&dir, vec![], Limits::default()), script).await
    else {
        return;
    };
    // The watch may stop the tree before `sh` carries on: what counts is the violation.
    assert_eq!(finished.violation, Some(Violation::ForbiddenCall));
    // The call made by a thread of a process whose first thread has ended.
    let script = r#"python3 -c '
import ctypes, fcntl, termios, threading, time
libc = ctypes.CDLL(None)
def later():
    time.sleep(0.2)
    fcntl.ioctl(0, termios.TIOCSTI, b"x")
threading.Thread(target=later).start()
libc.pthread_exit(None)
'; echo carried on"#;
    let finished = run_sh(&dir, profile(&dir, vec![], Limits::default()), script)
        .await
        .unwrap();
    assert_eq!(finished.violation, Some(Violation::ForbiddenCall));
    // The same program with a child that ends plainly is no violation.
    let script = "python3 -c 'pass'; echo carried on";
    let finished = run_sh(&dir, profile(&dir, vec![], Limits::default()), script)
        .await
        .unwrap();
    assert_eq!(stdout(&finished), "carried on\n");
    assert_eq!(finished.exit, Exit::Code(0));
    assert_eq!(finished.violation, None);
}

#[tokio::test]
async fn without_the_network_only_socket_pairs_open_and_reaching_out_is_a_violation() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    let probe = r#"python3 -c '
import socket
try:
    socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0); print("netlink allowed")
except OSError as e:
    print("netlink refused", e.errno)
try:
    socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); print("unix allowed")
except OSError as e:
    print("unix refused", e.errno)
socket.socketpair(); print("pair")
'"#;
    let Some(finished) = run_sh(&dir, profile(&dir, vec![], Limits::default()), probe).await else {
        return;
    };
    assert_eq!(
        stdout(&finished),
        "netlink refused 1\nunix refused 1\npair\n"
    );
    // UDP, TCP over IPv6, and MPTCP: each kills the process that tries.
    for (family, kind, proto) in [
        ("AF_INET", "SOCK_DGRAM", 0),
        ("AF_INET6", "SOCK_STREAM", 0),
        ("AF_INET", "SOCK_STREAM", 262),
    ] {
        let script = format!(
            "exec python3 -c 'import socket; socket.socket(socket.{family}, socket.{kind}, {proto}); print(\"open\")'"
        );
        let finished = run_sh(&dir, profile(&dir, vec![], Limits::default()), &script)
            .await
            .unwrap();
        assert_eq!(
            finished.violation,
            Some(Violation::ForbiddenCall),
            "{family} {kind} {proto}"
        );
        assert_eq!(stdout(&finished), "");
    }
}

/// A script that starts `count` children, each alive for two seconds, and waits for them. A
/// refused fork does not end it (a shell would end, and its children, orphaned, would be
/// taken for a daemon before the bound was looked at).
fn fork_many(count: u32) -> String {
    format!(
        "python3 -c 'import os, time\nkids = []\nfor _ in range({count}):\n    try:\n        \
         pid = os.fork()\n    except OSError:\n        break\n    if pid == 0:\n        \
         time.sleep(2)\n        os._exit(0)\n    kids.append(pid)\nfor pid in kids:\n    \
         os.waitpid(pid, 0)'"
    )
}

#[tokio::test]
async fn a_process_tree_past_its_bounds_is_stopped_and_says_which() {
    if matches!(bounds::cgroup_support(), bounds::CgroupSupport::None(_)) {
        skipping(&bounds::cgroup_support().describe());
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    let limits = Limits {
        memory_mib: Some(64),
        processes: Some(16),
        ..Limits::default()
    };
    let grow = "python3 -c 'b = bytearray(256 << 20); print(len(b))'";
    let Some(finished) = run_sh(&dir, profile(&dir, vec![], limits), grow).await else {
        return;
    };
    assert_eq!(
        finished.violation,
        Some(Violation::Bound("its memory bound (64 MiB)".into()))
    );
    let finished = run_sh(&dir, profile(&dir, vec![], limits), &fork_many(40))
        .await
        .unwrap();
    assert_eq!(
        finished.violation,
        Some(Violation::Bound("its process bound (16 processes)".into()))
    );
}

/// A process left in a launch's cgroup in a session of its own (out of reach of the process
/// group's kill) is killed by the cgroup's.
#[test]
fn every_process_left_in_a_launchs_cgroup_is_killed() {
    if matches!(bounds::cgroup_support(), bounds::CgroupSupport::None(_)) {
        skipping(&bounds::cgroup_support().describe());
        return;
    }
    let limits = Limits {
        processes: Some(8),
        ..Limits::default()
    };
    let (cgroup, _procs) = bounds::Cgroup::make(&limits).unwrap().unwrap();
    let mut left = std::process::Command::new("setsid")
        .args(["sleep", "60"])
        .spawn()
        .unwrap();
    for folder in cgroup.folders() {
        std::fs::write(folder.join("cgroup.procs"), left.id().to_string()).unwrap();
    }
    cgroup.kill_all();
    let status = left.wait().unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(nix::libc::SIGKILL)
    );
    for folder in cgroup.folders() {
        assert_eq!(
            std::fs::read_to_string(folder.join("cgroup.procs")).unwrap(),
            ""
        );
    }
}

/// The cgroups of a kavi that is gone (killed before it could remove them) are swept by the
/// next kavi, and what was left running in them is killed; a live kavi's, those a kavi of
/// another PID namespace made, and those whose name does not say, are left alone.
#[test]
fn a_dead_kavis_cgroups_are_swept_and_what_they_hold_is_killed() {
    let support = bounds::cgroup_support();
    if matches!(support, bounds::CgroupSupport::None(_)) {
        skipping(&support.describe());
        return;
    }
    // A pid no process has: a child's, once it is reaped.
    let mut ended = std::process::Command::new("true").spawn().unwrap();
    let dead = ended.id();
    ended.wait().unwrap();
    let namespace = bounds::pid_namespace();
    let orphan = format!("kavi-{dead}-0-deadbeef-{namespace}");
    let alive = format!("kavi-{}-990-deadbeef-{namespace}", std::process::id());
    let elsewhere = format!("kavi-{dead}-0-deadbeef-ns1");
    let legacy = format!("kavi-{dead}-1-deadbeef");
    let mut left = std::process::Command::new("setsid")
        .args(["sleep", "60"])
        .spawn()
        .unwrap();
    for parent in support.parents() {
        for name in [&orphan, &alive, &elsewhere, &legacy] {
            std::fs::create_dir(parent.join(name)).unwrap();
        }
        std::fs::write(
            parent.join(&orphan).join("cgroup.procs"),
            left.id().to_string(),
        )
        .unwrap();
    }
    // Another test's first launch in this process may sweep them first: what is checked is
    // what is left.
    bounds::sweep_orphans();
    let status = left.wait().unwrap();
    let kept: Vec<bool> = support
        .parents()
        .iter()
        .flat_map(|parent| {
            [&orphan, &alive, &elsewhere, &legacy].map(|name| {
                let folder = parent.join(name);
                let there = folder.exists();
                let _ = std::fs::remove_dir(folder);
                there
            })
        })
        .collect();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(nix::libc::SIGKILL)
    );
    assert_eq!(
        kept,
        [false, true, true, true].repeat(support.parents().len())
    );
}

/// Keeping cgroup moves fast moves kavi into the cgroups it is in: nothing about it changes,
/// and a bounded tree launched meanwhile is still stopped at its bound.
#[tokio::test]
async fn keeping_cgroup_moves_fast_leaves_kavi_where_it_is() {
    if matches!(bounds::cgroup_support(), bounds::CgroupSupport::None(_)) {
        skipping(&bounds::cgroup_support().describe());
        return;
    }
    let before = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    bounds::move_soon();
    bounds::move_soon();
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    let limits = Limits {
        processes: Some(8),
        ..Limits::default()
    };
    let Some(finished) = run_sh(&dir, profile(&dir, vec![], limits), &fork_many(20)).await else {
        return;
    };
    assert_eq!(
        finished.violation,
        Some(Violation::Bound("its process bound (8 processes)".into()))
    );
    assert_eq!(
        std::fs::read_to_string("/proc/self/cgroup").unwrap(),
        before
    );
}

/// Runs `fill` (a shell script given its write folder) under an 8 MiB disk bound, asserts the
/// bound stopped it, and hands back the folder; `None` where it could not run (skipped).
async fn stopped_at_the_disk_bound(dir: &Path, fill: impl Fn(&Path) -> String) -> Option<PathBuf> {
    let scope = dir.join("scope");
    std::fs::create_dir_all(&scope).unwrap();
    let limits = Limits {
        disk_mib: Some(8),
        ..Limits::default()
    };
    let finished = run_sh(
        dir,
        profile(dir, vec![scope.clone()], limits),
        &fill(&scope),
    )
    .await?;
    assert_eq!(
        finished.violation,
        Some(Violation::Bound("its disk bound (8 MiB)".into()))
    );
    Some(scope)
}

#[tokio::test]
async fn a_process_that_fills_its_write_folders_past_the_disk_bound_is_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    // 4 MiB a step, never one file past any file-size bound, for up to 30 seconds.
    let fill = |scope: &Path| {
        format!(
            "for i in $(seq 120); do head -c 4194304 /dev/zero > {}/f$i; sleep 0.25; done",
            scope.display()
        )
    };
    let Some(scope) = stopped_at_the_disk_bound(&dir, fill).await else {
        return;
    };
    let held = bounds::disk_used(&[scope]).unwrap();
    assert!(
        held < 64 << 20,
        "{held} bytes written before it was stopped"
    );
}

/// Runs `fill` (which leaves nothing named in its write folder, only files it holds) under an
/// 8 MiB disk bound, and asserts the bound stopped it.
async fn stopped_holding_what_no_folder_names(fill: impl Fn(&Path) -> String) {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    if let Some(scope) = stopped_at_the_disk_bound(&dir, fill).await {
        assert_eq!(std::fs::read_dir(&scope).unwrap().count(), 0);
    }
}

/// A file made in a write folder and removed while still open has no entry for a walk to find,
/// yet its blocks stay on the disk while it is held: they count.
#[tokio::test]
async fn a_process_that_holds_removed_files_past_the_disk_bound_is_stopped() {
    // 16 MiB in a file removed at once, held open for up to 30 seconds.
    let fill = |scope: &Path| {
        format!(
            "exec 3> {0}/held; head -c 16777216 /dev/zero >&3; rm {0}/held; sleep 30",
            scope.display()
        )
    };
    stopped_holding_what_no_folder_names(fill).await;
}

/// A file made with no name at all (`O_TMPFILE`) in a write folder counts as a removed one.
#[tokio::test]
async fn a_process_that_holds_nameless_files_past_the_disk_bound_is_stopped() {
    let fill = |scope: &Path| {
        format!(
            "exec python3 -c 'import os, time\n\
             fd = os.open(\"{}\", os.O_TMPFILE | os.O_RDWR, 0o600)\n\
             os.posix_fallocate(fd, 0, 16 << 20)\n\
             time.sleep(30)'",
            scope.display()
        )
    };
    stopped_holding_what_no_folder_names(fill).await;
}

/// Nor does a removed file that is only mapped (its descriptor closed) escape the count, a
/// page of it holding the whole file.
#[tokio::test]
async fn a_process_that_maps_removed_files_past_the_disk_bound_is_stopped() {
    let fill = |scope: &Path| {
        format!(
            "exec python3 -c 'import ctypes, os, time\n\
             libc = ctypes.CDLL(None)\n\
             libc.mmap.restype = ctypes.c_void_p\n\
             libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]\n\
             fd = os.open(\"{0}/mapped\", os.O_RDWR | os.O_CREAT, 0o600)\n\
             os.posix_fallocate(fd, 0, 16 << 20)\n\
             assert libc.mmap(None, 4096, 1, 1, fd, 0) not in (None, 2**64 - 1)\n\
             os.close(fd)\n\
             os.unlink(\"{0}/mapped\")\n\
             time.sleep(30)'",
            scope.display()
        )
    };
    stopped_holding_what_no_folder_names(fill).await;
}

/// A process whose first thread has ended (`exit(2)`, not `exit_group`) shows no descriptors
/// and no mappings under its own `/proc/PID`; what its other threads hold still counts.
#[tokio::test]
async fn a_process_whose_leader_thread_ended_holding_removed_files_is_stopped() {
    let fill = |scope: &Path| {
        format!(
            "exec python3 -c 'import ctypes, os, threading, time\n\
             held = threading.Event()\n\
             def hold():\n    \
                 fd = os.open(\"{0}/held\", os.O_RDWR | os.O_CREAT, 0o600)\n    \
                 os.posix_fallocate(fd, 0, 16 << 20)\n    \
                 os.unlink(\"{0}/held\")\n    \
                 held.set()\n    \
                 time.sleep(30)\n\
             threading.Thread(target=hold).start()\n\
             held.wait()\n\
             ctypes.CDLL(None).syscall(60, 0)'",
            scope.display()
        )
    };
    stopped_holding_what_no_folder_names(fill).await;
}

/// What a process writes just before it ends, sooner than the watch measures, is measured once
/// it has ended.
#[tokio::test]
async fn a_process_that_ends_right_after_filling_its_write_folders_is_past_the_disk_bound() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    let fill = |scope: &Path| format!("head -c 16777216 /dev/zero > {}/left", scope.display());
    let Some(scope) = stopped_at_the_disk_bound(&dir, fill).await else {
        return;
    };
    assert!(scope.join("left").exists());
}

/// Empty files take no blocks, yet each takes an inode: thousands of them are past the disk
/// bound, not a way around it to the host's inodes.
#[tokio::test]
async fn a_process_that_makes_empty_files_past_the_disk_bound_is_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    // 500 empty files a step (2 MiB at one block each), for up to 30 seconds.
    let fill = |scope: &Path| {
        format!(
            "cd {} && for i in $(seq 120); do touch $(seq -f \"$i-%g\" 500); sleep 0.25; done",
            scope.display()
        )
    };
    let Some(scope) = stopped_at_the_disk_bound(&dir, fill).await else {
        return;
    };
    let files = std::fs::read_dir(&scope).unwrap().count();
    assert!(files < 20_000, "{files} files made before it was stopped");
}

/// Each process's CPU rlimit is below the bound, yet three of them together pass it: the
/// tree's time is what is bounded, where the cgroup counts it.
#[tokio::test]
async fn a_tree_that_spends_more_cpu_than_its_bound_is_stopped() {
    if !matches!(
        bounds::cgroup_support(),
        bounds::CgroupSupport::V1 {
            cpuacct: Some(_),
            ..
        } | bounds::CgroupSupport::V2(_)
    ) {
        skipping(&bounds::cgroup_support().describe());
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    let limits = Limits {
        cpu_seconds: Some(2),
        ..Limits::default()
    };
    // Three spinners of 1.5 CPU seconds each, for at most 20 seconds.
    let spin = "for i in 1 2 3; do timeout 20 python3 -c 'import time\nend = time.process_time() + 1.5\nwhile time.process_time() < end: pass' & done; wait; sleep 20";
    let Some(finished) = run_sh(&dir, profile(&dir, vec![], limits), spin).await else {
        return;
    };
    assert_eq!(
        finished.violation,
        Some(Violation::Bound("its CPU bound (2 s)".into()))
    );
}

#[test]
fn without_isolation_a_required_profile_refuses_and_an_optional_one_runs_unconfined() {
    let dir = tempfile::tempdir().unwrap();
    let mut optional = profile(dir.path(), vec![], Limits::default());
    let err = prepare_with(
        optional.clone(),
        Some("bubblewrap (`bwrap`) is not installed"),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.starts_with("refusing to run the test unconfined: bubblewrap"),
        "{err}"
    );
    optional.require = false;
    let unconfined = prepare_with(optional, Some("no namespaces")).unwrap();
    assert!(!unconfined.isolated());
    assert_eq!(unconfined.record()["enforced"], "none");
    assert_eq!(unconfined.record()["unconfined_because"], "no namespaces");
}

/// Version control's state a process makes in its write scope in the workspace (a `.git`, or a
/// folder git takes for a repository by a `HEAD` link) would run its configuration as the person
/// who next runs git there: it is removed and the run fails for it. A repository that was there
/// before stays.
#[tokio::test]
async fn a_repository_made_in_a_write_scope_is_removed_and_fails_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    let scope = dir.join("notes");
    std::fs::create_dir_all(scope.join("kept/objects")).unwrap();
    std::fs::write(scope.join("kept/HEAD"), "ref: refs/heads/main\n").unwrap();
    let scoped = || {
        let mut profile = profile(&dir, vec![scope.clone()], Limits::default());
        profile.workspace = Some(dir.clone());
        profile
    };
    let script = format!(
        "mkdir -p {0}/made/.git {0}/linked/objects {0}/linked/refs && \
         printf '[core]\\n\\tfsmonitor = true\\n' > {0}/made/.git/config && \
         ln -s refs/heads/main {0}/linked/HEAD && cp {0}/made/.git/config {0}/linked/config",
        scope.display()
    );
    let Some(finished) = run_sh(&dir, scoped(), &script).await else {
        return;
    };
    let Some(Violation::Repository(what)) = &finished.violation else {
        panic!("{:?}", finished.violation);
    };
    assert!(
        what.contains("made/.git") && what.contains("linked"),
        "{what}"
    );
    assert!(!scope.join("made/.git").exists());
    assert!(scope.join("linked/HEAD").symlink_metadata().is_err());
    assert!(scope.join("kept/HEAD").exists());
    // Nothing made: the run is not failed for what was there before.
    let finished = run_sh(&dir, scoped(), "true").await.unwrap();
    assert_eq!(finished.violation, None);
}

/// A run that also outgrows a bound (as an attack may, on purpose, to be stopped for it first)
/// still fails for the repository it made: a security violation, never a resource limit.
#[tokio::test]
async fn a_bound_the_run_also_hit_does_not_hide_the_repository_it_made() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    let scope = dir.join("notes");
    std::fs::create_dir_all(&scope).unwrap();
    let mut profile = profile(
        &dir,
        vec![scope.clone()],
        Limits {
            disk_mib: Some(1),
            ..Limits::default()
        },
    );
    profile.workspace = Some(dir.clone());
    let script = format!(
        "mkdir -p {0}/made/.git && printf '[core]\\n\\tfsmonitor = true\\n' > {0}/made/.git/config && \
         head -c 3000000 /dev/zero > {0}/big",
        scope.display()
    );
    let Some(finished) = run_sh(&dir, profile, &script).await else {
        return;
    };
    let violation = finished.violation.expect("a violation");
    assert!(
        matches!(&violation, Violation::Repository(what) if what.contains("made/.git")),
        "{violation:?}"
    );
    assert_eq!(violation.failure_kind(), crate::confinement::SECURITY_KIND);
    assert!(!scope.join("made/.git").exists());
}

/// A process given a write scope in the workspace can nest folders past what a path can name;
/// every later look at the workspace (the views, the builder's copy) would then refuse to run
/// anything. What is too deep is removed when it ends, and the run fails for a bound.
#[tokio::test]
async fn folders_nested_past_a_nameable_path_are_removed_and_fail_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    let scope = dir.join("notes");
    std::fs::create_dir_all(&scope).unwrap();
    std::fs::write(scope.join("kept.txt"), "kept\n").unwrap();
    let mut profile = profile(&dir, vec![scope.clone()], Limits::default());
    profile.workspace = Some(dir.clone());
    let long = "n".repeat(200);
    let script = format!(
        "cd {} && for i in $(seq 14); do mkdir {long} && cd {long}; done && echo x > deepest",
        scope.display()
    );
    let Some(finished) = run_sh(&dir, profile, &script).await else {
        return;
    };
    let Some(Violation::Bound(what)) = &finished.violation else {
        panic!("{:?}", finished.violation);
    };
    assert!(what.contains("too long to name"), "{what}");
    let mut deepest = scope.clone();
    while let Some(next) = std::fs::read_dir(&deepest)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .find(|path| path.is_dir())
    {
        deepest = next;
    }
    assert!(deepest.as_os_str().len() <= kavi_foundation::removal::NAMEABLE);
    assert!(deepest.starts_with(scope.join(&long)));
    assert!(scope.join("kept.txt").exists());
}

/// The record says what the view shows of the workspace: only what git lists, but for a write
/// scope in it, which shows everything it holds.
#[test]
fn the_record_says_a_write_scope_in_the_workspace_shows_all_it_holds() {
    if runtime::bwrap().is_err() {
        skipping("bubblewrap (`bwrap`) is not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    let scope = dir.join("notes");
    std::fs::create_dir(&scope).unwrap();
    let workspace = |write| {
        let mut profile = profile(&dir, write, Limits::default());
        profile.workspace = Some(dir.clone());
        prepare(profile).unwrap().record()["isolation"]["workspace"].clone()
    };
    assert_eq!(
        workspace(vec![]),
        "only the files git tracks or would track: an ignored file is not there"
    );
    assert_eq!(
        workspace(vec![scope]),
        "only the files git tracks or would track, and all its write scopes hold: an ignored \
         file elsewhere is not there"
    );
}

/// A scope swapped for a symlink between the check and the start (another skill racing
/// in the folder around it) is refused when the process starts, never mounted.
#[tokio::test]
async fn a_write_scope_swapped_for_a_symlink_after_the_check_is_not_mounted() {
    if let Err(missing) = runtime::bwrap() {
        skipping(missing);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    let (scope, elsewhere) = (dir.join("scope"), dir.join("elsewhere"));
    std::fs::create_dir_all(&scope).unwrap();
    std::fs::create_dir_all(&elsewhere).unwrap();
    let confinement = prepare(profile(&dir, vec![scope.clone()], Limits::default())).unwrap();
    std::fs::remove_dir(&scope).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &scope).unwrap();
    let spec = CommandSpec {
        program: "sh".into(),
        args: vec!["-c".into(), format!("echo x > {}/planted", scope.display())],
        env: vec![],
        cwd: dir.clone(),
        stdin: None,
        confinement: Some(confinement),
    };
    let options = CaptureOptions {
        limit: 4096,
        spill_dir: dir.clone(),
        roster: None,
        live: None,
    };
    let err = crate::run(&spec, &options, &Default::default())
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("reached through a symlink"), "{err}");
    assert!(!elsewhere.join("planted").exists());
}

/// A folder nested past the longest path cannot be searched for secrets: the profile is
/// refused, never prepared with what the search reached before it.
#[test]
fn a_workspace_that_cannot_be_searched_for_secrets_refuses_the_role() {
    use nix::fcntl::{OFlag, open, openat};
    use nix::sys::stat::Mode;
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    let name = "d".repeat(200);
    let mut fd = open(&dir, OFlag::O_DIRECTORY | OFlag::O_RDONLY, Mode::empty()).unwrap();
    for _ in 0..25 {
        nix::sys::stat::mkdirat(&fd, name.as_str(), Mode::from_bits_truncate(0o755)).unwrap();
        fd = openat(
            &fd,
            name.as_str(),
            OFlag::O_DIRECTORY | OFlag::O_RDONLY,
            Mode::empty(),
        )
        .unwrap();
    }
    std::fs::write(dir.join("zz.env"), "API_KEY=1").unwrap();
    let mut profile = profile(&dir, vec![], Limits::default());
    let mut secrets = globset::GlobSetBuilder::new();
    secrets.add(globset::Glob::new("**/*.env").unwrap());
    profile.hide_matching = Some((Arc::new(secrets.build().unwrap()), vec![dir.clone()]));
    let err = prepare_with(profile, None).unwrap_err().to_string();
    assert!(
        err.contains("cannot search it for what `hide_matching` hides"),
        "{err}"
    );
    // The tree goes as it came, one level at a time below the longest path.
    let _ = std::process::Command::new("rm")
        .arg("-rf")
        .arg(&dir)
        .status();
}

#[test]
fn a_write_scope_reached_through_a_symlink_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    std::fs::create_dir_all(dir.join(".kavi")).unwrap();
    std::os::unix::fs::symlink(".kavi", dir.join("notes")).unwrap();
    let err = prepare_with(
        profile(&dir, vec![dir.join("notes")], Limits::default()),
        None,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("through a symlink"), "{err}");
}

#[tokio::test]
async fn a_link_to_the_accounts_files_reads_kavi_s_stand_ins_not_the_host_s() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    std::fs::create_dir_all(dir.join("notes")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", dir.join("notes/link.md")).unwrap();
    // A hard link would be a second name for the host's file, not a path the view must show.
    let mut profile = profile(&dir, Vec::new(), Limits::default());
    profile
        .read
        .extend(["/etc/passwd", "/etc/group"].map(PathBuf::from));
    let script = format!(
        "cat {dir}/notes/link.md; echo --; cat /etc/group; echo --; id -un",
        dir = dir.display()
    );
    let Some(finished) = run_sh(&dir, profile, &script).await else {
        return;
    };
    let out = stdout(&finished);
    let mut parts = out.split("--\n");
    let (passwd, group, me) = (
        parts.next().unwrap(),
        parts.next().unwrap(),
        parts.next().unwrap_or_default(),
    );
    let uid = nix::unistd::getuid().as_raw();
    let uids: Vec<u32> = passwd
        .lines()
        .map(|line| line.split(':').nth(2).unwrap().parse().unwrap())
        .collect();
    assert!(uids.contains(&0) && uids.contains(&65534), "{out}");
    assert!(uids.iter().all(|u| [0, 65534, uid].contains(u)), "{out}");
    assert!(
        passwd.lines().count() <= 3 && group.lines().count() <= 3,
        "{out}"
    );
    // The running account is found: tools that look their uid up still work.
    assert!(!me.trim().is_empty(), "{out}");
}

/// A profile without locks takes none, of any kind: a lock on a file every sandbox shows (the
/// interpreter) would be seen from another sandbox running at the same time. With locks, the
/// same calls succeed.
#[tokio::test]
async fn a_profile_without_locks_takes_none() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    let script = "exec python3 -c 'import fcntl, os, struct\n\
         fd = os.open(\"/usr/bin/python3\", os.O_RDONLY)\n\
         lock = struct.pack(\"hhqqi\", fcntl.F_RDLCK, 0, 1 << 40, 1, 0)\n\
         for name, call in [\n    \
             (\"setlk\", lambda: fcntl.fcntl(fd, fcntl.F_SETLK, lock)),\n    \
             (\"getlk\", lambda: fcntl.fcntl(fd, fcntl.F_GETLK, lock)),\n    \
             (\"ofd\", lambda: fcntl.fcntl(fd, 37, lock)),\n    \
             (\"flock\", lambda: fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)),\n\
         ]:\n    \
             try:\n        \
                 call()\n        \
                 print(name, \"taken\")\n    \
             except OSError as e:\n        \
                 print(name, e.errno)'";
    let mut without = profile(&dir, vec![], Limits::default());
    without.locks = false;
    let Some(finished) = run_sh(&dir, without, script).await else {
        return;
    };
    let eperm = nix::libc::EPERM;
    assert_eq!(
        stdout(&finished),
        format!("setlk {eperm}\ngetlk {eperm}\nofd {eperm}\nflock {eperm}\n"),
        "{}",
        String::from_utf8_lossy(&finished.stderr.head)
    );
    let finished = run_sh(&dir, profile(&dir, vec![], Limits::default()), script)
        .await
        .unwrap();
    assert_eq!(
        stdout(&finished),
        "setlk taken\ngetlk taken\nofd taken\nflock taken\n"
    );
}

/// No confined process may evict a file's pages from the page cache, nor ask which are there:
/// the cache of a file every sandbox shows (the interpreter) is shared with other sandboxes and
/// the machine's other accounts, and one process evicting what another asks about is a channel
/// out of a sandbox without the network. The same calls made by kavi's own account succeed (or
/// fail for another reason), so the refusal is the sandbox's.
#[tokio::test]
async fn no_confined_process_evicts_or_probes_the_page_cache() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    let probe = dir.join("probe.py");
    std::fs::write(&probe, PAGE_CACHE_PROBE).unwrap();
    let script = format!("exec python3 {}", probe.display());
    let Some(finished) = run_sh(&dir, profile(&dir, vec![], Limits::default()), &script).await
    else {
        return;
    };
    let eperm = nix::libc::EPERM;
    assert_eq!(
        stdout(&finished),
        format!(
            "fadvise {eperm}\npageout {eperm}\nmincore {eperm}\ncachestat {eperm}\n\
             nowait {eperm}\nread done\n"
        ),
        "{}",
        String::from_utf8_lossy(&finished.stderr.head)
    );
    let outside = std::process::Command::new("python3")
        .arg(&probe)
        .output()
        .unwrap();
    let outside = String::from_utf8(outside.stdout).unwrap();
    assert_eq!(outside.lines().count(), 6, "{outside}");
    assert!(
        !outside.contains(&format!(" {eperm}\n")),
        "refused outside a sandbox too: {outside}"
    );
}

/// Each call [`no_confined_process_evicts_or_probes_the_page_cache`] makes, and what it got.
const PAGE_CACHE_PROBE: &str = r#"import ctypes, mmap, os
libc = ctypes.CDLL(None, use_errno=True)
fd = os.open("/usr/bin/python3", os.O_RDONLY)
def c_call(result):
    if result == -1:
        raise OSError(ctypes.get_errno(), "")
def mincore():
    anon = mmap.mmap(-1, 4096)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(anon))
    c_call(libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(4096), ctypes.create_string_buffer(1)))
def cachestat():
    span = (ctypes.c_uint64 * 2)(0, 4096)
    stat = (ctypes.c_uint64 * 5)()
    c_call(libc.syscall(451, fd, span, stat, 0))
def pageout():
    mapped = mmap.mmap(fd, 4096, prot=mmap.PROT_READ)
    mapped.madvise(21)
for name, call in [
    ("fadvise", lambda: os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)),
    ("pageout", pageout),
    ("mincore", mincore),
    ("cachestat", cachestat),
    ("nowait", lambda: os.preadv(fd, [bytearray(16)], 0, os.RWF_NOWAIT)),
    ("read", lambda: os.preadv(fd, [bytearray(16)], 0, 0)),
]:
    try:
        call()
        print(name, "done")
    except OSError as e:
        print(name, e.errno)
"#;

/// A profile without programs: its Python interpreter, once started, starts no program by any
/// route (a child that execs dies of SIGSYS, an exec in its own process is a violation), its
/// own code runs as it would have, and a program that is not a Python interpreter is refused.
#[tokio::test]
async fn a_role_without_programs_starts_none_once_its_interpreter_runs() {
    let python = Path::new("/usr/bin/python3");
    if !python.exists() {
        skipping("/usr/bin/python3");
        return;
    }
    if let Err(missing) = runtime::bwrap() {
        skipping(missing);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    let mut held = profile(&dir, vec![], Limits::default());
    held.programs = false;
    let run = |program: &Path, args: &[&str]| {
        let spec = CommandSpec {
            program: program.display().to_string(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            env: vec![],
            cwd: dir.clone(),
            stdin: None,
            confinement: Some(prepare(held.clone()).unwrap()),
        };
        let options = CaptureOptions {
            limit: 1 << 20,
            spill_dir: dir.clone(),
            roster: None,
            live: None,
        };
        async move { crate::run(&spec, &options, &Default::default()).await }
    };
    let child = run(
        python,
        &[
            "-I",
            "-c",
            "import subprocess; print(subprocess.run(['/bin/true']).returncode)",
        ],
    )
    .await
    .unwrap();
    assert_eq!(stdout(&child), "-31\n", "{child:?}");
    // A library may try a program and carry on without it: a child's death is no violation.
    assert_eq!(child.violation, None);

    let own = run(
        python,
        &["-I", "-c", "import os; os.execv('/bin/true', ['true'])"],
    )
    .await
    .unwrap();
    assert_eq!(own.violation, Some(Violation::ForbiddenCall), "{own:?}");

    let plain = run(python, &["-I", "-c", "import sys; print(sys.argv)", "a"])
        .await
        .unwrap();
    assert_eq!(stdout(&plain), "['-c', 'a']\n", "{plain:?}");

    let error = run(Path::new("/bin/sh"), &["-c", "true"])
        .await
        .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("may start no program but a Python interpreter"),
        "{error}"
    );
}

/// The workspace a confined child sees holds only what git lists: an ignored credential file
/// is not there, through a tracked link to it neither, nor one made after the list was taken;
/// a tracked file and an untracked one the rules leave alone are, and a write scope git has
/// nothing of stays writable.
#[tokio::test]
async fn a_confined_child_sees_only_the_files_git_lists() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    let ws = dir.join("ws");
    std::fs::create_dir_all(ws.join("sub")).unwrap();
    std::fs::create_dir_all(ws.join("notes")).unwrap();
    std::fs::write(ws.join(".gitignore"), ".my.cnf\n.netrc\nnotes/\n").unwrap();
    std::fs::write(ws.join(".my.cnf"), "password=hunter2").unwrap();
    std::fs::write(ws.join("sub/.netrc"), "password hunter2").unwrap();
    std::fs::write(ws.join("tracked.txt"), "tracked").unwrap();
    std::os::unix::fs::symlink(".my.cnf", ws.join("link.txt")).unwrap();
    crate::git::run(&ws, &["init", "-q", "--template="])
        .await
        .unwrap();
    crate::git::run(&ws, &["add", "tracked.txt", "link.txt", ".gitignore"])
        .await
        .unwrap();
    crate::git::run(&ws, &["commit", "-q", "-m", "one"])
        .await
        .unwrap();
    std::fs::write(ws.join("untracked.txt"), "untracked").unwrap();
    let mut profile = profile(&ws, vec![ws.join("notes")], Limits::default());
    profile.workspace = Some(ws.clone());
    let script = format!(
        "cd {ws}; cat tracked.txt untracked.txt; echo; cat .my.cnf sub/.netrc link.txt 2>&1; \
         ls -a; echo written > notes/n; sleep 0.2; cat late.txt 2>&1",
        ws = ws.display()
    );
    // A file made while the child starts is not in the list it was given.
    let late = ws.join("late.txt");
    let writer = tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        std::fs::write(late, "password=late").unwrap();
    });
    let Some(finished) = run_sh(&ws, profile, &script).await else {
        return;
    };
    writer.await.unwrap();
    let out = stdout(&finished);
    assert!(out.starts_with("trackeduntracked"), "{out}");
    assert!(!out.contains("hunter2"), "read an ignored file: {out}");
    assert!(
        !out.contains("password=late"),
        "read a file made later: {out}"
    );
    assert!(
        !out.contains(".my.cnf\n"),
        "an ignored file is listed: {out}"
    );
    assert_eq!(
        std::fs::read_to_string(ws.join("notes/n")).unwrap(),
        "written\n"
    );
}
