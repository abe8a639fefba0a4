//! `kavi executor`: READ_ONLY skills run in sandboxes started ahead, each serving one run, with
//! the same output, record and view as a direct run, and nothing left when it ends.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, ChildStderr, Stdio};

use serde_json::Value;

use crate::common::{self, json, kavi};
use crate::trust::{PROPOSAL, TEST, verify_and_promote, workspace_with};

/// `demo` as trust's tests have it, printing also its PID namespace (a sandbox of its own per
/// run), what it reads at `notes/.env` (hidden from every skill: where the file exists, the
/// view shows a device node it may not open) and at `notes/kept.txt`.
const SKILL: &str = "import json\nimport os\nimport pathlib\nimport sys\nfrom typing import Any\n\nSIDE_EFFECT = \"READ_ONLY\"\n\n\ndef run(data: Any) -> dict[str, Any]:\n    return {'echo': data}\n\n\ndef seen(path: str) -> str | None:\n    file = pathlib.Path(path)\n    try:\n        return file.read_text() if file.exists() else None\n    except OSError as error:\n        return type(error).__name__\n\n\nif __name__ == '__main__':\n    out = run(json.load(sys.stdin))\n    out['sandbox'] = os.readlink('/proc/self/ns/pid')\n    out['hidden'] = seen('notes/.env')\n    out['kept'] = seen('notes/kept.txt')\n    print(json.dumps(out))\n";

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
        Self::start_with(root, &[])
    }

    /// [`Executor::start`] with `env` set for it.
    fn start_with(root: &Path, env: &[(&str, String)]) -> Self {
        let mut child = common::kavi_command(root, &["executor", "--idle-timeout", "300s"])
            .envs(env.iter().map(|(key, value)| (key, value)))
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

/// The sandboxes started ahead show the workspace as git listed it then. A file saved anew
/// since (a new inode: their view still links the old bytes) or one git no longer lists (now
/// ignored) is not served from them as it was: each run sees what a direct run sees at that
/// moment, and the executor serves again from sandboxes started after the change.
#[test]
fn a_file_saved_anew_or_ignored_after_the_sandboxes_started_is_not_served_stale() {
    let Some(dir) = trusted() else { return };
    let root = dir.path();
    let kept = root.join("notes/kept.txt");
    std::fs::create_dir(root.join("notes")).unwrap();
    std::fs::write(&kept, "old text\n").unwrap();
    let _executor = Executor::start(root);
    // A run served first: the other sandbox, started with it, has built its view by then.
    let served = run(root, "{}");
    assert_eq!(served["output"]["kept"], "old text\n", "{served}");
    // Saved as editors do: written beside, renamed over.
    std::fs::write(root.join("notes/kept.txt.new"), "new text\n").unwrap();
    std::fs::rename(root.join("notes/kept.txt.new"), &kept).unwrap();
    let mut launches = Vec::new();
    for round in 0..3 {
        let record = run(root, &format!("{{\"round\": {round}}}"));
        assert_eq!(record["output"]["kept"], "new text\n", "{record}");
        launches.push(record["confinement"]["launch"].clone());
    }
    assert_eq!(launches[0], Value::Null, "{launches:?}");
    assert_eq!(launches[2], "pre-started", "{launches:?}");
    // Ignored now: not in the view of any run after.
    std::fs::write(root.join(".gitignore"), "notes/kept.txt\n").unwrap();
    for round in 0..3 {
        let record = run(root, &format!("{{\"round\": {round}}}"));
        assert_eq!(record["output"]["kept"], Value::Null, "{record}");
    }
}

/// A policy whose READ_ONLY skills see no workspace at all: its sandboxes show nothing that can
/// change, and serve runs as any other.
#[test]
fn sandboxes_that_show_no_workspace_serve_runs() {
    if !common::isolation_or_skip() {
        return;
    }
    let dir = workspace_with(PROPOSAL, SKILL, TEST);
    let root = dir.path();
    let policy = root.join("policies/confinement.toml");
    let text = std::fs::read_to_string(&policy).unwrap();
    let own = "[read_only]\nrequire = true\nread = [\"{{ workspace }}\", \"{{ snapshot }}\"]";
    assert!(text.contains(own), "the shipped policy changed: {text}");
    std::fs::write(
        &policy,
        text.replace(
            own,
            "[read_only]\nrequire = true\nread = [\"{{ snapshot }}\"]",
        ),
    )
    .unwrap();
    verify_and_promote(root);
    let _executor = Executor::start(root);
    let launches: Vec<Value> = (0..3)
        .map(|round| {
            let record = run(root, &format!("{{\"round\": {round}}}"));
            assert_eq!(record["output"]["echo"]["round"], round, "{record}");
            record["confinement"]["launch"].clone()
        })
        .collect();
    assert!(
        launches.iter().all(|launch| launch == "pre-started"),
        "{launches:?}"
    );
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

/// A run's snapshot and temporary folder, as its record names them.
fn private_folders(record: &Value) -> Vec<std::path::PathBuf> {
    let confinement = &record["confinement"];
    let named = |key: &str| -> Vec<std::path::PathBuf> {
        confinement[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|path| std::path::PathBuf::from(path.as_str().unwrap()))
            .collect()
    };
    let mut folders: Vec<_> = named("read")
        .into_iter()
        .filter(|path| path.to_string_lossy().contains("kavi-snapshot-"))
        .collect();
    folders.extend(named("write"));
    folders
}

/// The executor answers before it removes a run's folders, and removes them right after: none
/// is kept while it goes on serving.
#[test]
fn a_runs_private_folders_are_removed_once_it_is_answered() {
    let Some(dir) = trusted() else { return };
    let root = dir.path();
    let _executor = Executor::start(root);
    let folders: Vec<_> = (0..3)
        .flat_map(|_| {
            let record = run(root, "{}");
            assert_eq!(record["confinement"]["launch"], "pre-started", "{record}");
            private_folders(&record)
        })
        .collect();
    assert_eq!(folders.len(), 6, "{folders:?}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while folders.iter().any(|folder| folder.exists()) {
        assert!(
            std::time::Instant::now() < deadline,
            "kept: {:?}",
            folders.iter().filter(|f| f.exists()).collect::<Vec<_>>()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A sandbox claimed before it has taken the stamp of what its view holds (a busy machine:
/// here, git slow to list the workspace for the first two sandboxes) waits for it, and serves
/// the run; it is not taken for one of another view, which would send the caller to run the
/// skill itself.
#[test]
fn a_sandbox_claimed_before_its_view_is_stamped_waits_for_it_and_serves() {
    let Some(dir) = trusted() else { return };
    let root = dir.path();
    let slow = tempfile::tempdir().unwrap();
    let tokens = slow.path().join("tokens");
    std::fs::create_dir(&tokens).unwrap();
    let path = std::env::var("PATH").unwrap();
    // The first two listings (the pool's two stamps) take seconds; `mkdir` takes a token once.
    let git = slow.path().join("git");
    std::fs::write(
        &git,
        format!(
            "#!/bin/sh\ncase \" $* \" in *\" ls-files \"*)\n  \
             if mkdir {tokens}/a 2>/dev/null || mkdir {tokens}/b 2>/dev/null; then sleep 4; fi\n\
             esac\nPATH='{path}' exec git \"$@\"\n",
            tokens = tokens.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&git, std::fs::Permissions::from_mode(0o755)).unwrap();
    let _executor = Executor::start_with(
        root,
        &[("PATH", format!("{}:{path}", slow.path().display()))],
    );
    let record = run(root, "{}");
    assert_eq!(record["confinement"]["launch"], "pre-started", "{record}");
    assert!(
        tokens.join("b").exists(),
        "the pool's listings were not slowed"
    );
}

/// A run of `demo` with the executor running: the confinement policy it ran under (its hash),
/// how it was started, what it saw at `notes/.env`, and what `kavi skill run` said on stderr.
#[derive(Debug)]
struct Governed {
    policy: Value,
    launch: Value,
    hidden: Value,
    stderr: String,
}

/// `runs` more runs of `demo`, each as [`Governed`].
fn governed(root: &Path, runs: usize) -> Vec<Governed> {
    (0..runs)
        .map(|round| {
            let ran = kavi(
                root,
                &[
                    "skill",
                    "run",
                    "demo",
                    "--input",
                    &format!("{{\"round\": {round}}}"),
                ],
            );
            let stderr = String::from_utf8_lossy(&ran.stderr).into_owned();
            assert!(ran.status.success(), "{stderr}");
            let record = json(&ran);
            Governed {
                policy: record["confinement"]["policy_hash"].clone(),
                launch: record["confinement"]["launch"].clone(),
                hidden: record["output"]["hidden"].clone(),
                stderr,
            }
        })
        .collect()
}

/// The hash a record names a policy text by.
fn text_hash(text: &str) -> String {
    use sha2::{Digest, Sha256};
    format!("sha256:{:x}", Sha256::digest(text.as_bytes()))
}

/// The hash of `policies/confinement.toml` in the adopted rule set, as the ledger keeps it.
fn adopted_confinement(root: &Path) -> String {
    let files = common::LedgerConnection::open(root)
        .texts("SELECT files FROM rule_sets WHERE status = 'adopted'");
    let files: Value = serde_json::from_str(&files[0]).unwrap();
    files["policies/confinement.toml"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// `policies/confinement.toml` with the NETWORK profile's network turned off, written in as many
/// bytes as before (`network = true` becomes `network= false`): a strengthening, by the shipped
/// `[adoption]` rules. Returns the new text.
fn network_off_same_size(root: &Path) -> String {
    let path = root.join("policies/confinement.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let start = text.find("[network]").unwrap();
    let at = start + text[start..].find("network = true").unwrap();
    let mut edited = text.clone();
    edited.replace_range(at..at + "network = true".len(), "network= false");
    assert_eq!(edited.len(), text.len());
    std::fs::write(&path, &edited).unwrap();
    edited
}

/// The executor parses the policies again only when the texts that govern change, and never
/// serves a run under a policy that is no longer the one that governs: here an edit of the
/// same size that does not weaken the adopted rules (so the file on disk governs), with the
/// file's modification time put back, so that only its bytes tell.
#[test]
fn a_policy_edited_on_disk_while_the_executor_runs_is_never_served_stale() {
    let Some(dir) = trusted() else { return };
    let root = dir.path();
    let path = root.join("policies/confinement.toml");
    let before_text = std::fs::read_to_string(&path).unwrap();
    let _executor = Executor::start(root);
    let before = governed(root, 2);
    assert_eq!(before[1].launch, "pre-started", "{before:?}");
    assert_eq!(
        before[1].policy,
        text_hash(&before_text).as_str(),
        "{before:?}"
    );

    let modified = std::fs::metadata(&path).unwrap().modified().unwrap();
    let edited = network_off_same_size(root);
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_modified(modified)
        .unwrap();
    let diff = kavi(root, &["policy", "diff"]);
    let said = String::from_utf8_lossy(&diff.stdout);
    assert!(
        said.contains("strengthening") && !said.contains("weakening "),
        "{said}"
    );

    // Every run after the edit names the edited policy; the sandboxes started under the old
    // one serve none of them, and those started after it do.
    let after = governed(root, 3);
    for run in &after {
        assert_eq!(run.policy, text_hash(&edited).as_str(), "{after:?}");
        assert!(!run.stderr.contains("weaken"), "{after:?}");
    }
    assert_eq!(after[2].launch, "pre-started", "{after:?}");
}

/// A weakening written while the executor runs does not govern its runs: the adopted copy does,
/// the run hides what the adopted profile hides, and the caller is told, as a direct run is.
#[test]
fn a_policy_weakened_on_disk_while_the_executor_runs_governs_none_of_its_runs() {
    let Some(dir) = trusted() else { return };
    let root = dir.path();
    std::fs::create_dir(root.join("notes")).unwrap();
    std::fs::write(root.join("notes/.env"), "TOKEN=hunter2\n").unwrap();
    let adopted = adopted_confinement(root);
    let _executor = Executor::start(root);
    let before = governed(root, 1);
    assert_eq!(before[0].policy, adopted.as_str(), "{before:?}");
    assert_eq!(before[0].hidden, "PermissionError", "{before:?}");

    crate::run_rules::unhide_everything(root);
    let after = governed(root, 3);
    for run in &after {
        assert_eq!(run.policy, adopted.as_str(), "{after:?}");
        assert_eq!(run.hidden, "PermissionError", "{after:?}");
        assert!(
            run.stderr.contains("weaken the adopted rules")
                && run.stderr.contains("running under adopted rule set 1"),
            "{after:?}"
        );
    }
    // The executor served them: what governs did not change, so neither did its sandboxes.
    assert!(
        after.iter().all(|run| run.launch == "pre-started"),
        "{after:?}"
    );
}

/// A rule set adopted while the executor runs governs its next run, though no governing file
/// is then what it was at the last run: here a strengthening is adopted and the file put back
/// as it was, so the disk now weakens the adopted set, and the adopted copy governs.
#[test]
fn a_rule_set_adopted_while_the_executor_runs_governs_its_next_runs() {
    if !common::isolation_or_skip() {
        return;
    }
    let dir = workspace_with(PROPOSAL, SKILL, TEST);
    let root = dir.path();
    // Who may adopt, in the rules the first run adopts.
    common::copy_policies(root, &["roles.toml"]);
    verify_and_promote(root);
    let path = root.join("policies/confinement.toml");
    let original = std::fs::read_to_string(&path).unwrap();
    let _executor = Executor::start(root);
    let before = governed(root, 1);
    assert_eq!(
        before[0].policy,
        text_hash(&original).as_str(),
        "{before:?}"
    );

    let stronger = network_off_same_size(root);
    let proposed = kavi(root, &["policy", "propose"]);
    let said = String::from_utf8_lossy(&proposed.stdout);
    assert!(
        said.starts_with("proposed rule change 2 (strengthening)"),
        "{said}{}",
        String::from_utf8_lossy(&proposed.stderr)
    );
    let adopted = kavi(root, &["policy", "adopt", "2"]);
    assert!(
        adopted.status.success(),
        "{}",
        String::from_utf8_lossy(&adopted.stderr)
    );
    std::fs::write(&path, &original).unwrap();
    assert_eq!(adopted_confinement(root), text_hash(&stronger));

    let after = governed(root, 3);
    for run in &after {
        assert_eq!(run.policy, text_hash(&stronger).as_str(), "{after:?}");
        assert!(
            run.stderr.contains("running under adopted rule set 2"),
            "{after:?}"
        );
    }
    assert_eq!(after[2].launch, "pre-started", "{after:?}");
}

/// A chain's steps run in the executor's sandboxes, by the same path as `kavi skill run`, and
/// their records keep their lineage: the chain, the step, the parent.
#[test]
fn a_chain_runs_its_steps_in_the_executors_sandboxes_with_their_lineage() {
    if !common::isolation_or_skip() {
        return;
    }
    let dir = workspace_with(PROPOSAL, SKILL, TEST);
    let root = dir.path();
    // Written before the rules are adopted: a chain nobody adopted does not govern.
    std::fs::create_dir(root.join("chains")).unwrap();
    std::fs::write(
        root.join("chains/twice.toml"),
        "[chain]\nname = \"twice\"\ndescription = \"Echo, then echo the echo\"\n\n\
         [[step]]\nid = \"first\"\nskill = \"demo\"\ninput = { word = \"hello\" }\n\n\
         [[step]]\nid = \"second\"\nskill = \"demo\"\nmap = { again = \"$.echo.word\" }\n",
    )
    .unwrap();
    verify_and_promote(root);
    let _executor = Executor::start(root);
    let ran = kavi(root, &["chain", "run", "twice", "--json"]);
    assert!(
        ran.status.success(),
        "{}",
        String::from_utf8_lossy(&ran.stderr)
    );
    let steps = json(&ran);
    let [first, second] = steps.as_array().unwrap().as_slice() else {
        panic!("{steps}");
    };
    for (step, id) in [(first, "first"), (second, "second")] {
        let record = &step["record"];
        assert_eq!(record["confinement"]["launch"], "pre-started", "{steps}");
        assert_eq!(record["chain"], "twice", "{steps}");
        assert_eq!(record["step"], id, "{steps}");
    }
    assert_eq!(second["record"]["input"]["again"], "hello", "{steps}");
    assert_eq!(
        second["record"]["parent_execution_id"], first["record"]["execution_id"],
        "{steps}"
    );
    // As the executor recorded them in the ledger.
    let recorded = common::LedgerConnection::open(root).texts(&format!(
        "SELECT chain || ' ' || step || ' ' || parent FROM executions WHERE id = '{}'",
        second["record"]["execution_id"].as_str().unwrap()
    ));
    assert_eq!(
        recorded,
        [format!(
            "twice second {}",
            first["record"]["execution_id"].as_str().unwrap()
        )]
    );
}

/// `kavi chat` and `kavi mcp` run a READ_ONLY skill in a sandbox the executor started ahead,
/// by the same path as `kavi skill run`, and the record names their caller.
#[test]
fn chat_and_mcp_use_the_executors_sandboxes_and_record_their_caller() {
    if !common::isolation_or_skip() {
        return;
    }
    let dir = common::shipped_workspace();
    let root = dir.path();
    let forged = kavi(
        root,
        &["pipeline", "run", "forge", "--set", "skill=word_count"],
    );
    assert!(
        forged.status.success(),
        "{}",
        String::from_utf8_lossy(&forged.stdout)
    );
    let _executor = Executor::start(root);

    let chat = kavi(
        root,
        &["chat", "--json", "-m", "count words in one two three"],
    );
    assert!(
        chat.status.success(),
        "{}",
        String::from_utf8_lossy(&chat.stderr)
    );
    let answer = json(&chat);
    let record = &answer["records"][0];
    assert_eq!(record["output"]["words"], 3, "{answer}");
    assert_eq!(record["caller"], "chat", "{answer}");
    assert_eq!(record["confinement"]["launch"], "pre-started", "{answer}");

    let Some(python) = crate::chains::mcp_client_python() else {
        return;
    };
    let session = crate::chains::mcp_session(&python, root, &[]);
    let execution = session["calls"]["word_count"]["structured"]["execution_id"]
        .as_str()
        .unwrap_or_else(|| panic!("{session}"))
        .to_owned();
    let recorded = common::LedgerConnection::open(root).texts(&format!(
        "SELECT caller || char(9) || confinement FROM executions WHERE id = '{execution}'"
    ));
    let (caller, confinement) = recorded[0].split_once('\t').unwrap();
    assert!(caller.starts_with("mcp:"), "{caller}");
    let confinement: Value = serde_json::from_str(confinement).unwrap();
    assert_eq!(confinement["launch"], "pre-started", "{confinement}");
}

/// The executor serves only its own workspace, with its own settings: a second workspace on
/// the same ledger (whose socket it shares) and a caller with a shorter `skill_timeout` run the
/// skill themselves, by their own folder and settings, and the executor's sandboxes wait for
/// its own callers.
#[test]
fn an_executor_serves_no_other_workspace_and_no_caller_with_other_settings() {
    let Some(dir) = trusted() else { return };
    let root = dir.path();
    let other = tempfile::tempdir().unwrap();
    let copied = std::process::Command::new("cp")
        .args(["-a", "--no-target-directory"])
        .arg(root)
        .arg(other.path())
        .status()
        .unwrap();
    assert!(copied.success());
    let executor = Executor::start(root);
    let asked = |cwd: &Path, env: (&str, &std::ffi::OsStr)| {
        let ran = common::kavi_command(cwd, &["skill", "run", "demo", "--input", "{}"])
            .env(env.0, env.1)
            .output()
            .unwrap();
        assert!(
            ran.status.success(),
            "{}",
            String::from_utf8_lossy(&ran.stderr)
        );
        json(&ran)
    };
    let shared_ledger = root.join(".kavi/ledger.db");
    assert!(shared_ledger.is_file());
    let elsewhere = asked(other.path(), ("KAVI_LEDGER", shared_ledger.as_os_str()));
    assert_eq!(elsewhere["confinement"].get("launch"), None, "{elsewhere}");
    let shorter = asked(root, ("KAVI_SKILL_TIMEOUT", "2s".as_ref()));
    assert_eq!(shorter["confinement"].get("launch"), None, "{shorter}");
    let own = asked(root, ("KAVI_SKILL_TIMEOUT", "60s".as_ref()));
    assert_eq!(own["confinement"]["launch"], "pre-started", "{own}");
    let said = executor.stop();
    assert!(
        said.contains(&format!(
            "not serving a caller in {}",
            other.path().display()
        )),
        "{said}"
    );
}
