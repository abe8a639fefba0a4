//! `kavi executor`: READ_ONLY skills run in sandboxes started ahead, each serving one run, with
//! the same output, record and view as a direct run, and nothing left when it ends.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, ChildStderr, Stdio};

use serde_json::Value;

use crate::common::{self, json, kavi};
use crate::trust::{PROPOSAL, TEST, verify_and_promote, workspace_with};

/// `demo` as trust's tests have it, printing also its PID namespace (a sandbox of its own per
/// run) and what it reads at `notes/.env` (hidden from every skill: where the file exists, the
/// view shows a device node it may not open).
const SKILL: &str = "import json\nimport os\nimport pathlib\nimport sys\nfrom typing import Any\n\nSIDE_EFFECT = \"READ_ONLY\"\n\n\ndef run(data: Any) -> dict[str, Any]:\n    return {'echo': data}\n\n\ndef seen(path: str) -> str | None:\n    file = pathlib.Path(path)\n    try:\n        return file.read_text() if file.exists() else None\n    except OSError as error:\n        return type(error).__name__\n\n\nif __name__ == '__main__':\n    out = run(json.load(sys.stdin))\n    out['sandbox'] = os.readlink('/proc/self/ns/pid')\n    out['hidden'] = seen('notes/.env')\n    print(json.dumps(out))\n";

/// A workspace with `demo` trusted, where this machine isolates.
fn trusted() -> Option<tempfile::TempDir> {
    if !common::isolation_or_skip() {
        return None;
    }
    let dir = workspace_with(PROPOSAL, SKILL, TEST);
    verify_and_promote(dir.path());
    Some(dir)
}

/// A running `kavi executor`, stopped with SIGTERM when dropped.
struct Executor {
    child: Child,
    stderr: BufReader<ChildStderr>,
}

impl Executor {
    /// Starts it and waits until it says its sandboxes are started.
    fn start(root: &Path) -> Self {
        let mut child = common::kavi_command(root, &["executor", "--idle-timeout", "300s"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        stderr.read_line(&mut line).unwrap();
        assert!(
            line.starts_with("executor: 2 READ_ONLY sandboxes started ahead"),
            "{line}"
        );
        Self { child, stderr }
    }

    /// Every process below it: the sandboxes it started and what runs in them.
    fn descendants(&self) -> Vec<i32> {
        let parents: Vec<(i32, i32)> = std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|entry| {
                let pid: i32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
                // The fields after the command's closing parenthesis: state, then the parent.
                let after = &stat[stat.rfind(')')? + 2..];
                let ppid = after.split(' ').nth(1)?.parse().ok()?;
                Some((pid, ppid))
            })
            .collect();
        let mut found = vec![i32::try_from(self.child.id()).unwrap()];
        let mut index = 0;
        while index < found.len() {
            let parent = found[index];
            found.extend(
                parents
                    .iter()
                    .filter(|(_, ppid)| *ppid == parent)
                    .map(|(pid, _)| *pid),
            );
            index += 1;
        }
        found.remove(0);
        found
    }

    /// Stops it with SIGTERM; what it printed after its first line.
    fn stop(mut self) -> String {
        self.terminate();
        let mut rest = String::new();
        let _ = self.stderr.read_to_string(&mut rest);
        rest
    }

    fn terminate(&mut self) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).unwrap());
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let _ = self.child.wait();
    }
}

impl Drop for Executor {
    fn drop(&mut self) {
        self.terminate();
    }
}

/// `kavi skill run demo` with `input`: its record, after checking it succeeded.
fn run(root: &Path, input: &str) -> Value {
    let ran = kavi(root, &["skill", "run", "demo", "--input", input]);
    assert!(
        ran.status.success(),
        "{}",
        String::from_utf8_lossy(&ran.stderr)
    );
    json(&ran)
}

/// A record's confinement without what differs run by run (its folders) and how it started.
fn view_of(record: &Value) -> Value {
    let mut confinement = record["confinement"].clone();
    for per_run in ["read", "write", "hide", "launch"] {
        confinement.as_object_mut().unwrap().remove(per_run);
    }
    confinement
}

#[test]
fn a_run_through_the_executor_is_recorded_as_a_direct_one_is_and_says_it_was_pre_started() {
    let Some(dir) = trusted() else { return };
    let root = dir.path();
    let direct = run(root, r#"{"x": 1}"#);
    assert_eq!(direct["confinement"].get("launch"), None, "{direct}");

    let executor = Executor::start(root);
    let served = run(root, r#"{"x": 1}"#);
    assert_eq!(served["confinement"]["launch"], "pre-started", "{served}");
    assert_eq!(served["output"]["echo"], direct["output"]["echo"]);
    assert_eq!(served["output"]["hidden"], Value::Null);
    for same in [
        "skill",
        "source_hash",
        "skill_version",
        "side_effect",
        "input",
        "success",
    ] {
        assert_eq!(served[same], direct[same], "{same}");
    }
    assert_eq!(view_of(&served), view_of(&direct));
    for list in ["read", "write", "hide"] {
        assert_eq!(
            served["confinement"][list].as_array().map(Vec::len),
            direct["confinement"][list].as_array().map(Vec::len),
            "{list}"
        );
    }
    // The executor recorded it in the ledger, as the direct run was.
    let recorded = common::LedgerConnection::open(root).texts(&format!(
        "SELECT confinement FROM executions WHERE id = '{}'",
        served["execution_id"].as_str().unwrap()
    ));
    let recorded: Value = serde_json::from_str(&recorded[0]).unwrap();
    assert_eq!(recorded["launch"], "pre-started");

    // Each run has a sandbox of its own: a new PID namespace, never one a run used before.
    let next = run(root, r#"{"x": 2}"#);
    assert_eq!(next["confinement"]["launch"], "pre-started", "{next}");
    let namespaces = [
        direct["output"]["sandbox"].as_str().unwrap(),
        served["output"]["sandbox"].as_str().unwrap(),
        next["output"]["sandbox"].as_str().unwrap(),
    ];
    assert!(
        namespaces[0] != namespaces[1]
            && namespaces[1] != namespaces[2]
            && namespaces[0] != namespaces[2],
        "{namespaces:?}"
    );
    drop(executor);
    common::assert_ledger_verifies(root);
}

#[test]
fn a_skill_changed_after_its_sandbox_started_is_refused_as_drift() {
    let Some(dir) = trusted() else { return };
    let root = dir.path();
    let _executor = Executor::start(root);
    let skill = root.join("skills/demo/skill.py");
    let text = std::fs::read_to_string(&skill).unwrap();
    std::fs::write(&skill, text.replace("echo", "ech0")).unwrap();
    let refused = kavi(root, &["skill", "run", "demo", "--input", "{}"]);
    assert_eq!(refused.status.code(), Some(2));
    assert!(refused.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.starts_with("error: refusing to run `demo`: its files changed since it was trusted"),
        "{stderr}"
    );
}

#[test]
fn a_secret_made_after_the_sandboxes_started_is_hidden_from_the_next_runs() {
    let Some(dir) = trusted() else { return };
    let root = dir.path();
    std::fs::create_dir(root.join("notes")).unwrap();
    let _executor = Executor::start(root);
    std::fs::write(root.join("notes/.env"), "TOKEN=hunter2\n").unwrap();
    // The sandboxes started before it do not hide it: they are not used, and the runs after
    // them are pre-started again, with it hidden.
    let mut launches = Vec::new();
    for round in 0..4 {
        let record = run(root, &format!("{{\"round\": {round}}}"));
        assert_eq!(record["output"]["hidden"], "PermissionError", "{record}");
        launches.push(record["confinement"]["launch"].clone());
    }
    assert_eq!(launches[0], Value::Null, "{launches:?}");
    assert_eq!(launches[3], "pre-started", "{launches:?}");
}

#[test]
fn no_process_the_executor_started_outlives_it() {
    let Some(dir) = trusted() else { return };
    let root = dir.path();
    let executor = Executor::start(root);
    run(root, "{}");
    let started = executor.descendants();
    assert!(!started.is_empty(), "no sandbox is running");
    let said = executor.stop();
    assert!(said.contains("executor: ended (stopped)"), "{said}");
    let alive = |pid: &i32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|stat| !stat[stat.rfind(')').unwrap() + 2..].starts_with('Z'))
    };
    let survivors: Vec<i32> = started.iter().copied().filter(alive).collect();
    assert!(survivors.is_empty(), "still running: {survivors:?}");
    // Without it, the run is the direct one, as before the executor existed.
    let direct = run(root, "{}");
    assert_eq!(direct["confinement"].get("launch"), None, "{direct}");
    assert!(!root.join(".kavi/ledger.locks/executor.sock").exists());
}
