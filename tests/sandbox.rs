//! Sandbox, diff gate and copy-back with real files and real git: a build can change only what
//! the allowlist names, and nothing else reaches the target.

mod common;

use common::{copy_policies, kavi, last_run, node};

use std::path::Path;

/// A workspace with the shipped policies, a target tree holding a secret, and a pipeline whose
/// builder runs `builder` (a shell line) inside the sandbox.
fn workspace(builder: &str, gated: bool) -> tempfile::TempDir {
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
    let policies: Vec<&str> = run["policies"]
        .as_array()
        .unwrap()
        .iter()
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
    assert_eq!(
        copy["error"],
        "refusing to copy back: `skills/demo/skill.py` is a symlink"
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
