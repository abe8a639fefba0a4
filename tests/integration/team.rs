//! Several machines on one ledger (issue 56): node attempts claimed once, a step killed midway,
//! a server that never answers, and machines set up differently. Real `kavi` processes, a real
//! ledger file or the tests' PostgreSQL server; another machine is another `TMPDIR` and another
//! spelling of the server's URL.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

use crate::common::{self, json};
use serde_json::Value;

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

fn start(root: &Path, ledger: Option<&str>) -> String {
    let started = kavi_on(root, ledger, &["pipeline", "start", "slow"])
        .output()
        .unwrap();
    assert_eq!(started.status.code(), Some(0), "{}", text(&started));
    String::from_utf8_lossy(&started.stdout).trim().to_owned()
}

fn node_rows(root: &Path, ledger: Option<&str>, run: &str) -> Vec<Value> {
    let shown = kavi_on(root, ledger, &["runs", "show", run, "--json"])
        .output()
        .unwrap();
    json(&shown)["nodes"].as_array().unwrap().clone()
}

/// Waits until the run's node is recorded `running`, as `runs show` says while a step runs it.
fn wait_until_running(root: &Path, ledger: Option<&str>, run: &str) {
    for _ in 0..300 {
        if node_rows(root, ledger, run)
            .iter()
            .any(|row| row["state"] == "running")
        {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    panic!("the node was never shown running while its step ran");
}

/// Two workers step the same node at once, on a file and on a server: one runs it, the other
/// says who has it, waits for its end and exits as it did; one attempt is recorded, whole.
#[test]
fn two_steps_of_one_node_run_it_once() {
    let server = common::postgres::database();
    for ledger in [None, server.as_deref()] {
        let dir = workspace_with(SLOW);
        let root = dir.path();
        let run = start(root, ledger);
        let step = ["pipeline", "step", "slow", "--run", &run, "slow"];
        let first = spawn(kavi_on(root, ledger, &step));
        wait_until_running(root, ledger, &run);
        let second = spawn(kavi_on(root, ledger, &step));
        let (first, second) = (
            first.wait_with_output().unwrap(),
            second.wait_with_output().unwrap(),
        );
        assert_eq!(first.status.code(), Some(0), "{}", text(&first));
        assert_eq!(second.status.code(), Some(0), "{}", text(&second));
        assert!(
            text(&second).contains("attempt 1 is claimed by"),
            "{}",
            text(&second)
        );
        assert_eq!(
            std::fs::read_to_string(root.join("runs.txt")).unwrap(),
            "ran\n"
        );
        let rows = node_rows(root, ledger, &run);
        assert_eq!(rows.len(), 1, "{rows:?}");
        assert_eq!(rows[0]["state"], "succeeded");
        let end = kavi_on(root, ledger, &["pipeline", "end", "slow", "--run", &run])
            .output()
            .unwrap();
        assert_eq!(end.status.code(), Some(0), "{}", text(&end));
        let verify = kavi_on(root, ledger, &["ledger", "verify"])
            .output()
            .unwrap();
        assert_eq!(verify.status.code(), Some(0), "{}", text(&verify));
    }
}

/// A step killed in the middle of its node leaves the node `running`, claimed; `pipeline end`
/// records it `interrupted`, as the docs say, and the run too.
#[test]
fn a_step_killed_midway_leaves_its_node_interrupted() {
    let dir = workspace_with(SLOW);
    let root = dir.path();
    let run = start(root, None);
    let mut step = spawn(kavi_on(
        root,
        None,
        &["pipeline", "step", "slow", "--run", &run, "slow"],
    ));
    wait_until_running(root, None, &run);
    step.kill().unwrap();
    step.wait().unwrap();
    let end = kavi_on(
        root,
        None,
        &["pipeline", "end", "slow", "--run", &run, "--json"],
    )
    .output()
    .unwrap();
    assert_eq!(end.status.code(), Some(1), "{}", text(&end));
    let detail: Value = serde_json::from_slice(&end.stdout).unwrap();
    assert_eq!(detail["status"], "interrupted");
    assert_eq!(detail["nodes"][0]["state"], "interrupted");
    assert_eq!(
        detail["nodes"][0]["reason"],
        "the step running it ended before it finished"
    );
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

/// A machine set up otherwise (its own cache and temporary folders, so its own sandbox folder, and the
/// server's URL spelt its own way) steps a run another machine started: its settings are its
/// own, not a change of the run's rules.
#[test]
fn a_machine_set_up_otherwise_steps_the_same_run() {
    let dir = workspace_with(SLOW);
    let root = dir.path();
    std::fs::write(root.join("kavi.toml"), "lease = \"10s\"\n").unwrap();
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
        command
            .env_remove("KAVI_SANDBOXES")
            .env("XDG_CACHE_HOME", tmp)
            .env("TMPDIR", tmp);
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

/// `kavi` as a process of machine `host` (its own hostname, in a UTS namespace of its own, and
/// its own cache and temporary folders: a server ledger's lock files live in the cache), on the
/// server's ledger `url`.
fn on_machine(root: &Path, host: &str, tmp: &Path, url: &str, args: &[&str]) -> Command {
    let mut unshare = Command::new("unshare");
    unshare
        .args([
            "--uts",
            "sh",
            "-c",
            &format!("hostname {host} && exec \"$0\" \"$@\""),
        ])
        .arg(env!("CARGO_BIN_EXE_kavi"));
    let mut command = common::with_test_env(unshare, root, args);
    command
        .env("KAVI_LEDGER", url)
        .env("XDG_CACHE_HOME", tmp)
        .env("TMPDIR", tmp);
    command
}

/// The process id a node wrote into `file` once it started what it leaves running.
fn node_pid(file: &Path) -> i32 {
    for _ in 0..300 {
        if std::fs::read_to_string(file).is_ok_and(|pid| pid.ends_with('\n')) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    std::fs::read_to_string(file)
        .expect("the node started")
        .trim()
        .parse()
        .unwrap()
}

fn alive(pid: i32) -> bool {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
}

/// A machine dies in the middle of a run (its kavi killed, what its node started left running):
/// once the run's lease (kavi.toml's `lease`, shorter than the default 30 s here) runs out,
/// another machine sharing the server sees it interrupted, resumes it and collects garbage;
/// when the dead machine comes back, its kavi stops what the node left running.
#[test]
fn a_dead_machines_run_is_recovered_from_another() {
    let Some(url) = common::postgres::database() else {
        return;
    };
    if !common::uts_namespace_or_skip() {
        return;
    }
    let dir = workspace_with(
        r#"
[pipeline]
name = "slow"

[nodes.slow]
kind = "exec"
shell = "if [ -e node.pid ]; then echo again; else sleep 600 & echo $! > node.pid; wait; fi"
"#,
    );
    let root = dir.path();
    std::fs::write(root.join("kavi.toml"), "lease = \"10s\"\n").unwrap();
    let (tmp_a, tmp_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let machine_a = |args: &[&str]| on_machine(root, "machine-a", tmp_a.path(), &url, args);
    let machine_b = |args: &[&str]| on_machine(root, "machine-b", tmp_b.path(), &url, args);
    let mut run = spawn(machine_a(&["pipeline", "run", "slow"]));
    let node = node_pid(&root.join("node.pid"));
    // The run is recorded (its first nodes start while that commits).
    for _ in 0..300 {
        let listed = json(&machine_b(&["runs", "list", "--json"]).output().unwrap());
        if listed[0]["status"] == "running" {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // Machine A dies: its kavi is gone (and the node's shell with it), what the node started
    // runs on.
    run.kill().unwrap();
    run.wait().unwrap();
    assert!(alive(node));

    // While the lease holds, the run is machine A's: B may not resume it, nor collect garbage.
    let early = machine_b(&["runs", "resume", "1"]).output().unwrap();
    assert_eq!(early.status.code(), Some(2), "{}", text(&early));
    assert!(text(&early).contains("still running"), "{}", text(&early));
    let gc = machine_b(&["gc", "--dry-run"]).output().unwrap();
    assert_eq!(gc.status.code(), Some(4), "{}", text(&gc));

    // Once it ran out (nothing renews it), any machine recovers the run: within the
    // configured lease, well before the default one would have run out.
    let mut status = Value::Null;
    for _ in 0..20 {
        let listed = json(&machine_b(&["runs", "list", "--json"]).output().unwrap());
        status = listed[0]["status"].clone();
        if status != "running" {
            break;
        }
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
    assert_eq!(status, "interrupted");
    let resumed = machine_b(&["runs", "resume", "1"]).output().unwrap();
    assert_eq!(resumed.status.code(), Some(0), "{}", text(&resumed));
    let gc = machine_b(&["gc", "--dry-run"]).output().unwrap();
    assert_eq!(gc.status.code(), Some(0), "{}", text(&gc));
    // What machine A left running is machine A's to stop, when it comes back.
    assert!(alive(node));
    let back = machine_a(&["runs", "list"]).output().unwrap();
    assert_eq!(back.status.code(), Some(0), "{}", text(&back));
    for _ in 0..100 {
        if !alive(node) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(!alive(node), "what machine A left running still runs");
}

/// The ledger's server stops in the middle of a run and does not come back: kavi starts no node
/// it could not record (at most the one that started as the server went, before any write had
/// failed), waits for the server as long as the URL's `statement_timeout` allows, and exits 4
/// saying the ledger could not be reached.
#[test]
fn no_node_starts_while_the_ledger_cannot_record_it() {
    let Some((url, server)) = common::postgres::own_server() else {
        return;
    };
    let url = format!("{url}?statement_timeout=3s");
    let mut pipeline = String::from("[pipeline]\nname = \"slow\"\n");
    for i in 0..60 {
        pipeline.push_str(&format!(
            "\n[nodes.n{i}]\nkind = \"exec\"\nshell = \"echo n{i} >> ran.txt; sleep 0.3\"\n"
        ));
        if i > 0 {
            pipeline.push_str(&format!("needs = [\"n{}\"]\n", i - 1));
        }
    }
    let dir = workspace_with(&pipeline);
    let root = dir.path();
    let run = spawn(kavi_on(root, Some(&url), &["pipeline", "run", "slow"]));
    let ran = || {
        std::fs::read_to_string(root.join("ran.txt"))
            .unwrap_or_default()
            .lines()
            .count()
    };
    for _ in 0..300 {
        if ran() >= 3 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(ran() >= 3);
    common::postgres::stop(&server);
    let at_stop = ran();
    let output = run.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(4), "{}", text(&output));
    // The node running as the server went, and the next one, which started before the ledger's
    // first failed write; before, nodes went on starting for as long as kavi waited (3 s, some
    // ten of them).
    assert!(
        ran() <= at_stop + 2,
        "{} node(s) started after the server stopped",
        ran() - at_stop
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("ledger"), "{stderr}");
}

/// The ledger's server restarts in the middle of a run: kavi's connections are made again, and
/// the run goes on to its end; every node that ran is recorded, and the ledger verifies.
#[test]
fn a_run_goes_on_across_a_server_restart() {
    let Some((url, server)) = common::postgres::own_server() else {
        return;
    };
    let chain = Chain::start(&url, 0.3);
    chain.wait_for(3);
    common::postgres::restart(&server);
    assert!(chain.ran() < 20, "the run ended before the restart");
    chain.assert_went_on();
}

/// The server ends kavi's sessions in the middle of their transactions (an administrator's
/// `pg_terminate_backend`, as a restart does to every session): each transaction it undid is
/// done again on a connection made anew, and the run goes on to its end, recorded once.
#[test]
fn a_run_goes_on_when_the_server_ends_its_sessions_mid_transaction() {
    let Some(url) = common::postgres::database() else {
        return;
    };
    let mut chain = Chain::start(&url, 0.1);
    chain.wait_for(2);
    let mut admin = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    // From once the run is recorded: the transaction that records it is not done again (the
    // run's id, handed to its nodes while the rest of it is written, would change).
    let recorded = |admin: &mut postgres::Client| {
        admin
            .query_one("SELECT count(*) FROM runs", &[])
            .unwrap()
            .get::<_, i64>(0)
            > 0
    };
    for _ in 0..300 {
        if recorded(&mut admin) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(recorded(&mut admin), "the run was not recorded within 30 s");
    let mut ended = 0;
    while ended < 4 && chain.ran() < 18 && chain.run.try_wait().unwrap().is_none() {
        ended += admin
            .query(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE datname = current_database() AND pid <> pg_backend_pid() \
                 AND xact_start IS NOT NULL",
                &[],
            )
            .unwrap()
            .len();
    }
    assert!(ended > 0, "no session was ended in a transaction");
    chain.assert_went_on();
}

/// A transaction whose session the server ended before its commit (here with
/// `pg_terminate_backend`, as a restart does) is told undone: its commit fails, the server says
/// it did not commit, nothing of it is there, and the connection is made again for what comes
/// next. A statement outside a transaction, refused as its session ends, is done once.
#[test]
fn a_commit_whose_session_the_server_ended_is_told_undone() {
    let Some(url) = common::postgres::database() else {
        return;
    };
    let db = kavi_ledger::db::Db::connect_postgres(&url).unwrap();
    db.execute_batch("CREATE TABLE kept (n bigint)").unwrap();
    let mut admin = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    let mut end_sessions = |state: &str| {
        let ended = admin
            .query(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE datname = current_database() AND pid <> pg_backend_pid() AND state = $1",
                &[&state],
            )
            .unwrap()
            .len();
        assert_eq!(ended, 1, "sessions {state}");
        // Gone before the next statement, so that it cannot be read before the session ends.
        while admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE datname = current_database() AND pid <> pg_backend_pid()",
                &[],
            )
            .unwrap()
            .get::<_, i64>(0)
            > 0
        {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    };
    db.begin_sharing().unwrap();
    db.execute("INSERT INTO kept VALUES (1)", []).unwrap();
    end_sessions("idle in transaction");
    let error = db.commit().unwrap_err();
    assert!(error.is_undone(), "{error}");
    let count = |db: &kavi_ledger::db::Db| {
        db.query_row("SELECT count(*) FROM kept", [], |row| row.get::<_, i64>(0))
            .unwrap()
    };
    assert_eq!(count(&db), 0);
    end_sessions("idle");
    db.execute("INSERT INTO kept VALUES (2)", []).unwrap();
    assert_eq!(count(&db), 1);
}

/// A run of a chain of 20 nodes, each appending its name to `ran.txt` and then sleeping, on
/// the ledger at `url`.
struct Chain {
    dir: tempfile::TempDir,
    url: String,
    run: Child,
}

impl Chain {
    fn start(url: &str, sleep: f64) -> Self {
        let mut pipeline = String::from("[pipeline]\nname = \"slow\"\n");
        for i in 0..20 {
            pipeline.push_str(&format!(
                "\n[nodes.n{i}]\nkind = \"exec\"\nshell = \"echo n{i} >> ran.txt; sleep {sleep}\"\n"
            ));
            if i > 0 {
                pipeline.push_str(&format!("needs = [\"n{}\"]\n", i - 1));
            }
        }
        let dir = workspace_with(&pipeline);
        let run = spawn(kavi_on(
            dir.path(),
            Some(url),
            &["pipeline", "run", "slow", "--json"],
        ));
        Self {
            dir,
            url: url.to_owned(),
            run,
        }
    }

    /// How many nodes have started.
    fn ran(&self) -> usize {
        std::fs::read_to_string(self.dir.path().join("ran.txt"))
            .unwrap_or_default()
            .lines()
            .count()
    }

    /// Waits until `count` nodes have started.
    fn wait_for(&self, count: usize) {
        for _ in 0..300 {
            if self.ran() >= count {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        panic!("{count} nodes did not start within 30 s");
    }

    /// The run succeeded with every node run once, and the ledger verifies.
    fn assert_went_on(self) {
        let output = self.run.wait_with_output().unwrap();
        assert_eq!(output.status.code(), Some(0), "{}", text(&output));
        let detail: Value = serde_json::from_slice(&output.stdout).unwrap();
        assert_eq!(detail["status"], "succeeded");
        let nodes = detail["nodes"].as_array().unwrap();
        assert_eq!(nodes.len(), 20);
        assert!(nodes.iter().all(|n| n["state"] == "succeeded"), "{nodes:?}");
        let root = self.dir.path();
        assert_eq!(
            std::fs::read_to_string(root.join("ran.txt"))
                .unwrap()
                .lines()
                .count(),
            20
        );
        assert_verifies(root, &self.url);
    }
}

/// `kavi ledger verify` on the server's ledger at `url` finds nothing wrong.
fn assert_verifies(root: &Path, url: &str) {
    let verify = kavi_on(root, Some(url), &["ledger", "verify"])
        .output()
        .unwrap();
    assert_eq!(verify.status.code(), Some(0), "{}", text(&verify));
}

/// A pipeline of `count` nodes in four chains, each node appending its name to `ran.txt`:
/// many short writes from one run.
fn chains(name: &str, count: usize) -> String {
    let mut pipeline = format!("[pipeline]\nname = \"{name}\"\n");
    for i in 0..count {
        pipeline.push_str(&format!(
            "\n[nodes.n{i}]\nkind = \"exec\"\nshell = \"echo {name}-n{i} >> ran.txt\"\n"
        ));
        if i >= 4 {
            pipeline.push_str(&format!("needs = [\"n{}\"]\n", i - 4));
        }
    }
    pipeline
}

/// A workspace whose pipeline `slow` (`count` nodes, see [`chains`]) has run once on the
/// server's ledger at `url`.
fn ran_once(url: &str, count: usize) -> tempfile::TempDir {
    let dir = workspace_with(&chains("slow", count));
    let first = kavi_on(dir.path(), Some(url), &["pipeline", "run", "slow"])
        .output()
        .unwrap();
    assert_eq!(first.status.code(), Some(0), "{}", text(&first));
    dir
}

/// Eight runs and eight workers stepping the same ten nodes, all at once on one server: the
/// runs' writes no longer wait for one another, yet their journal entries form one chain that
/// `ledger verify` accepts (appended at commit, one transaction at a time: without that, two
/// commits take the same entry number and one fails), and each stepped node ran once.
#[test]
fn many_writers_at_once_leave_one_chain_and_claim_each_node_once() {
    let Some(url) = common::postgres::database() else {
        return;
    };
    let dir = workspace_with(SLOW);
    let root = dir.path();
    std::fs::write(root.join("pipelines/many.toml"), chains("many", 40)).unwrap();
    let mut shared = String::from("[pipeline]\nname = \"shared\"\n");
    for i in 0..10 {
        shared.push_str(&format!(
            "\n[nodes.s{i}]\nkind = \"exec\"\nshell = \"echo s{i} >> stepped.txt; sleep 0.2\"\n"
        ));
    }
    std::fs::write(root.join("pipelines/shared.toml"), shared).unwrap();
    let started = kavi_on(root, Some(&url), &["pipeline", "start", "shared"])
        .output()
        .unwrap();
    assert_eq!(started.status.code(), Some(0), "{}", text(&started));
    let run = String::from_utf8_lossy(&started.stdout).trim().to_owned();

    let runs: Vec<Child> = (0..8)
        .map(|_| {
            spawn(kavi_on(
                root,
                Some(&url),
                &["pipeline", "run", "many", "--jobs", "4", "--json"],
            ))
        })
        .collect();
    // Each worker steps every node, starting from a different one.
    let workers: Vec<_> = (0..8)
        .map(|worker| {
            let (root, url, run) = (root.to_owned(), url.clone(), run.clone());
            std::thread::spawn(move || {
                (0..10)
                    .map(|i| {
                        let node = format!("s{}", (worker + i) % 10);
                        let step = ["pipeline", "step", "shared", "--run", &run, &node];
                        kavi_on(&root, Some(&url), &step).output().unwrap()
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    for output in workers.into_iter().flat_map(|w| w.join().unwrap()) {
        assert_eq!(output.status.code(), Some(0), "{}", text(&output));
    }
    for run in runs {
        let output = run.wait_with_output().unwrap();
        assert_eq!(output.status.code(), Some(0), "{}", text(&output));
        let detail: Value = serde_json::from_slice(&output.stdout).unwrap();
        let nodes = detail["nodes"].as_array().unwrap();
        assert_eq!(nodes.len(), 40);
        assert!(nodes.iter().all(|n| n["state"] == "succeeded"), "{nodes:?}");
    }

    let mut stepped: Vec<String> = std::fs::read_to_string(root.join("stepped.txt"))
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    stepped.sort();
    let once: Vec<String> = (0..10).map(|i| format!("s{i}")).collect();
    assert_eq!(stepped, once, "a stepped node ran more or less than once");
    let rows = node_rows(root, Some(&url), &run);
    assert_eq!(rows.len(), 10, "{rows:?}");
    assert!(
        rows.iter()
            .all(|row| row["state"] == "succeeded" && row["attempt"] == 1),
        "{rows:?}"
    );
    assert_eq!(
        std::fs::read_to_string(root.join("ran.txt"))
            .unwrap()
            .lines()
            .count(),
        8 * 40
    );
    let end = kavi_on(
        root,
        Some(&url),
        &["pipeline", "end", "shared", "--run", &run],
    )
    .output()
    .unwrap();
    assert_eq!(end.status.code(), Some(0), "{}", text(&end));
    assert_verifies(root, &url);
}

/// Another writer's transaction left open on the server does not hold up a run (before, every
/// write transaction held the one lock to its end, and the run's first write waited past its
/// `lock_timeout`); a transaction that decides under the lock, held alone, still does.
#[test]
fn a_writer_waits_for_a_deciding_transaction_and_for_no_other() {
    let Some(url) = common::postgres::database() else {
        return;
    };
    let dir = workspace_with(&chains("slow", 8));
    let root = dir.path();
    let url = format!("{url}?lock_timeout=2s");
    let run = || {
        kavi_on(root, Some(&url), &["pipeline", "run", "slow"])
            .output()
            .unwrap()
    };
    let first = run();
    assert_eq!(first.status.code(), Some(0), "{}", text(&first));
    let client_url = url.split_once('?').unwrap().0;
    let mut other = postgres::Client::connect(client_url, postgres::NoTls).unwrap();

    // A write under way: a changed row, its journal entry to come at its commit.
    let mut writing = other.transaction().unwrap();
    let changed = writing
        .execute("UPDATE runs SET error = error WHERE id = 1", &[])
        .unwrap();
    assert_eq!(changed, 1);
    let second = run();
    assert_eq!(second.status.code(), Some(0), "{}", text(&second));
    writing.rollback().unwrap();

    // A transaction that decides under the lock (as `kavi gc` or recovery does).
    let mut deciding = other.transaction().unwrap();
    deciding
        .execute(
            "SELECT pg_advisory_xact_lock($1)",
            &[&kavi_ledger::db::postgres::DECIDE_LOCK],
        )
        .unwrap();
    let third = run();
    assert_ne!(third.status.code(), Some(0), "{}", text(&third));
    assert!(text(&third).contains("lock timeout"), "{}", text(&third));
    deciding.rollback().unwrap();

    assert_verifies(root, &url);
}

/// A transaction that holds the write lock alone (a migration's) may write a row and then alter
/// or drop its table: its journal entries are appended as its rows change, not at its commit,
/// so the server finds none still to come (before, the DDL was refused: "pending trigger
/// events"), and the chain verifies after.
#[test]
fn a_deciding_transaction_writes_then_alters_the_table_it_wrote() {
    let Some(url) = common::postgres::database() else {
        return;
    };
    let dir = ran_once(&url, 1);
    let root = dir.path();
    let mut db = kavi_ledger::db::Db::connect_postgres(&url).unwrap();
    let entries = |db: &kavi_ledger::db::Db| -> i64 {
        db.query_row("SELECT count(*) FROM journal", [], |row| row.get(0))
            .unwrap()
    };
    let before = entries(&db);
    let tx = db.transaction().unwrap();
    let changed = tx
        .execute("UPDATE runs SET error = 'altered' WHERE id = 1", [])
        .unwrap();
    assert_eq!(changed, 1);
    tx.execute_batch(
        "ALTER TABLE runs ADD COLUMN added TEXT;
         ALTER TABLE runs DROP COLUMN added;",
    )
    .unwrap();
    // MACed as kavi does before its commits, with the key (a connection of the database layer's
    // alone has none).
    let updates = common::postgres::seal_by_hand(|query| {
        tx.prepare(query)
            .unwrap()
            .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    });
    assert_eq!(updates.len(), 1);
    for update in updates {
        tx.execute_batch(&update).unwrap();
    }
    tx.commit().unwrap();
    assert_eq!(entries(&db), before + 1);
    assert_verifies(root, &url);
}

/// The journal triggers an earlier kavi made on a server (appending at once, row by row) are
/// made again by the next kavi that opens the ledger, and the ledger verifies after.
#[test]
fn a_server_ledgers_journal_triggers_of_before_are_made_again() {
    let Some(url) = common::postgres::database() else {
        return;
    };
    let dir = ran_once(&url, 4);
    let root = dir.path();
    let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    let appending_at_once = |client: &mut postgres::Client| -> i64 {
        client
            .query_one(
                "SELECT count(*) FROM pg_trigger
                 WHERE NOT tgisinternal AND tgname::text LIKE 'journal\\_%'
                   AND (tgtype & 1) = 1 AND NOT tgdeferrable",
                &[],
            )
            .unwrap()
            .get(0)
    };
    assert_eq!(appending_at_once(&mut client), 0);
    // As an earlier kavi left it: the entry appended as the row changes.
    client
        .batch_execute(
            "DROP TRIGGER journal_runs_update ON runs;
             CREATE TRIGGER journal_runs_update AFTER UPDATE ON runs
               FOR EACH ROW EXECUTE FUNCTION journal_runs_update();",
        )
        .unwrap();
    assert_eq!(appending_at_once(&mut client), 1);
    let second = kavi_on(root, Some(&url), &["pipeline", "run", "slow"])
        .output()
        .unwrap();
    assert_eq!(second.status.code(), Some(0), "{}", text(&second));
    assert_eq!(appending_at_once(&mut client), 0);
    assert_verifies(root, &url);
}

/// Someone who can log in to the server but holds no kavi key learns nothing of the key from
/// kavi's sessions and cannot write in kavi's transactions: a trigger of theirs on kavi's tables
/// finds no key in kavi's session (the server never holds it: kavi MACs the entries itself),
/// and kavi refuses to MAC a transaction while such code is there, so the row it forged is never
/// vouched for; with the trigger gone kavi records again, and a row the login writes alone
/// carries no MAC, which `ledger verify` reports.
#[test]
fn a_database_login_neither_learns_the_key_nor_writes_in_kavis_transactions() {
    let Some(url) = common::postgres::database() else {
        return;
    };
    let dir = ran_once(&url, 1);
    let root = dir.path();
    let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    // The sequence keeps what the trigger saw though kavi's transaction is rolled back: the
    // length of the key's setting, plus one.
    client
        .batch_execute(
            "CREATE SCHEMA theirs;
             CREATE SEQUENCE theirs.seen;
             CREATE FUNCTION theirs.steal() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
               PERFORM setval('theirs.seen',
                              length(COALESCE(current_setting('kavi.mac_inner', true), '')) + 1);
               UPDATE runs SET error = 'forged' WHERE id = 1;
               RETURN NULL;
             END $$;
             CREATE TRIGGER steal AFTER INSERT OR UPDATE ON node_runs
               FOR EACH ROW EXECUTE FUNCTION theirs.steal();",
        )
        .unwrap();
    let refused = kavi_on(root, Some(&url), &["pipeline", "run", "slow"])
        .output()
        .unwrap();
    assert_ne!(refused.status.code(), Some(0), "{}", text(&refused));
    assert!(
        text(&refused).contains("holds code kavi did not make")
            && text(&refused).contains("trigger steal on node_runs"),
        "{}",
        text(&refused)
    );
    let seen: i64 = client
        .query_one("SELECT last_value FROM theirs.seen", &[])
        .unwrap()
        .get(0);
    assert_eq!(
        seen, 1,
        "the trigger ran in kavi's session and found no key"
    );
    let forged: i64 = client
        .query_one("SELECT count(*) FROM runs WHERE error = 'forged'", &[])
        .unwrap()
        .get(0);
    assert_eq!(forged, 0);
    let verify = kavi_on(root, Some(&url), &["ledger", "verify"])
        .output()
        .unwrap();
    assert_ne!(verify.status.code(), Some(0), "{}", text(&verify));
    assert!(
        text(&verify).contains("trigger steal on node_runs"),
        "{}",
        text(&verify)
    );

    // A rule that writes along with kavi's writes is code too.
    client
        .batch_execute(
            "DROP TRIGGER steal ON node_runs;
             CREATE RULE along AS ON INSERT TO node_runs
               DO ALSO UPDATE runs SET error = 'forged' WHERE id = 1;",
        )
        .unwrap();
    let refused = kavi_on(root, Some(&url), &["pipeline", "run", "slow"])
        .output()
        .unwrap();
    assert!(
        text(&refused).contains("rule along on node_runs"),
        "{}",
        text(&refused)
    );

    // So are a CHECK constraint (one can run SQL text, `query_to_xml`), and a table of theirs
    // that inherits a ledger table (kavi's statements reach its rows, and its triggers).
    client
        .batch_execute(
            "DROP RULE along ON node_runs;
             ALTER TABLE executions ADD CONSTRAINT theirs_check CHECK (true);
             CREATE TABLE theirs.kid () INHERITS (runs);",
        )
        .unwrap();
    let refused = kavi_on(root, Some(&url), &["pipeline", "run", "slow"])
        .output()
        .unwrap();
    assert!(
        text(&refused).contains("check theirs_check on executions")
            && text(&refused).contains("child kid on runs"),
        "{}",
        text(&refused)
    );
    client
        .batch_execute("ALTER TABLE executions DROP CONSTRAINT theirs_check; DROP TABLE theirs.kid")
        .unwrap();
    let ran = kavi_on(root, Some(&url), &["pipeline", "run", "slow"])
        .output()
        .unwrap();
    assert_eq!(ran.status.code(), Some(0), "{}", text(&ran));
    assert_verifies(root, &url);

    client
        .batch_execute("UPDATE runs SET error = 'forged' WHERE id = 1")
        .unwrap();
    let verify = kavi_on(root, Some(&url), &["ledger", "verify"])
        .output()
        .unwrap();
    assert_ne!(verify.status.code(), Some(0), "{}", text(&verify));
    assert!(text(&verify).contains("MAC"), "{}", text(&verify));
}

/// A journal function replaced while one of kavi's transactions is open (here with the same
/// text, as one swapped for a moment and put back would look) makes kavi refuse that
/// transaction rather than vouch for what the function may have written meanwhile: the
/// replacement is committed by a transaction that was still running when kavi's began (it
/// holds the row kavi's node end writes, so kavi's transaction waits for it).
#[test]
fn a_journal_function_replaced_during_a_transaction_is_not_vouched_for() {
    let Some(url) = common::postgres::database() else {
        return;
    };
    let dir = ran_once(&url, 1);
    let root = dir.path();
    std::fs::write(root.join("pipelines/slow.toml"), SLOW).unwrap();
    let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    let run = spawn(kavi_on(root, Some(&url), &["pipeline", "run", "slow"]));
    let mut running: i64 = 0;
    for _ in 0..300 {
        running = client
            .query_one(
                "SELECT count(*) FROM node_runs WHERE state = 'running'",
                &[],
            )
            .unwrap()
            .get(0);
        if running > 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(running, 1, "the node was never recorded running");
    let same_text: String = client
        .query_one(
            "SELECT pg_get_functiondef('journal_node_runs_update'::regproc)",
            &[],
        )
        .unwrap()
        .get(0);
    let mut swap = client.transaction().unwrap();
    swap.batch_execute("SELECT id FROM node_runs WHERE state = 'running' FOR UPDATE")
        .unwrap();
    swap.batch_execute(&same_text).unwrap();
    // The node sleeps 3 s; its end waits for the row, after kavi's transaction began.
    std::thread::sleep(std::time::Duration::from_secs(5));
    swap.commit().unwrap();
    let ended = run.wait_with_output().unwrap();
    assert_ne!(ended.status.code(), Some(0), "{}", text(&ended));
    assert!(
        text(&ended).contains("changed while this transaction was open"),
        "{}",
        text(&ended)
    );
}

/// Writes `s ID TIME` when its node starts and `e ID TIME` when it ends into `log`, sleeping
/// between: the interval it ran in.
fn interval_shell(log: &Path) -> String {
    format!(
        "echo \\\"s $$ $(date +%s%N)\\\" >> {log}; sleep 1; echo \\\"e $$ $(date +%s%N)\\\" >> {log}",
        log = log.display()
    )
}

/// The intervals `log` holds, as (start, end), by start.
fn intervals(log: &Path) -> Vec<(u128, u128)> {
    let text = std::fs::read_to_string(log).unwrap();
    let mut by_id: std::collections::HashMap<&str, (Option<u128>, Option<u128>)> =
        std::collections::HashMap::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let [mark, id, time] = fields[..] else {
            panic!("a line that is not `s|e ID TIME`: {line}");
        };
        let time = time.parse().unwrap();
        let entry = by_id.entry(id).or_default();
        match mark {
            "s" => entry.0 = Some(time),
            _ => entry.1 = Some(time),
        }
    }
    let mut intervals: Vec<(u128, u128)> = by_id
        .into_values()
        .map(|(s, e)| (s.expect("a start"), e.expect("an end")))
        .collect();
    intervals.sort_unstable();
    intervals
}

/// Runs of a group, and attempts of a node group, on two machines sharing a server's ledger
/// (each its own hostname and temporary folder, where its lock files live): the group's limit
/// holds across them, with runs and attempts that would otherwise overlap waiting their turn.
#[test]
fn a_concurrency_group_holds_across_machines_on_a_server() {
    let Some(url) = common::postgres::database() else {
        return;
    };
    if !common::uts_namespace_or_skip() {
        return;
    }
    let log_dir = tempfile::tempdir().unwrap();
    let runs_log = log_dir.path().join("runs.log");
    let nodes_log = log_dir.path().join("nodes.log");
    let runs = format!(
        "[pipeline]\nname = \"deploy\"\nconcurrency = {{ group = \"deploy\" }}\n\n\
         [nodes.work]\nkind = \"exec\"\nshell = \"{}\"\n",
        interval_shell(&runs_log)
    );
    let nodes = format!(
        "[pipeline]\nname = \"gpu\"\n\n\
         [nodes.a]\nkind = \"exec\"\nshell = \"{shell}\"\nconcurrency = {{ group = \"gpu\" }}\n\n\
         [nodes.b]\nkind = \"exec\"\nshell = \"{shell}\"\nconcurrency = {{ group = \"gpu\" }}\n",
        shell = interval_shell(&nodes_log)
    );
    // Two workspaces, one per machine, on the one server.
    let (dir_a, dir_b) = (workspace_with(&runs), workspace_with(&runs));
    for dir in [&dir_a, &dir_b] {
        std::fs::write(dir.path().join("pipelines/gpu.toml"), &nodes).unwrap();
    }
    let (tmp_a, tmp_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let machines = [
        (dir_a.path(), "machine-a", tmp_a.path()),
        (dir_b.path(), "machine-b", tmp_b.path()),
    ];
    for (pipeline, log, wanted) in [("slow", &runs_log, 2), ("gpu", &nodes_log, 4)] {
        let children: Vec<Child> = machines
            .iter()
            .map(|(root, host, tmp)| {
                spawn(on_machine(
                    root,
                    host,
                    tmp,
                    &url,
                    &["pipeline", "run", pipeline, "--jobs", "2"],
                ))
            })
            .collect();
        let outputs: Vec<Output> = children
            .into_iter()
            .map(|child| child.wait_with_output().unwrap())
            .collect();
        for output in &outputs {
            assert_eq!(output.status.code(), Some(0), "{}", text(output));
        }
        // Someone found the group full and waited, naming the holder by its machine.
        assert!(
            outputs
                .iter()
                .any(|o| text(o).contains("is full") && text(o).contains("@machine-")),
            "{}",
            outputs.iter().map(text).collect::<String>()
        );
        let intervals = intervals(log);
        assert_eq!(intervals.len(), wanted, "{intervals:?}");
        for pair in intervals.windows(2) {
            assert!(
                pair[0].1 <= pair[1].0,
                "{pipeline}: two members of a group of 1 ran at once: {intervals:?}"
            );
        }
    }
}

/// A machine holding a group's slot dies: the run waiting on another machine goes on once the
/// dead one's lease (kavi.toml's `lease`, 3 s here) has run out, not before. A run that finds
/// the group full with `cancel-running` has the holder on the other machine cancel its run
/// (recorded so) and then runs; one with `refuse` starts nothing, naming the holder.
#[test]
fn a_dead_or_cancelled_holder_on_another_machine_frees_its_groups_slot() {
    let Some(url) = common::postgres::database() else {
        return;
    };
    if !common::uts_namespace_or_skip() {
        return;
    }
    let holding = "[pipeline]\nname = \"slow\"\nconcurrency = { group = \"deploy\" }\n\n\
                   [nodes.hold]\nkind = \"exec\"\n\
                   shell = \"sleep 600 & echo $! > held.pid; wait\"\n";
    let (dir_a, dir_b) = (workspace_with(holding), workspace_with(holding));
    for (dir, on_conflict) in [
        (&dir_b, "queue"),
        (&dir_b, "cancel-running"),
        (&dir_b, "refuse"),
    ] {
        std::fs::write(
            dir.path().join(format!("pipelines/{on_conflict}.toml")),
            format!(
                "[pipeline]\nname = \"{on_conflict}\"\n\
                 concurrency = {{ group = \"deploy\", on_conflict = \"{on_conflict}\" }}\n\n\
                 [nodes.go]\nkind = \"exec\"\nshell = \"echo ran > {on_conflict}.ran\"\n"
            ),
        )
        .unwrap();
    }
    for dir in [&dir_a, &dir_b] {
        std::fs::write(dir.path().join("kavi.toml"), "lease = \"3s\"\n").unwrap();
    }
    let (root_a, root_b) = (dir_a.path(), dir_b.path());
    let (tmp_a, tmp_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let machine_a = |args: &[&str]| on_machine(root_a, "machine-a", tmp_a.path(), &url, args);
    let machine_b = |args: &[&str]| on_machine(root_b, "machine-b", tmp_b.path(), &url, args);
    let pid_file = root_a.join("held.pid");
    // Machine A's run holds the group until its node is stopped.
    let hold = |machine_a: &dyn Fn(&[&str]) -> Command| {
        let _ = std::fs::remove_file(&pid_file);
        let run = spawn(machine_a(&["pipeline", "run", "slow", "--json"]));
        (run, node_pid(&pid_file))
    };

    // A dies holding it; B waits all the while A lives, then goes on.
    let (mut run_a, node_a) = hold(&machine_a);
    let mut queued = spawn(machine_b(&["pipeline", "run", "queue"]));
    for _ in 0..20 {
        assert!(queued.try_wait().unwrap().is_none(), "B did not wait for A");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(
        !root_b.join("queue.ran").exists(),
        "B ran while A held the group"
    );
    run_a.kill().unwrap();
    run_a.wait().unwrap();
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(node_a),
        nix::sys::signal::Signal::SIGKILL,
    );
    let queued = queued.wait_with_output().unwrap();
    assert_eq!(queued.status.code(), Some(0), "{}", text(&queued));
    assert!(root_b.join("queue.ran").exists());
    let said = text(&queued);
    assert!(
        said.contains("concurrency group `deploy` is full: 1 run(s) at once, held by kavi process")
            && said.contains(&format!("{}@machine-a", run_a.id())),
        "{said}"
    );

    // A holds it again; B refuses to start, then cancels A's run and runs.
    let (run_a, node_a) = hold(&machine_a);
    let refused = machine_b(&["pipeline", "run", "refuse"]).output().unwrap();
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused));
    assert!(text(&refused).contains("@machine-a"), "{}", text(&refused));
    assert!(!root_b.join("refuse.ran").exists());
    let cancelling = machine_b(&["pipeline", "run", "cancel-running"])
        .output()
        .unwrap();
    assert_eq!(cancelling.status.code(), Some(0), "{}", text(&cancelling));
    assert!(
        text(&cancelling).contains("cancelling the run of kavi process"),
        "{}",
        text(&cancelling)
    );
    assert!(root_b.join("cancel-running.ran").exists());
    let cancelled = run_a.wait_with_output().unwrap();
    let detail: Value = serde_json::from_slice(&cancelled.stdout).unwrap();
    assert_eq!(detail["status"], "cancelled", "{}", text(&cancelled));
    for _ in 0..100 {
        if !alive(node_a) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(!alive(node_a), "the cancelled run's node still runs");
}
