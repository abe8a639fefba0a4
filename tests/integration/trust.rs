//! Trust end to end: a skill is promoted only at the hash its gates verified, the registry is
//! derived from the ledger, and one changed byte is reported as drift.

use crate::common;

use common::{copy_policies, json, kavi, node};

use serde_json::Value;

/// `verify-promote`: a build of `params.skill` copied back, its gates, and its promotion.
fn pipeline() -> String {
    format!("{HEAD}{}{TAIL}", common::BUILD_NODES)
}

const HEAD: &str = r#"
[pipeline]
name = "verify-promote"

[params.skill]
type = "string"

[params.tamper]
type = "boolean"
default = false

"#;

const TAIL: &str = r#"[nodes.built]
kind = "transition"
needs = ["copy"]
skill = "{{ params.skill }}"
to = "BUILT"

[nodes.gates]
kind = "gate"
needs = ["built"]
skill = "{{ params.skill }}"
vars = { skill = "{{ params.skill }}" }

[nodes.tamper]
kind = "exec"
needs = ["gates"]
when = "params.tamper"
env = { SKILL = "{{ params.skill }}" }
shell = "echo '# changed' >> \"skills/$SKILL/skill.py\""

[nodes.verified]
kind = "transition"
needs = ["gates", "tamper"]
skill = "{{ params.skill }}"
to = "VERIFIED"

[nodes.promote]
kind = "promote"
needs = ["verified"]
skill = "{{ params.skill }}"
comment = "all gates passed"
"#;

pub(crate) const PROPOSAL: &str = "name = \"demo\"\ndescription = \"Echo\"\nside_effect = \"READ_ONLY\"\ncommand = [\"python3\", \"skills/demo/skill.py\"]\ninput_schema = { type = \"object\" }\noutput_schema = { type = \"object\" }\n";
const SKILL: &str = "import json\nimport sys\nfrom typing import Any\n\nSIDE_EFFECT = \"READ_ONLY\"\n\ndef run(data: Any) -> dict[str, Any]:\n    return {'echo': data}\n\nif __name__ == '__main__':\n    print(json.dumps(run(json.load(sys.stdin))))\n";
pub(crate) const TEST: &str = "import unittest\nfrom skill import run\n\nclass T(unittest.TestCase):\n    def test_echo(self) -> None:\n        self.assertEqual(run(1), {'echo': 1})\n";

fn workspace() -> tempfile::TempDir {
    workspace_with(PROPOSAL, SKILL, TEST)
}

/// A workspace with the `demo` skill proposed from `proposal`, its files written.
pub(crate) fn workspace_with(proposal: &str, skill: &str, test: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    for folder in ["pipelines", "policies", "proposals", "skills/demo"] {
        std::fs::create_dir_all(root.join(folder)).unwrap();
    }
    copy_policies(
        root,
        &[
            "lifecycle.toml",
            "gates.toml",
            "classifier.toml",
            "scanner.toml",
            "trust.toml",
            "conventions.toml",
            "invariants.toml",
            "confinement.toml",
            "sandbox.toml",
            "allowlist.toml",
        ],
    );
    common::copy_gate_tools(root);
    // The skill is BUILT only by a build copied back: this one's builder leaves the files the
    // test wrote as they are, and the copy records their hash.
    std::fs::create_dir_all(root.join("templates")).unwrap();
    std::fs::copy(
        common::repo().join("templates/build_packet.md.j2"),
        root.join("templates/build_packet.md.j2"),
    )
    .unwrap();
    std::fs::write(root.join("kavi.toml"), "builder = \"true\"\n").unwrap();
    // These tests are about trust, not contracts: their proposals need declare no example.
    let gates = root.join("policies/gates.toml");
    let text = std::fs::read_to_string(&gates).unwrap();
    let relaxed = text.replacen("min_examples = 1\n", "min_examples = 0\n", 1);
    assert_ne!(relaxed, text, "the contract gate's minimum was not found");
    std::fs::write(&gates, relaxed).unwrap();
    // This workspace's governed path to TRUSTED is its own pipeline.
    let trust = std::fs::read_to_string(root.join("policies/trust.toml")).unwrap();
    let own = trust.replace(
        "pipelines = [\"pipelines/forge.toml\", \"pipelines/forge_attempt.toml\"]",
        "pipelines = [\"pipelines/verify-promote.toml\"]",
    );
    assert_ne!(own, trust);
    std::fs::write(root.join("policies/trust.toml"), own).unwrap();
    std::fs::write(root.join("proposals/demo.toml"), proposal).unwrap();
    std::fs::write(root.join("skills/demo/skill.py"), skill).unwrap();
    std::fs::write(root.join("skills/demo/test_skill.py"), test).unwrap();
    std::fs::write(root.join("pipelines/verify-promote.toml"), pipeline()).unwrap();
    json(&kavi(
        root,
        &["skill", "propose", "proposals/demo.toml", "--json"],
    ));
    dir
}

/// Runs the gates over `demo` and promotes it.
pub(crate) fn verify_and_promote(root: &std::path::Path) {
    let out = kavi(
        root,
        &["pipeline", "run", "verify-promote", "--set", "skill=demo"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn a_verified_skill_is_promoted_at_its_hash_and_drift_is_reported() {
    let dir = workspace();
    let root = dir.path();
    verify_and_promote(root);

    let run = json(&kavi(root, &["runs", "show", "--json"]));
    let verified_hash = run["verifications"][0]["source_hash"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(verified_hash.starts_with("sha256:"));
    let promote = node(&run, "promote");
    assert_eq!(promote["outputs"]["source_hash"], verified_hash.as_str());
    assert_eq!(promote["outputs"]["to"], "TRUSTED");

    let shown = json(&kavi(root, &["skill", "show", "demo", "--json"]));
    assert_eq!(shown["skill"]["state"], "TRUSTED");
    let last = shown["transitions"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(
        (last["from_state"].as_str(), last["to_state"].as_str()),
        (Some("VERIFIED"), Some("TRUSTED"))
    );
    assert_eq!(last["comment"], "all gates passed");

    let registry: Value =
        serde_json::from_str(&std::fs::read_to_string(root.join(".kavi/registry.json")).unwrap())
            .unwrap();
    assert_eq!(registry["skills"][0]["name"], "demo");
    assert_eq!(
        registry["skills"][0]["trusted_hash"],
        verified_hash.as_str()
    );

    let ran = kavi(root, &["skill", "run", "demo", "--input", r#"{"x": 1}"#]);
    assert!(
        ran.status.success(),
        "{}",
        String::from_utf8_lossy(&ran.stderr)
    );
    let record = json(&ran);
    assert_eq!(record["output"], serde_json::json!({"echo": {"x": 1}}));
    assert_eq!(record["source_hash"], verified_hash.as_str());

    let ok = kavi(root, &["skill", "verify"]);
    assert!(ok.status.success());
    assert!(String::from_utf8_lossy(&ok.stdout).starts_with("ok     demo  sha256:"));

    // One byte changed: drift, named, with the way back.
    let skill = root.join("skills/demo/skill.py");
    let text = std::fs::read_to_string(&skill).unwrap();
    std::fs::write(&skill, text.replace("echo", "ech0")).unwrap();
    // Running it is refused before anyone checks, with the way back, and the skill does not run.
    let refused = kavi(root, &["skill", "run", "demo", "--input", "{}"]);
    assert_eq!(refused.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.starts_with("error: refusing to run `demo`: its files changed since it was trusted"),
        "{stderr}"
    );
    assert!(stderr.contains("verify and promote it again"), "{stderr}");
    assert!(refused.stdout.is_empty());
    let drift = kavi(root, &["skill", "verify", "demo"]);
    assert_eq!(drift.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&drift.stdout);
    assert!(
        stdout.starts_with("DRIFT  demo  trusted sha256:"),
        "{stdout}"
    );
    assert!(stdout.contains("they are now SUSPENDED"), "{stdout}");
    // Suspended, with both hashes recorded; no longer listed, and it still does not run.
    let shown = json(&kavi(root, &["skill", "show", "demo", "--json"]));
    assert_eq!(shown["skill"]["state"], "SUSPENDED", "{shown}");
    let last = shown["transitions"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    // It names the machine that saw it, and the file, with what was trusted and what was found.
    let host = nix::unistd::gethostname().unwrap().into_string().unwrap();
    let comment = last["comment"].as_str().unwrap();
    assert!(
        comment.starts_with(&format!("drift on {host}: its files hash to sha256:")),
        "{last}"
    );
    assert!(
        comment.ends_with(&format!(
            "; skills/demo/skill.py: trusted sha256:{}, found sha256:{}",
            kavi::hash::sha256_hex(text.as_bytes()),
            kavi::hash::sha256_hex(text.replace("echo", "ech0").as_bytes())
        )),
        "{last}"
    );
    assert_eq!(
        json(&kavi(root, &["skill", "list", "--json"])),
        serde_json::json!([])
    );
    let refused = kavi(root, &["skill", "run", "demo", "--input", "{}"]);
    assert_eq!(refused.status.code(), Some(2));
    assert!(refused.stdout.is_empty());
}

/// Trust vouches for the proposal as well as the folder: editing the proposal after promotion
/// (its command, say) is drift, and the skill no longer runs.
#[test]
fn an_edited_proposal_is_drift_and_the_skill_no_longer_runs() {
    let dir = workspace();
    let root = dir.path();
    verify_and_promote(root);
    assert!(kavi(root, &["skill", "verify", "demo"]).status.success());

    let proposal = root.join("proposals/demo.toml");
    let text = std::fs::read_to_string(&proposal).unwrap();
    std::fs::write(&proposal, text.replace("\"Echo\"", "\"Echo, edited\"")).unwrap();
    let refused = kavi(root, &["skill", "run", "demo", "--input", "{}"]);
    assert_eq!(refused.status.code(), Some(2));
    assert!(refused.stdout.is_empty());
    let drift = kavi(root, &["skill", "verify", "demo"]);
    assert_eq!(drift.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&drift.stdout).starts_with("DRIFT  demo"));

    // Restore puts the trusted proposal back, byte for byte, and the skill is trusted again.
    let restored = kavi(root, &["skill", "restore", "demo"]);
    assert!(
        restored.status.success(),
        "{}",
        String::from_utf8_lossy(&restored.stderr)
    );
    assert_eq!(std::fs::read_to_string(&proposal).unwrap(), text);
    assert!(kavi(root, &["skill", "verify", "demo"]).status.success());

    // Gone is drift too, with the reason; restored, it runs again.
    std::fs::remove_file(&proposal).unwrap();
    let gone = kavi(root, &["skill", "verify", "demo"]);
    let stdout = String::from_utf8_lossy(&gone.stdout);
    assert!(
        stdout.contains("now unreadable: cannot read the proposal proposals/demo.toml"),
        "{stdout}"
    );
    assert!(kavi(root, &["skill", "restore", "demo"]).status.success());
    assert!(
        kavi(root, &["skill", "run", "demo", "--input", "{}"])
            .status
            .success()
    );
    common::assert_ledger_verifies(root);
}

/// A proposal's command may run only what trust vouches for: a file of the skill's folder, run
/// itself or by a Python interpreter with no option that loads code. Anything else (another
/// program, whose arguments could load anything) is refused at propose time, pointing at
/// `command`.
#[test]
fn a_command_that_names_a_file_outside_the_skill_folder_is_refused_at_propose() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    copy_policies(root, &["lifecycle.toml", "conventions.toml", "trust.toml"]);
    std::fs::create_dir_all(root.join("helpers")).unwrap();
    std::fs::write(root.join("helpers/impl.py"), "print('{}')\n").unwrap();
    std::fs::write(root.join("impl.py"), "print('{}')\n").unwrap();
    let propose = |command: &str| {
        let text = PROPOSAL.replace(
            "command = [\"python3\", \"skills/demo/skill.py\"]",
            &format!("command = {command}"),
        );
        std::fs::write(root.join("demo.toml"), text).unwrap();
        kavi(root, &["skill", "propose", "demo.toml"])
    };
    for command in [
        r#"["python3", "helpers/impl.py"]"#,
        r#"["python3", "impl.py"]"#,
        r#"["python3", "-u", "--script=helpers/impl.py"]"#,
        r#"["python3", "skills/demo/../../helpers/impl.py"]"#,
        r#"["python3", "/tmp/impl.py"]"#,
        r#"["helpers/impl.py"]"#,
        r#"["/usr/bin/env", "python3", "helpers/impl.py"]"#,
        // Each ran bytes no hash covered, and reached TRUSTED, before.
        r#"["python3", "-X", "pycache_prefix=pyc", "skills/demo/skill.py"]"#,
        r#"["env", "LD_PRELOAD=libfast.so", "python3", "skills/demo/skill.py"]"#,
        r#"["python3", "-c", "exec(open('impl.py').read())"]"#,
        r#"["python3", "-W", "ignore::impl.Warning", "skills/demo/skill.py"]"#,
        r#"["python3", "-m", "impl"]"#,
        r#"["sh", "-c", "python3 impl.py"]"#,
        r#"["bash", "skills/demo/run.sh"]"#,
    ] {
        let out = propose(command);
        assert_eq!(out.status.code(), Some(3), "{command} was accepted");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("trust cannot vouch for") && stderr.contains("demo.toml:4:"),
            "{command}: {stderr}"
        );
    }
    // Inside the folder, with flags and a bare program, is fine.
    let out = propose(r#"["python3", "-u", "skills/demo/skill.py", "--mode=fast"]"#);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn files_changed_after_verification_are_not_promoted() {
    let dir = workspace();
    let out = kavi(
        dir.path(),
        &[
            "pipeline",
            "run",
            "verify-promote",
            "--set",
            "skill=demo",
            "--set",
            "tamper=true",
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    let run = json(&kavi(dir.path(), &["runs", "show", "--json"]));
    let promote = node(&run, "promote");
    assert_eq!(promote["state"], "failed");
    let error = promote["error"].as_str().unwrap();
    assert!(
        error.starts_with("`demo` changed since it was verified (verified sha256:"),
        "{error}"
    );
    assert!(error.ends_with("; verify it again"), "{error}");
    let shown = json(&kavi(dir.path(), &["skill", "show", "demo", "--json"]));
    assert_eq!(shown["skill"]["state"], "VERIFIED");
    assert!(!dir.path().join(".kavi/registry.json").exists());
    let verify = kavi(dir.path(), &["skill", "verify", "demo"]);
    assert_eq!(verify.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&verify.stderr),
        "error: skill `demo` is not trusted (it is VERIFIED); only trusted skills have a hash to check\n"
    );
}

/// Secrets reach a skill only when it declares them, and never reach a record or the log.
#[test]
fn a_skill_gets_only_its_declared_secrets_and_their_values_are_never_recorded() {
    let proposal = PROPOSAL
        .replace("READ_ONLY", "SECRET_READ")
        .replace("description", "secrets = [\"DEMO_TOKEN\"]\ndescription");
    let skill = "import json\nimport os\nimport sys\nfrom typing import Any\n\nSIDE_EFFECT = \"SECRET_READ\"\n\ndef run(data: Any) -> dict[str, Any]:\n    token = os.environ.get('DEMO_TOKEN', '')\n    return {'token': 'token=' + token, 'other': os.environ.get('OTHER_VAR'), 'length': len(token), 'keyed': {token: 'x'}}\n\nif __name__ == '__main__':\n    json.dump(run(json.load(sys.stdin)), sys.stdout)\n";
    let test = "import unittest\nfrom skill import run\n\nclass T(unittest.TestCase):\n    def test_shape(self) -> None:\n        self.assertIn('length', run({}))\n";
    let dir = workspace_with(&proposal, skill, test);
    let root = dir.path();
    verify_and_promote(root);

    let secret = "s3cr3t-value-0451";
    let ran = common::kavi_command(root, &["skill", "run", "demo", "--input", "{}", "--yes"])
        .env("DEMO_TOKEN", secret)
        .env("OTHER_VAR", "not declared")
        .output()
        .unwrap();
    let record = json(&ran);
    // The skill saw the declared secret (its length) and not the undeclared variable.
    assert_eq!(record["output"]["length"], secret.len());
    assert!(record["output"]["other"].is_null());
    // The value itself is redacted from the record, as a value and as a key.
    assert_eq!(record["output"]["token"], "token=[redacted]");
    assert_eq!(
        record["output"]["keyed"],
        serde_json::json!({"[redacted]": "x"})
    );
    let id = record["execution_id"].as_str().unwrap();
    let kept = json(&kavi(root, &["session", "--execution-id", id, "--json"]));
    assert_eq!(kept[0]["output"]["token"], "token=[redacted]");
    let log = std::fs::read_to_string(root.join(".kavi/executions.jsonl")).unwrap();
    assert!(log.contains("token=[redacted]") && !log.contains(secret));
    // Nor anywhere in kavi's state: the ledger, its write-ahead log, the artifacts.
    common::assert_nowhere_under(&root.join(".kavi"), secret);

    // A declared secret that is unset, or too short to redact, stops the run before the skill
    // starts: it never runs with an empty value, and one character is never hidden everywhere.
    for (value, says) in [
        (None, "secret `DEMO_TOKEN` is not set in kavi's environment"),
        (
            Some("x"),
            "secret `DEMO_TOKEN` has 1 character(s); kavi needs at least 4",
        ),
    ] {
        let mut command =
            common::kavi_command(root, &["skill", "run", "demo", "--input", "{}", "--yes"]);
        command.env_remove("DEMO_TOKEN");
        if let Some(value) = value {
            command.env("DEMO_TOKEN", value);
        }
        let refused = command.output().unwrap();
        assert_eq!(refused.status.code(), Some(1), "{refused:?}");
        let record: serde_json::Value = serde_json::from_slice(&refused.stdout).unwrap();
        assert!(record["output"].is_null(), "{record}");
        assert!(record["error"].as_str().unwrap().contains(says), "{record}");
        assert!(
            record["confinement"].is_null(),
            "the skill was started: {record}"
        );
    }
}

/// A trusted skill `demo` that, given `{"wait": true}`, writes its pid into the workspace and
/// sleeps, started by `kavi skill run`: the kavi process, the skill's pid as this machine sees
/// it, and the workspace.
fn start_waiting_skill() -> (std::process::Child, i32, tempfile::TempDir) {
    let skill = "import json\nimport os\nimport sys\nimport time\nfrom typing import Any\n\nSIDE_EFFECT = \"READ_ONLY\"\n\ndef run(data: Any) -> dict[str, Any]:\n    if data.get('wait'):\n        with open('skill.pid', 'w') as out:\n            out.write(str(os.getpid()) + '\\n')\n        time.sleep(60)\n    return {'echo': data}\n\nif __name__ == '__main__':\n    json.dump(run(json.load(sys.stdin)), sys.stdout)\n";
    let test = "import unittest\nfrom skill import run\n\nclass T(unittest.TestCase):\n    def test_echo(self) -> None:\n        self.assertEqual(run({}), {'echo': {}})\n";
    let dir = workspace_with(PROPOSAL, skill, test);
    let root = dir.path();
    // Its READ_ONLY skill may write its pid file into the workspace.
    let policy = root.join("policies/confinement.toml");
    let text = std::fs::read_to_string(&policy).unwrap();
    let granted = text.replacen(
        "[read_only]\nrequire = true\nread = [\"{{ workspace }}\", \"{{ snapshot }}\"]\nwrite = [\"{{ tmp }}\"",
        "[read_only]\nrequire = true\nread = [\"{{ workspace }}\", \"{{ snapshot }}\"]\nwrite = [\"{{ workspace }}\", \"{{ tmp }}\"",
        1,
    );
    assert_ne!(granted, text, "the read_only profile was not found");
    std::fs::write(&policy, granted).unwrap();
    kernel_only(root);
    verify_and_promote(root);
    let kavi_process = common::kavi_command(
        root,
        &["skill", "run", "demo", "--input", r#"{"wait": true}"#],
    )
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::null())
    .spawn()
    .unwrap();
    let pid_file = root.join("skill.pid");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    // The pid the skill wrote is its own namespace's; kavi's side knows it by its working
    // folder and command line.
    let pid = loop {
        if std::fs::read_to_string(&pid_file).is_ok_and(|t| t.ends_with('\n'))
            && let Some(pid) = skill_process(root)
        {
            break pid;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the skill never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    (kavi_process, pid, dir)
}

/// A kavi killed while a skill runs, and the private folders it left (the skill's snapshot, its
/// temporary folder, the tripwires' decoys), each listed in its roster and still there.
fn killed_skill_runs_folders() -> (tempfile::TempDir, Vec<std::path::PathBuf>) {
    let (mut kavi_process, _, dir) = start_waiting_skill();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(kavi_process.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    kavi_process.wait().unwrap();
    let folders = common::roster_folders(dir.path());
    let names: Vec<String> = folders
        .iter()
        .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    for made in ["kavi-snapshot-", "kavi-tmp-skill-", "kavi-tripwires-"] {
        assert!(
            names.iter().any(|n| n.starts_with(made)),
            "{made} not listed: {names:?}"
        );
    }
    assert!(folders.iter().all(|f| f.is_dir()), "{folders:?}");
    (dir, folders)
}

/// The private folders of a kavi killed while a skill runs are removed by the next kavi that
/// opens the ledger, every one its roster lists.
#[test]
fn a_killed_skill_runs_private_folders_are_removed_by_the_next_kavi() {
    let (dir, folders) = killed_skill_runs_folders();
    assert!(kavi(dir.path(), &["runs", "list"]).status.success());
    let left: Vec<_> = folders.iter().filter(|f| f.exists()).collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// `kavi gc` removes them too: it is the command a user runs to clean up, and it removes
/// nothing of a live run's, so it must not take the killed kavi's folders for a live one's.
#[test]
fn a_killed_skill_runs_private_folders_are_removed_by_gc() {
    let (dir, folders) = killed_skill_runs_folders();
    let gc = kavi(dir.path(), &["gc"]);
    assert!(gc.status.success(), "{gc:?}");
    let left: Vec<_> = folders.iter().filter(|f| f.exists()).collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// Ctrl-C during `kavi skill run` stops the skill (in its own process group, so the terminal's
/// signal does not reach it) and records the execution as cancelled; kavi exits 130.
#[test]
fn ctrl_c_stops_a_running_skill_and_records_it_as_cancelled() {
    let (kavi_process, pid, _dir) = start_waiting_skill();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(kavi_process.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let out = kavi_process.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130));
    let record: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(record["success"], false);
    assert_eq!(record["error"], "cancelled");
    // The skill's process is gone (a zombie has exited already).
    let gone = || {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
            stat.rsplit(')')
                .next()
                .is_some_and(|rest| rest.trim_start().starts_with('Z'))
        })
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !gone() {
        assert!(
            std::time::Instant::now() < deadline,
            "the skill {pid} survived the cancel"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// The host pid of a `skill.py` running in `root`, found by its working folder.
fn skill_process(root: &std::path::Path) -> Option<i32> {
    let root = root.canonicalize().ok()?;
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let cwd = std::fs::read_link(entry.path().join("cwd")).ok()?;
            (String::from_utf8_lossy(&cmdline).contains("skill.py") && cwd == root).then_some(pid)
        })
}

/// A skill that writes where its input says, or fetches a URL: what a READ_ONLY skill must not do.
fn side_effect_skill(class: &str) -> String {
    format!(
        "import json\nimport os\nimport sys\nimport urllib.request\nfrom typing import Any\n\nSIDE_EFFECT = \"{class}\"\n\n\
         def run(data: Any) -> dict[str, Any]:\n    if 'write' in data:\n        with open(data['write'], 'w') as out:\n            \
         out.write('written\\n')\n    if 'scratch' in data:\n        \
         with open(os.path.join(os.environ['TMPDIR'], 'scratch'), 'w') as out:\n            \
         out.write('ok\\n')\n    if 'fetch' in data:\n        urllib.request.urlopen(data['fetch'], timeout=5)\n    \
         return {{'echo': data}}\n\nif __name__ == '__main__':\n    print(json.dumps(run(json.load(sys.stdin))))\n"
    )
}

const SIDE_EFFECT_TEST: &str = "import unittest\nfrom skill import run\n\nclass T(unittest.TestCase):\n    def test_echo(self) -> None:\n        self.assertEqual(run({}), {'echo': {}})\n";

/// Leaves the kernel alone to enforce the class: drops the invariants' capability rules and the
/// policy scan (the gates' early refusals, tests/integration/scanner.rs), as if the skill's code had found a
/// way past them.
fn kernel_only(root: &std::path::Path) {
    let gates = root.join("policies/gates.toml");
    let text = std::fs::read_to_string(&gates).unwrap();
    let kept: Vec<&str> = text
        .split("[[gate]]")
        .filter(|gate| !gate.contains("kind = \"policy_scan\""))
        .collect();
    assert!(
        kept.len() < text.split("[[gate]]").count(),
        "no policy scan found"
    );
    std::fs::write(&gates, kept.join("[[gate]]")).unwrap();
    let path = root.join("policies/invariants.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let kept: Vec<&str> = text
        .split("[[invariant]]")
        .filter(|rule| !rule.contains("kind = \"capability\""))
        .collect();
    assert!(
        kept.len() < text.split("[[invariant]]").count(),
        "no capability rule found"
    );
    std::fs::write(&path, kept.join("[[invariant]]")).unwrap();
}

/// Before the kernel, the gate refuses code that does what its class may not, naming the line.
#[test]
fn the_gate_refuses_a_read_only_skill_whose_code_uses_the_network_or_writes() {
    let dir = workspace_with(PROPOSAL, &side_effect_skill("READ_ONLY"), SIDE_EFFECT_TEST);
    let out = kavi(
        dir.path(),
        &["pipeline", "run", "verify-promote", "--set", "skill=demo"],
    );
    assert_eq!(out.status.code(), Some(1));
    let run = json(&kavi(dir.path(), &["runs", "show", "--json"]));
    let error = node(&run, "gates")["error"].as_str().unwrap().to_owned();
    for expected in [
        "skills/demo/skill.py:4: [network-needs-network] uses the network, which only a skill \
         proposed as NETWORK may, and this one was proposed as READ_ONLY: import urllib.request",
        "[writes-need-file-write] writes files, which only a skill proposed as FILE_WRITE may",
        // The policy scan, by syntax, names the import, the use and the write mode.
        "skills/demo/skill.py:4:1: [network] uses the network: imports `urllib.request`",
        "[file_write] writes files: opens a file with mode `w`",
    ] {
        assert!(error.contains(expected), "{error}");
    }
    let shown = json(&kavi(dir.path(), &["skill", "show", "demo", "--json"]));
    assert_ne!(shown["skill"]["state"], "TRUSTED");
}

/// Runs `demo` with `input`; returns its execution record (success or not).
fn run_demo(root: &std::path::Path, input: &str, yes: bool) -> serde_json::Value {
    let mut args = vec!["skill", "run", "demo", "--input", input];
    if yes {
        args.push("--yes");
    }
    let out = kavi(root, &args);
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&out.stderr)))
}

/// What a failing skill printed on stderr is quoted in kavi's error line, and shown there, never
/// obeyed: a terminal escape (here a window title and a clipboard write) and a carriage return
/// reach stderr in caret notation.
#[test]
fn a_failing_skills_stderr_is_shown_never_sent_to_the_terminal() {
    let skill = SKILL.replace(
        "    print(json.dumps(run(json.load(sys.stdin))))\n",
        "    data = json.load(sys.stdin)\n    sys.stderr.write(str(data['shout']))\n    sys.exit(1)\n",
    );
    assert_ne!(skill, SKILL);
    let dir = workspace_with(PROPOSAL, &skill, TEST);
    let root = dir.path();
    verify_and_promote(root);
    let out = kavi(
        root,
        &[
            "skill",
            "run",
            "demo",
            "--input",
            r#"{"shout": "\u001b]0;PWNED\u0007\u001b]52;c;ZWNobw==\u0007\rFAKE: ok"}"#,
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("^[]0;PWNED^G^[]52;c;ZWNobw==^G^MFAKE: ok"),
        "{stderr}"
    );
    assert!(!stderr.contains(['\u{1b}', '\r', '\u{7}']), "{stderr:?}");
}

/// The execution failed because its confinement denied something: a read-only path, a path
/// not in its view, or a call its seccomp filter refuses or kills.
fn assert_denied(record: &serde_json::Value) {
    assert_eq!(record["success"], false);
    let error = record["error"].as_str().unwrap();
    assert!(
        [
            "Read-only file system",
            "No such file",
            "forbidden system call",
            "Operation not permitted"
        ]
        .iter()
        .any(|denial| error.contains(denial)),
        "{record}"
    );
}

#[test]
fn a_read_only_skill_can_neither_write_outside_its_temporary_folder_nor_connect() {
    if !common::isolation_or_skip() {
        return;
    }
    let dir = workspace_with(PROPOSAL, &side_effect_skill("READ_ONLY"), SIDE_EFFECT_TEST);
    let root = dir.path();
    kernel_only(root);
    verify_and_promote(root);

    let target = root.join("outside.txt");
    let record = run_demo(
        root,
        &format!(r#"{{"write": "{}"}}"#, target.display()),
        false,
    );
    assert_eq!(record["success"], false);
    let error = record["error"].as_str().unwrap();
    assert!(
        error.contains("under the READ_ONLY profile") && error.contains("Read-only file system"),
        "{error}"
    );
    assert!(!target.exists());
    assert_eq!(record["confinement"]["role"], "READ_ONLY skill");
    assert_eq!(record["confinement"]["network"], "none");
    // The policy the profile came from is kept, and named by its hash.
    let hash = record["confinement"]["policy_hash"].as_str().unwrap();
    let policy = kavi(root, &["spec", "show", hash]);
    assert_eq!(
        String::from_utf8_lossy(&policy.stdout),
        std::fs::read_to_string(root.join("policies/confinement.toml")).unwrap()
    );

    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let url = format!(
        "http://127.0.0.1:{}/",
        listener.local_addr().unwrap().port()
    );
    let record = run_demo(root, &format!(r#"{{"fetch": "{url}"}}"#), false);
    assert_denied(&record);
    assert_eq!(
        listener.accept().map(|_| ()).unwrap_err().kind(),
        std::io::ErrorKind::WouldBlock,
        "the listener saw a connection"
    );

    // Its private temporary folder is its own to write.
    assert_eq!(
        run_demo(root, r#"{"scratch": true}"#, false)["success"],
        true
    );
}

#[test]
fn a_file_write_skill_writes_only_under_the_paths_its_proposal_declares() {
    if !common::isolation_or_skip() {
        return;
    }
    let proposal = PROPOSAL
        .replace("READ_ONLY", "FILE_WRITE")
        .replace("command =", "writes = [\"out\"]\ncommand =");
    let dir = workspace_with(
        &proposal,
        &side_effect_skill("FILE_WRITE"),
        SIDE_EFFECT_TEST,
    );
    let root = dir.path();
    // `out` does not exist yet: kavi makes it, so the profile can grant it.
    kernel_only(root);
    verify_and_promote(root);

    let record = run_demo(root, r#"{"write": "elsewhere.txt"}"#, true);
    assert_denied(&record);
    assert!(!root.join("elsewhere.txt").exists());

    let record = run_demo(root, r#"{"write": "out/note.txt"}"#, true);
    assert_eq!(record["success"], true, "{record}");
    assert_eq!(
        std::fs::read_to_string(root.join("out/note.txt")).unwrap(),
        "written\n"
    );
    assert!(
        record["confinement"]["write"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p.as_str().unwrap().ends_with("/out")),
        "{record}"
    );
}

/// A NETWORK skill reaches the hosts `[processes] allowed_hosts` lists, only through kavi's
/// proxy, and its execution record says which connections were allowed and which refused.
#[test]
fn a_network_skill_reaches_only_allowed_hosts_and_its_record_lists_each_connection() {
    if !common::isolation_or_skip() {
        return;
    }
    let serve = |body: &'static str| {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for mut stream in listener.incoming().flatten() {
                use std::io::{Read, Write};
                let mut head = [0u8; 4096];
                let _ = stream.read(&mut head);
                let _ = write!(
                    stream,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        port
    };
    let (allowed, other) = (serve("allowed"), serve("other"));
    let proposal = PROPOSAL.replace("READ_ONLY", "NETWORK");
    let dir = workspace_with(&proposal, &side_effect_skill("NETWORK"), SIDE_EFFECT_TEST);
    let root = dir.path();
    kernel_only(root);
    std::fs::write(
        root.join("policies/network.toml"),
        format!("allowed_hosts = []\n[processes]\nallowed_hosts = [\"127.0.0.1:{allowed}\"]\n"),
    )
    .unwrap();
    verify_and_promote(root);

    let record = run_demo(
        root,
        &format!(r#"{{"fetch": "http://127.0.0.1:{allowed}/"}}"#),
        true,
    );
    assert_eq!(record["success"], true, "{record}");
    let confinement = &record["confinement"];
    assert_eq!(confinement["network"], "proxy", "{record}");
    assert_eq!(confinement["proxy"]["policy"], "policies/network.toml");
    let connections = confinement["proxy"]["connections"].as_array().unwrap();
    assert_eq!(connections.len(), 1, "{record}");
    assert_eq!(connections[0]["port"], allowed);
    assert_eq!(connections[0]["allowed"], true);

    let record = run_demo(
        root,
        &format!(r#"{{"fetch": "http://127.0.0.1:{other}/"}}"#),
        true,
    );
    assert_eq!(record["success"], false, "{record}");
    assert!(
        record["error"].as_str().unwrap().contains("403"),
        "{record}"
    );
    let connections = record["confinement"]["proxy"]["connections"]
        .as_array()
        .unwrap();
    assert_eq!(connections.len(), 1, "{record}");
    assert_eq!(connections[0]["port"], other);
    assert_eq!(connections[0]["allowed"], false);
    assert_eq!(record["confinement"]["proxy"]["refused"], 1);
}

/// Secrets go only to a skill whose classes include SECRET_READ; several classes are written as
/// an array and recorded as one set.
#[test]
fn secrets_need_secret_read_and_classes_combine() {
    let dir = tempfile::tempdir().unwrap();
    copy_policies(
        dir.path(),
        &["lifecycle.toml", "conventions.toml", "trust.toml"],
    );
    let with_secret = PROPOSAL.replace("command =", "secrets = [\"API_TOKEN\"]\ncommand =");
    std::fs::write(dir.path().join("demo.toml"), &with_secret).unwrap();
    let out = kavi(dir.path(), &["skill", "propose", "demo.toml"]);
    assert_eq!(out.status.code(), Some(3));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("`secrets` is for SECRET_READ skills; this one is READ_ONLY"),
        "{stderr}"
    );
    let combined = with_secret.replace(
        "side_effect = \"READ_ONLY\"",
        "side_effect = [\"SECRET_READ\", \"NETWORK\"]",
    );
    std::fs::write(dir.path().join("demo.toml"), combined).unwrap();
    let skill = json(&kavi(
        dir.path(),
        &["skill", "propose", "demo.toml", "--json"],
    ));
    assert_eq!(skill["side_effect"], "NETWORK+SECRET_READ");
}

#[test]
fn writes_are_refused_in_a_proposal_that_is_not_file_write() {
    let proposal = PROPOSAL.replace("command =", "writes = [\"out\"]\ncommand =");
    let dir = tempfile::tempdir().unwrap();
    copy_policies(
        dir.path(),
        &["lifecycle.toml", "conventions.toml", "trust.toml"],
    );
    std::fs::write(dir.path().join("demo.toml"), proposal).unwrap();
    let out = kavi(dir.path(), &["skill", "propose", "demo.toml"]);
    // An invalid spec (docs/exit-codes.md), pointing at the field.
    assert_eq!(out.status.code(), Some(3));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("`writes` is for FILE_WRITE skills; this one is READ_ONLY")
            && stderr.contains("demo.toml:4:"),
        "{stderr}"
    );
}

#[test]
fn a_proposal_is_named_as_its_file_and_its_secrets_are_variable_names() {
    let dir = tempfile::tempdir().unwrap();
    copy_policies(
        dir.path(),
        &["lifecycle.toml", "conventions.toml", "trust.toml"],
    );
    let propose = |file: &str, text: &str| {
        std::fs::write(dir.path().join(file), text).unwrap();
        let out = kavi(dir.path(), &["skill", "propose", file]);
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // Named otherwise than its file, every attempt would build the wrong skill the same way.
    let (code, stderr) = propose("other.toml", PROPOSAL);
    assert_eq!(code, Some(3), "{stderr}");
    assert!(
        stderr.contains("the proposal names the skill `demo`, but its file is named `other`")
            && stderr.contains("--> other.toml:1:8"),
        "{stderr}"
    );
    let secret_read = PROPOSAL.replace("\"READ_ONLY\"", "\"SECRET_READ\"");
    for bad in ["", "bad name;rm -rf /", "1TOKEN", "A=B"] {
        let text = secret_read.replace(
            "command =",
            &format!("secrets = [{}]\ncommand =", toml::Value::from(bad)),
        );
        let (code, stderr) = propose("demo.toml", &text);
        assert_eq!(code, Some(3), "{bad:?}: {stderr}");
        assert!(
            stderr.contains("is not an environment variable name") && stderr.contains("demo.toml:"),
            "{bad:?}: {stderr}"
        );
    }
    let good = secret_read.replace("command =", "secrets = [\"API_TOKEN\"]\ncommand =");
    assert_eq!(propose("demo.toml", &good).0, Some(0));
}

/// A skill that reports how it was started: the file it ran from and Python's flags.
const INTROSPECT: &str = "import json\nimport sys\nfrom typing import Any\n\nSIDE_EFFECT = \"READ_ONLY\"\n\n\ndef run(data: Any) -> dict[str, Any]:\n    return {\n        \"echo\": data,\n        \"file\": __file__,\n        \"isolated\": sys.flags.isolated,\n        \"no_bytecode\": sys.flags.dont_write_bytecode,\n    }\n\n\nif __name__ == \"__main__\":\n    print(json.dumps(run(json.load(sys.stdin))))\n";
const INTROSPECT_TEST: &str = "import unittest\n\nfrom skill import run\n\n\nclass T(unittest.TestCase):\n    def test_echo(self) -> None:\n        self.assertEqual(run(1)[\"echo\"], 1)\n";

/// A module that, imported as `json`, makes the skill print something else.
const EVIL_JSON: &str =
    "def load(f):\n    return {}\n\n\ndef dumps(o):\n    return '{\"pwned\": true}'\n";

/// The trusted bytes run, from a private read-only snapshot, under an isolated interpreter;
/// files the hash leaves out (a `json.pyc` beside `skill.py`, `__pycache__/`) never reach it.
#[test]
fn a_skill_runs_its_trusted_bytes_from_a_snapshot_and_planted_bytecode_changes_nothing() {
    let dir = workspace_with(PROPOSAL, INTROSPECT, INTROSPECT_TEST);
    let root = dir.path();
    verify_and_promote(root);

    let record = run_demo(root, r#"{"x": 1}"#, false);
    assert_eq!(record["success"], true, "{record}");
    let output = &record["output"];
    assert_eq!(output["echo"], serde_json::json!({"x": 1}));
    let file = std::path::PathBuf::from(output["file"].as_str().unwrap());
    assert!(
        file.ends_with("skills/demo/skill.py") && !file.starts_with(root),
        "it ran from {}",
        file.display()
    );
    assert!(!file.exists(), "the snapshot outlived the run");
    assert_eq!(output["isolated"], 1, "{output}");
    assert_eq!(output["no_bytecode"], 1, "{output}");

    // Bytecode the hash excludes, planted beside the skill and in its cache: sourceless
    // `json.pyc` shadowed the standard library when the skill ran from its folder.
    let evil = root.join("evil_json.py");
    std::fs::write(&evil, EVIL_JSON).unwrap();
    let folder = root.join("skills/demo");
    std::fs::create_dir_all(folder.join("__pycache__")).unwrap();
    for planted in ["json.pyc", "__pycache__/json.cpython-311.pyc"] {
        let compiled = std::process::Command::new("python3")
            .args(["-c", "import py_compile, sys; py_compile.compile(sys.argv[1], cfile=sys.argv[2], doraise=True)"])
            .arg(&evil)
            .arg(folder.join(planted))
            .status()
            .unwrap();
        assert!(compiled.success());
    }
    std::fs::remove_file(&evil).unwrap();
    let verify = kavi(root, &["skill", "verify", "demo"]);
    assert!(verify.status.success(), "excluded files are not drift");
    let record = run_demo(root, r#"{"x": 2}"#, false);
    assert_eq!(record["success"], true, "{record}");
    assert_eq!(
        record["output"]["echo"],
        serde_json::json!({"x": 2}),
        "{record}"
    );
    assert!(
        !folder.join("__pycache__/skill.cpython-311.pyc").exists(),
        "the run wrote bytecode into the skill's folder"
    );
}

/// A loop rewriting `skill.py` while the skill is run again and again never gets its bytes run
/// under the trusted hash: each run either runs the trusted bytes or is refused as drift.
#[test]
fn bytes_rewritten_during_runs_never_run_under_the_trusted_hash() {
    let dir = workspace();
    let root = dir.path().to_owned();
    verify_and_promote(&root);
    let skill = root.join("skills/demo/skill.py");
    let trusted = std::fs::read_to_string(&skill).unwrap();
    let other = trusted.replace("{'echo': data}", "{'echo': 'other bytes'}");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let rewriter = {
        let (stop, skill, trusted) = (stop.clone(), skill.clone(), trusted.clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // Written in place, as an attacker racing the interpreter's open would.
                std::fs::write(&skill, &other).unwrap();
                std::thread::sleep(std::time::Duration::from_millis(2));
                std::fs::write(&skill, &trusted).unwrap();
                // The trusted bytes stay a while, so that some runs get past the hash check
                // and show what runs then.
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        })
    };
    let mut ran = 0;
    for _ in 0..25 {
        let out = kavi(&root, &["skill", "run", "demo", "--input", r#"{"n": 1}"#]);
        if out.status.success() {
            ran += 1;
            assert_eq!(json(&out)["output"], serde_json::json!({"echo": {"n": 1}}));
        } else {
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(stderr.contains("refusing to run `demo`"), "{stderr}");
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    rewriter.join().unwrap();
    eprintln!("{ran} of 25 runs ran (the others were refused as drift)");
    // A run that got past the hash ran the trusted bytes: the check above held for each.
    assert!(
        ran > 0,
        "every run was refused: the race never reached the interpreter"
    );
}

/// A FILE_WRITE scope cannot name kavi's state, its governance, other skills, hidden files at
/// the workspace root or anything outside the workspace: refused at propose and by
/// `kavi policy check`, pointing at the entry, with what was probably meant.
#[test]
fn writes_that_name_kavis_state_are_refused_at_propose_and_by_policy_check() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    copy_policies(root, &["lifecycle.toml", "conventions.toml", "trust.toml"]);
    std::fs::create_dir_all(root.join("proposals")).unwrap();
    let file_write = PROPOSAL.replace("READ_ONLY", "FILE_WRITE");
    let with_writes = |entry: &str| {
        file_write.replace(
            "command =",
            &format!(
                "writes = [\"notes\", {}]\ncommand =",
                toml::Value::from(entry)
            ),
        )
    };
    for (entry, said) in [
        (".kavi", "`.kavi` holds the ledger"),
        (".kavi/ledger.db", "`.kavi` holds the ledger"),
        ("policies", "`policies` holds the policies"),
        ("policies/confinement.toml", "`policies` holds"),
        ("pipelines", "`pipelines` holds"),
        ("chains/x", "`chains` holds"),
        ("templates", "`templates` holds"),
        ("kavi.toml", "`kavi.toml` holds"),
        (".git", "`.git` holds"),
        (".git/config", "`.git` holds"),
        ("proposals", "`proposals` holds"),
        ("skills/other", "`skills` holds the skills' trusted files"),
        ("skills", "`skills` holds"),
        (".python-version", "hidden at the workspace root"),
        ("../elsewhere", "contains `..`"),
        ("/etc", "absolute"),
        (".", "not normalised"),
        ("notes/../.kavi", "contains `..`"),
    ] {
        std::fs::write(root.join("proposals/demo.toml"), with_writes(entry)).unwrap();
        let out = kavi(root, &["skill", "propose", "proposals/demo.toml"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{entry}: {stderr}");
        // The second entry of line 4: `writes = ["notes", ` is 19 characters.
        assert!(
            stderr.contains(&format!("`writes` path `{entry}` is refused"))
                && stderr.contains(said)
                && stderr.contains("proposals/demo.toml:4:20")
                && stderr.contains("help:"),
            "{entry}: {stderr}"
        );
        let checked = kavi(root, &["policy", "check"]);
        let stderr = String::from_utf8_lossy(&checked.stderr);
        assert_eq!(checked.status.code(), Some(3), "{entry}: {stderr}");
        assert!(
            stderr.contains(&format!("`writes` path `{entry}` is refused"))
                && stderr.contains("proposals/demo.toml:4:20"),
            "{entry}: {stderr}"
        );
    }

    // A link on the way out of the workspace, or into its state: refused once it is there.
    std::fs::write(
        root.join("proposals/demo.toml"),
        with_writes("notes/shared"),
    )
    .unwrap();
    assert!(kavi(root, &["policy", "check"]).status.success());
    std::fs::create_dir_all(root.join("notes")).unwrap();
    std::os::unix::fs::symlink("../.kavi", root.join("notes/shared")).unwrap();
    for args in [
        &["skill", "propose", "proposals/demo.toml"][..],
        &["policy", "check"],
    ] {
        let out = kavi(root, args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{args:?}: {stderr}");
        assert!(
            stderr.contains("`notes/shared` is a symlink") && stderr.contains("demo.toml:4:20"),
            "{args:?}: {stderr}"
        );
    }
}

/// A scope that became a symlink after promotion is refused when the skill runs.
#[test]
fn a_write_scope_turned_into_a_symlink_after_promotion_is_refused_at_run_time() {
    let proposal = PROPOSAL
        .replace("READ_ONLY", "FILE_WRITE")
        .replace("command =", "writes = [\"out\"]\ncommand =");
    let dir = workspace_with(
        &proposal,
        &side_effect_skill("FILE_WRITE"),
        SIDE_EFFECT_TEST,
    );
    let root = dir.path();
    kernel_only(root);
    verify_and_promote(root);
    std::os::unix::fs::symlink(".kavi", root.join("out")).unwrap();
    let record = run_demo(root, r#"{"write": "out/forged.txt"}"#, true);
    assert_eq!(record["success"], false, "{record}");
    let error = record["error"].as_str().unwrap();
    assert!(error.contains("`out` is a symlink"), "{error}");
    assert!(!root.join(".kavi/forged.txt").exists());
}

/// A trusted file's mode changing is drift, though its bytes (and so the source hash) are the
/// same: refused before a run, suspended by `skill verify`, and `skill restore` puts it back.
/// The same bytes with a new modification time (another checkout's) are not.
#[test]
fn a_chmod_on_a_trusted_file_is_drift_and_a_new_mtime_is_not() {
    use std::os::unix::fs::PermissionsExt;
    let dir = workspace();
    let root = dir.path();
    verify_and_promote(root);
    let skill = root.join("skills/demo/skill.py");
    assert!(kavi(root, &["skill", "verify", "demo"]).status.success());

    let mode = std::fs::metadata(&skill).unwrap().permissions().mode();
    std::fs::set_permissions(&skill, std::fs::Permissions::from_mode(mode | 0o111)).unwrap();
    let refused = kavi(root, &["skill", "run", "demo", "--input", "{}"]);
    assert_eq!(refused.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("the mode of skills/demo/skill.py changed"),
        "{stderr}"
    );
    let drift = kavi(root, &["skill", "verify", "demo"]);
    assert_eq!(drift.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&drift.stdout);
    assert!(stdout.contains("same bytes, but the mode of"), "{stdout}");
    let shown = json(&kavi(root, &["skill", "show", "demo", "--json"]));
    assert_eq!(shown["skill"]["state"], "SUSPENDED", "{shown}");

    let restored = kavi(root, &["skill", "restore", "demo"]);
    assert!(
        restored.status.success(),
        "{}",
        String::from_utf8_lossy(&restored.stderr)
    );
    assert!(kavi(root, &["skill", "verify", "demo"]).status.success());

    // The same bytes written again, as a checkout does: a new modification time, no drift.
    let bytes = std::fs::read(&skill).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    std::fs::write(&skill, &bytes).unwrap();
    assert!(
        kavi(root, &["skill", "run", "demo", "--input", "{}"])
            .status
            .success()
    );
}

/// A process without kavi's keys swaps a trusted skill's code for its own and the row's hash
/// for that code's (journaled through the public hash function, so the public chain holds):
/// `skill run` and `skill verify` check the row against the journal's keyed entry, and refuse.
#[test]
fn a_trusted_skill_whose_code_and_hash_were_swapped_in_the_ledger_does_not_run() {
    let dir = workspace();
    let root = dir.path();
    verify_and_promote(root);
    assert!(
        kavi(root, &["skill", "run", "demo", "--input", "{}"])
            .status
            .success()
    );
    let planted = format!("{SKILL}\nimport os  # planted\n");
    // The planted code's hash, as kavi reports drift from a copy.
    let copy = tempfile::tempdir().unwrap();
    common::copy_dir(root, copy.path());
    std::fs::write(copy.path().join("skills/demo/skill.py"), &planted).unwrap();
    let drift = json(
        &common::kavi_command(copy.path(), &["skill", "verify", "demo", "--json"])
            .output()
            .map(|mut out| {
                // Drift exits 1; its JSON is the answer all the same.
                out.status = std::process::ExitStatus::default();
                out
            })
            .unwrap(),
    );
    let planted_hash = drift[0]["current_hash"].as_str().unwrap().to_owned();

    std::fs::write(root.join("skills/demo/skill.py"), &planted).unwrap();
    common::attacker_connection(root)
        .execute(
            "UPDATE skills SET trusted_hash = ?1, verified_hash = ?1, trusted_tree = NULL
             WHERE name = 'demo'",
            [&planted_hash],
        )
        .unwrap();
    let run = kavi(root, &["skill", "run", "demo", "--input", "{}"]);
    assert_eq!(run.status.code(), Some(2));
    let said = String::from_utf8_lossy(&run.stderr);
    assert!(
        said.contains("has no MAC that holds under kavi's key"),
        "{said}"
    );
    let verified = kavi(root, &["skill", "verify", "demo"]);
    assert_eq!(verified.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&verified.stderr).contains("skill `demo`: journal entry"),
        "{}",
        String::from_utf8_lossy(&verified.stderr)
    );
}

/// A READ_ONLY skill that reads a path it is given cannot read kavi's own files where
/// `kavi.toml` puts them (outside `.kavi`, under names no hiding glob matches): the ledger and
/// the executions log are covered in its view, and opening them is refused.
#[test]
fn a_skill_never_reads_kavi_state_wherever_it_is_configured() {
    let dir = common::shipped_workspace();
    let root = dir.path();
    let config = std::fs::read_to_string(root.join("kavi.toml")).unwrap();
    std::fs::write(
        root.join("kavi.toml"),
        format!(
            "{config}\nledger = \"state/kavi.ledger\"\nexecutions_log = \"logs/executions.jsonl\"\n"
        ),
    )
    .unwrap();
    let forged = kavi(
        root,
        &["pipeline", "run", "forge", "--set", "skill=summarize_note"],
    );
    assert!(forged.status.success(), "{forged:?}");
    assert!(root.join("state/kavi.ledger").is_file());
    for state in ["state/kavi.ledger", "logs/executions.jsonl"] {
        let input = format!("{{\"path\": \"{state}\"}}");
        let read = kavi(root, &["skill", "run", "summarize_note", "--input", &input]);
        assert!(!read.status.success(), "{state} was readable: {read:?}");
        let record: Value = serde_json::from_slice(&read.stdout).unwrap();
        let error = record["error"].to_string();
        assert!(error.contains("Permission denied"), "{state}: {error}");
    }
}
