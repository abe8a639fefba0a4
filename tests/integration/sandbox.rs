//! Sandbox, diff gate and copy-back with real files and real git: a build can change only what
//! the allowlist names, and nothing else reaches the target.

use crate::common;

use common::{copy_policies, kavi, last_run, node};

use std::path::Path;

/// A workspace with the shipped policies, a target tree holding a secret, and a pipeline whose
/// builder runs `builder` (a shell line) inside the sandbox.
pub(crate) fn workspace(builder: &str, gated: bool) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    for folder in ["pipelines", "templates", "policies", "skills/existing"] {
        std::fs::create_dir_all(root.join(folder)).unwrap();
    }
    copy_policies(
        root,
        &["sandbox.toml", "allowlist.toml", "conventions.toml"],
    );
    std::fs::write(root.join(".env"), "TOKEN=hunter2\n").unwrap();
    // Regression: ignored files in the target were left out of the sandbox's baseline commit,
    // so the diff gate reported them as changes made by the build.
    std::fs::write(root.join(".gitignore"), "generated/\n").unwrap();
    std::fs::create_dir_all(root.join("generated")).unwrap();
    std::fs::write(root.join("generated/fixture.txt"), "made by a tool\n").unwrap();
    std::fs::write(root.join("skills/existing/skill.py"), "print('old')\n").unwrap();
    let needs = if gated { r#"["gate"]"# } else { r#"["build"]"# };
    let pipeline = format!(
        r#"
[pipeline]
name = "build"

[params.skill]
type = "string"
default = "demo"

[nodes.sandbox]
kind = "sandbox"

[nodes.build]
kind = "exec"
needs = ["sandbox"]
cwd = "{{{{ nodes.sandbox.outputs.path }}}}"
shell = '''{builder}'''
env = {{ SKILL = "{{{{ params.skill }}}}" }}

[nodes.gate]
kind = "diff_gate"
needs = ["sandbox", "build"]
sandbox = "{{{{ nodes.sandbox.outputs.path }}}}"
vars = {{ skill = "{{{{ params.skill }}}}" }}

[nodes.copy]
kind = "copy_back"
needs = {needs_with_sandbox}
sandbox = "{{{{ nodes.sandbox.outputs.path }}}}"
vars = {{ skill = "{{{{ params.skill }}}}" }}
"#,
        needs_with_sandbox = needs.replace('[', r#"["sandbox", "#),
    );
    std::fs::write(root.join("pipelines/build.toml"), pipeline).unwrap();
    dir
}

const GOOD: &str = r#"mkdir -p skills/$SKILL && echo 'def run(): pass' > skills/$SKILL/skill.py && echo 'def test(): pass' > skills/$SKILL/test_skill.py && mkdir -p skills/$SKILL/__pycache__ && echo x > skills/$SKILL/__pycache__/c.pyc && test ! -e .env"#;

#[test]
fn an_allowlisted_build_is_copied_back_and_secrets_never_enter_the_sandbox() {
    let dir = workspace(GOOD, true);
    let out = kavi(dir.path(), &["pipeline", "run", "build"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let run = last_run(dir.path());
    let sandbox = node(&run, "sandbox");
    assert!(sandbox["outputs"]["baseline"].as_str().unwrap().len() == 40);
    let sandbox_dir = Path::new(sandbox["outputs"]["path"].as_str().unwrap());
    assert!(!sandbox_dir.join(".env").exists());
    assert!(
        !sandbox_dir.join(".kavi").exists(),
        "kavi's own state was copied"
    );
    let gate = &node(&run, "gate")["outputs"];
    assert_eq!(
        gate["allowed"],
        serde_json::json!(["skills/demo/skill.py", "skills/demo/test_skill.py"])
    );
    assert_eq!(
        gate["ignored"],
        serde_json::json!(["skills/demo/__pycache__/c.pyc"])
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("skills/demo/skill.py")).unwrap(),
        "def run(): pass\n"
    );
    assert!(!dir.path().join("skills/demo/__pycache__").exists());
    // The policies that governed the run are recorded with it.
    let policies: Vec<&str> = run["governing"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["role"] == "policy")
        .map(|p| p["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        policies,
        [
            "policies/allowlist.toml",
            "policies/conventions.toml",
            "policies/sandbox.toml"
        ]
    );
}

#[test]
fn a_file_outside_the_allowlist_fails_the_gate_by_name_and_nothing_reaches_the_target() {
    for builder in [
        format!("{GOOD} && echo pwned > evil.txt"),
        // Ignoring a file in git does not hide it from the gate.
        format!("{GOOD} && echo '*' > .gitignore && echo pwned > evil.txt"),
        // Nor does changing a file that already exists.
        format!("{GOOD} && echo 'print(1)' > skills/existing/skill.py"),
    ] {
        let dir = workspace(&builder, true);
        let out = kavi(dir.path(), &["pipeline", "run", "build"]);
        assert_eq!(out.status.code(), Some(1));
        let run = last_run(dir.path());
        let gate = node(&run, "gate");
        assert_eq!(gate["state"], "failed");
        let error = gate["error"].as_str().unwrap();
        assert!(
            error.starts_with("changed outside the allowlist: "),
            "{error}"
        );
        assert!(
            error.contains("evil.txt") || error.contains("skills/existing/skill.py"),
            "{error}"
        );
        assert_eq!(node(&run, "copy")["state"], "blocked");
        assert!(!dir.path().join("skills/demo").exists());
        assert!(!dir.path().join("evil.txt").exists());
        assert_eq!(
            std::fs::read_to_string(dir.path().join("skills/existing/skill.py")).unwrap(),
            "print('old')\n"
        );
    }
}

/// Issue 52: a file that configures a gate's tool is never admitted, even where the allowlist
/// is widened to cover it, and is named with the rule that refused it.
#[test]
fn a_tool_configuration_file_is_refused_even_where_the_allowlist_admits_it() {
    let builder = format!(
        "{GOOD} && echo 'def pytest_collection_modifyitems(items): items.clear()' > \
         skills/$SKILL/conftest.py && printf '[mypy]\\nignore_errors = True\\n' > \
         skills/$SKILL/setup.cfg"
    );
    let dir = workspace(&builder, true);
    let allowlist = dir.path().join("policies/allowlist.toml");
    let text = std::fs::read_to_string(&allowlist).unwrap();
    std::fs::write(
        &allowlist,
        format!("{text}\n[[path]]\npath = \"{{{{ paths.folder }}}}/conftest.py\"\n\n[[path]]\npath = \"{{{{ paths.folder }}}}/setup.cfg\"\n"),
    )
    .unwrap();
    let out = kavi(dir.path(), &["pipeline", "run", "build"]);
    assert_eq!(out.status.code(), Some(1));
    let run = last_run(dir.path());
    let gate = node(&run, "gate");
    assert_eq!(gate["state"], "failed");
    let error = gate["error"].as_str().unwrap();
    for (path, glob) in [
        ("skills/demo/conftest.py", "**/conftest.py"),
        ("skills/demo/setup.cfg", "**/setup.cfg"),
    ] {
        assert!(
            error.contains(&format!(
                "`{path}` configures a gate's tool and is never admitted (`deny` glob `{glob}` \
                 in policies/allowlist.toml)"
            )),
            "{error}"
        );
    }
    assert_eq!(node(&run, "copy")["state"], "blocked");
    assert!(!dir.path().join("skills/demo").exists());
}

#[test]
fn a_missing_required_file_fails_the_gate() {
    let dir = workspace(
        "mkdir -p skills/$SKILL && echo x > skills/$SKILL/skill.py",
        true,
    );
    assert_eq!(
        kavi(dir.path(), &["pipeline", "run", "build"])
            .status
            .code(),
        Some(1)
    );
    let run = last_run(dir.path());
    assert_eq!(
        node(&run, "gate")["error"],
        "required but missing: skills/demo/test_skill.py"
    );
}

#[test]
fn copy_back_refuses_symlinks_and_paths_that_leave_the_target_on_its_own() {
    // Without the gate in front: copy_back must refuse by itself.
    let link = "mkdir -p skills/$SKILL && ln -s /etc/passwd skills/$SKILL/skill.py && echo t > skills/$SKILL/test_skill.py";
    let dir = workspace(link, false);
    assert_eq!(
        kavi(dir.path(), &["pipeline", "run", "build"])
            .status
            .code(),
        Some(1)
    );
    let run = last_run(dir.path());
    let copy = node(&run, "copy");
    assert_eq!(copy["state"], "failed");
    let error = copy["error"].as_str().unwrap();
    assert!(
        error.starts_with(
            "refusing to copy back: `skills/demo/skill.py` is a symlink: only regular files are \
             copied back (rule `regular_files_only`)"
        ),
        "{error}"
    );
    assert!(
        !dir.path().join("skills/demo").exists(),
        "part of a refused copy reached the target"
    );

    let dir = workspace(GOOD, false);
    let out = kavi(
        dir.path(),
        &["pipeline", "run", "build", "--set", "skill=../escape"],
    );
    assert_eq!(out.status.code(), Some(1));
    let run = last_run(dir.path());
    assert_eq!(
        node(&run, "copy")["error"],
        "allowlist path `skills/../escape/skill.py` is refused: the path contains `..`"
    );
    assert!(!dir.path().join("escape").exists());
    assert!(!dir.path().parent().unwrap().join("escape").exists());
}

// ---------------------------------------------------------------------------------------------
// The drill corpus: a builder that misbehaves, one case each, through one real forge attempt of
// `word_count` in a fresh copy of the shipped workspace. Each case checks the refusal and its
// message, that the skill is not trusted, and that nothing in the workspace changed outside
// `.kavi/` (where only kavi writes: the ledger, and artifacts whose names are their hashes).

/// What a path in the workspace is: its type and content (or link target).
#[derive(Debug, PartialEq, Eq)]
enum Snapshot {
    File(Vec<u8>),
    Link(std::path::PathBuf),
    Dir,
    Other,
}

fn snapshot(root: &Path) -> std::collections::BTreeMap<String, Snapshot> {
    fn walk(root: &Path, dir: &Path, into: &mut std::collections::BTreeMap<String, Snapshot>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let relative = path.strip_prefix(root).unwrap().display().to_string();
            let kind = path.symlink_metadata().unwrap().file_type();
            let seen = if kind.is_symlink() {
                Snapshot::Link(std::fs::read_link(&path).unwrap())
            } else if kind.is_dir() {
                walk(root, &path, into);
                Snapshot::Dir
            } else if kind.is_file() {
                Snapshot::File(std::fs::read(&path).unwrap())
            } else {
                Snapshot::Other
            };
            into.insert(relative, seen);
        }
    }
    let mut found = std::collections::BTreeMap::new();
    walk(root, root, &mut found);
    found
}

struct Drill {
    workspace: tempfile::TempDir,
    /// Whether the machine isolates the builder (bubblewrap and namespaces). Where it cannot, the
    /// drills run with `require = false`, and those that need the kernel say that they skip.
    confined: bool,
    /// The drill's own sandbox folder, so that what a builder writes next to its sandbox lands
    /// in a folder the test removes.
    sandboxes: tempfile::TempDir,
}

/// The outcome of one drill's attempt.
struct Attempt {
    output: std::process::Output,
    run: serde_json::Value,
}

impl Attempt {
    /// The builder's output, from the build's BUILD_LOG artifact.
    fn build_log(&self, root: &Path) -> String {
        let log = node(&self.run, "build")["artifacts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["role"] == "log")
            .unwrap()["path"]
            .as_str()
            .unwrap()
            .to_owned();
        std::fs::read_to_string(root.join(".kavi/artifacts").join(log)).unwrap()
    }

    /// The error of a node that must have failed.
    fn failed(&self, node_id: &str) -> String {
        let n = node(&self.run, node_id);
        assert_eq!(
            n["state"],
            "failed",
            "{node_id} did not fail: {}",
            String::from_utf8_lossy(&self.output.stdout)
        );
        n["error"].as_str().unwrap().to_owned()
    }
}

impl Drill {
    fn new() -> Self {
        let workspace = common::shipped_workspace();
        let missing = kavi::confinement::runtime::bwrap().err();
        let confined = missing.is_none();
        if let Some(missing) = missing {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI must isolate: {missing}"
            );
            eprintln!(
                "skipping the kernel's part of this drill: {missing}; the builder runs unconfined"
            );
            let policy = workspace.path().join("policies/confinement.toml");
            let text = std::fs::read_to_string(&policy).unwrap();
            std::fs::write(&policy, text.replace("require = true", "require = false")).unwrap();
        }
        Self {
            workspace,
            confined,
            sandboxes: tempfile::tempdir().unwrap(),
        }
    }

    fn root(&self) -> &Path {
        self.workspace.path()
    }

    /// Records the proposal, so that a ledger exists before the attempt.
    fn propose(&self) {
        let out = kavi(
            self.root(),
            &["skill", "propose", "proposals/word_count.toml"],
        );
        assert!(out.status.success());
    }

    /// The drill's temporary folder, one level down in its own folder.
    fn temp_folder(&self) -> std::path::PathBuf {
        let folder = self.sandboxes.path().join("tmp");
        std::fs::create_dir_all(&folder).unwrap();
        folder
    }

    /// Runs one forge attempt with `misbehaviour` after the scripted builder's honest work, and
    /// checks what every drill must: the workspace unchanged outside `.kavi/`, the skill not
    /// trusted, and no sandbox of a failed attempt lost from the record.
    fn attempt(&self, misbehaviour: &str) -> Attempt {
        let before = snapshot(self.root());
        let builder = format!("python3 builders/scripted.py && {misbehaviour}");
        let output = common::kavi_command(
            self.root(),
            &[
                "pipeline",
                "run",
                "forge_attempt",
                "--set",
                "skill=word_count",
            ],
        )
        .env("KAVI_BUILDER", &builder)
        // kavi's default sandbox folder is `$XDG_CACHE_HOME/kavi/sandboxes`: with the drill's
        // folder as the cache, `../../../x` from a sandbox lands in the drill's folder, and no
        // sandbox is left in the account's own cache.
        .env_remove("KAVI_SANDBOXES")
        .env("XDG_CACHE_HOME", self.sandboxes.path())
        .env("TMPDIR", self.temp_folder())
        .output()
        .unwrap();
        assert_ne!(
            output.status.code(),
            Some(0),
            "the attempt passed: {}",
            String::from_utf8_lossy(&output.stdout)
        );
        let after = snapshot(self.root());
        // The ledger's own files change with every row kavi writes; the ledger drill checks
        // that the builder did not reach them.
        let kavi_writes = |path: &str| {
            path.starts_with(".kavi/ledger.") || path.starts_with(".kavi/artifacts/tmp")
        };
        for (path, was) in before.iter().filter(|(path, _)| !kavi_writes(path)) {
            assert!(
                after.get(path) == Some(was),
                "`{path}` changed in the workspace"
            );
        }
        for (path, now) in &after {
            if before.contains_key(path) {
                continue;
            }
            // Only what kavi writes may appear: its ledger files, its artifacts, its log.
            let kavi_wrote = path == ".kavi"
                || kavi_writes(path)
                || path == ".kavi/artifacts"
                || path.starts_with(".kavi/artifacts/sha256")
                || path == ".kavi/executions.jsonl";
            assert!(kavi_wrote, "`{path}` appeared in the workspace");
            // Every artifact is named by the hash of what it holds: nothing else wrote there.
            if let (Some(name), Snapshot::File(_)) =
                (path.strip_prefix(".kavi/artifacts/sha256/"), now)
            {
                let (sha, _) = kavi::hash::hash_file(&self.root().join(path)).unwrap();
                assert!(
                    name.ends_with(&sha),
                    "artifact `{path}` does not hold {sha}"
                );
            }
        }
        let skill = common::json(&kavi(
            self.root(),
            &["skill", "show", "word_count", "--json"],
        ));
        assert_ne!(skill["skill"]["state"], "TRUSTED");
        let run = last_run(self.root());
        Attempt { output, run }
    }
}

#[test]
fn drill_the_builder_is_told_the_sandbox_and_never_the_workspace() {
    let drill = Drill::new();
    // What the measured attack did: find the workspace through the environment and through the
    // relative paths that led there from the old sandbox folder, and weaken the policies.
    let attempt = drill.attempt(
        r#"env > env.txt; for w in "$KAVI_WORKSPACE" .. ../.. ../../..; do
             if [ -n "$w" ] && [ -f "$w/policies/scanner.toml" ]; then
               echo 'weakened = true' >> "$w/policies/scanner.toml"; fi; done; true"#,
    );
    // The dump stays in the sandbox, where the diff gate finds it.
    let error = attempt.failed("diff");
    assert!(
        error.contains("changed outside the allowlist: env.txt"),
        "{error}"
    );
    let sandbox = node(&attempt.run, "sandbox")["outputs"]["path"]
        .as_str()
        .unwrap()
        .to_owned();
    let env = std::fs::read_to_string(Path::new(&sandbox).join("env.txt")).unwrap();
    let workspace = drill.root().canonicalize().unwrap();
    assert!(
        !env.contains(&*workspace.to_string_lossy()) && !env.contains("KAVI_WORKSPACE"),
        "the builder's environment leads to the workspace:\n{env}"
    );
    assert!(env.contains(&format!("KAVI_SANDBOX={sandbox}")), "{env}");
    assert!(env.contains(&format!("PWD={sandbox}")), "{env}");
    // The failed attempt's sandbox is kept for a person to look at (policies/sandbox.toml).
    let doctor = kavi(drill.root(), &["doctor"]);
    let doctor = String::from_utf8_lossy(&doctor.stdout);
    assert!(
        doctor.contains("1 kept after runs that did not succeed"),
        "{doctor}"
    );
}

#[test]
fn drill_a_write_beside_the_sandbox_does_not_reach_the_workspace() {
    let drill = Drill::new();
    // `../../../` led from the old sandbox folder (.kavi/sandboxes/<id>) to the workspace.
    let attempt = drill.attempt(
        "echo pwned > ../notes-from-builder.txt; echo pwned > ../../../notes-from-builder.txt; false",
    );
    let sandbox = node(&attempt.run, "sandbox")["outputs"]["path"]
        .as_str()
        .unwrap()
        .to_owned();
    let beside = Path::new(&sandbox)
        .parent()
        .unwrap()
        .join("notes-from-builder.txt");
    // The drill's folder is the one `../../../` names from the sandbox.
    assert_eq!(
        Path::new(&sandbox).ancestors().nth(3),
        Some(drill.sandboxes.path()),
        "the sandbox is not where the drill looks: {sandbox}"
    );
    let above = drill.sandboxes.path().join("notes-from-builder.txt");
    assert!(!drill.root().join("notes-from-builder.txt").exists());
    if drill.confined {
        // The builder may write its sandbox and its temporary folder only: beside and above the
        // sandbox is its private /tmp (the drill's sandboxes are under /tmp), gone with it.
        assert!(!beside.exists() && !above.exists());
    } else {
        // Unconfined, the writes land outside the workspace, in folders of the drill's.
        assert!(beside.exists() && above.exists());
    }
}

#[test]
fn drill_the_confined_builder_cannot_write_the_workspace_or_the_ledger_by_absolute_path() {
    let drill = Drill::new();
    if !drill.confined {
        return;
    }
    drill.propose();
    let root = drill.root().canonicalize().unwrap();
    let w = root.display();
    let attempt = drill.attempt(&format!(
        "rc=0; echo 'weakened = true' >> {w}/policies/scanner.toml || rc=1; \
         echo corrupt >> {w}/.kavi/ledger.db || rc=1; touch {w}/PWNED || rc=1; exit $rc"
    ));
    let error = attempt.failed("build");
    assert_eq!(error, "the builder exited with code 1");
    // The workspace is not in the builder's view: each path it names does not exist there.
    let log = attempt.build_log(drill.root());
    assert_eq!(log.matches("nonexistent").count(), 2, "{log}");
    assert_eq!(log.matches("No such file").count(), 1, "{log}");
    let confinement = &node(&attempt.run, "build")["outputs"]["confinement"];
    assert_eq!(confinement["role"], "builder");
    assert_eq!(confinement["enforced"], "bubblewrap", "{confinement}");
}

/// A builder that tries to get something out, to reach the terminal, to read a secret or to
/// leave a daemon is stopped by its confinement, and the attempt goes to a person at once as a
/// security violation; also when the process that tried is one it started and ignores.
#[test]
fn drill_a_builder_that_reaches_out_is_stopped_and_escalated() {
    let ignored_children = [
        (
            "python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b\"k\", (\"127.0.0.1\", 9))'; true",
            "forbidden system call",
        ),
        (
            "python3 -c 'import fcntl, termios; fcntl.ioctl(2, termios.TIOCSTI, b\"x\")' || echo carried on",
            "forbidden system call",
        ),
    ];
    let ignored_children = if common::every_death_or_skip() {
        &ignored_children[..]
    } else {
        &[]
    };
    for &(misbehaviour, stopped_for) in [
        // Credentials out over UDP.
        (
            "python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b\"k\", (\"127.0.0.1\", 9))'",
            "forbidden system call",
        ),
        // Input pushed into the terminal that started kavi.
        (
            "python3 -c 'import fcntl, termios; fcntl.ioctl(2, termios.TIOCSTI, b\"x\")'",
            "forbidden system call",
        ),
        // The user's SSH key, to embed in the skill.
        (
            "cat ~/.ssh/id_rsa >> skills/word_count/skill.py; sleep 5",
            "/.ssh/id_rsa, a decoy",
        ),
        // Every process it may signal: kavi's, were it visible.
        ("kill -9 -1", "forbidden system call"),
        // A daemon, double forked, while the builder goes on with its work.
        ("(setsid sleep 60 &); sleep 5", "(a daemon)"),
    ]
    .iter()
    .chain(ignored_children)
    {
        // A workspace each: the first attempt leaves its skill awaiting review.
        let drill = Drill::new();
        if !drill.confined {
            return;
        }
        drill.propose();
        let attempt = drill.attempt(misbehaviour);
        let error = attempt.failed("build");
        assert!(error.contains(stopped_for), "{error}");
        let build = node(&attempt.run, "build");
        assert_eq!(build["outputs"]["failure_kind"], "SECURITY_VIOLATION");
        assert_eq!(
            node(&attempt.run, "classify")["outputs"]["kind"],
            "SECURITY_VIOLATION"
        );
        // A security kind stops the loop at once, for a person.
        let escalate = node(&attempt.run, "escalate");
        assert_eq!(escalate["state"], "awaiting_review", "{escalate}");
        assert!(
            escalate["outputs"]["triggers"]
                .to_string()
                .contains("SECURITY_VIOLATION"),
            "{escalate}"
        );
    }
}

#[test]
fn drill_the_confined_builder_cannot_connect_to_a_listening_socket() {
    let drill = Drill::new();
    if !drill.confined {
        return;
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let attempt = drill.attempt(&format!(
        "python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}), timeout=5)'"
    ));
    // Opening an IPv4 socket without the network kills the builder.
    assert!(attempt.failed("build").contains("forbidden system call"));
    assert_eq!(
        listener.accept().map(|_| ()).unwrap_err().kind(),
        std::io::ErrorKind::WouldBlock,
        "the listener saw a connection"
    );
}

#[test]
fn drill_the_ledger_is_out_of_reach_of_relative_paths_and_the_environment() {
    let drill = Drill::new();
    // A ledger must exist for the builder to find: propose first.
    drill.propose();
    let attempt = drill.attempt(
        r#"found=no; for d in "$KAVI_WORKSPACE" . .. ../.. ../../..; do
             if [ -n "$d" ] && [ -f "$d/.kavi/ledger.db" ]; then
               echo corrupt >> "$d/.kavi/ledger.db"; found=yes; fi; done; echo "$found" > found.txt"#,
    );
    let error = attempt.failed("diff");
    assert!(error.contains("found.txt"), "{error}");
    let sandbox = node(&attempt.run, "sandbox")["outputs"]["path"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        std::fs::read_to_string(Path::new(&sandbox).join("found.txt")).unwrap(),
        "no\n"
    );
}

#[test]
fn drill_git_configuration_in_the_sandbox_runs_nothing_and_counts_as_a_change() {
    let drill = Drill::new();
    let marker = drill.sandboxes.path().join("PWNED");
    let m = marker.display();
    let attempt = drill.attempt(&format!(
        r#"printf '[core]\n\tfsmonitor = "touch {m}; false"\n\thooksPath = .git/evil\n[diff]\n\texternal = "touch {m}"\n' >> .git/config &&
           mkdir -p .git/evil && printf '#!/bin/sh\ntouch {m}\n' > .git/evil/post-index-change &&
           chmod +x .git/evil/post-index-change"#
    ));
    let error = attempt.failed("diff");
    assert!(
        error.contains("changed outside the allowlist: .git/config, .git/evil"),
        "{error}"
    );
    assert!(
        !marker.exists(),
        "kavi's git ran a command the builder configured"
    );
}

#[test]
fn drill_committing_or_hiding_changes_from_git_hides_nothing() {
    for (hide, path) in [
        // Commit the change, so that `git diff HEAD` shows nothing.
        (
            "echo pwned > evil.txt && git add -A && git -c user.name=x -c user.email=x@x commit -qm x",
            "evil.txt",
        ),
        // Tell git's index to stop looking at a file the builder weakened.
        (
            "echo 'weakened = true' >> policies/gates.toml && \
             git update-index --assume-unchanged policies/gates.toml && test -z \"$(git status --porcelain policies)\"",
            "policies/gates.toml",
        ),
        // Ignore it.
        ("echo '*' > .gitignore && echo pwned > evil.txt", "evil.txt"),
    ] {
        let drill = Drill::new();
        let attempt = drill.attempt(hide);
        let error = attempt.failed("diff");
        assert!(
            error.starts_with("changed outside the allowlist: ") && error.contains(path),
            "{hide}: {error}"
        );
    }
}

#[test]
fn drill_ninety_thousand_files_hide_nothing_and_hit_the_file_limit() {
    let drill = Drill::new();
    // No need to keep this sandbox: the policy may say so, and the sweep removes it at once.
    let policy = drill.root().join("policies/sandbox.toml");
    let text = std::fs::read_to_string(&policy).unwrap();
    std::fs::write(
        &policy,
        text.replace("keep_failed = \"24h\"", "keep_failed = \"0s\""),
    )
    .unwrap();
    let attempt = drill.attempt(
        r#"python3 -c '
import pathlib
d = pathlib.Path("bulk")
d.mkdir()
for i in range(90000):
    (d / ("f%05d-" % i + "x" * 150)).write_bytes(b"")
pathlib.Path("zzz_violation.txt").write_text("hidden at the end\n")
'"#,
    );
    let error = attempt.failed("diff");
    assert!(
        error.contains("paths changed, over `max_changed_files` = 100 (policies/sandbox.toml)"),
        "{}",
        &error[error.len().saturating_sub(300)..]
    );
    assert!(
        error.contains("and 89951 more"),
        "the message is not bounded"
    );
    // The whole review is kept as an artifact, the last path included.
    let diff = node(&attempt.run, "diff");
    assert_eq!(diff["outputs"]["violation_count"], 90001);
    let review = diff["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["role"] == "review")
        .unwrap();
    let review: serde_json::Value = serde_json::from_slice(
        &std::fs::read(
            drill
                .root()
                .join(".kavi/artifacts")
                .join(review["path"].as_str().unwrap()),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(
        review["violations"].as_array().unwrap().last().unwrap(),
        "zzz_violation.txt"
    );
    let sandbox = node(&attempt.run, "sandbox")["outputs"]["path"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        !Path::new(&sandbox).exists(),
        "a sandbox kept for 0s was left behind"
    );
}

#[test]
fn drill_links_fifos_and_oversized_files_are_refused_by_path_and_rule() {
    for (misbehaviour, expected) in [
        (
            "ln -sf /etc/passwd skills/word_count/README.md",
            "`skills/word_count/README.md` is a symlink: only regular files are copied back \
             (rule `regular_files_only`)",
        ),
        (
            "ln -f builders/scripted.py skills/word_count/README.md",
            "`skills/word_count/README.md` has 2 links (a hard link): only files with one link \
             are copied back (rule `single_link`)",
        ),
        (
            "mkfifo skills/word_count/README.md",
            "`skills/word_count/README.md` is a FIFO: only regular files are copied back \
             (rule `regular_files_only`)",
        ),
        (
            "truncate -s 1G skills/word_count/README.md",
            "`skills/word_count/README.md` holds 1073741824 bytes, over `max_file_bytes` = \
             1048576 (policies/sandbox.toml)",
        ),
        // Outside the allowlist, a FIFO is as visible as any file.
        (
            "mkfifo hidden_pipe",
            "changed outside the allowlist: hidden_pipe",
        ),
    ] {
        let drill = Drill::new();
        let attempt = drill.attempt(misbehaviour);
        let error = attempt.failed("diff");
        assert!(error.contains(expected), "{misbehaviour}: {error}");
        assert_eq!(node(&attempt.run, "copy")["state"], "blocked");
    }
}

#[test]
fn drill_a_link_on_an_allowlisted_path_stops_the_build_before_the_builder_runs() {
    let elsewhere = tempfile::tempdir().unwrap();
    for (link, target) in [
        ("skills", elsewhere.path().to_owned()),
        (
            "skills/word_count/skill.py",
            Path::new("../../policies/gates.toml").to_owned(),
        ),
    ] {
        let drill = Drill::new();
        let link_path = drill.root().join(link);
        std::fs::create_dir_all(link_path.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(&target, &link_path).unwrap();
        let attempt = drill.attempt("touch builder-ran.txt");
        let error = attempt.failed("build");
        assert!(
            error.starts_with(&format!("refusing to build: `{link}` is a symlink"))
                && error.contains("(rule `no_links_on_allowlisted_paths`) in the workspace"),
            "{error}"
        );
        assert!(
            node(&attempt.run, "build")["outputs"]["build_id"].is_null(),
            "the builder ran"
        );
        assert_eq!(std::fs::read_dir(elsewhere.path()).unwrap().count(), 0);
    }
}

/// A failed attempt's sandbox is kept for a person to look at, inert: no `.git` is left in it
/// (the builder's `core.fsmonitor` ran as the person when they ran `git status` there), nested
/// ones included, and no folder git would take for a bare repository by its contents.
#[test]
fn drill_a_kept_sandbox_has_no_git_and_git_status_there_runs_nothing() {
    let drill = Drill::new();
    let marker = drill.sandboxes.path().join("PWNED");
    let m = marker.display();
    let attempt = drill.attempt(&format!(
        r#"printf '[core]\n\tfsmonitor = "touch {m}; false"\n' >> .git/config &&
           mkdir -p notes && cp -r .git notes/.git && printf 'gitdir: {m}.git\n' > skills/.git &&
           mkdir -p .hg && printf '[hooks]\npre-status = touch {m}\n' > .hg/hgrc &&
           mkdir -p bare/objects bare/refs/heads && printf 'ref: refs/heads/main\n' > bare/HEAD &&
           printf '[core]\n\tbare = false\n\tworktree = .\n\tfsmonitor = "touch {m}; false"\n' > bare/config &&
           mkdir -p linked/objects linked/refs/heads && ln -s refs/heads/main linked/HEAD &&
           cp bare/config linked/config &&
           mkdir -p pointed && printf 'ref: refs/heads/main\n' > pointed/HEAD &&
           ln -s ../bare/objects pointed/objects && ln -s ../bare/refs pointed/refs &&
           cp bare/config pointed/config"#
    ));
    attempt.failed("diff");
    let sandbox = node(&attempt.run, "sandbox")["outputs"]["path"]
        .as_str()
        .unwrap()
        .to_owned();
    let sandbox = Path::new(&sandbox);
    assert!(
        sandbox.is_dir(),
        "the failed attempt's sandbox was not kept"
    );
    let left: Vec<_> = walkdir::WalkDir::new(sandbox)
        .into_iter()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name() == ".git" || e.file_name() == ".hg")
        .map(|e| e.path().display().to_string())
        .collect();
    assert!(left.is_empty(), "left in the kept sandbox: {left:?}");
    // A repository git finds by what a folder holds, whatever its name, is not one any more.
    // Git takes a `HEAD` link as well as a file, and follows links to `objects` and `refs`.
    assert!(sandbox.join("bare/objects").is_dir());
    for repository in ["bare", "linked", "pointed"] {
        let head = sandbox.join(repository).join("HEAD");
        assert!(
            head.symlink_metadata().is_err(),
            "{} is left",
            head.display()
        );
        assert!(!sandbox.join(repository).join("config").exists());
    }
    for dir in [
        sandbox.to_owned(),
        sandbox.join("notes"),
        sandbox.join("bare"),
        sandbox.join("linked"),
        sandbox.join("pointed"),
    ] {
        // As a person would: their own git, in the folder, with the sandbox's files.
        let _ = std::process::Command::new("git")
            .arg("status")
            .current_dir(&dir)
            .env("GIT_CEILING_DIRECTORIES", sandbox.parent().unwrap())
            .output()
            .unwrap();
    }
    assert!(
        !marker.exists(),
        "git status in the kept sandbox ran the builder's command"
    );
}

/// A failed attempt's sandbox over its budget (`keep_max_bytes`) is not kept; the ledger says
/// why. `kavi gc` holds sandboxes kept before to the same budget.
#[test]
fn drill_a_sandbox_over_its_keep_budget_is_not_kept_and_the_record_says_why() {
    let drill = Drill::new();
    let policy = drill.root().join("policies/sandbox.toml");
    let text = std::fs::read_to_string(&policy).unwrap();
    std::fs::write(
        &policy,
        text.replace("keep_max_bytes = 268_435_456", "keep_max_bytes = 1_048_576"),
    )
    .unwrap();
    let attempt = drill.attempt("head -c 2000000 /dev/zero > big.bin");
    attempt.failed("diff");
    let sandbox = node(&attempt.run, "sandbox")["outputs"]["path"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        !Path::new(&sandbox).exists(),
        "a sandbox over its budget was kept"
    );
    if common::postgres::ledger_for(drill.root()).is_none() {
        let conn = rusqlite::Connection::open(drill.root().join(".kavi/ledger.db")).unwrap();
        let (status, error, budget): (String, String, i64) = conn
            .query_row(
                "SELECT status, error, keep_max_bytes FROM sandboxes WHERE path = ?1",
                [&sandbox],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .unwrap();
        assert_eq!((status.as_str(), budget), ("removed", 1_048_576));
        assert!(
            error.starts_with("not kept: it holds ") && error.contains("`keep_max_bytes`"),
            "{error}"
        );
    }

    // One kept under a larger budget that grew past it since (a survivor kept writing) goes
    // at the next `kavi gc`.
    std::fs::write(&policy, &text).unwrap();
    let attempt = drill.attempt("true > extra.txt");
    attempt.failed("diff");
    let sandbox = node(&attempt.run, "sandbox")["outputs"]["path"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(Path::new(&sandbox).is_dir());
    let grown = std::fs::File::create(Path::new(&sandbox).join("grown.bin")).unwrap();
    grown.set_len(300 * 1024 * 1024).unwrap();
    drop(grown);
    let gc = kavi(drill.root(), &["gc"]);
    assert!(
        gc.status.success(),
        "{}",
        String::from_utf8_lossy(&gc.stderr)
    );
    assert!(
        !Path::new(&sandbox).exists(),
        "gc left a kept sandbox over its budget"
    );
}

/// kavi's own files are never copied into a build's sandbox, wherever `kavi.toml` puts them: the
/// executions log (past skills' inputs and outputs) and the registry included.
#[test]
fn kavi_state_never_enters_the_sandbox_wherever_it_is_configured() {
    let dir = workspace(
        "test ! -e logs/executions.jsonl && test ! -e .kavi/registry.json && test ! -e state/kavi.ledger",
        false,
    );
    let root = dir.path();
    std::fs::write(
        root.join("kavi.toml"),
        "ledger = \"state/kavi.ledger\"\nexecutions_log = \"logs/executions.jsonl\"\n",
    )
    .unwrap();
    std::fs::create_dir_all(root.join("logs")).unwrap();
    std::fs::write(
        root.join("logs/executions.jsonl"),
        "{\"input\": \"confidential\"}\n",
    )
    .unwrap();
    std::fs::create_dir_all(root.join(".kavi")).unwrap();
    std::fs::write(root.join(".kavi/registry.json"), "{}\n").unwrap();
    kavi(root, &["pipeline", "run", "build"]);
    let run = last_run(root);
    assert_eq!(node(&run, "build")["state"], "succeeded", "{run}");
}
