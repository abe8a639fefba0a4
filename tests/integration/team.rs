//! Several machines on one ledger (issue 56): node attempts claimed once, a step killed midway,
//! a server that never answers, and machines set up differently. Real `kavi` processes, a real
//! ledger file or the tests' PostgreSQL server; another machine is another `TMPDIR` and another
//! spelling of the server's URL.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

use crate::common;

/// One node that counts its runs and takes long enough for a second step to come while it runs.
const SLOW: &str = r#"
[pipeline]
name = "slow"

[nodes.slow]
kind = "exec"
shell = "echo ran >> runs.txt; sleep 3"
"#;

fn workspace_with(pipeline: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("pipelines")).unwrap();
    std::fs::write(dir.path().join("kavi.toml"), "# a workspace\n").unwrap();
    std::fs::write(dir.path().join("pipelines/slow.toml"), pipeline).unwrap();
    dir
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// `kavi` in `root` on `ledger` (a server's URL, or `None` for the workspace's file).
fn kavi_on(root: &Path, ledger: Option<&str>, args: &[&str]) -> Command {
    let mut command = common::kavi_command(root, args);
    if let Some(url) = ledger {
        command.env("KAVI_LEDGER", url);
    }
    command
}

fn spawn(mut command: Command) -> Child {
    command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// A server that takes the connection and never answers: kavi gives up after the URL's
/// `connect_timeout`, saying so without the password, and exits 4 (the ledger could not be
/// used), rather than hanging.
#[test]
fn a_silent_server_is_an_error_not_a_hang() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    // Takes every connection and keeps it open, saying nothing.
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming() {
            held.push(stream);
        }
    });
    let dir = workspace_with(SLOW);
    let url = format!("postgres://kavi:hunter22@127.0.0.1:{port}/kavi?connect_timeout=2");
    let mut kavi = spawn(kavi_on(dir.path(), Some(&url), &["runs", "list"]));
    let mut waited = 0;
    while kavi.try_wait().unwrap().is_none() {
        // A bound far past the timeout: a hang fails the test instead of stopping the suite.
        if waited == 600 {
            kavi.kill().unwrap();
            panic!("kavi still waits on a server that never answers");
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        waited += 1;
    }
    let output = kavi.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(4), "{}", text(&output));
    let said = text(&output);
    assert!(
        said.contains("the server did not let kavi in within 2s"),
        "{said}"
    );
    assert!(!said.contains("hunter22"), "{said}");
}

/// A machine set up otherwise (its own temporary folder, so its own sandbox folder, and the
/// server's URL spelt its own way) steps a run another machine started: its settings are its
/// own, not a change of the run's rules.
#[test]
fn a_machine_set_up_otherwise_steps_the_same_run() {
    let dir = workspace_with(SLOW);
    let root = dir.path();
    let (tmp_a, tmp_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let server = common::postgres::database();
    let (ledger_a, ledger_b) = match &server {
        // 127.0.0.1 here, localhost there, with a timeout of its own.
        Some(url) => (
            Some(url.clone()),
            Some(format!(
                "{}?connect_timeout=5",
                url.replace("@127.0.0.1:", "@localhost:")
            )),
        ),
        None => (None, None),
    };
    let machine = |tmp: &Path, ledger: Option<&str>, args: &[&str]| {
        let mut command = kavi_on(root, ledger, args);
        command.env_remove("KAVI_SANDBOXES").env("TMPDIR", tmp);
        command.output().unwrap()
    };
    let started = machine(
        tmp_a.path(),
        ledger_a.as_deref(),
        &["pipeline", "start", "slow"],
    );
    assert_eq!(started.status.code(), Some(0), "{}", text(&started));
    let run = String::from_utf8_lossy(&started.stdout).trim().to_owned();
    let step = machine(
        tmp_b.path(),
        ledger_b.as_deref(),
        &["pipeline", "step", "slow", "--run", &run, "slow"],
    );
    assert_eq!(step.status.code(), Some(0), "{}", text(&step));
    let end = machine(
        tmp_a.path(),
        ledger_a.as_deref(),
        &["pipeline", "end", "slow", "--run", &run],
    );
    assert_eq!(end.status.code(), Some(0), "{}", text(&end));
}
