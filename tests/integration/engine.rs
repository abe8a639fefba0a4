//! The engine end to end: the real `kavi` binary, real processes, a real ledger file.

use crate::common;

use common::{json, kavi, kavi_command, node};

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

fn workspace() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("pipelines")).unwrap();
    std::fs::create_dir(dir.path().join("templates")).unwrap();
    dir
}

fn write(dir: &Path, relative: &str, text: &str) -> PathBuf {
    let path = dir.join(relative);
    std::fs::write(&path, text).unwrap();
    path
}

/// Writes a pipeline `name` of one exec node, `a`, whose `run` or `shell` line is `action`, and
/// runs it, which must succeed.
fn run_one_node(dir: &Path, name: &str, action: &str) {
    write(
        dir,
        &format!("pipelines/{name}.toml"),
        &format!("[pipeline]\nname = \"{name}\"\n[nodes.a]\nkind = \"exec\"\n{action}\n"),
    );
    let out = kavi(dir, &["pipeline", "run", name]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn nodes_by_state(detail: &Value) -> Vec<(String, String)> {
    detail["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["node_id"].as_str().unwrap().to_owned(),
                n["state"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// Waits for a file a node writes, so a test acts only once the node is really running.
fn wait_for_file(path: &Path) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(text) = std::fs::read_to_string(path)
            && text.ends_with('\n')
        {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits for kavi to exit, killing it and failing with `never` once `seconds` have passed.
fn exit_within(
    child: &mut std::process::Child,
    seconds: u64,
    never: &str,
) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(seconds);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            child.kill().unwrap();
            panic!("{never}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn process_alive(pid: i32) -> bool {
    // A zombie (state Z, after the command name in parentheses) has exited already.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => false,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')),
    }
}

/// Processes may take a moment to be reaped after their group is killed.
fn wait_until_dead(pid: i32) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if !process_alive(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

const DIAMOND: &str = r#"
[pipeline]
name = "diamond"

[params.greeting]
type = "string"
default = "hello"

[nodes.a]
kind = "exec"
run = ["sh", "-c", "printf '%s' \"$GREETING\""]
env = { GREETING = "{{ params.greeting }}" }

[nodes.b]
kind = "exec"
needs = ["a"]
run = ["echo", "b saw {{ nodes.a.outputs.stdout }}"]

[nodes.c]
kind = "exec"
needs = ["a"]
env = { SAW = "{{ nodes.a.outputs.stdout }}" }
shell = 'echo c saw "$SAW"'

[nodes.d]
kind = "render"
needs = ["b", "c"]
template = "report.j2"
"#;

/// A pipeline file over `max_spec_kib` is refused by name before it is parsed; under it, the
/// same file runs.
#[test]
fn a_pipeline_file_over_the_size_limit_is_refused_by_name() {
    let dir = workspace();
    let padding = "#".repeat(2048);
    write(
        dir.path(),
        "pipelines/big.toml",
        &format!(
            "{padding}\n[pipeline]\nname = \"big\"\n[nodes.a]\nkind = \"exec\"\nrun = [\"true\"]\n"
        ),
    );
    write(dir.path(), "kavi.toml", "max_spec_kib = 1\n");
    let out = kavi(dir.path(), &["pipeline", "run", "big"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains("pipelines/big.toml: it is 3 KiB, over the 1 KiB a spec file may be"),
        "{stderr}"
    );
    write(dir.path(), "kavi.toml", "max_spec_kib = 4\n");
    let out = kavi(dir.path(), &["pipeline", "run", "big"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Checking that every node reads only what is upstream of it walks from reader to read (a
/// chain of 6,000 nodes that read what they need, the node before that and the first took over
/// half a minute when each reader's whole ancestry was gathered; how long it takes is the
/// benches' to measure, not a test's): every read upstream passes, and a read of a node that is
/// not upstream is still refused, once.
#[test]
fn a_long_chain_of_reads_is_checked_and_a_read_not_upstream_refused() {
    let dir = workspace();
    let mut text = String::from(
        "[pipeline]\nname = \"long\"\n\n[nodes.n0]\nkind = \"exec\"\nrun = [\"true\"]\n",
    );
    for i in 1..6000 {
        let before = i.max(2) - 2;
        text.push_str(&format!(
            "\n[nodes.n{i}]\nkind = \"exec\"\nneeds = [\"n{}\"]\nrun = [\"echo\", \
             \"{{{{ nodes.n{}.outputs.stdout }}}}\", \"{{{{ nodes.n{before}.outputs.stdout }}}}\", \
             \"{{{{ nodes.n0.outputs.stdout }}}}\"]\n",
            i - 1,
            i - 1
        ));
    }
    text.push_str(
        "\n[nodes.side]\nkind = \"exec\"\nrun = [\"true\"]\n\n[nodes.last]\nkind = \"exec\"\n\
         needs = [\"n5999\"]\nrun = [\"echo\", \"{{ nodes.side.outputs.stdout }}\"]\n",
    );
    write(dir.path(), "pipelines/long.toml", &text);
    let out = kavi(dir.path(), &["pipeline", "check", "long"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert_eq!(stderr.matches("error:").count(), 1, "{stderr}");
    assert!(
        stderr.contains("node `last` reads the outputs of `side` but does not need it"),
        "{stderr}"
    );
}

#[test]
fn a_diamond_runs_and_the_ledger_shows_every_node_run_and_the_spec() {
    let dir = workspace();
    write(dir.path(), "pipelines/diamond.toml", DIAMOND);
    write(
        dir.path(),
        "templates/report.j2",
        "{{ nodes.b.outputs.stdout }}{{ nodes.c.outputs.stdout }}",
    );

    let out = kavi(
        dir.path(),
        &[
            "pipeline",
            "run",
            "diamond.toml",
            "--set",
            "greeting=$(touch pwned) it's",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(
        !dir.path().join("pwned").exists(),
        "a parameter was run as shell code"
    );

    let detail = json(&kavi(dir.path(), &["runs", "show", "--json"]));
    assert_eq!(detail["status"], "succeeded");
    let states = nodes_by_state(&detail);
    let expected: Vec<(String, String)> = ["a", "b", "c", "d"]
        .iter()
        .map(|n| ((*n).to_owned(), "succeeded".to_owned()))
        .collect();
    assert_eq!(states, expected);
    for node in detail["nodes"].as_array().unwrap() {
        assert!(node["started_at"].is_string() && node["finished_at"].is_string());
        assert!(node["duration_ms"].is_u64());
    }
    let nodes = detail["nodes"].as_array().unwrap();
    assert_eq!(nodes[1]["outputs"]["stdout"], "b saw $(touch pwned) it's\n");
    assert_eq!(nodes[2]["outputs"]["stdout"], "c saw $(touch pwned) it's\n");

    // The rendered report is an artifact with the text the template produced.
    let artifact = Path::new(nodes[3]["outputs"]["path"].as_str().unwrap());
    assert_eq!(
        std::fs::read_to_string(artifact).unwrap(),
        "b saw $(touch pwned) it's\nc saw $(touch pwned) it's\n"
    );

    // The spec text that governed the run is retrievable by its hash.
    let hash = detail["spec_hash"].as_str().unwrap();
    let spec = kavi(dir.path(), &["spec", "show", hash]);
    assert!(spec.status.success());
    assert_eq!(String::from_utf8(spec.stdout).unwrap(), DIAMOND);
}

#[test]
fn jobs_bounds_how_many_nodes_run_at_once() {
    let dir = workspace();
    std::fs::create_dir(dir.path().join("slots")).unwrap();
    // Each node takes a slot, records how many slots are taken, holds it briefly, and frees it.
    let mut spec = String::from("[pipeline]\nname = \"wide\"\n");
    for i in 0..4 {
        spec.push_str(&format!(
            "\n[nodes.n{i}]\nkind = \"exec\"\nshell = \"touch slots/{i}; ls slots | wc -l >> seen; sleep 0.5; rm slots/{i}\"\n"
        ));
    }
    write(dir.path(), "pipelines/wide.toml", &spec);

    for (jobs, expected) in [("2", 2), ("1", 1)] {
        let _ = std::fs::remove_file(dir.path().join("seen"));
        let out = kavi(dir.path(), &["pipeline", "run", "wide", "--jobs", jobs]);
        assert!(out.status.success());
        let seen = std::fs::read_to_string(dir.path().join("seen")).unwrap();
        let most = seen
            .lines()
            .map(|l| l.trim().parse::<usize>().unwrap())
            .max()
            .unwrap();
        assert_eq!(
            most, expected,
            "with --jobs {jobs}, at most {expected} nodes may overlap"
        );
    }
}

#[test]
fn a_node_over_its_timeout_is_timed_out_and_leaves_no_process_alive() {
    let dir = workspace();
    write(
        dir.path(),
        "pipelines/slow.toml",
        r#"
[pipeline]
name = "slow"

[nodes.slow]
kind = "exec"
shell = "sleep 60 & echo $! > grandchild.pid; wait"
timeout = "1s"

[nodes.after]
kind = "exec"
needs = ["slow"]
run = ["true"]
"#,
    );
    let out = kavi(dir.path(), &["pipeline", "run", "slow"]);
    assert_eq!(out.status.code(), Some(1));
    let pid: i32 = std::fs::read_to_string(dir.path().join("grandchild.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        wait_until_dead(pid),
        "the node's background process {pid} outlived it"
    );

    let detail = json(&kavi(dir.path(), &["runs", "show", "latest", "--json"]));
    assert_eq!(detail["status"], "failed");
    assert_eq!(
        nodes_by_state(&detail),
        [
            ("slow".into(), "timed_out".into()),
            ("after".into(), "blocked".into())
        ]
    );
    assert_eq!(detail["nodes"][0]["error"], "timed out after 1s");
    assert_eq!(
        detail["nodes"][1]["reason"],
        "needs `slow`, which timed out"
    );
}

#[test]
fn a_failure_blocks_dependants_while_the_rest_finishes_unless_fail_fast() {
    let dir = workspace();
    let spec = |fail_fast: bool| {
        format!(
            r#"
[pipeline]
name = "branches"
fail_fast = {fail_fast}

[nodes.bad]
kind = "exec"
run = ["sh", "-c", "exit 3"]

[nodes.after_bad]
kind = "exec"
needs = ["bad"]
run = ["true"]

[nodes.other]
kind = "exec"
needs = ["bad_is_done"]
run = ["true"]

[nodes.bad_is_done]
kind = "exec"
run = ["sh", "-c", "sleep 0.3"]
"#
        )
    };
    write(dir.path(), "pipelines/branches.toml", &spec(false));
    let out = kavi(dir.path(), &["pipeline", "run", "branches", "--jobs", "2"]);
    assert_eq!(out.status.code(), Some(1));
    let detail = json(&kavi(dir.path(), &["runs", "show", "--json"]));
    let states = nodes_by_state(&detail);
    assert!(states.contains(&("bad".into(), "failed".into())));
    assert!(states.contains(&("after_bad".into(), "blocked".into())));
    assert!(
        states.contains(&("other".into(), "succeeded".into())),
        "{states:?}"
    );
    assert_eq!(detail["nodes"][0]["exit_code"], 3);

    write(dir.path(), "pipelines/branches.toml", &spec(true));
    let out = kavi(dir.path(), &["pipeline", "run", "branches", "--jobs", "2"]);
    assert_eq!(out.status.code(), Some(1));
    let detail = json(&kavi(dir.path(), &["runs", "show", "--json"]));
    let states = nodes_by_state(&detail);
    // `bad_is_done` was already running and finishes; `other` never starts.
    assert!(
        states.contains(&("other".into(), "cancelled".into())),
        "{states:?}"
    );
    assert!(
        states.contains(&("bad_is_done".into(), "succeeded".into())),
        "{states:?}"
    );
}

#[test]
fn retries_record_each_attempt_and_continue_lets_dependants_run() {
    let dir = workspace();
    write(
        dir.path(),
        "pipelines/retry.toml",
        r#"
[pipeline]
name = "retry"

[nodes.flaky]
kind = "exec"
shell = "n=$(cat count 2>/dev/null || echo 0); echo $((n + 1)) > count; test $n -ge 2"
retry = { attempts = 4, backoff = "10ms" }

[nodes.optional]
kind = "exec"
run = ["false"]
on_failure = "continue"

[nodes.after_optional]
kind = "exec"
needs = ["optional"]
run = ["echo", "{{ nodes.optional.state }}"]

[nodes.skipped]
kind = "exec"
run = ["true"]
when = "nodes.optional.state == 'succeeded'"
needs = ["optional"]
"#,
    );
    let out = kavi(dir.path(), &["pipeline", "run", "retry"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let detail = json(&kavi(dir.path(), &["runs", "show", "--json"]));
    let attempts: Vec<(i64, &str)> = detail["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["node_id"] == "flaky")
        .map(|n| (n["attempt"].as_i64().unwrap(), n["state"].as_str().unwrap()))
        .collect();
    assert_eq!(attempts, [(1, "failed"), (2, "failed"), (3, "succeeded")]);
    let states = nodes_by_state(&detail);
    assert!(states.contains(&("optional".into(), "failed".into())));
    assert!(states.contains(&("after_optional".into(), "succeeded".into())));
    assert!(states.contains(&("skipped".into(), "skipped".into())));
}

const LONG: &str = r#"
[pipeline]
name = "long"

[nodes.long]
kind = "exec"
shell = "echo $$ > shell.pid; sleep 60 & echo $! > child.pid; wait"

[nodes.after]
kind = "exec"
needs = ["long"]
run = ["true"]
"#;

/// Runs `pipeline`, which runs `LONG` somewhere, presses Ctrl-C once its `long` node's sleep has
/// started, and checks that kavi exits 130 having killed that sleep.
fn ctrl_c_once_long_runs(dir: &Path, pipeline: &str) {
    signal_once_long_runs(dir, pipeline, nix::sys::signal::Signal::SIGINT);
}

/// [`ctrl_c_once_long_runs`] with any signal: kavi exits 128 + its number.
fn signal_once_long_runs(dir: &Path, pipeline: &str, signal: nix::sys::signal::Signal) {
    let child = kavi_command(dir, &["pipeline", "run", pipeline])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid: i32 = wait_for_file(&dir.join("child.pid"))
        .trim()
        .parse()
        .unwrap();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), signal).unwrap();
    let status = child.wait_with_output().unwrap().status;
    assert_eq!(status.code(), Some(128 + signal as i32), "{signal}");
    assert!(
        wait_until_dead(pid),
        "the node's process {pid} survived the cancel"
    );
}

#[test]
fn ctrl_c_cancels_running_nodes_and_records_them_as_cancelled() {
    let dir = workspace();
    write(dir.path(), "pipelines/long.toml", LONG);
    ctrl_c_once_long_runs(dir.path(), "long");

    let detail = json(&kavi(dir.path(), &["runs", "show", "--json"]));
    assert_eq!(detail["status"], "cancelled");
    assert_eq!(
        nodes_by_state(&detail),
        [
            ("long".into(), "cancelled".into()),
            ("after".into(), "cancelled".into())
        ]
    );
}

/// SIGTERM (what `timeout`, `docker stop` and CI cancellation send) and SIGHUP stop a run as
/// Ctrl-C does: no process of it left, every unfinished node cancelled, exit 143 and 129.
#[test]
fn sigterm_and_sighup_cancel_running_nodes_like_ctrl_c() {
    use nix::sys::signal::Signal;
    for signal in [Signal::SIGTERM, Signal::SIGHUP] {
        let dir = workspace();
        write(dir.path(), "pipelines/long.toml", LONG);
        signal_once_long_runs(dir.path(), "long", signal);
        let shell: i32 = std::fs::read_to_string(dir.path().join("shell.pid"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(
            wait_until_dead(shell),
            "{signal}: the node's shell {shell} survived"
        );
        let detail = json(&kavi(dir.path(), &["runs", "show", "--json"]));
        assert_eq!(detail["status"], "cancelled", "{signal}");
        assert_eq!(
            nodes_by_state(&detail),
            [
                ("long".into(), "cancelled".into()),
                ("after".into(), "cancelled".into())
            ],
            "{signal}"
        );
    }
}

/// Ctrl-C while a node's key is being made ends the hashing of its inputs too: kavi exits at
/// once, the node cancelled, where reading a 1 TiB input through would take many minutes.
#[test]
fn ctrl_c_stops_the_hashing_of_inputs() {
    let dir = workspace();
    std::fs::create_dir(dir.path().join("data")).unwrap();
    // Sparse: nothing on disk, and as long to read as a terabyte.
    std::fs::File::create(dir.path().join("data/huge.bin"))
        .unwrap()
        .set_len(1 << 40)
        .unwrap();
    write(
        dir.path(),
        "pipelines/huge.toml",
        r#"
[pipeline]
name = "huge"

[nodes.hashed]
kind = "exec"
run = ["true"]
inputs = ["data/huge.bin"]

[nodes.marker]
kind = "exec"
shell = "echo $$ > child.pid; sleep 600"
"#,
    );
    let mut child = kavi_command(dir.path(), &["pipeline", "run", "huge", "--jobs", "2"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // `marker` starts once `hashed`'s hashing has (it comes first): the loop is running.
    wait_for_file(&dir.path().join("child.pid"));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let status = exit_within(
        &mut child,
        60,
        "kavi was still hashing a minute after Ctrl-C",
    );
    assert_eq!(status.code(), Some(130));
    let detail = json(&kavi(dir.path(), &["runs", "show", "--json"]));
    assert_eq!(detail["status"], "cancelled");
    assert_eq!(
        nodes_by_state(&detail),
        [
            ("hashed".into(), "cancelled".into()),
            ("marker".into(), "cancelled".into())
        ]
    );
    assert_eq!(
        node(&detail, "hashed")["reason"],
        "not started: run cancelled"
    );
}

fn files_under(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .map(|path| if path.is_dir() { files_under(&path) } else { 1 })
        .sum()
}

/// Waits until the workspace's ledger holds a run. A run is recorded whole, and its first
/// plain nodes may start before that commit (on a server ledger, milliseconds later): a test
/// of what the next kavi does with a killed run kills only once the run is recorded.
fn wait_for_the_run_record(root: &Path) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while json(&kavi(root, &["runs", "list", "--json"]))
        .as_array()
        .is_none_or(Vec::is_empty)
    {
        assert!(Instant::now() < deadline, "the run was never recorded");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A kavi killed while it copies a declared output of gigabytes into the store leaves no part
/// of the copy behind once the next kavi starts: it is made in the run's own spill folder,
/// which that kavi's recovery removes.
#[test]
fn a_copy_cut_short_by_a_kill_is_removed_by_the_next_kavi() {
    let dir = workspace();
    write(dir.path(), "seed.txt", "1\n");
    write(
        dir.path(),
        "pipelines/big.toml",
        r#"
[pipeline]
name = "big"

[nodes.model]
kind = "exec"
shell = "mkdir -p out; truncate -s 2G out/model.bin"
inputs = ["seed.txt"]
outputs = ["out/model.bin"]
"#,
    );
    let mut child = kavi_command(dir.path(), &["pipeline", "run", "big"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // The kill waits for the run's record, then for the copy.
    wait_for_the_run_record(dir.path());
    let deadline = Instant::now() + Duration::from_secs(60);
    let temporary = dir.path().join(".kavi/artifacts/tmp");
    while !temporary.is_dir() || files_under(&temporary) == 0 {
        assert!(child.try_wait().unwrap().is_none(), "the run ended first");
        assert!(Instant::now() < deadline, "the output was never copied");
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap(); // SIGKILL, mid-copy
    child.wait().unwrap();
    let runs = json(&kavi(dir.path(), &["runs", "list", "--json"]));
    assert_eq!(runs[0]["status"], "interrupted");
    assert_eq!(files_under(&temporary), 0, "the cut copy was left behind");
}

/// SIGKILL gives kavi no chance to clean up. The kernel stops the node's shell with kavi; the
/// next kavi command stops what the shell left in its group, marks every row of the run
/// interrupted, and removes the spill file.
#[test]
fn a_killed_run_leaves_nothing_behind_once_kavi_starts_again() {
    let dir = workspace();
    // `LONG`, printing past the in-memory limit first, so that its output spills to a file.
    let spilling = LONG.replace("shell = \"echo", "shell = \"head -c 300000 /dev/zero; echo");
    assert_ne!(spilling, LONG);
    write(dir.path(), "pipelines/long.toml", &spilling);
    let mut child = kavi_command(dir.path(), &["pipeline", "run", "long"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let grandchild: i32 = wait_for_file(&dir.path().join("child.pid"))
        .trim()
        .parse()
        .unwrap();
    let shell: i32 = wait_for_file(&dir.path().join("shell.pid"))
        .trim()
        .parse()
        .unwrap();
    let spill = dir.path().join(".kavi/artifacts/tmp");
    let spilled = || files_under(&spill);
    // The spill file, and the live log the node's output is written to as it comes (in pieces:
    // `head -c` prints no newline).
    assert_eq!(spilled(), 2, "the node's output did not spill to a file");
    wait_for_the_run_record(dir.path());
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert!(
        wait_until_dead(shell),
        "the node's shell {shell} outlived kavi"
    );
    // The shell's own child is still there: only the next kavi can stop it.
    assert!(process_alive(grandchild), "nothing was left to recover");

    let runs = json(&kavi(dir.path(), &["runs", "list", "--json"]));
    let killed = wait_until_dead(grandchild);
    if !killed {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(grandchild),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    assert!(killed, "the node's child {grandchild} survived recovery");
    assert_eq!(
        spilled(),
        0,
        "the spill file or the live log was left behind"
    );
    assert_eq!(
        std::fs::read_dir(&spill).unwrap().count(),
        0,
        "the killed kavi's spill folder was left behind"
    );
    assert_eq!(runs[0]["status"], "interrupted");
    let detail = json(&kavi(dir.path(), &["runs", "show", "--json"]));
    assert_eq!(
        nodes_by_state(&detail),
        [
            ("long".into(), "interrupted".into()),
            ("after".into(), "interrupted".into())
        ]
    );
    // The ledger is intact and usable: a new run records normally.
    run_one_node(dir.path(), "ok", "run = [\"true\"]");
    let runs = json(&kavi(dir.path(), &["runs", "list", "--json"]));
    assert_eq!(runs[0]["status"], "succeeded");
    assert_eq!(runs[1]["status"], "interrupted");
}

/// A secret of several lines printed by a node is hidden in the live output too, which kavi
/// shows a line at a time (so the secret never appears whole in one of them).
#[test]
fn a_secret_of_several_lines_never_reaches_the_live_output() {
    let dir = workspace();
    write(
        dir.path(),
        "pipelines/leak.toml",
        r#"
[pipeline]
name = "leak"

[nodes.leak]
kind = "exec"
shell = "printf 'the key is %s\n' \"$TOKEN\""
secrets = ["TOKEN"]
"#,
    );
    let out = kavi_command(dir.path(), &["pipeline", "run", "leak", "--stream"])
        .env("TOKEN", "top-secret-line-one\ntop-secret-line-two")
        .output()
        .unwrap();
    assert!(out.status.success());
    let shown = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        shown.contains("leak | the key is [redacted]"),
        "the line was not shown: {shown}"
    );
    assert!(!shown.contains("top-secret"), "{shown}");
    let detail = json(&kavi(dir.path(), &["runs", "show", "--json"]));
    assert_eq!(
        detail["nodes"][0]["outputs"]["stdout"],
        "the key is [redacted]\n"
    );
}

#[test]
fn nodes_get_only_a_minimal_environment_unless_they_inherit() {
    let dir = workspace();
    write(
        dir.path(),
        "pipelines/env.toml",
        r#"
[pipeline]
name = "env"

[nodes.scrubbed]
kind = "exec"
shell = "echo \"${SECRET_TOKEN:-unset} $KAVI_NODE_ID $DECLARED\""
env = { DECLARED = "yes" }

[nodes.inherits]
kind = "exec"
shell = "echo \"${SECRET_TOKEN:-unset}\""
inherit_env = true
"#,
    );
    let out = kavi_command(dir.path(), &["pipeline", "run", "env"])
        .env("SECRET_TOKEN", "hunter2")
        .output()
        .unwrap();
    assert!(out.status.success());
    let detail = json(&kavi(dir.path(), &["runs", "show", "--json"]));
    assert_eq!(
        detail["nodes"][0]["outputs"]["stdout"],
        "unset scrubbed yes\n"
    );
    assert_eq!(detail["nodes"][1]["outputs"]["stdout"], "hunter2\n");
}

/// A variable the node sets replaces the one it would inherit: the child's environment holds
/// it once, so `sh` (the first entry) and Python (the last) see the same value.
#[test]
fn a_variable_the_node_sets_replaces_the_inherited_one() {
    let dir = workspace();
    write(
        dir.path(),
        "pipelines/env.toml",
        r#"
[pipeline]
name = "env"

[nodes.set]
kind = "exec"
run = ["python3", "-c", "import os, sys; sys.stdout.write(os.environ['LANG'] + ' ' + str(sum(1 for e in open('/proc/self/environ', 'rb').read().split(b'\\0') if e.startswith(b'LANG='))))"]
env = { LANG = "C.override" }
inherit_env = true
"#,
    );
    let out = kavi_command(dir.path(), &["pipeline", "run", "env"])
        .env("LANG", "C.UTF-8")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let detail = json(&kavi(dir.path(), &["runs", "show", "--json"]));
    assert_eq!(detail["nodes"][0]["outputs"]["stdout"], "C.override 1");
}

/// A reader that goes away (`kavi pipeline run X 2>&1 | head -1`, the progress being on
/// stderr) does not end the run: it goes on to its end, is recorded as it ended, and kavi's exit
/// code is the run's.
#[test]
fn a_run_whose_reader_goes_away_goes_on_and_is_recorded() {
    use std::io::BufRead as _;
    let dir = workspace();
    let mut text = String::from("[pipeline]\nname = \"slow\"\n");
    for n in 0..4 {
        let needs = if n == 0 {
            String::new()
        } else {
            format!("needs = [\"n{}\"]\n", n - 1)
        };
        text.push_str(&format!(
            "[nodes.n{n}]\nkind = \"exec\"\nrun = [\"sleep\", \"0.1\"]\n{needs}"
        ));
    }
    write(dir.path(), "pipelines/slow.toml", &text);
    let mut child = kavi_command(dir.path(), &["pipeline", "run", "slow"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufReader::new(child.stderr.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.starts_with("run 1: slow"), "{first}");
    // The reader is dropped here: every later write of kavi's finds the pipe closed.
    assert_eq!(child.wait().unwrap().code(), Some(0));
    let detail = json(&kavi(dir.path(), &["runs", "show", "1", "--json"]));
    assert_eq!(detail["status"], "succeeded", "{detail}");
    assert_eq!(
        nodes_by_state(&detail)
            .iter()
            .filter(|(_, state)| state == "succeeded")
            .count(),
        4
    );
}

/// A log that goes to a reader who went away too (`kavi -vv pipeline run X 2>&1 | head -1`):
/// the lines that cannot be written are dropped and the run goes on to its end. The logger's
/// own report of a failed write was a panic while the run was being recorded, and the recorder
/// then waited forever for the run it would never be handed.
#[test]
fn a_run_whose_log_reader_goes_away_goes_on_and_is_recorded() {
    use std::io::BufRead as _;
    let dir = workspace();
    write(
        dir.path(),
        "pipelines/slow.toml",
        "[pipeline]\nname = \"slow\"\n[nodes.a]\nkind = \"exec\"\nrun = [\"sleep\", \"0.2\"]\n\
         [nodes.b]\nkind = \"exec\"\nneeds = [\"a\"]\nrun = [\"true\"]\n",
    );
    let (reader, writer) = std::io::pipe().unwrap();
    let mut child = kavi_command(dir.path(), &["-vv", "pipeline", "run", "slow"])
        .stdout(writer.try_clone().unwrap())
        .stderr(writer)
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufReader::new(reader)
        .read_line(&mut first)
        .unwrap();
    assert!(!first.is_empty());
    // The reader is dropped here. A kavi that hangs is stopped after two minutes and fails the
    // test, rather than hanging it.
    let mut waited = 0;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if waited == 1200 {
            child.kill().unwrap();
            panic!("kavi did not end once its log's reader went away");
        }
        std::thread::sleep(Duration::from_millis(100));
        waited += 1;
    };
    assert_eq!(status.code(), Some(0));
    let detail = json(&kavi(dir.path(), &["runs", "show", "1", "--json"]));
    assert_eq!(detail["status"], "succeeded", "{detail}");
}

/// `kavi runs logs` of a node still running prints what it has printed so far, and `-f`
/// follows it from another process as it prints, until it ends, exiting as the node did (here
/// it fails: 1); once it has ended, `-f` prints what the ledger kept and exits the same way.
#[test]
fn runs_logs_shows_a_running_node_and_follows_it_to_its_end() {
    use std::io::{BufRead as _, Read as _};
    let dir = workspace();
    write(
        dir.path(),
        "pipelines/talk.toml",
        "[pipeline]\nname = \"talk\"\n[nodes.talk]\nkind = \"exec\"\nshell = \"echo first; \
         while [ ! -e go ]; do sleep 0.05; done; echo second; exit 3\"\n",
    );
    let mut run = kavi_command(dir.path(), &["pipeline", "run", "talk"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // The node has printed its first line and waits: that line, while it runs.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let so_far = kavi(dir.path(), &["runs", "logs", "1", "talk"]);
        if so_far.status.success() && so_far.stdout == b"first\n" {
            break;
        }
        assert!(Instant::now() < deadline, "{so_far:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut follower = kavi_command(dir.path(), &["runs", "logs", "-f", "1", "talk"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut followed = std::io::BufReader::new(follower.stdout.take().unwrap());
    let mut first = String::new();
    followed.read_line(&mut first).unwrap();
    assert_eq!(first, "first\n");
    // Only now does the node go on: the follower printed its first line while it ran.
    write(dir.path(), "go", "");
    let mut rest = String::new();
    followed.read_to_string(&mut rest).unwrap();
    assert_eq!(rest, "second\n");
    assert_eq!(follower.wait().unwrap().code(), Some(1));
    assert_eq!(run.wait().unwrap().code(), Some(1));
    let ended = kavi(dir.path(), &["runs", "logs", "-f", "1", "talk"]);
    assert_eq!(ended.status.code(), Some(1), "{ended:?}");
    assert_eq!(ended.stdout, b"first\nsecond\n");
}

/// A disk that fills while a run is recorded (here the ledger's, a node filling it) ends the
/// run with the cause recorded: kavi writes it in the room its lock file keeps, and the next kavi,
/// once space is freed, records the run and its nodes as interrupted for want of space, not as
/// stopped by a kill.
#[test]
fn a_full_disk_is_recorded_as_the_cause_of_the_run_ending() {
    let dir = workspace();
    if common::postgres::ledger_for(dir.path()).is_some() {
        // The ledger is on the server, not on the disk that fills.
        return;
    }
    write(
        dir.path(),
        "pipelines/fill.toml",
        "[pipeline]\nname = \"fill\"\n[nodes.fill]\nkind = \"exec\"\nshell = \"head -c \
         4000000 /dev/zero > .kavi/filler; echo filled\"\n[nodes.after]\nkind = \"exec\"\n\
         needs = [\"fill\"]\nrun = [\"echo\", \"after\"]\n",
    );
    let Some(out) = common::sh_with_small_disk(
        dir.path(),
        ".kavi",
        "2m",
        r#""$KAVI" pipeline run fill >/dev/null; echo "run exited $?" >&2; rm .kavi/filler; exec "$KAVI" runs show 1 --json"#,
    ) else {
        return;
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("run exited 4"), "{stderr}");
    let detail: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"));
    assert_eq!(detail["status"], "interrupted", "{detail}");
    let error = detail["error"].as_str().unwrap();
    assert!(error.contains("no space left on device"), "{error}");
    for node in detail["nodes"].as_array().unwrap() {
        let said = node["reason"].as_str().unwrap_or_default();
        assert!(said.contains("no space left on device"), "{node}");
    }
}

/// A node whose output cannot be kept for want of disk space (its spill file, here on a disk a
/// node before it nearly filled) fails saying so, not that its command failed to start.
#[test]
fn a_node_whose_output_finds_the_disk_full_says_so() {
    let dir = workspace();
    write(
        dir.path(),
        "pipelines/spill.toml",
        "[pipeline]\nname = \"spill\"\n[nodes.fill]\nkind = \"exec\"\nshell = \"head -c \
         $(( $(df -k --output=avail .kavi | tail -1) * 1024 - 200000 )) /dev/zero > .kavi/filler\"\n\
         [nodes.loud]\nkind = \"exec\"\nneeds = [\"fill\"]\nshell = \"yes | head -c 1000000\"\n",
    );
    let Some(out) = common::sh_with_small_disk(
        dir.path(),
        ".kavi",
        "2m",
        r#""$KAVI" pipeline run spill >/dev/null; echo "run exited $?" >&2; rm .kavi/filler; exec "$KAVI" runs show 1 --json"#,
    ) else {
        return;
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("run exited 1"), "{stderr}");
    let detail: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"));
    let loud = node(&detail, "loud");
    assert_eq!(loud["state"], "failed", "{loud}");
    let error = loud["error"].as_str().unwrap();
    assert!(
        error.starts_with("no space left on device for the output of `sh`"),
        "{error}"
    );
}

/// kavi raises its open-file soft limit to the hard one (its nodes' commands get the limit
/// kavi was started with back), runs fewer nodes at once where even the hard limit leaves room
/// for fewer, and refuses to start where it leaves room for none. Its 200 nodes print past the
/// in-memory head on both streams, so each holds every file a node may (pipes, spill files, live
/// logs) while the next ones start. `prlimit` (util-linux) sets the limits kavi starts with.
#[test]
fn the_open_file_limit_is_raised_and_bounds_how_many_nodes_run_at_once() {
    let dir = workspace();
    let mut text = String::from(
        "[pipeline]\nname = \"many\"\n[nodes.limit]\nkind = \"exec\"\nshell = \"ulimit -n\"\n",
    );
    for n in 0..200 {
        text.push_str(&format!(
            "[nodes.n{n}]\nkind = \"exec\"\nshell = \"yes | head -c 70000; yes | head -c 70000 >&2; \
             sleep 0.05\"\n"
        ));
    }
    write(dir.path(), "pipelines/many.toml", &text);
    // kavi as the tests start it (its ledger, its folders), under `prlimit`.
    let run = |limits: &str, run: &str| {
        let plain = kavi_command(
            dir.path(),
            &["pipeline", "run", "many", "--jobs", "8", "--no-cache"],
        );
        let mut command = Command::new("prlimit");
        command
            .arg(format!("--nofile={limits}"))
            .arg(plain.get_program())
            .args(plain.get_args())
            .current_dir(dir.path());
        for (key, value) in plain.get_envs() {
            match value {
                Some(value) => command.env(key, value),
                None => command.env_remove(key),
            };
        }
        command
            .output()
            .unwrap_or_else(|e| panic!("prlimit (util-linux) could not run: {e} ({run})"))
    };
    // A soft limit too low for 8 nodes at once, under a high hard one: raised, all succeed,
    // and the command sees the soft limit it would have had without kavi.
    let raised = run("40:4096", "raised");
    assert!(raised.status.success(), "{raised:?}");
    let stderr = String::from_utf8_lossy(&raised.stderr);
    assert!(!stderr.contains("open-file limit"), "{stderr}");
    let detail = json(&kavi(dir.path(), &["runs", "show", "--json"]));
    assert_eq!(node(&detail, "limit")["outputs"]["stdout"], "40\n");
    // A hard limit with room for 4 nodes at once: 4 run at once, said on stderr, all succeed.
    let fewer = run("64:64", "fewer");
    assert!(fewer.status.success(), "{fewer:?}");
    let stderr = String::from_utf8_lossy(&fewer.stderr);
    assert!(
        stderr
            .contains("the open-file limit (64) leaves room for 4 nodes at once; running 4, not 8"),
        "{stderr}"
    );
    // No room for one: refused before anything runs.
    let none = run("32:32", "none");
    assert_eq!(none.status.code(), Some(4), "{none:?}");
    assert!(
        String::from_utf8_lossy(&none.stderr)
            .contains("the open-file limit is 32; kavi needs at least 40 to run a node"),
        "{none:?}"
    );
}

/// `runs list` shows the newest runs up to `--limit` and says on stderr how many more match.
#[test]
fn runs_list_says_how_many_more_runs_match() {
    let dir = workspace();
    write(
        dir.path(),
        "pipelines/one.toml",
        "[pipeline]\nname = \"one\"\n[nodes.a]\nkind = \"exec\"\nrun = [\"true\"]\n",
    );
    for _ in 0..4 {
        assert!(
            kavi(dir.path(), &["pipeline", "run", "one", "--no-cache"])
                .status
                .success()
        );
    }
    let listed = |limit: &str| {
        let out = kavi(dir.path(), &["runs", "list", "--limit", limit]);
        assert!(out.status.success());
        let rows = String::from_utf8_lossy(&out.stdout).lines().count() - 1;
        (rows, String::from_utf8_lossy(&out.stderr).into_owned())
    };
    assert_eq!(
        listed("2"),
        (
            2,
            "2 more runs match; show them all with --limit 4\n".into()
        )
    );
    assert_eq!(
        listed("3"),
        (3, "1 more run matches; show it with --limit 4\n".into())
    );
    assert_eq!(listed("4"), (4, String::new()));
}

/// What a node's command chose (here a program name with a terminal escape and a carriage
/// return, as a builder's file name could be) is shown on the terminal, never obeyed: every
/// control character but tab and newline reaches stdout or stderr in caret notation.
#[test]
fn control_characters_from_a_node_are_shown_never_sent_to_the_terminal() {
    let dir = workspace();
    write(
        dir.path(),
        "pipelines/esc.toml",
        "[pipeline]\nname = \"esc\"\n[nodes.a]\nkind = \"exec\"\nrun = [\"./no\\u001b]0;PWNED\\u0007\\rFAKE: all passed\"]\n",
    );
    let ran = kavi(dir.path(), &["pipeline", "run", "esc"]);
    let shown = kavi(dir.path(), &["runs", "show", "latest"]);
    // The run's progress line names the command, on stderr; `runs show` on stdout.
    for shown in [&ran.stderr, &shown.stdout] {
        let shown = String::from_utf8_lossy(shown);
        assert!(
            shown.contains("./no^[]0;PWNED^G^MFAKE: all passed"),
            "{shown}"
        );
        assert!(!shown.contains(['\u{1b}', '\r', '\u{7}']), "{shown:?}");
    }
}

/// An empty program is refused where it is written, before anything runs.
#[test]
fn an_empty_program_is_refused_by_check() {
    let dir = workspace();
    for (run, message) in [
        (
            r#"["", "x"]"#,
            "the program to run (the first item of `run`) is empty",
        ),
        ("[]", "`run` needs at least the program to run"),
    ] {
        write(
            dir.path(),
            "pipelines/empty.toml",
            &format!("[pipeline]\nname = \"empty\"\n[nodes.a]\nkind = \"exec\"\nrun = {run}\n"),
        );
        let out = kavi(dir.path(), &["pipeline", "check", "empty"]);
        assert_eq!(out.status.code(), Some(3), "{out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(message), "{stderr}");
        assert!(stderr.contains("empty.toml:5:"), "{stderr}");
    }
}

/// An `env` name that is not a variable name is refused by check where it is written: one with
/// `=` would set another variable (`PATH=/tmp/evil:` sets PATH), and an empty one, one with NUL
/// or a leading digit cannot be one. A value is only ever a value, `=` and all.
#[test]
fn env_names_are_checked_and_a_value_is_only_a_value() {
    let dir = workspace();
    for (name, shown) in [
        (r#""BAD=NAME""#, "`BAD=NAME` is not"),
        (r#""PATH=/tmp/evil:""#, "`PATH=/tmp/evil:` is not"),
        (r#""""#, "the empty string is not"),
        (r#""A\u0000B""#, "`A\\0B` is not"),
        (r#""1ST""#, "`1ST` is not"),
    ] {
        write(
            dir.path(),
            "pipelines/env.toml",
            &format!(
                "[pipeline]\nname = \"env\"\n[nodes.a]\nkind = \"exec\"\nrun = [\"true\"]\n\
                 env = {{ {name} = \"x\" }}\n"
            ),
        );
        let out = kavi(dir.path(), &["pipeline", "check", "env"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{name}: {stderr}");
        assert!(
            stderr.contains(&format!("{shown} an environment variable name"))
                && stderr.contains("pipelines/env.toml:6:9"),
            "{name}: {stderr}"
        );
    }
    write(
        dir.path(),
        "pipelines/env.toml",
        r#"
[pipeline]
name = "env"

[nodes.a]
kind = "exec"
run = ["sh", "-c", "printf '%s|%s' \"$X\" \"$PATH\""]
env = { X = "PATH=/tmp/evil:" }
"#,
    );
    let out = kavi(dir.path(), &["pipeline", "run", "env"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let detail = json(&kavi(dir.path(), &["runs", "show", "--json"]));
    let stdout = detail["nodes"][0]["outputs"]["stdout"].as_str().unwrap();
    let (x, path) = stdout.split_once('|').unwrap();
    assert_eq!(x, "PATH=/tmp/evil:");
    assert!(!path.contains("/tmp/evil"), "{path}");

    // A builder's `env` is checked the same way (its node loads the shipped policies).
    let shipped = common::shipped_workspace();
    write(
        shipped.path(),
        "pipelines/env.toml",
        "[pipeline]\nname = \"env\"\n[nodes.build]\nkind = \"build\"\nskill = \"x\"\n\
         sandbox = \"s\"\nvars = { skill = \"x\" }\nenv = { \"PATH=/tmp/evil:\" = \"x\" }\n",
    );
    let out = kavi(shipped.path(), &["pipeline", "check", "env"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains("`PATH=/tmp/evil:` is not an environment variable name")
            && stderr.contains("pipelines/env.toml:8:9"),
        "{stderr}"
    );
}

/// A node's declared secrets reach its command, and their values are redacted from all that is
/// kept of it: the output streams (past the in-memory head too), JSON keys and values, JSON that
/// spelled the secret with escapes, and the ledger, its WAL and the artifacts as files.
#[test]
fn a_nodes_declared_secrets_are_redacted_everywhere_they_could_be_kept() {
    let dir = workspace();
    write(
        dir.path(),
        "pipelines/secrets.toml",
        r#"
[pipeline]
name = "secrets"

[nodes.keyed]
kind = "exec"
shell = 'printf "{\"%s\": \"x\", \"v\": \"token=%s\"}" "$API_TOKEN" "$API_TOKEN"; echo "$API_TOKEN" >&2'
stdout = "json"
secrets = ["API_TOKEN"]

[nodes.escaped]
kind = "exec"
shell = 'printf "%s" "{\"k\": \"sk\\/live-123456\"}"'
stdout = "json"
secrets = ["API_TOKEN"]

[nodes.spilled]
kind = "exec"
shell = 'head -c 100000 /dev/zero | tr "\0" a; printf "%s" "$API_TOKEN"; head -c 100000 /dev/zero | tr "\0" b'
inherit_env = true
secrets = ["API_TOKEN"]

[nodes.missing]
kind = "exec"
run = ["true"]
secrets = ["NOT_SET_ANYWHERE"]
"#,
    );
    let secret = "sk/live-123456";
    let out = kavi_command(dir.path(), &["pipeline", "run", "secrets"])
        .env("API_TOKEN", secret)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "only `missing` should fail");
    let detail = json(&kavi(dir.path(), &["runs", "show", "--json"]));
    let outputs = |id: &str| node(&detail, id)["outputs"].clone();
    assert_eq!(
        outputs("keyed")["json"],
        serde_json::json!({"[redacted]": "x", "v": "token=[redacted]"})
    );
    assert_eq!(outputs("keyed")["stderr"], "[redacted]\n");
    assert_eq!(
        outputs("escaped")["json"],
        serde_json::json!({"k": "[redacted]"})
    );
    let missing = node(&detail, "missing");
    assert_eq!(missing["state"], "failed");
    assert_eq!(
        missing["error"],
        "secret `NOT_SET_ANYWHERE` is not set in kavi's environment"
    );
    common::assert_nowhere_under(&dir.path().join(".kavi"), secret);
    // The spilled stream was redacted, not dropped: its artifact holds the marker in place.
    let artifact = node(&detail, "spilled")["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["role"] == "stdout")
        .unwrap()["path"]
        .as_str()
        .unwrap()
        .to_owned();
    let stored = std::fs::read(dir.path().join(".kavi/artifacts").join(artifact)).unwrap();
    assert_eq!(stored.len(), 200_000 + "[redacted]".len());
    assert_eq!(&stored[100_000..100_010], b"[redacted]");
}

/// A secret shorter than `min_secret_chars` (4 by default) fails its node before the command
/// starts, naming the secret, since redacting it would hide ordinary text; the minimum is a
/// setting, and never under 2, so a single character is never redacted everywhere.
#[test]
fn a_secret_shorter_than_the_minimum_stops_its_node_and_the_minimum_is_a_setting() {
    let dir = workspace();
    write(
        dir.path(),
        "pipelines/short.toml",
        r#"
[pipeline]
name = "short"

[nodes.a]
kind = "exec"
run = ["sh", "-c", "touch started; printf 'x%sx' \"$SHORT_TOKEN\""]
secrets = ["SHORT_TOKEN"]
"#,
    );
    let run = |dir: &Path| {
        let out = kavi_command(dir, &["pipeline", "run", "short"])
            .env("SHORT_TOKEN", "abc")
            .output()
            .unwrap();
        (out, json(&kavi(dir, &["runs", "show", "--json"])))
    };
    let (out, detail) = run(dir.path());
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(node(&detail, "a")["state"], "failed");
    let error = node(&detail, "a")["error"].as_str().unwrap().to_owned();
    assert!(
        error.starts_with("secret `SHORT_TOKEN` has 3 character(s); kavi needs at least 4"),
        "{error}"
    );
    assert!(!dir.path().join("started").exists(), "the command ran");

    write(dir.path(), "kavi.toml", "min_secret_chars = 3\n");
    let (out, detail) = run(dir.path());
    assert!(out.status.success(), "{out:?}");
    assert_eq!(node(&detail, "a")["outputs"]["stdout"], "x[redacted]x");

    write(dir.path(), "kavi.toml", "min_secret_chars = 1\n");
    let out = kavi(dir.path(), &["pipeline", "check", "short"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{stderr}");
    assert!(
        stderr.contains("`min_secret_chars` must be at least 2")
            && stderr.contains("kavi.toml:1:20"),
        "{stderr}"
    );
}

/// `stdout = "json"` parses the whole document, not the in-memory head; bytes that are not
/// UTF-8 set `stdout_lossy`, and a character cut at the head's end does not.
#[test]
fn json_stdout_is_parsed_whole_and_lossy_text_is_flagged() {
    let dir = workspace();
    write(
        dir.path(),
        "pipelines/out.toml",
        r#"
[pipeline]
name = "out"

[nodes.big]
kind = "exec"
run = ["python3", "-c", "import json; print(json.dumps({'items': ['x' * 100] * 1000}))"]
stdout = "json"

[nodes.lossy]
kind = "exec"
shell = 'printf "a\377b"'

[nodes.cut]
kind = "exec"
run = ["python3", "-c", "import sys; sys.stdout.write('a' * 65535 + 'é')"]
"#,
    );
    let out = kavi(dir.path(), &["pipeline", "run", "out"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let detail = json(&kavi(dir.path(), &["runs", "show", "--json"]));
    let big = &node(&detail, "big")["outputs"];
    assert_eq!(big["truncated"]["stdout"], true);
    assert_eq!(big["json"]["items"].as_array().unwrap().len(), 1000);
    let lossy = &node(&detail, "lossy")["outputs"];
    assert_eq!(lossy["stdout"], "a\u{fffd}b");
    assert_eq!(lossy["stdout_lossy"], true);
    let cut = &node(&detail, "cut")["outputs"];
    assert_eq!(cut["truncated"]["stdout"], true);
    assert!(cut.get("stdout_lossy").is_none(), "{cut}");
    assert_eq!(cut["stdout"].as_str().unwrap().len(), 65535);
}

/// Starts `count` kavi processes with `args` at once, and requires every one to succeed.
fn run_at_once(dir: &Path, count: usize, args: &[&str]) {
    let children: Vec<_> = (0..count)
        .map(|_| {
            kavi_command(dir, args)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Many kavi processes starting at once on one ledger: each one's recovery looks for owners
/// that died while the others are claiming theirs. None is refused, and no live run is taken
/// for a dead one's and marked interrupted.
#[test]
fn many_runs_starting_at_once_are_neither_refused_nor_taken_for_dead() {
    let dir = workspace();
    write(
        dir.path(),
        "pipelines/short.toml",
        "[pipeline]\nname = \"short\"\n[nodes.a]\nkind = \"exec\"\nrun = [\"sleep\", \"0.3\"]\n",
    );
    // The ledger exists before the crowd arrives, as on a team's busy workspace.
    assert!(
        kavi(dir.path(), &["pipeline", "run", "short"])
            .status
            .success()
    );
    run_at_once(dir.path(), 64, &["pipeline", "run", "short", "--no-cache"]);
    let runs = json(&kavi(
        dir.path(),
        &["runs", "list", "--json", "--limit", "100"],
    ));
    let statuses: Vec<&str> = runs
        .as_array()
        .unwrap()
        .iter()
        .map(|run| run["status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses.len(), 65);
    assert!(statuses.iter().all(|s| *s == "succeeded"), "{statuses:?}");
    // Nothing was written out of turn: every row is in the journal's chain.
    let verified = kavi(dir.path(), &["ledger", "verify"]);
    assert!(verified.status.success(), "{verified:?}");
}

#[test]
fn concurrent_runs_share_one_ledger() {
    let dir = workspace();
    let mut spec = String::from("[pipeline]\nname = \"busy\"\n");
    for i in 0..20 {
        spec.push_str(&format!(
            "\n[nodes.n{i}]\nkind = \"exec\"\nrun = [\"echo\", \"{i}\"]\n"
        ));
    }
    write(dir.path(), "pipelines/busy.toml", &spec);
    run_at_once(dir.path(), 4, &["pipeline", "run", "busy", "--jobs", "4"]);
    let runs = json(&kavi(dir.path(), &["runs", "list", "--json"]));
    let runs = runs.as_array().unwrap();
    assert_eq!(runs.len(), 4);
    for run in runs {
        assert_eq!(run["status"], "succeeded");
        let detail = json(&kavi(
            dir.path(),
            &["runs", "show", &run["id"].to_string(), "--json"],
        ));
        assert_eq!(detail["nodes"].as_array().unwrap().len(), 20);
    }
}

#[test]
fn exec_feeds_stdin_runs_in_cwd_and_parses_json_and_render_refuses_escaping_paths() {
    let dir = workspace();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    write(
        dir.path(),
        "templates/note.j2",
        "{{ vars.title }}: {{ nodes.json.outputs.json.n }}\n",
    );
    write(
        dir.path(),
        "pipelines/fields.toml",
        r#"
[pipeline]
name = "fields"

[params.dest]
type = "string"
default = "out/note.md"

[nodes.stdin]
kind = "exec"
run = ["cat"]
stdin = "fed {{ run.id }}"

[nodes.cwd]
kind = "exec"
run = ["pwd"]
cwd = "sub"

[nodes.no_cwd]
kind = "exec"
run = ["pwd"]
cwd = "gone"
on_failure = "continue"

[nodes.json]
kind = "exec"
run = ["echo", "{\"n\": 7}"]
stdout = "json"

[nodes.not_json]
kind = "exec"
run = ["echo", "plain"]
stdout = "json"
on_failure = "continue"

[nodes.note]
kind = "render"
needs = ["json"]
template = "note.j2"
vars = { title = "count" }
dest = "{{ params.dest }}"
"#,
    );
    let out = kavi(dir.path(), &["pipeline", "run", "fields"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let detail = json(&kavi(dir.path(), &["runs", "show", "--json"]));
    assert_eq!(node(&detail, "stdin")["outputs"]["stdout"], "fed 1");
    let cwd = node(&detail, "cwd")["outputs"]["stdout"]
        .as_str()
        .unwrap()
        .trim()
        .to_owned();
    assert!(cwd.ends_with("/sub"), "{cwd}");
    assert_eq!(node(&detail, "no_cwd")["state"], "failed");
    let error = node(&detail, "no_cwd")["error"].as_str().unwrap();
    assert!(
        error.starts_with("working directory ") && error.ends_with("/gone does not exist"),
        "{error}"
    );
    assert_eq!(node(&detail, "json")["outputs"]["json"]["n"], 7);
    assert_eq!(node(&detail, "not_json")["state"], "failed");
    assert!(
        node(&detail, "not_json")["error"]
            .as_str()
            .unwrap()
            .starts_with("stdout is not valid JSON")
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("out/note.md")).unwrap(),
        "count: 7\n"
    );
    let artifacts = node(&detail, "note")["artifacts"].clone();
    assert_eq!(artifacts[0]["role"], "rendered");
    assert_eq!(artifacts[0]["kind"], "RENDERED");

    for (dest, reason) in [
        ("../escape.md", "contains `..`"),
        ("/tmp/escape.md", "is absolute"),
    ] {
        let out = kavi(
            dir.path(),
            &[
                "pipeline",
                "run",
                "fields",
                "--set",
                &format!("dest={dest}"),
            ],
        );
        assert_eq!(out.status.code(), Some(1));
        let detail = json(&kavi(dir.path(), &["runs", "show", "--json"]));
        let note = node(&detail, "note").clone();
        assert_eq!(note["state"], "failed");
        let error = note["error"].as_str().unwrap();
        assert!(
            error.starts_with("refused `dest`") && error.contains(reason),
            "{error}"
        );
    }
    assert!(!dir.path().parent().unwrap().join("escape.md").exists());
}

/// A failed node with `on_failure = "continue"` lets its dependants run, and its failure
/// handler still fires: the failure did happen. `explain` says why, consistently with what the
/// handler needs.
#[test]
fn a_failure_handler_fires_when_the_failed_node_continues() {
    let dir = workspace();
    write(
        dir.path(),
        "pipelines/continues.toml",
        r#"
[pipeline]
name = "continues"

[nodes.flaky]
kind = "exec"
run = ["sh", "-c", "exit 3"]
on_failure = "continue"

[nodes.after]
kind = "exec"
needs = ["flaky"]
run = ["true"]

[nodes.on_flaky]
kind = "exec"
needs = ["flaky"]
trigger = "failure"
run = ["echo", "{{ nodes.flaky.state }}"]
"#,
    );
    kavi(dir.path(), &["pipeline", "run", "continues"]);
    let detail = json(&kavi(dir.path(), &["runs", "show", "--json"]));
    assert_eq!(node(&detail, "flaky")["state"], "failed");
    assert_eq!(node(&detail, "after")["state"], "succeeded");
    assert_eq!(node(&detail, "on_flaky")["state"], "succeeded", "{detail}");
    assert_eq!(node(&detail, "on_flaky")["outputs"]["stdout"], "failed\n");
    let explained = kavi(dir.path(), &["explain", "1", "on_flaky"]);
    let text = String::from_utf8_lossy(&explained.stdout);
    assert!(
        text.contains("it ran: `flaky` failed, and it runs only on failure")
            && text.contains("needs `flaky`: failed")
            && !text.contains("no dependency failed"),
        "{text}"
    );
}

/// Regression: a skipped dependency used to skip every dependant, so an optional step placed
/// before a required one silently skipped the required one too.
#[test]
fn a_skipped_dependency_skips_only_the_nodes_that_read_its_outputs() {
    let dir = workspace();
    write(
        dir.path(),
        "pipelines/optional.toml",
        r#"
[pipeline]
name = "optional"

[nodes.optional]
kind = "exec"
run = ["echo", "maybe"]
when = "false"

[nodes.after]
kind = "exec"
needs = ["optional"]
run = ["echo", "ran"]

[nodes.reader]
kind = "exec"
needs = ["optional"]
run = ["echo", "{{ nodes.optional.outputs.stdout }}"]

[nodes.state_reader]
kind = "exec"
needs = ["optional"]
run = ["echo", "{{ nodes.optional.state }}"]
"#,
    );
    let out = kavi(dir.path(), &["pipeline", "run", "optional"]);
    assert!(out.status.success());
    let detail = json(&kavi(dir.path(), &["runs", "show", "--json"]));
    assert_eq!(
        nodes_by_state(&detail),
        [
            ("optional".into(), "skipped".into()),
            ("after".into(), "succeeded".into()),
            ("reader".into(), "skipped".into()),
            ("state_reader".into(), "succeeded".into()),
        ]
    );
    assert_eq!(
        detail["nodes"][2]["reason"],
        "reads the outputs of `optional`, which was skipped"
    );
    assert_eq!(detail["nodes"][3]["outputs"]["stdout"], "skipped\n");
}

#[test]
fn failure_handlers_run_only_on_failure_and_cleanup_always_even_under_fail_fast() {
    let dir = workspace();
    let spec = |fail_fast: bool| {
        format!(
            r#"
[pipeline]
name = "handlers"
fail_fast = {fail_fast}

[nodes.build]
kind = "exec"
run = ["sh", "-c", "echo broken >&2; exit 2"]

[nodes.after]
kind = "exec"
needs = ["build"]
run = ["true"]

[nodes.on_failure]
kind = "exec"
needs = ["build"]
trigger = "failure"
run = ["echo", "{{{{ nodes.build.state }}}}: {{{{ nodes.build.outputs.stderr | trim }}}}"]

[nodes.cleanup]
kind = "exec"
needs = ["build"]
trigger = "always"
run = ["echo", "cleaned"]

[nodes.fine]
kind = "exec"
run = ["true"]

[nodes.on_fine_failure]
kind = "exec"
needs = ["fine"]
trigger = "failure"
run = ["true"]
"#
        )
    };
    for fail_fast in [false, true] {
        write(dir.path(), "pipelines/handlers.toml", &spec(fail_fast));
        let out = kavi(dir.path(), &["pipeline", "run", "handlers", "--jobs", "1"]);
        assert_eq!(
            out.status.code(),
            Some(1),
            "the failure still fails the run"
        );
        let detail = json(&kavi(dir.path(), &["runs", "show", "--json"]));
        let state = |id: &str| node(&detail, id);
        assert_eq!(state("after")["state"], "blocked");
        assert_eq!(
            state("on_failure")["state"],
            "succeeded",
            "fail_fast = {fail_fast}"
        );
        assert_eq!(state("on_failure")["outputs"]["stdout"], "failed: broken\n");
        assert_eq!(
            state("cleanup")["state"],
            "succeeded",
            "fail_fast = {fail_fast}"
        );
        if !fail_fast {
            assert_eq!(state("on_fine_failure")["state"], "skipped");
            assert_eq!(
                state("on_fine_failure")["reason"],
                "no dependency failed, and it runs only on failure (trigger = \"failure\")"
            );
        }
    }
}

/// Regression: with fail_fast and one job, a queued node cancelled by the stop released its
/// dependants into the ready queue while nothing was running, and the scheduler waited forever.
#[test]
fn a_fail_fast_stop_with_queued_nodes_finishes() {
    let dir = workspace();
    write(
        dir.path(),
        "pipelines/queued.toml",
        r#"
[pipeline]
name = "queued"
fail_fast = true

[nodes.bad]
kind = "exec"
run = ["false"]

[nodes.queued]
kind = "exec"
run = ["true"]

[nodes.after_queued]
kind = "exec"
needs = ["queued"]
run = ["true"]
"#,
    );
    let mut child = kavi_command(dir.path(), &["pipeline", "run", "queued", "--jobs", "1"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let status = exit_within(&mut child, 30, "the run never finished");
    assert_eq!(status.code(), Some(1));
    let detail = json(&kavi(dir.path(), &["runs", "show", "--json"]));
    assert_eq!(
        nodes_by_state(&detail),
        [
            ("bad".into(), "failed".into()),
            ("queued".into(), "cancelled".into()),
            ("after_queued".into(), "cancelled".into())
        ]
    );
}

/// Regression: printing to a reader that went away (`kavi runs list | head`) panicked.
#[test]
fn a_closed_stdout_ends_a_command_quietly() {
    let dir = workspace();
    run_one_node(dir.path(), "ok", "run = [\"true\"]");
    let mut child = kavi_command(dir.path(), &["runs", "show", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(out.status.code(), Some(0));

    // A log of a megabyte, printed whole when read whole, and ended quietly when its reader
    // goes away (`kavi runs logs RUN NODE | head`).
    run_one_node(dir.path(), "loud", "shell = \"yes | head -c 1048576\"");
    let whole = kavi(dir.path(), &["runs", "logs", "latest", "a"]);
    assert!(whole.status.success());
    assert_eq!(whole.stdout.len(), 1 << 20);
    let mut child = kavi_command(dir.path(), &["runs", "logs", "latest", "a"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
    assert_eq!(out.status.code(), Some(0));
}

const OUTER: &str = r#"
[pipeline]
name = "outer"

[params.word]
type = "string"
default = "hello"

[nodes.inner]
kind = "pipeline"
file = "inner"
params = { word = "{{ params.word }}", times = "2" }
retry = { attempts = 2, backoff = "10ms" }

[nodes.after]
kind = "exec"
needs = ["inner"]
run = ["echo", "{{ nodes.inner.outputs.nodes.say.outputs.stdout | trim }}"]
"#;

const INNER: &str = r#"
[pipeline]
name = "inner"

[params.word]
type = "string"

[params.times]
type = "integer"

[nodes.say]
kind = "exec"
run = ["echo", "{{ params.word }} x{{ params.times }}"]

# Fails the first time it runs in a workspace, then succeeds.
[nodes.flaky]
kind = "exec"
needs = ["say"]
shell = "test -f tried || { touch tried; echo first try >&2; exit 3; }"
"#;

/// A template that reads into a child's outputs is checked where the child declares them: a
/// child pipeline's node's fields and its kind's outputs, and a chain step's fields, each with
/// "did you mean" from the declared names and the place it is written.
#[test]
fn references_into_a_childs_outputs_are_checked_with_did_you_mean() {
    // A chain node loads its chain with the policies that govern skills.
    let dir = common::shipped_workspace();
    write(dir.path(), "pipelines/inner.toml", INNER);
    write(
        dir.path(),
        "chains/two.toml",
        "[chain]\nname = \"two\"\n\n[[step]]\nid = \"search\"\nskill = \"find_notes\"\n\n\
         [[step]]\nid = \"summarize\"\nskill = \"summarize_note\"\n",
    );
    let chained = format!(
        "{OUTER}\n[nodes.summary]\nkind = \"chain\"\nchain = \"two\"\n\n[nodes.title]\n\
         kind = \"exec\"\nneeds = [\"summary\"]\n\
         run = [\"echo\", \"{{{{ nodes.summary.outputs.steps.summarize.output.title }}}}\"]\n"
    );
    let read = "nodes.inner.outputs.nodes.say.outputs.stdout";
    for (from, to, says, help, at) in [
        (
            read,
            "nodes.inner.outputs.nodes.say.outptus.stdout",
            "`inner`'s `nodes.say` has no `outptus` (it has: state, outputs)",
            "did you mean `outputs`?",
            "outer.toml:18:",
        ),
        (
            read,
            "nodes.inner.outputs.nodes.say.outputs.stdot",
            "`exec` nodes have no output `stdot`",
            "did you mean `stdout`?",
            "outer.toml:18:",
        ),
        (
            "steps.summarize.output.title",
            "steps.summarize.outptu.title",
            "`summary`'s `steps.summarize` has no `outptu` (it has: status, skill, execution_id, \
             output, error)",
            "did you mean `output`?",
            "outer.toml:27:",
        ),
    ] {
        write(
            dir.path(),
            "pipelines/outer.toml",
            &chained.replace(from, to),
        );
        let out = kavi(dir.path(), &["pipeline", "check", "outer"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{to}: {stderr}");
        assert!(
            stderr.contains(says) && stderr.contains(help) && stderr.contains(at),
            "{to}: {stderr}"
        );
    }
    write(dir.path(), "pipelines/outer.toml", &chained);
    let out = kavi(dir.path(), &["pipeline", "check", "outer"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_pipeline_node_runs_its_child_as_a_run_of_its_own_and_retries_it() {
    let dir = workspace();
    write(dir.path(), "pipelines/outer.toml", OUTER);
    write(dir.path(), "pipelines/inner.toml", INNER);
    let out = kavi(
        dir.path(),
        &["pipeline", "run", "outer", "--set", "word=hi"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    let outer = json(&kavi(dir.path(), &["runs", "show", "--json"]));
    assert_eq!(outer["id"], 1, "`latest` is the run the user started");
    let children: Vec<(i64, &str)> = outer["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["id"].as_i64().unwrap(), c["status"].as_str().unwrap()))
        .collect();
    assert_eq!(children, [(2, "failed"), (3, "succeeded")]);
    let attempts: Vec<(&str, i64, &str)> = outer["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["node_id"].as_str().unwrap(),
                n["attempt"].as_i64().unwrap(),
                n["state"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        attempts,
        [
            ("inner", 1, "failed"),
            ("inner", 2, "succeeded"),
            ("after", 1, "succeeded")
        ]
    );
    assert_eq!(
        node(&outer, "inner")["outputs"]["run_id"],
        3,
        "the final attempt's child run"
    );
    // The child saw its parameters parsed by its own declared types.
    assert_eq!(node(&outer, "after")["outputs"]["stdout"], "hi x2\n");
    let failed = &outer["nodes"][0];
    assert_eq!(
        failed["error"],
        "child run 2 failed at `flaky`: exited with code 3"
    );

    let child = json(&kavi(dir.path(), &["runs", "show", "2", "--json"]));
    assert_eq!(child["parent_run"], 1);
    assert_eq!(child["pipeline"], "inner");
    assert_eq!(
        child["params"],
        serde_json::json!({"word": "hi", "times": 2})
    );
}

#[test]
fn ctrl_c_reaches_the_nodes_of_a_child_run() {
    let dir = workspace();
    write(dir.path(), "pipelines/long.toml", LONG);
    write(
        dir.path(),
        "pipelines/wrapper.toml",
        "[pipeline]\nname = \"wrapper\"\n\n[nodes.child]\nkind = \"pipeline\"\nfile = \"long\"\n",
    );
    ctrl_c_once_long_runs(dir.path(), "wrapper");
    let wrapper = json(&kavi(dir.path(), &["runs", "show", "1", "--json"]));
    assert_eq!(wrapper["status"], "cancelled");
    assert_eq!(node(&wrapper, "child")["state"], "cancelled");
    let child = json(&kavi(dir.path(), &["runs", "show", "2", "--json"]));
    assert_eq!(child["status"], "cancelled");
    assert_eq!(node(&child, "long")["state"], "cancelled");
}

#[test]
fn an_http_node_sends_a_templated_body_extracts_by_jsonpath_and_refuses_other_hosts() {
    // A stand-in service on a loopback port: it echoes what it was sent, with a result list.
    let service = common::stand_in::StandIn::start(|request| {
        if request.request_line.starts_with("GET /missing") {
            return (404, serde_json::json!({"error": "no such thing"}));
        }
        (
            200,
            serde_json::json!({
                "got": request.body,
                "authorized": request.header("authorization") == Some("Bearer token-123"),
                "results": [{"path": "notes/a.md"}, {"path": "notes/b.md"}],
            }),
        )
    });
    let dir = workspace();
    std::fs::create_dir(dir.path().join("policies")).unwrap();
    write(
        dir.path(),
        "policies/network.toml",
        "allowed_hosts = [\"127.0.0.1\"]\n",
    );
    write(
        dir.path(),
        "pipelines/call.toml",
        &format!(
            r#"
[pipeline]
name = "call"

[params.word]
type = "string"
default = "hi"

[nodes.post]
kind = "http"
url = "{origin}/search"
json = {{ query = "{{{{ params.word }}}}", limit = 2, tags = ["x", "{{{{ run.id }}}}"] }}
bearer_env = "SERVICE_TOKEN"
extract = {{ first = "$.results[0].path", echoed = "$.got.query", all = "$.results[*].path" }}
timeout = "10s"

[nodes.use]
kind = "exec"
needs = ["post"]
run = ["echo", "{{{{ nodes.post.outputs.extract.first }}}}"]

[nodes.missing]
kind = "http"
url = "{origin}/missing"

[nodes.elsewhere]
kind = "http"
url = "http://localhost:9/"
"#,
            origin = service.origin
        ),
    );
    let out = kavi_command(
        dir.path(),
        &["pipeline", "run", "call", "--set", "word=kavi"],
    )
    .env("SERVICE_TOKEN", "token-123")
    .output()
    .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let run = json(&kavi(dir.path(), &["runs", "show", "--json"]));
    let post = node(&run, "post");
    assert_eq!(post["state"], "succeeded");
    assert_eq!(post["outputs"]["status"], 200);
    assert_eq!(
        post["outputs"]["body"]["got"],
        serde_json::json!({"query": "kavi", "limit": 2, "tags": ["x", "1"]})
    );
    assert_eq!(post["outputs"]["body"]["authorized"], true);
    assert_eq!(post["outputs"]["extract"]["first"], "notes/a.md");
    assert_eq!(post["outputs"]["extract"]["echoed"], "kavi");
    // A path that may select many gives every match.
    assert_eq!(
        post["outputs"]["extract"]["all"],
        serde_json::json!(["notes/a.md", "notes/b.md"])
    );
    assert_eq!(node(&run, "use")["outputs"]["stdout"], "notes/a.md\n");
    // The token went to the service only: it is in no record.
    assert!(!serde_json::to_string(&run).unwrap().contains("token-123"));

    let missing = node(&run, "missing");
    assert_eq!(missing["state"], "failed");
    assert_eq!(
        missing["error"],
        format!("{}/missing answered 404", service.origin)
    );
    assert_eq!(missing["outputs"]["body"]["error"], "no such thing");

    let elsewhere = node(&run, "elsewhere");
    assert_eq!(
        elsewhere["error"],
        "refused `http://localhost:9/`: host `localhost` is not in allowed_hosts of policies/network.toml"
    );
    let requests = service.received();
    assert_eq!(requests.len(), 2, "the refused request was never sent");
}

/// Regression: `shell = "echo \"hello {{ params.name }}\""` with `--set 'name=$(touch PWNED)'`
/// created PWNED: quoting a value for the shell is not safe inside the shell's own quotes. A
/// template in a shell string is now refused before anything runs; the same value passed
/// through `env` stays data.
#[test]
fn a_template_in_a_shell_string_is_refused_and_env_keeps_the_value_data() {
    let dir = workspace();
    write(
        dir.path(),
        "pipelines/inject.toml",
        "[pipeline]\nname = \"inject\"\n\n[params.name]\ntype = \"string\"\n\n[nodes.greet]\nkind = \"exec\"\nshell = \"echo \\\"hello {{ params.name }}\\\"\"\n",
    );
    let out = kavi(
        dir.path(),
        &["pipeline", "run", "inject", "--set", "name=$(touch PWNED)"],
    );
    assert_eq!(out.status.code(), Some(3));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("a `shell` string may not hold a template")
            && stderr.contains("pipelines/inject.toml:9:9"),
        "{stderr}"
    );
    assert!(!dir.path().join("PWNED").exists());

    write(
        dir.path(),
        "pipelines/safe.toml",
        "[pipeline]\nname = \"safe\"\n\n[params.name]\ntype = \"string\"\n\n[nodes.greet]\nkind = \"exec\"\nenv = { NAME = \"{{ params.name }}\" }\nshell = 'echo \"hello $NAME\"'\n",
    );
    let out = kavi(
        dir.path(),
        &[
            "pipeline",
            "run",
            "safe",
            "--set",
            "name=$(touch PWNED)",
            "--json",
        ],
    );
    let detail = json(&out);
    assert_eq!(
        detail["nodes"][0]["outputs"]["stdout"],
        "hello $(touch PWNED)\n"
    );
    assert!(!dir.path().join("PWNED").exists());
}

/// Durations and counts are bounded at `check`, each error naming the range and the place, and no
/// value panics kavi. Regression: `backoff = "18446744073709551615s"` passed `check` and panicked
/// at run time (overflow when adding a duration to an instant); `timeout = "0s"` passed `check`.
#[test]
fn extreme_durations_and_counts_are_refused_at_check_with_their_range() {
    let dir = workspace();
    let node = |fields: &str| {
        format!(
            "[pipeline]\nname = \"p\"\n\n[nodes.a]\nkind = \"exec\"\nrun = [\"true\"]\n{fields}\n"
        )
    };
    for (fields, expected) in [
        ("timeout = \"0s\"", "`timeout` must be from 1ms to 30days"),
        (
            "timeout = \"18446744073709551615s\"",
            "`timeout` must be from 1ms to 30days",
        ),
        ("timeout = \"31days\"", "out of range"),
        ("timeout = \"soon\"", "invalid duration `soon`"),
        (
            "retry = { attempts = 3, backoff = \"18446744073709551615s\" }",
            "`retry.backoff` must be from 0s to 1day",
        ),
        ("retry = { attempts = 0 }", "must be from 1 to 100"),
        ("retry = { attempts = 4294967295 }", "must be from 1 to 100"),
        ("retry = { attempts = 4294967296 }", "invalid value"),
        ("retry = { attempts = -1 }", "invalid value"),
    ] {
        write(dir.path(), "pipelines/p.toml", &node(fields));
        let out = kavi(dir.path(), &["pipeline", "check", "p"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{fields}: {stderr}");
        assert!(stderr.contains(expected), "{fields}: {stderr}");
        assert!(stderr.contains("pipelines/p.toml:7:"), "{fields}: {stderr}");
    }
    // The edges of each range are accepted, and run.
    write(
        dir.path(),
        "pipelines/p.toml",
        &node("timeout = \"30days\"\nretry = { attempts = 100, backoff = \"1day\" }"),
    );
    assert!(kavi(dir.path(), &["pipeline", "run", "p"]).status.success());
}

#[test]
fn retry_on_names_what_is_tried_again() {
    let dir = workspace();
    write(
        dir.path(),
        "pipelines/retry_on.toml",
        r#"
[pipeline]
name = "retry_on"

[nodes.hang_not_retried]
kind = "exec"
shell = "echo x >> hang_not_retried; sleep 5"
timeout = "200ms"
retry = { attempts = 3, on = ["failed"] }
on_failure = "continue"

[nodes.hang_retried]
kind = "exec"
shell = "echo x >> hang_retried; sleep 5"
timeout = "200ms"
retry = { attempts = 3, on = ["timed_out"] }
on_failure = "continue"

[nodes.exit_3_not_retried]
kind = "exec"
shell = "echo x >> exit_3_not_retried; exit 3"
retry = { attempts = 3, on = [2] }
on_failure = "continue"

[nodes.exit_2_retried]
kind = "exec"
shell = "echo x >> exit_2_retried; exit 2"
retry = { attempts = 3, backoff = "10ms", factor = 1, max_backoff = "10ms", on = [2, "timed_out"] }
on_failure = "continue"
"#,
    );
    // Every node continues on failure, so the run itself goes on to the end.
    kavi(dir.path(), &["pipeline", "run", "retry_on"]);
    let tries = |name: &str| {
        std::fs::read_to_string(dir.path().join(name))
            .unwrap()
            .lines()
            .count()
    };
    assert_eq!(tries("hang_not_retried"), 1);
    assert_eq!(tries("hang_retried"), 3);
    assert_eq!(tries("exit_3_not_retried"), 1);
    assert_eq!(tries("exit_2_retried"), 3);

    // What `on` may name is checked where it is written.
    for (on, message) in [
        ("[0]", "exit codes are from 1 to 255"),
        (
            "[\"succeeded\"]",
            "a node is never retried from `succeeded`",
        ),
        (
            "[\"VERIFY_TSET\"]",
            "`VERIFY_TSET` is not a known failure kind",
        ),
    ] {
        common::copy_policies(dir.path(), &["classifier.toml"]);
        write(
            dir.path(),
            "pipelines/bad_on.toml",
            &format!(
                "[pipeline]\nname = \"bad_on\"\n[nodes.a]\nkind = \"exec\"\nrun = [\"true\"]\nretry = {{ attempts = 2, on = {on} }}\n"
            ),
        );
        let out = kavi(dir.path(), &["pipeline", "check", "bad_on"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{on}: {stderr}");
        assert!(
            stderr.contains(message) && stderr.contains("pipelines/bad_on.toml:6:"),
            "{on}: {stderr}"
        );
    }
}

#[test]
fn a_spent_budget_stops_the_run_failed_and_names_the_budget() {
    let dir = workspace();
    common::copy_policies(dir.path(), &["network.toml"]);
    let run = |name: &str, text: &str| {
        write(dir.path(), &format!("pipelines/{name}.toml"), text);
        let out = kavi(dir.path(), &["pipeline", "run", name]);
        assert_eq!(
            out.status.code(),
            Some(1),
            "{name}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        json(&kavi(dir.path(), &["runs", "show", "--json"]))
    };

    // Three attempts in all, though the node would try ten times.
    let attempts = run(
        "attempts",
        "[pipeline]\nname = \"attempts\"\n[pipeline.budget]\nattempts = 3\n\
         [nodes.flaky]\nkind = \"exec\"\nshell = \"echo x >> tries; exit 1\"\nretry = { attempts = 10 }\n",
    );
    assert_eq!(attempts["status"], "failed");
    assert_eq!(
        attempts["error"],
        "the run's `attempts` budget (3 node attempts) is spent"
    );
    let tries = std::fs::read_to_string(dir.path().join("tries")).unwrap();
    assert_eq!(tries.lines().count(), 3);

    // The whole run may take 300ms: the sleeping node is cancelled, the next never starts.
    let wall = run(
        "wall",
        "[pipeline]\nname = \"wall\"\n[pipeline.budget]\nwall = \"300ms\"\n\
         [nodes.slow]\nkind = \"exec\"\nrun = [\"sleep\", \"5\"]\n\
         [nodes.after]\nkind = \"exec\"\nneeds = [\"slow\"]\ntrigger = \"always\"\nrun = [\"true\"]\n",
    );
    assert_eq!(wall["status"], "failed");
    assert_eq!(wall["error"], "the run's `wall` budget (300ms) is spent");
    assert_eq!(node(&wall, "slow")["state"], "cancelled");
    assert_eq!(node(&wall, "after")["state"], "cancelled");

    // No HTTP call at all: the http node is not started.
    let http = run(
        "http_calls",
        "[pipeline]\nname = \"http_calls\"\n[pipeline.budget]\nhttp_calls = 0\n\
         [nodes.fetch]\nkind = \"http\"\nurl = \"http://127.0.0.1:9/x\"\n",
    );
    assert_eq!(
        http["error"],
        "the run's `http_calls` budget (0 HTTP calls) is spent"
    );
    assert_eq!(node(&http, "fetch")["state"], "cancelled");
}

#[test]
fn logs_artifacts_listings_and_run_filters_read_what_was_recorded() {
    let dir = workspace();
    write(
        dir.path(),
        "pipelines/talk.toml",
        "[pipeline]\nname = \"talk\"\ndescription = \"says things\"\n[nodes.a]\nkind = \"exec\"\nshell = \"echo hello; echo oops >&2\"\n",
    );
    write(
        dir.path(),
        "pipelines/fail.toml",
        "[pipeline]\nname = \"fail\"\n[nodes.a]\nkind = \"exec\"\nrun = [\"false\"]\n",
    );
    assert!(
        kavi(dir.path(), &["pipeline", "run", "talk"])
            .status
            .success()
    );
    assert_eq!(
        kavi(dir.path(), &["pipeline", "run", "fail"]).status.code(),
        Some(1)
    );

    let logs = kavi(dir.path(), &["runs", "logs", "1", "a"]);
    assert_eq!(logs.stdout, b"hello\n");
    let errors = kavi(dir.path(), &["runs", "logs", "1", "a", "--stderr"]);
    assert_eq!(errors.stdout, b"oops\n");
    assert_eq!(
        kavi(dir.path(), &["runs", "logs", "1", "b"]).status.code(),
        Some(5)
    );
    // `false` writes nothing: no artifact is kept for either stream, and its logs are empty.
    let silent = json(&kavi(dir.path(), &["runs", "show", "2", "--json"]));
    assert_eq!(node(&silent, "a")["artifacts"], serde_json::json!([]));
    assert_eq!(node(&silent, "a")["outputs"]["stdout"], "");
    for stream in [
        &["runs", "logs", "2", "a"][..],
        &["runs", "logs", "2", "a", "--stderr"],
    ] {
        let logs = kavi(dir.path(), stream);
        assert!(logs.status.success(), "{logs:?}");
        assert!(logs.stdout.is_empty());
    }

    // An artifact is printed whole, and refused once its file no longer matches its hash.
    let run = json(&kavi(dir.path(), &["runs", "show", "1", "--json"]));
    let stdout = node(&run, "a")["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["role"] == "stdout")
        .unwrap()
        .clone();
    let sha = stdout["sha256"].as_str().unwrap();
    assert_eq!(
        kavi(dir.path(), &["artifact", "cat", &sha[..10]]).stdout,
        b"hello\n"
    );
    // A line of output is kept in the ledger, not in a file of its own; altered there, it is
    // refused on reading and reported by `ledger verify`.
    assert_eq!(stdout["path"], "");
    let mut ledger = common::LedgerConnection::open(dir.path());
    let set_content = |ledger: &mut common::LedgerConnection, text: &str| {
        ledger.execute(
            &format!(
                "UPDATE artifact_contents SET content = CAST('{text}\n' AS BLOB) WHERE sha256 = ?1"
            ),
            &format!(
                "UPDATE artifact_contents SET content = convert_to('{text}' || chr(10), 'UTF8') \
                 WHERE sha256 = $1"
            ),
            sha,
        )
    };
    assert_eq!(set_content(&mut ledger, "HELLO"), 1);
    let refused = kavi(dir.path(), &["artifact", "cat", sha]);
    assert_eq!(refused.status.code(), Some(4));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("was altered"));
    let verify = kavi(dir.path(), &["ledger", "verify"]);
    assert_eq!(verify.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&verify.stdout).contains(&format!(
            "artifact {sha}: the content the ledger keeps no longer hashes to its name"
        )),
        "{}",
        String::from_utf8_lossy(&verify.stdout)
    );
    set_content(&mut ledger, "hello");

    // Filters.
    let listed = |args: &[&str]| {
        let mut command = vec!["runs", "list", "--json"];
        command.extend(args);
        json(&kavi(dir.path(), &command))
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["pipeline"].as_str().unwrap().to_owned())
            .collect::<Vec<_>>()
    };
    assert_eq!(listed(&["--status", "failed"]), ["fail"]);
    assert_eq!(listed(&["--pipeline", "talk"]), ["talk"]);
    assert_eq!(listed(&["--since", "1h"]), ["fail", "talk"]);
    assert_eq!(
        kavi(dir.path(), &["runs", "list", "--status", "nope"])
            .status
            .code(),
        Some(2)
    );

    // Listings check each file; a broken one is shown with its problem (exit 3).
    let pipelines = json(&kavi(dir.path(), &["pipeline", "list", "--json"]));
    assert_eq!(pipelines[1]["name"], "talk");
    assert_eq!(pipelines[1]["nodes"], 1);
    assert_eq!(pipelines[1]["description"], "says things");
    write(dir.path(), "pipelines/zbroken.toml", "[pipeline\n");
    let broken = kavi(dir.path(), &["pipeline", "list"]);
    assert_eq!(broken.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&broken.stdout).contains("pipelines/zbroken.toml  INVALID: "));
}

/// `--stream` prints what a node writes while it runs, after the node's id, with its secrets
/// hidden; off a terminal, every node's start is a line too.
#[test]
fn stream_shows_node_output_while_the_node_runs_with_secrets_hidden() {
    use std::io::BufRead;
    let dir = workspace();
    write(
        dir.path(),
        "pipelines/talk.toml",
        r#"
[pipeline]
name = "talk"

[nodes.talk]
kind = "exec"
# Says it is ready, then waits until the test has seen that line: the line was printed live.
shell = 'echo "ready $API_TOKEN"; while [ ! -e go ]; do sleep 0.02; done; echo done >&2; printf tail'
secrets = ["API_TOKEN"]

[nodes.after]
kind = "exec"
needs = ["talk"]
run = ["true"]
"#,
    );
    let mut child = kavi_command(dir.path(), &["pipeline", "run", "talk", "--stream"])
        .env("API_TOKEN", "sk-live-987")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut seen = Vec::new();
    loop {
        let mut line = String::new();
        assert_ne!(stdout.read_line(&mut line).unwrap(), 0, "{seen:?}");
        seen.push(line.trim_end().to_owned());
        if line.starts_with("talk | ready") {
            break;
        }
    }
    std::fs::write(dir.path().join("go"), "").unwrap();
    let mut remaining = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut remaining).unwrap();
    seen.extend(remaining.lines().map(str::to_owned));
    let rest = child.wait_with_output().unwrap();
    assert!(rest.status.success());
    let stderr = String::from_utf8_lossy(&rest.stderr);
    // stdout: what the node wrote there, then the run's result; its progress is on stderr.
    assert_eq!(seen[0], "talk | ready [redacted]", "{seen:?}");
    assert_eq!(seen[1], "talk | tail", "{seen:?}");
    assert!(seen[2].starts_with("run 1 succeeded"), "{seen:?}");
    let progress: Vec<&str> = stderr.lines().collect();
    assert_eq!(progress[1], "  ..     talk started", "{stderr}");
    assert_eq!(progress[2], "talk | done", "{stderr}");
    assert!(
        progress[3].starts_with("  ok     talk succeeded"),
        "{stderr}"
    );
    assert_eq!(progress[4], "  ..     after started", "{stderr}");
    assert!(!format!("{seen:?}{stderr}").contains("sk-live-987"));
}

/// Fix and resume: the nodes that succeeded are reused (a counter proves the expensive one ran
/// once), the failed node and what needs it run, and `explain` says why; a change to the files
/// that govern the run is refused unless allowed.
#[test]
fn resume_reruns_only_what_failed_and_what_needs_it() {
    let dir = workspace();
    write(
        dir.path(),
        "pipelines/fix.toml",
        r#"
[pipeline]
name = "fix"

[nodes.expensive]
kind = "exec"
shell = "echo ran >> count.txt; echo 42"

[nodes.flaky]
kind = "exec"
needs = ["expensive"]
env = { GOT = "{{ nodes.expensive.outputs.stdout | trim }}" }
# What "fixed" it is out of the governing set: no word of the command names the marker's path.
shell = 'find . -name marker | grep -q . && echo "got $GOT"'

[nodes.after]
kind = "exec"
needs = ["flaky"]
run = ["echo", "{{ nodes.flaky.outputs.stdout | trim }}"]
"#,
    );
    let failed = kavi(dir.path(), &["pipeline", "run", "fix"]);
    assert_eq!(failed.status.code(), Some(1));
    std::fs::create_dir(dir.path().join("state")).unwrap();
    std::fs::write(dir.path().join("state/marker"), "").unwrap();

    let resumed = kavi(dir.path(), &["runs", "resume", "1", "--json"]);
    assert!(
        resumed.status.success(),
        "{}",
        String::from_utf8_lossy(&resumed.stderr)
    );
    let detail = json(&kavi(dir.path(), &["runs", "show", "2", "--json"]));
    assert_eq!(detail["resumed_from"], 1);
    assert_eq!(
        nodes_by_state(&detail),
        [
            ("expensive".into(), "reused".into()),
            ("flaky".into(), "succeeded".into()),
            ("after".into(), "succeeded".into()),
        ]
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("count.txt")).unwrap(),
        "ran\n",
        "the expensive node ran once"
    );
    // The reused node run points at the one it reused, whose outputs and logs it shows.
    let first = json(&kavi(dir.path(), &["runs", "show", "1", "--json"]));
    assert_eq!(
        node(&detail, "expensive")["reused_from"],
        node(&first, "expensive")["id"]
    );
    assert_eq!(node(&detail, "after")["outputs"]["stdout"], "got 42\n");
    let logs = kavi(dir.path(), &["runs", "logs", "2", "expensive"]);
    assert_eq!(String::from_utf8_lossy(&logs.stdout), "42\n");
    let shown =
        String::from_utf8_lossy(&kavi(dir.path(), &["runs", "show", "2"]).stdout).into_owned();
    assert!(shown.contains("reused from run 1"), "{shown}");

    // explain says why each node did what it did.
    let explained = |run: &str, node: &str| {
        let out = kavi(dir.path(), &["explain", run, node]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let blocked = explained("1", "after");
    assert!(
        blocked.contains("it did not run: needs `flaky`, which failed"),
        "{blocked}"
    );
    let reused = explained("2", "expensive");
    assert!(
        reused.contains("of run 1, which this run resumes"),
        "{reused}"
    );
    let ran = explained("2", "flaky");
    assert!(
        ran.contains("it ran") && ran.contains("needs `expensive`: reused"),
        "{ran}"
    );
    let typo = kavi(dir.path(), &["explain", "2", "flakey"]);
    assert_eq!(typo.status.code(), Some(5));
    assert!(String::from_utf8_lossy(&typo.stderr).contains("did you mean `flaky`?"));

    // Nothing to resume in a run that succeeded.
    let again = kavi(dir.path(), &["runs", "resume", "2"]);
    assert!(String::from_utf8_lossy(&again.stdout).contains("nothing to resume"));

    // A governing file changed since: refused, naming it, unless allowed.
    std::fs::remove_file(dir.path().join("state/marker")).unwrap();
    assert_eq!(
        kavi(dir.path(), &["pipeline", "run", "fix"]).status.code(),
        Some(1)
    );
    write(dir.path(), "kavi.toml", "skill_timeout = \"90s\"\n");
    let refused = kavi(dir.path(), &["runs", "resume", "latest"]);
    assert_eq!(refused.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("changed kavi.toml (config)"), "{stderr}");
    std::fs::write(dir.path().join("state/marker"), "").unwrap();
    let allowed = kavi(dir.path(), &["runs", "resume", "3", "--allow-changed"]);
    assert!(allowed.status.success());
    assert_eq!(
        std::fs::read_to_string(dir.path().join("count.txt")).unwrap(),
        "ran\nran\n"
    );
    common::assert_ledger_verifies(dir.path());
}

/// Up-to-date nodes: an unchanged node is cached (a counter proves it ran once) and its output
/// file put back; touching an input reruns it and `explain` names the input; `--no-cache`,
/// `cache = false` and a pruned source behave as documented; bad declarations are refused.
#[test]
fn a_node_with_unchanged_inputs_is_cached_and_explain_names_what_changed() {
    let dir = workspace();
    std::fs::create_dir(dir.path().join("src")).unwrap();
    write(dir.path(), "src/a.txt", "alpha\n");
    write(dir.path(), "src/b.txt", "beta\n");
    write(
        dir.path(),
        "pipelines/make.toml",
        r#"
[pipeline]
name = "make"

[nodes.build]
kind = "exec"
shell = "echo ran >> count.txt; mkdir -p out; cat src/*.txt > out/all.txt; wc -l < out/all.txt"
inputs = ["src/*.txt"]
outputs = ["out/all.txt"]

[nodes.report]
kind = "exec"
needs = ["build"]
run = ["echo", "lines: {{ nodes.build.outputs.stdout | trim }}"]

[nodes.always]
kind = "exec"
shell = "echo ran >> always.txt"
inputs = ["src"]
cache = false
"#,
    );
    let run = |args: &[&str]| {
        let mut all = vec!["pipeline", "run", "make", "--json"];
        all.extend_from_slice(args);
        let out = kavi(dir.path(), &all);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        json(&out)
    };
    let count = || std::fs::read_to_string(dir.path().join("count.txt")).unwrap();
    let first = run(&[]);
    assert_eq!(node(&first, "build")["state"], "succeeded");
    let second = run(&[]);
    assert_eq!(
        nodes_by_state(&second),
        [
            ("build".into(), "cached".into()),
            ("report".into(), "succeeded".into()),
            ("always".into(), "succeeded".into()),
        ]
    );
    assert_eq!(count(), "ran\n", "the cached node ran once");
    assert_eq!(node(&second, "report")["outputs"]["stdout"], "lines: 2\n");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("always.txt")).unwrap(),
        "ran\nran\n",
        "`cache = false` always runs"
    );
    // Its logs are the ones it recorded when it ran.
    let logs = kavi(dir.path(), &["runs", "logs", "2", "build"]);
    assert_eq!(String::from_utf8_lossy(&logs.stdout), "2\n");

    // A removed (or altered) output file is put back from the store.
    std::fs::write(dir.path().join("out/all.txt"), "tampered\n").unwrap();
    assert_eq!(node(&run(&[]), "build")["state"], "cached");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("out/all.txt")).unwrap(),
        "alpha\nbeta\n"
    );

    // Touching an input reruns it, and explain names the input.
    write(dir.path(), "src/a.txt", "alpha\nagain\n");
    let touched = run(&[]);
    assert_eq!(node(&touched, "build")["state"], "succeeded");
    assert_eq!(count(), "ran\nran\n");
    let explained = kavi(dir.path(), &["explain", "latest", "build"]);
    let text = String::from_utf8_lossy(&explained.stdout).into_owned();
    assert!(
        text.contains("no earlier run of it with this key succeeded"),
        "{text}"
    );
    assert!(text.contains("input `src/a.txt` changed"), "{text}");
    assert!(!text.contains("src/b.txt"), "{text}");
    let cached = kavi(dir.path(), &["explain", "3", "build"]);
    let text = String::from_utf8_lossy(&cached.stdout).into_owned();
    assert!(text.contains("it was not run: node run"), "{text}");
    // A new input file is named as one.
    write(dir.path(), "src/c.txt", "gamma\n");
    run(&[]);
    let explained = json(&kavi(dir.path(), &["explain", "latest", "build", "--json"]));
    assert_eq!(
        explained["cache"]["changed"],
        serde_json::json!(["input `src/c.txt` is new"])
    );

    // --no-cache runs it, and says so.
    assert_eq!(node(&run(&["--no-cache"]), "build")["state"], "succeeded");
    assert_eq!(count(), "ran\nran\nran\nran\n");
    let explained = kavi(dir.path(), &["explain", "latest", "build"]);
    assert!(String::from_utf8_lossy(&explained.stdout).contains("--no-cache"));

    // Its source pruned, a later cached node run still serves, with its stored output.
    let pruned = kavi(dir.path(), &["gc", "--older-than", "0s", "--keep", "1"]);
    assert!(
        pruned.status.success(),
        "{}",
        String::from_utf8_lossy(&pruned.stderr)
    );
    assert_eq!(node(&run(&[]), "build")["state"], "cached");
    std::fs::remove_file(dir.path().join("out/all.txt")).unwrap();
    let kept = kavi(dir.path(), &["gc", "--older-than", "0s", "--keep", "1"]);
    assert!(kept.status.success());
    assert_eq!(node(&run(&[]), "build")["state"], "cached");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("out/all.txt")).unwrap(),
        "alpha\nagain\nbeta\ngamma\n"
    );
    assert_eq!(count().lines().count(), 4);
    common::assert_ledger_verifies(dir.path());

    // A declared output the node did not write fails it.
    write(
        dir.path(),
        "pipelines/liar.toml",
        r#"
[pipeline]
name = "liar"

[nodes.liar]
kind = "exec"
run = ["true"]
inputs = ["src"]
outputs = ["out/never.txt"]
"#,
    );
    let liar = kavi(dir.path(), &["pipeline", "run", "liar", "--json"]);
    assert_eq!(liar.status.code(), Some(1));
    let liar: Value = serde_json::from_slice(&liar.stdout).unwrap();
    assert_eq!(
        node(&liar, "liar")["error"],
        "declared output `out/never.txt` was not written"
    );

    // Declarations that cannot work are refused where they are written.
    for (field, message) in [
        ("outputs = [\"x.txt\"]", "`outputs` without `inputs`"),
        ("inputs = [\"../secret\"]", "`../secret` contains `..`"),
        ("inputs = [\"/etc/passwd\"]", "is absolute"),
        (
            "inputs = [\"src\"]\noutputs = [\"out/*.txt\"]",
            "`outputs` name files",
        ),
        ("inputs = [\"src/[a\"]", "invalid glob"),
    ] {
        write(
            dir.path(),
            "pipelines/bad.toml",
            &format!(
                "[pipeline]\nname = \"bad\"\n\n[nodes.a]\nkind = \"exec\"\nrun = [\"true\"]\n{field}\n"
            ),
        );
        let out = kavi(dir.path(), &["pipeline", "check", "bad"]);
        assert_eq!(out.status.code(), Some(3), "{field}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(message), "{field}: {stderr}");
        assert!(stderr.contains("pipelines/bad.toml:"), "{field}: {stderr}");
    }
}

/// Real work's files. An output past what the ledger keeps is copied into the store as it is
/// hashed, and put back from it with a new file's permissions; a stored copy altered since makes
/// the node run again. Hashing a large input, which the loop once did itself, holds up no other
/// node: one that prints a megabyte (more than its pipe holds, so it ends only once kavi reads)
/// ends while the key of a node with 1 GiB of input is still being made.
#[test]
fn large_files_are_stored_hashed_and_put_back_in_a_stream_off_the_loop() {
    let dir = workspace();
    std::fs::create_dir(dir.path().join("data")).unwrap();
    write(dir.path(), "data/seed.txt", "1\n");
    // Sparse: as long to hash as 1 GiB of data, and nothing on disk.
    std::fs::File::create(dir.path().join("data/big.bin"))
        .unwrap()
        .set_len(1 << 30)
        .unwrap();
    write(
        dir.path(),
        "pipelines/big.toml",
        r#"
[pipeline]
name = "big"

[nodes.model]
kind = "exec"
shell = "mkdir -p out; seq 1 400000 > out/model.bin"
inputs = ["data/seed.txt"]
outputs = ["out/model.bin"]

[nodes.hashed]
kind = "exec"
run = ["true"]
inputs = ["data/big.bin"]

[nodes.quick]
kind = "exec"
shell = "yes | head -c 1048576"
"#,
    );
    let run = || {
        let out = kavi(
            dir.path(),
            &["pipeline", "run", "big", "--json", "--jobs", "4"],
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        json(&out)
    };
    let model = dir.path().join("out/model.bin");
    let first = run();
    assert_eq!(
        nodes_by_state(&first),
        [
            ("model".into(), "succeeded".into()),
            ("hashed".into(), "succeeded".into()),
            ("quick".into(), "succeeded".into()),
        ]
    );
    let (quick_end, hashed_start) = (
        node(&first, "quick")["finished_at"].as_str().unwrap(),
        node(&first, "hashed")["started_at"].as_str().unwrap(),
    );
    assert!(
        quick_end < hashed_start,
        "`quick` ended at {quick_end}, after `hashed` started at {hashed_start}: its output \
         waited for the hashing"
    );
    let made = std::fs::read(&model).unwrap();
    let output = node(&first, "model")["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["role"] == "output")
        .unwrap()
        .clone();
    assert_eq!(output["size"], made.len());
    let stored = dir
        .path()
        .join(".kavi/artifacts")
        .join(output["path"].as_str().unwrap());
    assert_eq!(std::fs::read(&stored).unwrap(), made, "a file in the store");

    // Gone from the workspace: put back, the same bytes, made as a new file would be.
    std::fs::remove_file(&model).unwrap();
    let second = run();
    assert_eq!(node(&second, "model")["state"], "cached");
    assert_eq!(node(&second, "hashed")["state"], "cached");
    assert_eq!(std::fs::read(&model).unwrap(), made);
    use std::os::unix::fs::PermissionsExt;
    let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
    let fresh = write(dir.path(), "out/fresh.txt", "");
    assert_eq!(mode(&model), mode(&fresh), "not a temporary file's 0600");

    // The store's copy altered: refused as it is copied, and the node runs again.
    let mut altered = std::fs::read(&stored).unwrap();
    altered[0] = b'9';
    let mut permissions = std::fs::metadata(&stored).unwrap().permissions();
    permissions.set_mode(0o644);
    std::fs::set_permissions(&stored, permissions).unwrap();
    std::fs::write(&stored, &altered).unwrap();
    let sha256 = output["sha256"].as_str().unwrap();
    if common::postgres::ledger_for(dir.path()).is_some() {
        // A server ledger keeps every artifact's content: the local store is a cache, and an
        // altered copy in it is fetched again from the server, checked, and put back
        // (tests/integration/distributed.rs refuses an altered copy on the server).
        let fetched = kavi(dir.path(), &["artifact", "cat", sha256]);
        assert_eq!(fetched.status.code(), Some(0), "{fetched:?}");
        assert_eq!(fetched.stdout, made);
        assert_eq!(
            std::fs::read(&stored).unwrap(),
            made,
            "the cache is put back"
        );
        return;
    }
    // Printed, it is refused before a byte of it is.
    let refused = kavi(dir.path(), &["artifact", "cat", sha256]);
    assert_eq!(refused.status.code(), Some(4));
    assert!(refused.stdout.is_empty());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("was altered"));
    std::fs::write(&model, "kept\n").unwrap();
    let third = run();
    assert_eq!(node(&third, "model")["state"], "succeeded");
    assert_eq!(std::fs::read(&model).unwrap(), made);
    let explained = kavi(dir.path(), &["explain", "latest", "model"]);
    let text = String::from_utf8_lossy(&explained.stdout).into_owned();
    assert!(
        text.contains("the stored copy of output `out/model.bin` is unusable")
            && text.contains("was altered"),
        "{text}"
    );
    assert_eq!(
        std::fs::read_dir(dir.path().join(".kavi/artifacts/tmp"))
            .unwrap()
            .count(),
        0,
        "no staged copy is left behind"
    );
    // Its output stored again replaced the altered copy: the next run takes it.
    assert!(
        std::fs::read(&stored).unwrap() == made,
        "the store's copy is still the altered one"
    );
    std::fs::remove_file(&model).unwrap();
    assert_eq!(node(&run(), "model")["state"], "cached");
    assert_eq!(std::fs::read(&model).unwrap(), made);
}

/// A large input unchanged since the last run is recognised by its identity and times, not read
/// again; a change disguised as none (same size, modification time put back) is still seen.
#[test]
fn an_unchanged_large_input_is_not_read_again_and_a_disguised_change_is_seen() {
    use std::os::unix::fs::MetadataExt;
    let dir = workspace();
    std::fs::create_dir(dir.path().join("data")).unwrap();
    let big = dir.path().join("data/big.bin");
    std::fs::write(&big, vec![b'a'; 2 << 20]).unwrap();
    let written = std::time::Instant::now();
    write(
        dir.path(),
        "pipelines/big.toml",
        r#"
[pipeline]
name = "big"

[nodes.use]
kind = "exec"
run = ["true"]
inputs = ["data/big.bin"]
"#,
    );
    let run = || {
        let out = kavi(dir.path(), &["pipeline", "run", "big", "--json"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        node(&json(&out), "use")["state"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let memos = || {
        std::fs::read_dir(dir.path().join(".kavi/artifacts/digests"))
            .map_or(Vec::new(), |entries| {
                entries.map(|e| e.unwrap().path()).collect()
            })
    };
    // Just written, the file may yet change within one tick of the file system's clock without
    // its times showing it: it is read, and nothing is remembered.
    let settled = std::time::Duration::from_secs(2);
    assert_eq!(run(), "succeeded");
    if written.elapsed() < settled {
        assert!(memos().is_empty(), "{:?}", memos());
    } else {
        eprintln!(
            "not checked that a file changed under 2 s ago is not remembered: the first run \
             ended {:?} after the file was written",
            written.elapsed()
        );
    }
    // Settled (a change time can only be waited out, not set), it is remembered...
    std::thread::sleep(
        (settled + std::time::Duration::from_millis(100)).saturating_sub(written.elapsed()),
    );
    assert_eq!(run(), "cached");
    let remembered = memos();
    assert_eq!(remembered.len(), 1);
    // ...and what is remembered is what the next run takes, without reading the file: a memo
    // saying otherwise changes the node's key, and it runs.
    let text = std::fs::read_to_string(&remembered[0]).unwrap();
    let digest = text.lines().nth(3).unwrap();
    assert_eq!(digest.len(), 64, "{text}");
    std::fs::write(&remembered[0], text.replace(digest, &"0".repeat(64))).unwrap();
    assert_eq!(run(), "succeeded");
    std::fs::write(&remembered[0], text).unwrap();
    assert_eq!(run(), "cached");

    // The content changed in place, same size, modification time put back: seen, and run.
    let before = std::fs::metadata(&big).unwrap();
    let mut file = std::fs::OpenOptions::new().write(true).open(&big).unwrap();
    std::io::Write::write_all(&mut file, &vec![b'b'; 2 << 20]).unwrap();
    file.set_modified(before.modified().unwrap()).unwrap();
    drop(file);
    let after = std::fs::metadata(&big).unwrap();
    assert_eq!(
        (after.len(), after.mtime(), after.mtime_nsec(), after.ino()),
        (
            before.len(),
            before.mtime(),
            before.mtime_nsec(),
            before.ino()
        )
    );
    assert_eq!(run(), "succeeded");

    // The input gone, `kavi gc` forgets what was remembered of it.
    std::fs::remove_file(&big).unwrap();
    let gc = json(&kavi(dir.path(), &["gc", "--json"]));
    assert_eq!(gc["input_digests"], 1, "{gc}");
    assert!(memos().is_empty(), "{:?}", memos());
}

/// A template a rendered template includes governs the run too: editing it is a change of
/// governance `policy diff` names, and what it reads is checked like its includer's.
#[test]
fn an_included_template_is_governing_and_checked() {
    let dir = workspace();
    write(
        dir.path(),
        "pipelines/report.toml",
        r#"
[pipeline]
name = "report"

[nodes.report]
kind = "render"
template = "report.md.j2"
vars = { title = "Weekly" }
"#,
    );
    write(
        dir.path(),
        "templates/report.md.j2",
        "# {{ vars.title }}\n{% include \"footer.md.j2\" %}\n",
    );
    write(dir.path(), "templates/footer.md.j2", "run {{ run.id }}\n");
    assert!(
        kavi(dir.path(), &["pipeline", "run", "report"])
            .status
            .success()
    );
    let detail = json(&kavi(dir.path(), &["runs", "show", "1", "--json"]));
    let governing: Vec<&str> = detail["governing"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["path"].as_str().unwrap())
        .collect();
    assert!(
        governing.contains(&"templates/footer.md.j2"),
        "{governing:?}"
    );

    write(
        dir.path(),
        "templates/footer.md.j2",
        "run {{ run.id }}, by kavi\n",
    );
    let diff = kavi(dir.path(), &["policy", "diff", "1"]);
    assert_eq!(diff.status.code(), Some(1));
    let said = String::from_utf8_lossy(&diff.stdout);
    assert!(said.contains("changed  templates/footer.md.j2"), "{said}");

    write(dir.path(), "templates/footer.md.j2", "run {{ run.idd }}\n");
    let checked = kavi(dir.path(), &["pipeline", "check", "report"]);
    assert_eq!(checked.status.code(), Some(3));
    let stderr = String::from_utf8_lossy(&checked.stderr);
    assert!(stderr.contains("templates/footer.md.j2:1:8"), "{stderr}");
}

/// The executor records nodes on a thread of its own while they run; a node whose command runs
/// kavi starts only once everything before it is committed, so it reads the run as it is. The
/// test holds the ledger's write lock while `first` ends: the reader may not start until it is
/// released and `first`'s end is committed.
#[test]
fn a_node_that_runs_kavi_starts_once_what_ran_before_it_is_recorded() {
    let dir = workspace();
    let kavi_path = env!("CARGO_BIN_EXE_kavi");
    write(
        dir.path(),
        "pipelines/reads.toml",
        &format!(
            r#"
[pipeline]
name = "reads"

[nodes.first]
kind = "exec"
shell = "echo $$ > started.pid; while [ ! -e go ]; do sleep 0.01; done; echo hello"

[nodes.reader]
kind = "exec"
run = ["sh", "-c", "touch reader.started; exec \"$0\" runs show \"$1\" --json", "{kavi_path}", "{{{{ run.id }}}}"]
stdout = "json"
needs = ["first"]
env = {{ KAVI_LEDGER = "{ledger}" }}
"#,
            // The kavi it runs reads the same ledger (a server's, given to kavi by KAVI_LEDGER).
            ledger = common::postgres::ledger_for(dir.path()).unwrap_or_else(|| dir
                .path()
                .join(".kavi/ledger.db")
                .display()
                .to_string()),
        ),
    );
    let mut run = kavi_command(dir.path(), &["pipeline", "run", "reads"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    wait_for_file(&dir.path().join("started.pid"));
    // The write lock: SQLite's, or the advisory lock kavi's writers take on a server.
    let (take, release) = match common::postgres::ledger_for(dir.path()) {
        None => ("BEGIN IMMEDIATE", "COMMIT"),
        Some(_) => (
            "SELECT pg_advisory_lock(1801549417)",
            "SELECT pg_advisory_unlock(1801549417)",
        ),
    };
    let mut lock = common::LedgerConnection::open(dir.path());
    lock.batch(take);
    std::fs::write(dir.path().join("go"), "").unwrap();
    // Long enough for `first` to end and a reader that did not wait to start.
    std::thread::sleep(Duration::from_secs(1));
    let started_early = dir.path().join("reader.started").exists();
    lock.batch(release);
    assert!(run.wait().unwrap().success());
    assert!(
        !started_early,
        "the reader started before the end of `first` was committed"
    );
    let detail = json(&kavi(dir.path(), &["runs", "show", "--json"]));
    let seen = &detail["nodes"][1]["outputs"]["json"];
    assert_eq!(
        nodes_by_state(seen),
        [
            ("first".into(), "succeeded".into()),
            ("reader".into(), "running".into())
        ],
        "{seen}"
    );
    assert_eq!(seen["nodes"][0]["outputs"]["stdout"], "hello\n");
}

/// A node that runs once per item of a list parameter: the most instances at once its
/// `max_parallel` allows (each counts the instances holding a slot as it starts), each recorded
/// as its own node run with its item, and what needs it sees their outputs as a list.
const FAN_OUT: &str = r#"
[pipeline]
name = "fan"

[params.items]
type = "list"
default = ["a", "b", "c"]

[nodes.fan]
kind = "exec"
for_each = "{{ params.items }}"
max_parallel = 2
env = { ITEM = "{{ item }}" }
shell = "touch \"slots/$ITEM\"; ls slots | wc -l >> seen; sleep 0.5; rm \"slots/$ITEM\"; echo \"$ITEM\" | tr a-z A-Z"

[nodes.report]
kind = "exec"
needs = ["fan"]
run = ["printf", "%s", "{% for o in nodes.fan.outputs %}{{ o.item }}={{ o.stdout | trim }};{% endfor %}"]
"#;

#[test]
fn a_fan_out_runs_an_instance_per_item_at_most_max_parallel_at_once_and_gathers_outputs() {
    let dir = workspace();
    std::fs::create_dir(dir.path().join("slots")).unwrap();
    write(dir.path(), "pipelines/fan.toml", FAN_OUT);
    let out = kavi(dir.path(), &["pipeline", "run", "fan", "--jobs", "8"]);
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let detail = common::last_run(dir.path());
    let states = nodes_by_state(&detail);
    for id in ["fan", "fan[0]", "fan[1]", "fan[2]", "report"] {
        assert!(
            states.contains(&(id.into(), "succeeded".into())),
            "{id}: {states:?}"
        );
    }
    assert_eq!(states.len(), 5, "{states:?}");
    for (i, item) in ["a", "b", "c"].iter().enumerate() {
        let instance = node(&detail, &format!("fan[{i}]"));
        assert_eq!(instance["outputs"]["item"], *item);
        assert_eq!(
            instance["outputs"]["stdout"],
            format!("{}\n", item.to_uppercase())
        );
    }
    assert_eq!(node(&detail, "fan")["outputs"].as_array().unwrap().len(), 3);
    assert_eq!(node(&detail, "report")["outputs"]["stdout"], "a=A;b=B;c=C;");
    let seen = std::fs::read_to_string(dir.path().join("seen")).unwrap();
    let most = seen
        .lines()
        .map(|l| l.trim().parse::<usize>().unwrap())
        .max();
    assert_eq!(most, Some(2), "max_parallel = 2 with --jobs 8: {seen}");

    // A list set on the command line, words between commas.
    let out = kavi(
        dir.path(),
        &["pipeline", "run", "fan", "--set", "items=x,y"],
    );
    assert!(out.status.success());
    let detail = common::last_run(dir.path());
    assert_eq!(node(&detail, "report")["outputs"]["stdout"], "x=X;y=Y;");
}

/// One item fails: the others still run, and the fan-out fails with it, which its
/// `on_failure` then handles as any node's failure.
#[test]
fn a_failing_item_fails_its_fan_out_as_its_on_failure_says() {
    let dir = workspace();
    for on_failure in ["continue", "stop"] {
        write(
            dir.path(),
            "pipelines/items.toml",
            &format!(
                r#"
[pipeline]
name = "items"

[nodes.fan]
kind = "exec"
for_each = [1, 2, 3]
on_failure = "{on_failure}"
env = {{ ITEM = "{{{{ item }}}}" }}
shell = "test \"$ITEM\" != 2"

[nodes.after]
kind = "exec"
needs = ["fan"]
run = ["echo", "{{{{ nodes.fan.state }}}}"]
"#
            ),
        );
        let out = kavi(dir.path(), &["pipeline", "run", "items"]);
        let detail = common::last_run(dir.path());
        let states = nodes_by_state(&detail);
        for (id, state) in [
            ("fan[0]", "succeeded"),
            ("fan[1]", "failed"),
            ("fan[2]", "succeeded"),
            ("fan", "failed"),
        ] {
            assert!(states.contains(&(id.into(), state.into())), "{states:?}");
        }
        assert_eq!(
            node(&detail, "fan")["error"],
            "`fan[1]` failed: exited with code 1",
            "{detail}"
        );
        if on_failure == "continue" {
            assert!(out.status.success());
            assert_eq!(detail["status"], "succeeded");
            assert_eq!(node(&detail, "after")["outputs"]["stdout"], "failed\n");
        } else {
            assert_eq!(out.status.code(), Some(1));
            assert_eq!(detail["status"], "failed");
            assert_eq!(node(&detail, "after")["state"], "blocked");
        }
    }
}

/// Each instance has a key of its own, with its item and not the whole list: a run over a
/// longer list takes the items it already ran from the cache and runs only the new one.
#[test]
fn each_item_of_a_fan_out_is_cached_on_its_own() {
    let dir = workspace();
    write(dir.path(), "data.txt", "data\n");
    write(
        dir.path(),
        "pipelines/cached.toml",
        r#"
[pipeline]
name = "cached"

[params.items]
type = "list"
required = true

[nodes.fan]
kind = "exec"
for_each = "{{ params.items }}"
inputs = ["data.txt"]
env = { ITEM = "{{ item }}" }
shell = "echo \"$ITEM\" >> ran; echo \"$ITEM\""
"#,
    );
    let run = |items: &str| {
        let out = kavi(
            dir.path(),
            &[
                "pipeline",
                "run",
                "cached",
                "--set",
                &format!("items={items}"),
            ],
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        nodes_by_state(&common::last_run(dir.path()))
    };
    run("a,b");
    let states = run(r#"["a", "b", "c"]"#);
    assert_eq!(
        states,
        [
            ("fan".into(), "succeeded".into()),
            ("fan[0]".into(), "cached".into()),
            ("fan[1]".into(), "cached".into()),
            ("fan[2]".into(), "succeeded".into()),
        ]
    );
    // Each item ran once over both runs; the first run's two ran side by side, in either order.
    let ran = std::fs::read_to_string(dir.path().join("ran")).unwrap();
    let mut items: Vec<&str> = ran.lines().collect();
    items.sort_unstable();
    assert_eq!(items, ["a", "b", "c"], "{ran}");
    assert_eq!(ran.lines().last(), Some("c"), "{ran}");
    let detail = common::last_run(dir.path());
    assert_eq!(node(&detail, "fan[1]")["outputs"]["item"], "b");
    assert_eq!(node(&detail, "fan")["outputs"][2]["stdout"], "c\n");
}

/// `for_each` over what an upstream node printed: a JSON array.
#[test]
fn a_fan_out_runs_over_the_json_list_a_node_printed() {
    let dir = workspace();
    write(
        dir.path(),
        "pipelines/listed.toml",
        r#"
[pipeline]
name = "listed"

[nodes.list]
kind = "exec"
run = ["echo", "[\"x\", \"y\"]"]

[nodes.each]
kind = "exec"
needs = ["list"]
for_each = "{{ nodes.list.outputs.stdout }}"
run = ["echo", "got {{ item }}"]

[nodes.word]
kind = "exec"
run = ["echo", "not json"]

[nodes.bad]
kind = "exec"
needs = ["word"]
for_each = "{{ nodes.word.outputs.stdout }}"
run = ["true"]
"#,
    );
    let out = kavi(dir.path(), &["pipeline", "run", "listed"]);
    assert_eq!(out.status.code(), Some(1));
    let detail = common::last_run(dir.path());
    let each = node(&detail, "each")["outputs"].clone();
    assert_eq!(each[0]["stdout"], "got x\n");
    assert_eq!(each[1]["stdout"], "got y\n");
    let bad = node(&detail, "bad");
    assert_eq!(bad["state"], "failed");
    let error = bad["error"].as_str().unwrap();
    assert!(
        error.starts_with(
            "`for_each` (nodes.word.outputs.stdout) gave text that is not a JSON array"
        ),
        "{error}"
    );
}

/// Pipelines naming one concurrency group (limit 1), each holding it with a node that counts the
/// runs inside as it starts.
fn grouped(dir: &Path, name: &str, on_conflict: &str) {
    write(
        dir,
        &format!("pipelines/{name}.toml"),
        &format!(
            "[pipeline]\nname = \"{name}\"\nconcurrency = {{ group = \"deploy\", on_conflict = \"{on_conflict}\" }}\n\
             [nodes.hold]\nkind = \"exec\"\n\
             shell = \"touch slots/{name}; ls slots | wc -l >> seen; sleep 1; rm slots/{name}\"\n"
        ),
    );
}

/// Two runs in one concurrency group of limit 1, each its own kavi process: the second waits
/// for the first (`queue`), so their nodes never overlap; with `refuse` it starts nothing.
#[test]
fn a_concurrency_group_holds_its_runs_to_its_limit_across_processes() {
    let dir = workspace();
    std::fs::create_dir(dir.path().join("slots")).unwrap();
    grouped(dir.path(), "first", "queue");
    grouped(dir.path(), "second", "queue");
    grouped(dir.path(), "third", "refuse");
    let start_first = || {
        let _ = std::fs::remove_file(dir.path().join("seen"));
        let first = kavi_command(dir.path(), &["pipeline", "run", "first"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // Its node runs: it holds the group.
        wait_for_file(&dir.path().join("seen"));
        first
    };

    let mut first = start_first();
    let second = kavi(dir.path(), &["pipeline", "run", "second"]);
    assert!(first.wait().unwrap().success());
    assert!(second.status.success());
    let waited = String::from_utf8_lossy(&second.stderr);
    assert!(
        waited.contains("concurrency group `deploy` is full: 1 run(s) at once")
            && waited.contains("waiting for a slot"),
        "{waited}"
    );
    let seen = std::fs::read_to_string(dir.path().join("seen")).unwrap();
    assert_eq!(
        seen.split_whitespace().collect::<Vec<_>>(),
        ["1", "1"],
        "runs overlapped"
    );

    let mut first = start_first();
    let third = kavi(dir.path(), &["pipeline", "run", "third"]);
    assert!(first.wait().unwrap().success());
    assert_eq!(third.status.code(), Some(2));
    let refused = String::from_utf8_lossy(&third.stderr);
    assert!(
        refused.contains("concurrency group `deploy` is full")
            && refused.contains("`on_conflict = \"refuse\"` starts nothing"),
        "{refused}"
    );
    let runs = json(&kavi(dir.path(), &["runs", "list", "--json"]));
    let pipelines: Vec<&str> = runs
        .as_array()
        .unwrap()
        .iter()
        .map(|run| run["pipeline"].as_str().unwrap())
        .collect();
    assert!(!pipelines.contains(&"third"), "{pipelines:?}");
    assert_eq!(pipelines.len(), 3, "{pipelines:?}");
}

/// `cancel-running`: the newest run of the group cancels the one holding it, as SIGTERM does,
/// and runs once it has ended.
#[test]
fn a_run_whose_group_says_cancel_running_cancels_the_run_holding_it() {
    let dir = workspace();
    write(
        dir.path(),
        "pipelines/long.toml",
        "[pipeline]\nname = \"long\"\nconcurrency = { group = \"deploy\" }\n\
         [nodes.hold]\nkind = \"exec\"\nshell = \"echo started > started; sleep 30\"\n",
    );
    write(
        dir.path(),
        "pipelines/newest.toml",
        "[pipeline]\nname = \"newest\"\n\
         concurrency = { group = \"deploy\", on_conflict = \"cancel-running\" }\n\
         [nodes.go]\nkind = \"exec\"\nrun = [\"true\"]\n",
    );
    let mut long = kavi_command(dir.path(), &["pipeline", "run", "long"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for_file(&dir.path().join("started"));
    let newest = kavi(dir.path(), &["pipeline", "run", "newest"]);
    assert!(
        newest.status.success(),
        "{}",
        String::from_utf8_lossy(&newest.stderr)
    );
    assert_eq!(long.wait().unwrap().code(), Some(143));
    let long = json(&kavi(dir.path(), &["runs", "show", "1", "--json"]));
    assert_eq!(long["status"], "cancelled");
    assert_eq!(common::last_run(dir.path())["status"], "succeeded");
}

/// A pipeline `name` whose node `deploy` is in concurrency group `deploy` (limit 1), beside a
/// node `free` in none. `deploy` counts the node runs of the group inside as it starts, writes
/// `holding-NAME` and, when `hold`, stays until the file `release` appears.
fn grouped_node(dir: &Path, name: &str, on_conflict: &str, hold: bool) {
    let until = if hold {
        "until [ -e release ]; do sleep 0.05; done; "
    } else {
        ""
    };
    write(
        dir,
        &format!("pipelines/{name}.toml"),
        &format!(
            "[pipeline]\nname = \"{name}\"\n\
             [nodes.free]\nkind = \"exec\"\nrun = [\"true\"]\n\
             [nodes.deploy]\nkind = \"exec\"\n\
             concurrency = {{ group = \"deploy\", on_conflict = \"{on_conflict}\" }}\n\
             shell = \"touch slots/{name}; ls slots | wc -l >> seen; echo held > holding-{name}; \
             {until}rm slots/{name}\"\n"
        ),
    );
}

/// Starts a run of `name` (from [`grouped_node`]) in the background, once its `deploy` holds
/// the group.
fn start_holding(dir: &Path, name: &str) -> std::process::Child {
    let holding = dir.join(format!("holding-{name}"));
    let _ = std::fs::remove_file(&holding);
    let run = kavi_command(dir, &["pipeline", "run", name])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for_file(&holding);
    run
}

/// The run's JSON, once `ready` holds for it (a run in another process, seen as it goes).
fn run_when(dir: &Path, run: &str, ready: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let shown = kavi(dir, &["runs", "show", run, "--json"]);
        if shown.status.success() {
            let detail: Value = serde_json::from_slice(&shown.stdout).unwrap();
            if ready(&detail) {
                return detail;
            }
        }
        assert!(Instant::now() < deadline, "run {run} never got there");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Two pipelines whose `deploy` nodes share a concurrency group of limit 1, run by two kavi
/// processes: the second's `deploy` waits, recorded on its row and said on stderr, while its
/// other node runs; the two never overlap, and the wait's note is gone once it ran.
#[test]
fn a_node_concurrency_group_holds_node_runs_to_its_limit_across_processes() {
    let dir = workspace();
    std::fs::create_dir(dir.path().join("slots")).unwrap();
    grouped_node(dir.path(), "first", "queue", true);
    grouped_node(dir.path(), "second", "queue", true);
    let mut first = start_holding(dir.path(), "first");
    let second = kavi_command(dir.path(), &["pipeline", "run", "second"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let waiting = run_when(dir.path(), "2", |run| {
        node(run, "deploy")["reason"]
            .as_str()
            .is_some_and(|reason| reason.starts_with("waiting: "))
            && node(run, "free")["state"] == "succeeded"
    });
    let deploy = node(&waiting, "deploy");
    assert_eq!(deploy["state"], "pending");
    let reason = deploy["reason"].as_str().unwrap();
    assert!(
        reason.starts_with(
            "waiting: concurrency group `deploy` is full: 1 node run(s) at once, held by kavi process "
        ),
        "{reason}"
    );
    assert!(!dir.path().join("holding-second").exists());
    write(dir.path(), "release", "");
    assert!(exit_within(&mut first, 60, "the first run never ended").success());
    let second = second.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(second.status.success(), "{stderr}");
    assert!(
        stderr.contains("deploy waits: concurrency group `deploy` is full: 1 node run(s) at once"),
        "{stderr}"
    );
    let seen = std::fs::read_to_string(dir.path().join("seen")).unwrap();
    assert_eq!(
        seen.split_whitespace().collect::<Vec<_>>(),
        ["1", "1"],
        "node runs overlapped"
    );
    let done = json(&kavi(dir.path(), &["runs", "show", "2", "--json"]));
    assert_eq!(node(&done, "deploy")["state"], "succeeded");
    assert_eq!(node(&done, "deploy")["reason"], Value::Null);
}

/// A node holding a slot of its group whose kavi is killed (-9) frees it: the next node of the
/// group runs at once. `refuse` fails the node (not the run's other nodes), naming the holder;
/// `cancel-running` cancels the run holding the group.
#[test]
fn a_node_group_slot_is_freed_by_a_killed_holder_and_refused_or_taken_over_on_conflict() {
    let dir = workspace();
    std::fs::create_dir(dir.path().join("slots")).unwrap();
    grouped_node(dir.path(), "holder", "queue", true);
    grouped_node(dir.path(), "refused", "refuse", false);
    grouped_node(dir.path(), "taker", "cancel-running", false);
    grouped_node(dir.path(), "after", "queue", false);

    let mut holder = start_holding(dir.path(), "holder");
    let refused = kavi(dir.path(), &["pipeline", "run", "refused"]);
    assert_eq!(refused.status.code(), Some(1));
    let run = common::last_run(dir.path());
    assert_eq!(node(&run, "free")["state"], "succeeded");
    let deploy = node(&run, "deploy");
    assert_eq!(deploy["state"], "failed");
    let error = deploy["error"].as_str().unwrap();
    assert!(
        error.contains(&format!("held by kavi process {}", holder.id()))
            && error.ends_with("this node's `on_conflict = \"refuse\"` runs nothing"),
        "{error}"
    );

    // Killed: its node's process stays (recovery's to stop), the slot goes with kavi.
    holder.kill().unwrap();
    holder.wait().unwrap();
    let mut after = kavi_command(dir.path(), &["pipeline", "run", "after"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let status = exit_within(&mut after, 60, "the killed holder's slot was never freed");
    write(dir.path(), "release", "");
    assert!(status.success());
    assert_eq!(
        node(&common::last_run(dir.path()), "deploy")["state"],
        "succeeded"
    );

    std::fs::remove_file(dir.path().join("release")).unwrap();
    let mut holder = start_holding(dir.path(), "holder");
    let taker = kavi(dir.path(), &["pipeline", "run", "taker"]);
    let stderr = String::from_utf8_lossy(&taker.stderr);
    assert!(taker.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "deploy: cancelling the run of kavi process {}",
            holder.id()
        )),
        "{stderr}"
    );
    assert_eq!(
        exit_within(&mut holder, 60, "the holding run was never cancelled").code(),
        Some(143)
    );
}
