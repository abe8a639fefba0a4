//! Tests of starting, capturing, cancelling and watching processes.

use std::collections::HashMap;
use std::path::Path;

use nix::unistd::Pid;

use super::*;
use crate::child::QUIET_TIMERS;

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
    let kept =
        || QUIET_TIMERS.with_borrow(|kept| kept.iter().filter(|(id, _)| *id == runtime).count());
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
